"""GPU-side copies of CPU annotations (``cat: gpu_user_annotation``), as a specification.

Kineto draws on a GPU stream the ranges of the CPU annotations that launched GPU work, and
recent versions do it for the profiler's own ``ProfilerStep#N`` too: the same step twice, once
on the CPU's thread and once on the stream. The copy is a range on the stream, never a step of
its own: every analysis that reads steps gives the same answer with and without it, and the
report is written whole on such a trace.

The trace here is built to the format of a recent one-GPU trace: per step, the CPU's
``ProfilerStep#N`` (``user_annotation``, with its ``External id``), an op, the CUDA launch of a
kernel (``correlation``), the kernel on stream 7 and, with ``copies``, the step's copy on stream
7 (``gpu_user_annotation``, the CPU annotation's ``External id``) around the kernel. The second
step's kernel runs on past the step's end, into the third, as queued GPU work does.
"""

from __future__ import annotations

import pandas as pd
import pytest

from conftest import complete_event, trace_doc, write_doc
from helpers import critical_path, gpu_idle_time, load_run, step_times, summarise_run, what_if
from helpers.report import build_report
from helpers.report.__main__ import main

STEP_US, STEPS = 1000.0, 3
#: per step: when its kernel starts after the step began, and how long it runs
KERNELS = {1: (100.0, 500.0), 2: (700.0, 400.0), 3: (100.0, 500.0)}


def gpu_steps_doc(copies: bool) -> dict:
    """One GPU rank of ``STEPS`` steps, with or without the GPU copies of ``ProfilerStep#N``."""
    gpu = {"pid": 0, "tid": 7, "device": 0, "stream": 7}  # on a GPU: the device, the stream
    events = []
    for step in range(1, STEPS + 1):
        t, ext = (step - 1) * STEP_US, 10 * step
        begins, runs = KERNELS[step]
        events += [
            complete_event(f"ProfilerStep#{step}", t, 900.0, cat="user_annotation", **_ids(ext)),
            complete_event("aten::mm", t + 10, 300.0, **_ids(ext + 1)),
            complete_event(
                "cudaLaunchKernel", t + 50, 20.0, cat="cuda_runtime", **_ids(ext + 1, ext + 2)
            ),
            complete_event(
                "gemm_kernel", t + begins, runs, cat="kernel", **_ids(ext + 1, ext + 2), **gpu
            ),
            complete_event("aten::add", t + 400, 100.0, **_ids(ext + 3)),
        ]
        if copies:
            copy = complete_event(f"ProfilerStep#{step}", t + begins, runs, cat="gpu_user_annotation", **_ids(ext), **gpu)  # fmt: skip
            events.append(copy)
    return trace_doc(events, rank=0, world=1, backend="nccl")


def _ids(external: int, correlation: int | None = None) -> dict:
    """An event's ``External id`` and, for a launch and its kernel, their ``correlation``."""
    ids = {"External id": external}
    return ids if correlation is None else {**ids, "correlation": correlation}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[bool, object]:
    """A run folder each, with the copies (True) and without (False)."""
    found = {}
    for copies in (True, False):
        folder = tmp_path_factory.mktemp("copies" if copies else "plain")
        write_doc(folder / "rank0.json", gpu_steps_doc(copies))
        found[copies] = folder
    return found


@pytest.fixture(scope="module")
def events(folders) -> dict[bool, pd.DataFrame]:
    return {copies: load_run(folder, cache=False).events for copies, folder in folders.items()}


def test_the_gpu_copy_of_a_step_is_an_annotation_on_its_stream_in_the_step_that_launched_it(
    events,
):
    copies = events[True][events[True]["cat"] == "gpu_user_annotation"]
    assert len(copies) == STEPS
    assert set(copies["kind"]) == {"annotation"}
    assert set(copies["lane"]) == {"GPU 0 stream 7"}
    assert copies["step"].tolist() == [1, 2, 3]
    assert (events[True]["kind"] == "step").sum() == STEPS


def _path(events: pd.DataFrame) -> pd.DataFrame:
    return critical_path(events).drop(columns=["name", "kind"]).reset_index(drop=True)


def _kernel_steps(events: pd.DataFrame) -> pd.Series:
    kernels = events[events["kind"] == "gpu kernel"]
    return kernels.set_index("start_us")["step"].sort_index()


#: each analysis that reads steps, as a function of a run's folder and its events
READ_STEPS = {
    "step times": lambda folder, ev: step_times(ev),
    "each kernel's step": lambda folder, ev: _kernel_steps(ev),
    "the critical path": lambda folder, ev: _path(ev),
    "the what-if": lambda folder, ev: what_if(ev, 0, "^aten::add$"),
    "GPU idle time": lambda folder, ev: gpu_idle_time(ev),
    "rank by rank": lambda folder, ev: summarise_run(folder, cache=False).step_times(),
}


@pytest.mark.parametrize("analysis", READ_STEPS.values(), ids=READ_STEPS.keys())
def test_every_analysis_of_steps_gives_the_same_answer_with_and_without_the_copies(
    folders, events, analysis
):
    with_copies = analysis(folders[True], events[True])
    without = analysis(folders[False], events[False])
    if isinstance(with_copies, pd.DataFrame):
        pd.testing.assert_frame_equal(with_copies, without)
    else:
        pd.testing.assert_series_equal(with_copies, without)


def test_the_path_never_walks_on_a_copy(events):
    path = critical_path(events[True])
    assert not path["name"].str.startswith("ProfilerStep").any()


def test_the_report_on_a_trace_with_copies_is_written_whole(folders):
    report = build_report(folders[True])
    titles = [s.title for s in report.sections]
    assert report.failed == []
    assert {"What held the steps, what to fix first", "Step time per rank", "The GPU"} <= set(
        titles
    )
    assert report.glance["steps"] == "3: ProfilerStep#1-3"


def test_a_section_that_fails_is_said_among_the_cautions_and_the_rest_is_written(
    folders, monkeypatch, tmp_path, capsys
):
    def broken(*args, **kwargs):
        raise ValueError("Index contains duplicate entries, cannot reshape")

    monkeypatch.setattr("helpers.report.build.gpu_section", broken)
    report = build_report(folders[True])
    assert report.failed == [("The GPU", "ValueError: Index contains duplicate entries, cannot reshape")]  # fmt: skip
    assert "The GPU" not in [s.title for s in report.sections]
    assert "Step time per rank" in [s.title for s in report.sections]
    said = report.section("What the traces cannot tell").text
    assert "“The GPU” could not be written (ValueError: Index contains duplicate" in said
    assert "please report it" in said
    assert main([str(folders[True]), "--out", str(tmp_path / "report.html")]) == 0
    assert (tmp_path / "report.html").stat().st_size > 0
    assert "the section “The GPU” could not be written" in capsys.readouterr().out


def test_a_failing_first_section_leaves_the_others_in_their_order(folders, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no way through")

    monkeypatch.setattr("helpers.report.held.held_section", broken)
    titles = [s.title for s in build_report(folders[True]).sections]
    assert titles[:3] == ["What the traces cannot tell", "Step time per rank", "Waiting and the straggler"]  # fmt: skip
