"""What-ifs whose answers are worked out by hand: a check of the dependency graph that can fail.

The replay of a run as measured reproduces it whatever the graph says (each edge carries the
delay it measured), so its replay error cannot tell a wrong graph from a right one. A what-if
can: take one event out of a small hand-built run, work out by hand when everything else would
happen, and compare. One case per kind of dependency (each case's comment is the arithmetic),
and a mutation check: drop any one builder of the graph, and some case here fails. The step's
end, which no what-if reads (no moment waits for it), has answers of its own: the rank where
the step's path begins.

A wait ends as long after the last of what it waited for (its own start included) as it did
when measured: its *delay* (helpers/analysis/path/graph.py).
"""

from __future__ import annotations

import pandas as pd
import pytest
from test_graph import GLOO, OTHER, STREAM, kernel, launch, op, peer, record, step, stream_wait

from conftest import complete_event, trace_doc, write_doc
from helpers import critical_path, what_if
from helpers.analysis.path import builders
from helpers.analysis.path.dependencies import DEPENDENCIES
from helpers.traces import load_run


def sync_call(name: str, ts: float, dur: float, **args) -> dict:
    return op(name, ts, dur, cat="cuda_runtime", **args)


def gloo_span(name: str, ts: float, dur: float) -> dict:
    return op(f"gloo:{name}", ts, dur, tid=GLOO, cat="user_annotation")


#: Two ranks, one all-reduce: rank 1 computes 600 µs, rank 0 300 and waits for it.
ONE_COLLECTIVE = {
    0: [step(0, 900), op("aten::mm", 0, 300), op("c10d::allreduce_", 300, 10),
        gloo_span("all_reduce", 310, 490), op("Optimizer.step#SGD.step", 800, 100)],
    1: [step(0, 900), op("aten::mm", 0, 600), op("c10d::allreduce_", 600, 10),
        gloo_span("all_reduce", 610, 190), op("Optimizer.step#SGD.step", 800, 100)],
}  # fmt: skip

