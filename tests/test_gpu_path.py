"""The critical path on GPU jobs: the CPU waiting for the GPU, a stream waiting for another, a
collective of GPU tensors joined when its data was ready, an op's GPU work going with it in a
what-if. Checked on a real GPU job of ours (one H200, DDP of 2 ranks over gloo with CUDA
tensors, ``../shared/real-traces/h200``: ``gpuslow-1`` adds about 28 ms of GPU matmuls a step
to rank 1 under ``record_function("slow_op")``, ``base-1`` is the same job without them) and
against HolisticTraceAnalysis's own answers on its traces with CUDA synchronisation events."""

from __future__ import annotations

import gzip
import json
import warnings

import numpy as np
import pandas as pd
import pytest
from test_graph import kernel, launch, op, step

from conftest import REAL_TRACES, REPO, trace_doc, write_doc
from helpers import collective_waits, critical_path, find_straggler, path_summary, what_if
from helpers.report import build_report
from helpers.traces import load_run

HTA_ANSWERS = REPO / "tests" / "data" / "hta-critical" / "event_sync_answers.json"


def _events(folder) -> pd.DataFrame:
    with warnings.catch_warnings():  # a few of its stream waits began before the window
        warnings.simplefilter("ignore", UserWarning)
        return load_run(folder, cache=False).events


@pytest.fixture(scope="module")
def h200() -> dict[str, pd.DataFrame]:
    """The two runs' events (the tests skip without ../shared)."""
    if not REAL_TRACES.is_dir():
        pytest.skip("../shared/real-traces is not here")
    return {case: _events(REAL_TRACES / "h200" / case) for case in ("base-1", "gpuslow-1")}


def _median_step_ms(events: pd.DataFrame) -> float:
    steps = events[events["kind"] == "step"]
    return float(steps.groupby("step")["dur_us"].max().median() / 1e3)


def _slow_op_work(events: pd.DataFrame) -> pd.Index:
    """The GPU events rank 1 launched inside its ``slow_op`` annotations (from their thread)."""
    mine = events[events["rank"] == 1]
    ops = mine[
        (mine["name"] == "slow_op") & (mine["cat"] == "user_annotation")
    ]  # not the GPU's copy
    calls = mine[(mine["kind"] == "cuda runtime") & (mine["lane"] == ops["lane"].iloc[0])]
    inside = [t for t in calls["start_us"] if ((ops["start_us"] <= t) & (t < ops["end_us"])).any()]
    return mine.index[mine["launch_us"].isin(inside)]


def test_the_path_holds_the_added_time_on_the_slowed_ranks_slow_op_kernels(h200):
    events = h200["gpuslow-1"]
    added = _median_step_ms(events) - _median_step_ms(h200["base-1"])  # 86.0 - 56.2
    path = critical_path(events)
    names = events["name"].astype(str)
    slow = names.loc[_slow_op_work(events)].unique()
    on_them = path[(path["rank"] == 1) & path["name"].isin(slow) & (path["reason"] == "work")]
    per_step = on_them.groupby("step")["dur_us"].sum() / 1e3
    assert per_step.median() >= 0.8 * added, (per_step.median(), added)  # 30.9 of 29.8 ms
    assert set(on_them["launched_by"]) == {"aten::mm"}


def test_the_what_if_without_the_slow_op_predicts_the_run_without_it(h200):
    events = h200["gpuslow-1"]
    predicted = what_if(events, rank=1, name="^slow_op$")
    measured_without = _median_step_ms(h200["base-1"])
    assert predicted.median() == pytest.approx(measured_without, rel=0.15)  # 59.7 against 56.2
    assert predicted.attrs["changed"]["gpu_work"] == len(_slow_op_work(events))


def test_the_straggler_is_the_rank_whose_gpu_work_was_slowed_and_it_waits_for_nobody(h200):
    events = h200["gpuslow-1"]
    assert find_straggler(events) == 1
    waits = collective_waits(events).groupby("rank")["wait_us"].sum()
    assert waits[1] < 0.05 * waits[0]  # its wait for its own GPU is not waiting for the others


