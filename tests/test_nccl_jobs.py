"""The critical path on real multi-GPU NCCL jobs of other people, every rank of each present, one
GPU per rank (``../shared/real-traces/nccl-jobs``: nine TorchRec DLRM runs on 4 and 2 V100s,
PyTorch about 2.2, and a Megatron tensor-parallel run on 2 V100s, PyTorch about 2.4): each NCCL
kernel is its rank's arrival at a collective, the path moves to the rank whose kernel started
last, and what held a stream or a CPU is found where the trace does not record it (issue 68).

The three figures are measured by ``benchmarks/nccl_path_checks.py``, which finds each collective
on every rank by time alone (the kernel of the same name that overlaps it longest), sharing
nothing with the path's matching by order."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest

from conftest import REAL_TRACES, REPO, quick_sample
from helpers import (
    collectives_outside_windows,
    compare_runs,
    critical_path,
    unmatched_collectives,
    what_if,
)
from helpers.analysis.collectives import matched_collectives, on_every_rank
from helpers.report import build_report
from helpers.traces import load_run

sys.path.insert(0, str(REPO / "benchmarks"))
from nccl_path_checks import figures  # noqa: E402

JOBS = REAL_TRACES / "nccl-jobs"
FOLDERS = ["megatron-tp2", "torchrec-resnet18", "torchrec-a2a-optimizer", "torchrec-a2a-optimizer-2a",
           "torchrec-a2a-optimizer-2b", "torchrec-a2a-optimizer-3", "torchrec-a2a-optimizer-4",
           "torchrec-a2a-optimizer-5", "torchrec-a2a-optimizer-5-qcomm-a",
           "torchrec-a2a-optimizer-qcomm-trace"]  # fmt: skip
#: The quick loop reads one job of each kind (Megatron, TorchRec's ResNet and its all-to-alls);
#: ``make test`` every one.
SWEEP = quick_sample(FOLDERS, lambda folder: "-".join(folder.split("-")[:2]))
#: The job whose GPU never held its CPU: its path holds no collective (see its test).
CPU_BOUND = "torchrec-resnet18"
_RUNS: dict[str, tuple[pd.DataFrame, pd.DataFrame]] = {}


def job(folder: str) -> Path:
    """A job's folder (skips without ../shared)."""
    if not (JOBS / folder).is_dir():
        pytest.skip("../shared/real-traces/nccl-jobs is not here")
    return JOBS / folder