#: Per case: the ranks' events, the what-if (rank, name, factor, and the machine's cores where
#: the case gives them) and the median step it must predict (ms), and the kind of dependency
#: the answer depends on.
KNOWN = {
    "transfer: without rank 1's slow op, both ranks leave the collective sooner": (
        # rank 1 arrives at 10 (its c10d call 0-10, gloo's thread 0 µs later), rank 0 at 310;
        # the transfer is the shortest duration, 190: both end at 500, the optimizer 500-600
        ONE_COLLECTIVE, (1, "^aten::mm$", 0.0), 0.600, "transfer",
    ),
    "begin: a collective taken out ends as it began, the other rank still waits for it": (
        # rank 0's all-reduce removed ends at its arrival, 310: its optimizer runs 310-410;
        # rank 1's still waits for rank 0's arrival: 610 + 190 = 800, its step 900; (410+900)/2
        ONE_COLLECTIVE, (0, "^gloo:all_reduce$", 0.0), 0.655, "begin",
    ),
    "receive: a receive after its send, the send's rank without its forward": (
        # rank 0: forward gone, the send 0-10; its send's wait (510-535 measured, 25 µs after
        # the send) ends at 35, its step 5 µs later: 40. Rank 1's receive waited 20 µs after
        # the send ended: 30, then 10 µs, the forward 40-340 and 60 µs: 400. (40 + 400) / 2
        {0: [step(0, 540), op("forward", 0, 500), op("c10d::send", 500, 10, **peer(1)),
             op("gloo:send", 508, 27, cat="user_annotation")],
         1: [step(0, 900), op("c10d::recv_", 0, 10, **peer(0)),
             op("gloo:recv", 8, 522, cat="user_annotation"), op("forward", 540, 300)]},
        (0, "^forward$", 0.0), 0.220, "receive",
    ),
    "send: a send's wait held until its receive was posted, the receiver without its op": (
        # rank 1: mm gone, its receive posted at 0 ends 5 µs after the send (510): 515, then
        # 5 µs, the forward 520-820, 40 µs: 860. Rank 0's send's wait, 20 µs after the later of
        # its send (510) and the posting (0): 530, then 10 µs: 540. (540 + 860) / 2
        {0: [step(0, 570), op("forward", 0, 500), op("c10d::send", 500, 10, **peer(1)),
             op("gloo:send", 508, 52, cat="user_annotation")],
         1: [step(0, 900), op("aten::mm", 0, 540), op("c10d::recv_", 540, 10, **peer(0)),
             op("gloo:recv", 548, 7, cat="user_annotation"), op("forward", 560, 300)]},
        (1, "^aten::mm$", 0.0), 0.700, "send",
    ),
    "wake-up: a thread waiting for gloo's thread wakes when the collective ends sooner": (
        # gloo's span at half its 685 µs: 115-457.5; the main thread wakes 5 µs later (462.5),
        # its add takes 195: the step ends at 657.5
        {0: [step(0, 1000), op("aten::mm", 0, 100), op("c10d::allreduce_", 100, 10),
             gloo_span("all_reduce", 115, 685), op("aten::add", 805, 195)]},
        (0, "^gloo:all_reduce$", 0.5), 0.6575, "wake-up",
    ),
    "sync: a device sync waits for every stream, not only the one that ended last": (
        # without stream 7's kernel (15-475) the sync still waits for stream 9's (25-300), which
        # shared the GPU with it all along: alone, it takes half as long (SHARED_GPU), 25-162.5;
        # the sync ends 5 µs after, at 167.5, and the step 10 µs later
        {0: [step(0, 490), launch(0, 10, 1), kernel("long", 15, 460, 1), launch(10, 10, 2),
             kernel("short", 25, 275, 2, stream=OTHER), sync_call("cudaDeviceSynchronize", 20, 460)]},
        (0, "^long$", 0.0), 0.1775, "sync",
    ),
    "sync: a blocking copy waits for its copy, which waits behind the kernel before it": (
        # without the kernel (15-415), the copy starts once launched (the call began at 20):
        # 20-100, the call returns 5 µs after it (105) and the step 100 µs later
        {0: [step(0, 600), launch(0, 10, 1), kernel("gemm", 15, 400, 1), sync_call("cudaMemcpy", 20, 480, correlation=2),
             complete_event("Memcpy DtoH (Device -> Pageable)", 415, 80, cat="gpu_memcpy", pid=0, tid=STREAM,
                            correlation=2, stream=STREAM, device=0)]},
        (0, "^gemm$", 0.0), 0.205, "sync",
    ),
    "stream wait: a kernel that waits for another stream's work, launched sooner": (
        # without the CPU's 270 µs before relu's launch, relu still waits for gemm on stream 9
        # (20-520): it starts at 525 as before, and the sync and the step end as measured
        {0: [step(0, 640), launch(0, 10, 1), kernel("gemm", 20, 500, 1, stream=OTHER), record(12, 2),
             *stream_wait(20, 3, on=OTHER, recorded=2), op("prepare", 30, 270), launch(300, 10, 4),
             kernel("relu", 525, 100, 4), sync_call("cudaDeviceSynchronize", 320, 310)]},
        (0, "^prepare$", 0.0), 0.640, "stream wait",
    ),
    "stream wait: matched by the record call before it, where the trace has no sync events": (
        # the same run recorded without enable_cuda_sync_events: the same answer
        {0: [step(0, 640), launch(0, 10, 1), kernel("gemm", 20, 500, 1, stream=OTHER), record(12, 2),
             op("cudaStreamWaitEvent", 20, 5, cat="cuda_runtime", correlation=3), op("prepare", 30, 270),
             launch(300, 10, 4), kernel("relu", 525, 100, 4), sync_call("cudaDeviceSynchronize", 320, 310)]},
        (0, "^prepare$", 0.0), 0.640, "stream wait",
    ),
    "stream wait: inferred from timing, where the trace holds no record call": (
        # the same run with no record call traced: relu began 5 µs after gemm ended, the one
        # work of another stream that ended just before it: the same answer
        {0: [step(0, 640), launch(0, 10, 1), kernel("gemm", 20, 500, 1, stream=OTHER),
             op("cudaStreamWaitEvent", 20, 5, cat="cuda_runtime", correlation=3), op("prepare", 30, 270),
             launch(300, 10, 4), kernel("relu", 525, 100, 4), sync_call("cudaDeviceSynchronize", 320, 310)]},
        (0, "^prepare$", 0.0), 0.640, "stream wait",
    ),
    "sync: a cudaFree that waited for the device returns sooner without the kernel": (
        # without gemm (15-415), cudaFree (20-420, 5 µs after gemm ended) ends 5 µs after its
        # start: 25; the add 25-125, the untraced 80 µs after it: 205
        {0: [step(0, 600), launch(0, 10, 1), kernel("gemm", 15, 400, 1), sync_call("cudaFree", 20, 400),
             op("aten::add", 420, 100)]},
        (0, "^gemm$", 0.0), 0.205, "sync",
    ),
    "sync: an op that waited inside, in a call not traced, ends sooner without the kernel": (
        # the cat's own time (20-8520) ended 505 µs after the NCCL-like kernel (15-8015): without
        # it, the cat ends 505 µs after its start (525), and the step's last 1480 µs follow: 2005
        {0: [step(0, 10_000), launch(0, 10, 1), kernel("long", 15, 8_000, 1), op("aten::cat", 20, 8_500)]},
        (0, "^long$", 0.0), 2.005, "sync",
    ),
    "launch: a kernel starts once launched, and the CPU's wait for it with it": (
        # without the CPU's 300 µs before the launch: launch 0-10, the kernel 15-215, the sync
        # ends 5 µs after it (220), the step 10 µs later
        {0: [step(0, 530), op("prepare", 0, 300), launch(300, 10, 1), kernel("gemm", 315, 200, 1),
             sync_call("cudaDeviceSynchronize", 310, 210)]},
        (0, "^prepare$", 0.0), 0.230, "launch",
    ),
    "queue: a kernel queued behind another starts after its launch once that one is gone": (
        # without gemm (15-515), relu waits 5 µs after the later of its launch (30) and the
        # stream freeing (15): 35-435; the sync ends 5 µs later (440), the step 5 µs after
        {0: [step(0, 930), launch(0, 10, 1), kernel("gemm", 15, 500, 1), launch(20, 10, 2),
             kernel("relu", 520, 400, 2), sync_call("cudaDeviceSynchronize", 30, 895)]},
        (0, "^gemm$", 0.0), 0.445, "queue",
    ),
    "queue: a kernel that waited for room on the GPU starts once the other stream's is gone": (
        # small (launched by 15) waited on stream 7 from 100 to 515 while big held the GPU on
        # stream 9 (100-510): without big, its queue is 410 µs shorter, 105-205; the sync ends
        # 5 µs after (210) and the step 10 µs later
        {0: [step(0, 630), launch(0, 5, 1), kernel("first", 10, 90, 1), launch(5, 5, 2),
             kernel("big", 100, 410, 2, stream=OTHER), launch(10, 5, 3), kernel("small", 515, 100, 3),
             sync_call("cudaDeviceSynchronize", 15, 605)]},
        (0, "^big$", 0.0), 0.220, "queue",
    ),
    "work: two ranks on one core share it once the one that slept computes beside the other": (
        # rank 1 slept 100 µs (an annotation: no core) while rank 0 computed alone, then
        # computed alone: each op had the core to itself. Without the sleep both compute at
        # once on the one core, each at half speed: 200 µs each, both arrive at 200, the
        # transfer 10 µs, then 10 µs untraced: 220 (the run's cores given: cores=1)
        {0: [step(0, 220), op("aten::mm", 0, 100), gloo_span("all_reduce", 100, 110)],
         1: [step(0, 220), op("load", 0, 100, cat="user_annotation"), op("aten::mm", 100, 100),
             gloo_span("all_reduce", 200, 10)]},
        (1, "^load$", 0.0, 1), 0.220, "work",
    ),
    "completion: a step ends no sooner than the collective its gloo thread ran in it": (
        # rank 0 never waits for its all-reduce (its op overlaps it); without the op its step
        # still ends with the collective (rank 1 arrives at 600, transfer 10 µs): 610. Rank 1
        # as measured: 1000. (610 + 1000) / 2
        {0: [step(0, 1000), op("c10d::allreduce_", 0, 10), gloo_span("all_reduce", 10, 600),
             op("overlapped", 10, 990)],
         1: [step(0, 1000), op("aten::mm", 0, 590), op("c10d::allreduce_", 590, 10),
             gloo_span("all_reduce", 600, 10), op("aten::add", 615, 385)]},
        (0, "^overlapped$", 0.0), 0.805, "completion",
    ),
    "work: an op's own time goes, what it encloses goes with it": (
        {0: [step(0, 1000), op("aten::linear", 0, 1000), op("aten::mm", 100, 600)]},
        (0, "^aten::mm$", 0.0), 0.400, "work",
    ),
    "untraced: time no event recorded stays, the op before it goes": (
        {0: [step(0, 1000), op("aten::mm", 0, 300), op("aten::add", 800, 200)]},
        (0, "^aten::mm$", 0.0), 0.700, "untraced",
    ),
    "lane order: an op starts where the one before it on its thread ended": (
        {0: [step(0, 600), op("a", 0, 200), op("b", 200, 200), op("c", 400, 200)]},
        (0, "^b$", 0.0), 0.400, "lane order",
    ),
}  # fmt: skip