def test_a_gloo_collective_of_cuda_tensors_is_joined_when_its_data_was_ready(h200):
    events = h200["gpuslow-1"]
    waits = collective_waits(events)
    opened = events[(events["name"] == "cudaStreamSynchronize") & events["lane"].astype(str).str.contains("gloo")]  # fmt: skip
    first = waits.sort_values("start_us").groupby("rank").head(1)
    for rank, start, arrival in zip(first["rank"], first["start_us"], first["arrival_us"]):
        mine = opened[(opened["rank"] == rank) & (opened["start_us"] >= start)].iloc[0]
        assert arrival == pytest.approx(mine["end_us"])


def test_the_reports_first_fix_on_the_slowed_job_names_the_op_that_launched_its_kernels(real_traces):  # fmt: skip
    report = build_report(real_traces / "h200" / "gpuslow-1")
    held = report.section("What held the steps, what to fix first").text
    fix = held.split("Fix that first")[0].rsplit("heaviest is ", 1)[-1]
    assert fix.startswith("rank 1's `slow_op` (its GPU kernels)")
    assert "If rank 1's `slow_op` took no time, with the 60 GPU events it launched" in held
    assert "rank 1 is the straggler" in report.section("Waiting and the straggler").text


@pytest.mark.parametrize(
    "case, window",
    [("cuda_event_sync", None), ("cuda_event_sync_multi_stream", "trace")],
    ids=["one stream, event and device syncs", "three streams, a stream wait"],
)
def test_htas_gpu_path_and_ours_share_their_gpu_time(real_traces, case, window):
    """HTA's critical path of its traces with CUDA sync events (its answer, kept in
    tests/data/hta-critical) against ours over the same window."""
    trace = real_traces / "hta" / "critical_path" / case / "event_sync_trace.json.gz"
    events = _events([trace])
    ours = critical_path(events, window=window)
    ours = ours[ours["kind"].isin(["gpu kernel", "gpu memory"])]
    raw = json.loads(gzip.open(trace).read())
    offset = events["start_us"].min() - min(e["ts"] for e in raw["traceEvents"] if e.get("ph") == "X")  # fmt: skip
    theirs = json.loads(HTA_ANSWERS.read_text())["critical_gpu_events"][case]
    starts = np.array([e["ts"] for e in theirs], float) + offset
    ends = starts + np.array([e["dur"] for e in theirs], float)
    common = sum(np.clip(np.minimum(ends, b) - np.maximum(starts, a), 0, None).sum() for a, b in zip(ours["start_us"], ours["end_us"]))  # fmt: skip
    assert common / (ends - starts).sum() >= 0.9  # 100 % and 99.2 %
    assert common / ours["dur_us"].sum() >= 0.9  # 97.4 % and 99.2 %


def test_a_stream_wait_that_matches_nothing_is_said_and_the_path_still_tiles(tmp_path):
    # a cudaStreamWaitEvent with no record call before it, and a kernel launched after it
    # that held its stream: the kernel began 180 µs after its launch returned
    events = [step(0, 500), op("aten::mm", 0, 100), op("cudaStreamWaitEvent", 100, 5, cat="cuda_runtime", correlation=9),
              launch(110, 10, 1), kernel("gemm", 300, 100, 1)]  # fmt: skip
    write_doc(tmp_path / "rank0.json", trace_doc(events))
    run = load_run(tmp_path, cache=False).events
    with pytest.warns(
        UserWarning,
        match="1 of the 1 stream waits .* held their stream, and what they waited for could not be found",
    ):
        path = critical_path(run)
    assert path["dur_us"].sum() == 500


def test_a_trace_without_cuda_activity_has_a_path_with_no_gpu_in_it(real_traces):
    events = _events(sorted((real_traces / "hta" / "cpu_only").glob("*.json.gz")))
    path = critical_path(events, window="trace")
    assert not path.empty and not path["kind"].isin(["gpu kernel", "sync", "stream wait"]).any()
    assert path_summary(path)["share"].sum() == pytest.approx(1.0)