def run(folder: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A job's events and critical path (read once per session; skips without ../shared)."""
    job(folder)
    if folder not in _RUNS:
        with warnings.catch_warnings():  # GPU events launched before the window, said elsewhere
            warnings.simplefilter("ignore", UserWarning)
            events = load_run(JOBS / folder, cache=False).events
            _RUNS[folder] = events, critical_path(events)
    return _RUNS[folder]


@pytest.mark.parametrize("folder", SWEEP)
def test_the_path_tiles_each_step_and_holds_little_waiting_inside_nccl_kernels(folder):
    measured = figures(folder, *run(folder))
    assert measured.worst_tiling <= 0.03 and measured.overlaps == 0
    assert measured.waiting_share <= 0.05, "ranks spinning in NCCL before the last arrival"


@pytest.mark.parametrize("folder", [f for f in SWEEP if f.values[0] != CPU_BOUND])
def test_before_each_collective_the_path_holds_it_is_on_the_rank_that_arrived_last(folder):
    measured = figures(folder, *run(folder))
    assert measured.transfers >= 1
    assert measured.right_share >= 0.8, (measured.right_rank, measured.transfers)


def test_a_job_whose_gpu_never_held_its_cpu_has_its_path_on_the_last_arrivals_cpu():
    # TorchRec's resnet18 on 2 V100s: rank 1's kernels run within µs of their launch, its CPU
    # never blocks in a CUDA call for more than 22 µs, and it arrives last at every collective:
    # nothing of rank 0's and no collective's transfer decides when its steps end
    events, path = run(CPU_BOUND)
    assert set(path["rank"]) == {1} and not (path["reason"] == "transfer").any()
    kernels = figures(CPU_BOUND, events, path)
    assert kernels.transfers == 0
    calls = events[(events["rank"] == 1).to_numpy() & events["name"].astype(str).str.match(r"^cuda(Stream|Device|Event)Synchronize$|^cudaMemcpy").to_numpy()]  # fmt: skip
    assert calls["dur_us"].max() < 50


def test_a_rank_that_sleeps_a_second_a_step_holds_each_step():
    # rank 2 of this TorchRec run spends about 1 s a step in its sparse arch, with nothing
    # recorded under it: the others wait for it in the all-to-all that follows
    events, path = run("torchrec-a2a-optimizer")
    per_rank = path.groupby(["step", "rank"])["dur_us"].sum().unstack(fill_value=0.0)
    assert (per_rank[2] / per_rank.sum(axis=1) > 0.9).all()
    asleep = path[(path["rank"] == 2) & (path["name"] == "# running sparse arch")]
    assert (asleep.groupby("step")["dur_us"].sum() > 1e6).all()


def test_a_late_rank_is_visited_where_it_arrived_last():
    # Megatron's rank 0 began its step 12 ms after rank 1, which then waited 21.6 ms in the
    # first all-reduce: every collective's transfer on the path is rank 0's, the last to arrive
    events, path = run("megatron-tp2")
    transfers = path[path["reason"] == "transfer"]
    assert len(transfers) >= 1 and set(transfers["rank"]) == {0}
    waits = matched_collectives(events, None).sort_values("start_us")
    first = waits[waits["index"] == waits["index"].min()]
    assert first.set_index("rank")["start_us"].diff().abs().max() > 20_000  # rank 1 first


def test_nccl_kernels_whose_windows_began_apart_are_matched_and_the_edges_said_no_hang():
    # rank 2 began profiling 13.7 ms after the others: the first two collectives ran without
    # it, which matching by order alone pairs with rank 2's first two kernels
    events, _ = run("torchrec-a2a-optimizer-2a")
    matched = matched_collectives(events, None)
    assert matched.groupby("rank").size().to_dict() == {0: 33, 1: 33, 2: 31, 3: 33}
    full = on_every_rank(matched)
    assert full.groupby(["key", "index"]).ngroups == 31
    spans = full.groupby(["key", "index"]).agg(last=("start_us", "max"), first_end=("end_us", "min"))  # fmt: skip
    assert (spans["last"] <= spans["first_end"] + 100).all(), "all under way at the last arrival"
    outside = collectives_outside_windows(events)
    assert len(outside) == 6 and all(ranks == [2] for ranks in outside["not_recording"])
    assert unmatched_collectives(events).empty


def test_send_and_receive_kernels_are_paired_by_time_only_where_every_rank_is_here():
    # two ranks of four: an all-to-all's SendRecv kernels are left as sends and receives
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        events = load_run(sorted(job("torchrec-a2a-optimizer-2a").glob("*.json.gz"))[:2], cache=False).events  # fmt: skip
    matched = matched_collectives(events, None)
    sends = matched[matched["name"].astype(str).str.contains("SendRecv")]
    assert set(sends["matched_by"].astype(str)) == {"name and order on each rank"}
    path = critical_path(events)
    assert not path.empty


def test_a_partial_job_still_gets_a_report_that_names_the_missing_ranks():
    files = sorted(job("torchrec-a2a-optimizer-2a").glob("*.json.gz"))[1:]
    report = build_report(files)
    assert "1 of the job's 4 ranks left no trace here" in report.section("What the traces cannot tell").text  # fmt: skip
    assert report.section("What held the steps, what to fix first") is not None


def test_a_stream_wait_without_a_record_call_is_matched_by_the_calls_or_the_gpus_timing():
    _, path = run("torchrec-a2a-optimizer-2a")
    said = path.loc[path["reason"].isin(["stream wait", "sync"]), "waited_for"]
    assert said.str.endswith("(inferred from timing)").any() and said.str.endswith("(inferred)").any()  # fmt: skip


def test_the_report_says_how_the_kernels_were_matched_and_which_ran_before_a_rank_recorded():
    report = build_report(job("torchrec-a2a-optimizer-2a"))
    said = report.section("What the traces cannot tell").text
    assert "rank 0: 33, rank 1: 33, rank 2: 31, rank 3: 33 kernels" in said
    assert "6 collective kernels or spans ran while rank 2 was not recording yet" in said
    assert "no partner on rank" not in report.section("What held the steps, what to fix first").text  # fmt: skip


# ------------------------------------------------- the side stream and the slow op on one H200


@pytest.fixture(scope="module")
def h200() -> tuple[dict[str, pd.DataFrame], dict[str, pd.DataFrame]]:
    """The three H200 runs' events and critical paths."""
    if not REAL_TRACES.is_dir():
        pytest.skip("../shared/real-traces is not here")
    with warnings.catch_warnings():  # one of side-1's stream waits is said unmatched
        warnings.simplefilter("ignore", UserWarning)
        events = {c: load_run(REAL_TRACES / "h200" / c, cache=False).events for c in ("base-1", "side-1", "gpuslow-1")}  # fmt: skip
        paths = {c: critical_path(e) for c, e in events.items()}
    return events, paths


def _median_step_ms(events: pd.DataFrame) -> float:
    return float(events[events["kind"] == "step"].groupby("step")["dur_us"].max().median() / 1e3)


def test_the_path_holds_the_time_a_side_stream_adds_on_its_kernels(h200):
    events, paths = h200
    added = _median_step_ms(events["side-1"]) - _median_step_ms(events["base-1"])  # 84.5 - 56.5
    path = paths["side-1"]
    side = path[(path["rank"] == 1) & (path["launched_within"] == "side_op") & (path["reason"] == "work")]  # fmt: skip
    assert side.groupby("step")["dur_us"].sum().median() / 1e3 >= 0.8 * added  # 32.5 of 28.0
    waited = path[path["reason"] == "stream wait"]
    assert waited["waited_for"].str.contains("· rank 1 · GPU 0 stream 13").any()


def test_the_what_if_without_the_side_stream_work_predicts_the_run_without_it(h200):
    events, _ = h200
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        predicted = what_if(events["side-1"], rank=1, name="^side_op$").median()
    assert predicted == pytest.approx(_median_step_ms(events["base-1"]), rel=0.15)  # 57.9 / 56.5


def test_compare_runs_names_the_op_that_launched_the_kernels_that_went(h200):
    events, _ = h200
    verdict = compare_runs(events["gpuslow-1"], events["base-1"]).verdict
    assert (
        "The largest change on the critical path is rank 1's slow_op (its GPU kernels)" in verdict
    )


def _cycles(folder: str) -> pd.DataFrame:
    """The cycles in the graph of a job's run (:func:`helpers.analysis.path.graph.validate`)."""
    from helpers.analysis.path.graph import validate
    from helpers.analysis.path.lanes import lane_intervals

    events, _ = run(folder)
    with warnings.catch_warnings():  # a cycle is warned of; here it is counted
        warnings.simplefilter("ignore", UserWarning)
        found = validate(lane_intervals(events).graph)
    return found[found["problem"] == "cycle"]


@pytest.mark.parametrize("folder", SWEEP)
def test_no_cuda_call_waits_for_gpu_work_that_ended_after_its_lane_let_it_go(folder):
    # a pageable copy's cudaMemcpyAsync, cut short on its lane by an aten::copy_ that began
    # inside it: its sync edge went into the cut end, 5 µs before its copy ended (a cycle, and
    # most of the graph after it kept its measured times): 8 of these 10 jobs had one or more
    assert not _cycles(folder)["dependency"].str.contains("sync").any()


@pytest.mark.parametrize("folder", SWEEP)
def test_the_graph_of_a_real_nccl_job_holds_no_cycle(folder):
    # before: two threads' waits, each woken by the other's end a few µs after its own (the
    # waker's tolerance is either side), on 3 of the TorchRec jobs
    assert _cycles(folder).empty