#: Per case: the ranks' events, the rank on which the path of their one step must begin (the
#: last to end it), and the kind of dependency the answer depends on.
KNOWN_STARTS = {
    "step end: the path begins on the rank that ended the step last": (
        {0: [step(0, 900), op("aten::mm", 0, 900)], 1: [step(0, 500), op("aten::mm", 0, 500)],
         2: [step(0, 950), op("aten::mm", 0, 950)]},
        2, "step end",
    ),
    "step end: of ranks that ended it together, the path begins on the lowest": (
        {0: [step(0, 500), op("aten::mm", 0, 500)], 1: [step(0, 900), op("aten::mm", 0, 900)],
         2: [step(0, 900), op("aten::mm", 0, 900)]},
        1, "step end",
    ),
}  # fmt: skip


def predicted_from(events: pd.DataFrame, change: tuple) -> float:
    """The median step (ms) ``what_if`` predicts for a run of ``events`` under ``change``."""
    rank, name, factor, *cores = change
    return float(what_if(events, rank=rank, name=name, factor=factor, cores=(cores or [None])[0]).median())  # fmt: skip


def path_begins_on(events: pd.DataFrame) -> int | None:
    """The rank on which ``critical_path`` begins the path of the run's one step (its last
    segment's); None where it finds none."""
    try:
        path = critical_path(events)
    except ValueError as error:  # the step's end is no node of the graph
        if "nodes of a step's end" not in str(error):
            raise
        return None
    return int(path["rank"].iat[-1]) if len(path) else None


@pytest.fixture(scope="module")
def known_runs(tmp_path_factory) -> dict[str, pd.DataFrame]:
    """Each known answer's run, written as traces and read back once: its events by case."""
    runs = {}
    for case, (ranks, *_) in {**KNOWN, **KNOWN_STARTS}.items():
        folder = tmp_path_factory.mktemp("known")
        for rank, events in ranks.items():
            write_doc(folder / f"rank{rank}.json", trace_doc(events, rank=rank, world=len(ranks)))
        runs[case] = load_run(folder, cache=False).events
    return runs


@pytest.mark.parametrize("case", KNOWN.keys())
def test_a_what_if_gives_the_answer_worked_out_by_hand(known_runs, case):
    _, change, expected, _ = KNOWN[case]
    assert predicted_from(known_runs[case], change) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("case", KNOWN_STARTS.keys())
def test_the_path_begins_on_the_rank_worked_out_by_hand(known_runs, case):
    assert path_begins_on(known_runs[case]) == KNOWN_STARTS[case][1]


def test_the_known_answers_cover_every_kind_of_dependency():
    known = {**KNOWN, **KNOWN_STARTS}
    assert {kind for *_, kind in known.values()} == {d.name for d in DEPENDENCIES}


@pytest.mark.parametrize("builder", builders.BUILDERS, ids=lambda b: b.build.__name__)
def test_dropping_any_builder_fails_a_known_answer(known_runs, monkeypatch, builder):
    monkeypatch.setattr(builders, "BUILDERS", tuple(b for b in builders.BUILDERS if b is not builder))  # fmt: skip
    answers = [
        predicted_from(known_runs[case], change) == pytest.approx(expected, abs=1e-6)
        for case, (_, change, expected, _) in KNOWN.items()
    ]
    answers += [path_begins_on(known_runs[case]) == rank for case, (_, rank, _) in KNOWN_STARTS.items()]  # fmt: skip
    assert not all(answers), f"without {builder.build.__name__}, every known answer still holds"


def test_without_the_machines_cores_a_what_if_keeps_every_op_as_long_as_it_was(known_runs):
    # the case of the two ranks on one core, told nothing of the cores: rank 1's op moves to
    # 0-100 beside rank 0's, both arrive at 100, the step ends at 120
    case = "work: two ranks on one core share it once the one that slept computes beside the other"
    _, (rank, name, factor, _), _, _ = KNOWN[case]
    assert predicted_from(known_runs[case], (rank, name, factor, 0)) == pytest.approx(
        0.120, abs=1e-6
    )


@pytest.mark.parametrize(
    "experiment, rank, name",
    [("pipeline-1f1b", 1, "^forward \\d$"), ("ddp-straggler", 1, "^aten::")],
    ids=["a pipeline stage's forwards", "a DDP rank's ops"],
)
def test_a_what_if_that_halves_events_lies_between_removing_and_keeping_them(
    lesson_run, experiment, rank, name
):
    # at a trace's clock (~1e15 µs) a float's step is a quarter of a µs: ops shorter than
    # that once seemed to get no share of a core, and a half made steps of 500 s
    events = load_run(lesson_run(experiment), cache=False).events
    removed, half, kept = (
        what_if(events, rank=rank, name=name, factor=f).median() for f in (0.0, 0.5, 1.0)
    )
    assert removed - 1e-6 <= half <= kept + 1e-6
