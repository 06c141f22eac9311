"""The dependency graph under the critical path (helpers/analysis/path/: graph.py, builders.py,
dependencies.py), as a specification: each builder's edges on tiny traces, the rules of the
graph (the last arrival binds, a wait's edges carry its delay, the replay keeps every
constraint, what validate finds), and one registry that alone interprets them."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO, complete_event, trace_doc, write_doc
from helpers import critical_path, what_if
from helpers.analysis.path.dependencies import (
    BEGIN,
    DEPENDENCIES,
    LANE_ORDER,
    TRANSFER,
    UNTRACED,
    WAKE_UP,
    WORK,
)
from helpers.analysis.path.graph import Edges, Graph, replayed_times, validate
from helpers.analysis.path.lanes import _flatten, lane_intervals
from helpers.analysis.path.step_ends import last_to_end
from helpers.traces import load_run

MAIN, GLOO, STREAM = 1, 2, 7  # the main thread, gloo's thread, a GPU stream


def step(ts, dur, number=1):
    return complete_event(f"ProfilerStep#{number}", ts, dur, cat="user_annotation", pid=100, tid=MAIN)  # fmt: skip


def op(name, ts, dur, tid=MAIN, cat="cpu_op", **args):
    return complete_event(name, ts, dur, cat=cat, pid=100, tid=tid, **args)


def kernel(name, ts, dur, correlation, stream=STREAM):
    return complete_event(name, ts, dur, cat="kernel", pid=0, tid=stream, correlation=correlation, stream=stream, device=0)  # fmt: skip


def launch(ts, dur, correlation):
    return op("cudaLaunchKernel", ts, dur, cat="cuda_runtime", correlation=correlation)


def stream_wait(ts, correlation, on, recorded, stream=STREAM) -> list[dict]:
    """``cudaStreamWaitEvent`` at ``ts``: ``stream`` waits for the CUDA event recorded on
    stream ``on`` by the ``cudaEventRecord`` call of correlation ``recorded``, and the
    ``cuda_sync`` event Kineto writes for it (``enable_cuda_sync_events``)."""
    args = {"wait_on_stream": on, "wait_on_cuda_event_record_corr_id": recorded}
    gpu = {"pid": 0, "tid": stream, "stream": stream, "device": 0, "correlation": correlation}
    return [
        op("cudaStreamWaitEvent", ts, 5, cat="cuda_runtime", correlation=correlation),
        complete_event("Stream Wait Event", ts + 1, 2, cat="cuda_sync", **gpu, **args),
    ]


def record(ts, correlation):
    return op("cudaEventRecord", ts, 5, cat="cuda_runtime", correlation=correlation)


OTHER = 9  # a second GPU stream
#: One rank: stream 9's gemm (launched at 0, runs 20-520), an event recorded after it, stream 7
#: made to wait for it, then relu launched on stream 7 (at 30) starts 5 µs after gemm ends; the
#: CPU synchronises until relu has ended, and the step ends 10 µs later.
WAITED = [step(0, 640), launch(0, 10, 1), kernel("gemm", 20, 500, 1, stream=OTHER), record(12, 2),
          *stream_wait(20, 3, on=OTHER, recorded=2), launch(30, 10, 4), kernel("relu", 525, 100, 4),
          op("cudaDeviceSynchronize", 45, 585, cat="cuda_runtime")]  # fmt: skip


def peer(rank: int, tag: int = 0) -> dict:
    """The ``args`` of a send or a receive to or from ``rank`` (``record_shapes=True``)."""
    return {"Concrete Inputs": ["", "", str(rank), str(tag)]}


#: Two stages: rank 0 sends at 510 (its wait for the send 510-535), rank 1's receive, posted at
#: 0, has its data at 530.
PIPELINE = {
    0: [step(0, 540), op("forward", 0, 500), op("c10d::send", 500, 10, **peer(1)),
        op("gloo:send", 508, 27, cat="user_annotation")],
    1: [step(0, 900), op("c10d::recv_", 0, 10, **peer(0)), op("gloo:recv", 8, 522, cat="user_annotation"),
        op("forward", 540, 300)],
}  # fmt: skip


#: Rank 0 sends at 510 and waits for it (510-560); rank 1 posts its receive only at 540, after
#: its own work, and has the data at 555.
LATE_RECEIVE = {
    0: [step(0, 570), op("forward", 0, 500), op("c10d::send", 500, 10, **peer(1)),
        op("gloo:send", 508, 52, cat="user_annotation")],
    1: [step(0, 900), op("aten::mm", 0, 540), op("c10d::recv_", 540, 10, **peer(0)),
        op("gloo:recv", 548, 7, cat="user_annotation"), op("forward", 560, 300)],
}  # fmt: skip


def call(name: str, ts: float, dur: float, correlation: int) -> dict:
    """A CUDA runtime call."""
    return op(name, ts, dur, cat="cuda_runtime", correlation=correlation)


def gpu_sync(name: str, ts: float, correlation: int, stream: int = -1, **args) -> dict:
    """The ``cuda_sync`` record Kineto writes for a synchronisation (``enable_cuda_sync_events``):
    ``Stream Sync`` (with its ``stream``), ``Event Sync`` (with what it waited on), ..."""
    return complete_event(name, ts + 1, 2, cat="cuda_sync", pid=0, tid=STREAM, correlation=correlation, stream=stream, device=0, **args)  # fmt: skip


#: One rank's step: gemm on stream 7 (launched at 0, runs 15-415), other on stream 9 (launched at
#: 10, runs 25-500); a CUDA call from 20 waits for one or both.
TWO_STREAMS = [step(0, 600), launch(0, 10, 1), kernel("gemm", 15, 400, 1), launch(10, 5, 2),
               kernel("other", 25, 475, 2, stream=OTHER)]  # fmt: skip


def edges_of(tmp_path, ranks: dict[int, list[dict]], dependency: str, into: str | None) -> set:
    """The edges of ``dependency`` in the graph of a run whose rank r holds ``ranks[r]`` (only
    those into the lane ``into``, when given; of an interval's own time, those that bind: every
    interval has one), each as ``(source, target, lag)`` with a node written
    ``"r<rank> <event>.<start|end>"`` (``gap`` for an interval with no event) and the lag
    rounded to µs."""
    ranks = {0: ranks} if isinstance(ranks, list) else ranks
    for rank, events in ranks.items():
        write_doc(tmp_path / f"rank{rank}.json", trace_doc(events, rank=rank, world=len(ranks)))
    events = load_run(tmp_path, cache=False).events
    lanes = lane_intervals(events)
    iv, graph = lanes.intervals, lanes.graph
    names = events["name"].astype(str)

    def node(n: int) -> str:
        if n >= 2 * graph.intervals:
            return "hub"  # a collective's or a step end's node of its own
        label, rank = int(iv["event"].iat[n // 2]), int(iv["rank"].iat[n // 2])
        what = names.get(label, "gap") if label >= 0 else "gap"
        return f"r{rank} {what}.{'end' if n % 2 else 'start'}"

    lanes_of = np.r_[iv["lane_id"].to_numpy(), np.full(graph.hubs, -1)]
    lane = np.r_[lanes.lanes["lane"].to_numpy(), [""]][lanes_of[graph.target // 2]]
    (kind,) = [d for d in DEPENDENCIES if d.name == dependency]
    mine = np.flatnonzero((graph.dependency == kind.code) & ((lane == into) | (into is None)))
    if kind.own_start:
        mine = mine[graph.binding[graph.target[mine]] == mine]
    return {(node(graph.source[e]), node(graph.target[e]), round(float(graph.lag[e]))) for e in mine}  # fmt: skip


#: Per case: the ranks' events, the dependency looked at (into the lane named, where one is),
#: and the edges it must have.
BUILDERS = {
    "transfer: through its hub, from each rank's arrival to each rank's end, after the shortest duration": (
        {0: [step(0, 900), op("aten::mm", 0, 300), op("gloo:all_reduce", 300, 500, tid=GLOO, cat="user_annotation")],  # fmt: skip
         1: [step(0, 900), op("aten::mm", 0, 600), op("gloo:all_reduce", 600, 200, tid=GLOO, cat="user_annotation")]},  # fmt: skip
        ("transfer", None),
        {("r0 gloo:all_reduce.start", "hub", 0), ("r1 gloo:all_reduce.start", "hub", 0),
         ("hub", "r0 gloo:all_reduce.end", 200), ("hub", "r1 gloo:all_reduce.end", 200)},
    ),
    "step end: through its hub, from each rank's end of the step": (
        {0: [step(0, 500), op("aten::mm", 0, 500)], 1: [step(0, 900), op("aten::mm", 0, 900)]},
        ("step end", None),
        {("r0 aten::mm.end", "hub", 0), ("r1 aten::mm.end", "hub", 0)},
    ),
    "transfer: a rank that left before another arrived waited only for those there by then": (
        # gloo's broadcast of 3 ranks: rank 1 has the root's data at 110, before rank 2 arrives
        {0: [step(0, 400), op("aten::mm", 0, 100), op("gloo:broadcast", 100, 10, tid=GLOO, cat="user_annotation")],  # fmt: skip
         1: [step(0, 400), op("aten::mm", 0, 50), op("gloo:broadcast", 50, 60, tid=GLOO, cat="user_annotation")],  # fmt: skip
         2: [step(0, 400), op("aten::mm", 0, 300), op("gloo:broadcast", 300, 10, tid=GLOO, cat="user_annotation")]},  # fmt: skip
        ("transfer", None),
        {(f"r{a} gloo:broadcast.start", f"r{b} gloo:broadcast.end", 10)
         for b, came in ((0, (0, 1)), (1, (0, 1)), (2, (0, 1, 2))) for a in came},
    ),
    "receive: a receive's wait ends after the later of its send and its posting, plus the transfer": (
        PIPELINE, ("receive", None),
        {("r0 c10d::send.end", "r1 gloo:recv.end", 20), ("r1 c10d::recv_.start", "r1 gloo:recv.end", 20)},  # fmt: skip
    ),
    "send: a send's wait that began before its receive was posted ends likewise": (
        LATE_RECEIVE, ("send", None),
        {("r0 c10d::send.end", "r0 gloo:send.end", 20), ("r1 c10d::recv_.start", "r0 gloo:send.end", 20)},  # fmt: skip
    ),
    "receive: a wait that began once both were issued has their edges, its delay its own time": (
        LATE_RECEIVE, ("receive", None),
        {("r0 c10d::send.end", "r1 gloo:recv.end", 5), ("r1 c10d::recv_.start", "r1 gloo:recv.end", 5)},  # fmt: skip
    ),
    "completion: a rank's step ends no sooner than the collective gloo's thread ran in it": (
        {0: [step(0, 1000), op("aten::mm", 0, 100), op("gloo:all_reduce", 100, 500, tid=GLOO, cat="user_annotation"),  # fmt: skip
             op("overlapped", 100, 800)],
         1: [step(0, 1000), op("aten::mm", 0, 500), op("gloo:all_reduce", 500, 100, tid=GLOO, cat="user_annotation"),  # fmt: skip
             op("aten::add", 600, 400)]},
        ("completion", None),
        {("r0 gloo:all_reduce.end", "r0 gap.end", 0), ("r1 gloo:all_reduce.end", "r1 aten::add.end", 0)},  # fmt: skip
    ),
    "wake-up: a thread's gap ends when gloo's thread ends its collective": (
        {0: [step(0, 1000), op("aten::mm", 0, 100), op("gloo:all_reduce", 100, 700, tid=GLOO, cat="user_annotation"),  # fmt: skip
             op("aten::add", 805, 195)]},
        ("wake-up", "thread 1"),
        {("r0 gloo:all_reduce.end", "r0 gap.end", 5)},
    ),
    "wake-up: a functional collective's wait ends when gloo's thread ends the collective": (
        {0: [step(0, 1000), op("_c10d_functional::all_reduce", 0, 50),
             op("gloo:all_reduce", 60, 700, tid=GLOO, cat="user_annotation"),
             op("_c10d_functional::wait_tensor", 100, 665), op("aten::add", 800, 200)]},
        ("wake-up", "thread 1"),
        {("r0 gloo:all_reduce.end", "r0 _c10d_functional::wait_tensor.end", 5)},
    ),
    "wake-up: an end 4 ms before a gap's end is too far to wake it": (
        {0: [step(0, 20_000), op("aten::mm", 0, 100), op("aten::relu", 2_000, 14_000, tid=GLOO),
             op("aten::add", 20_000 - 1, 1)]},
        ("wake-up", "thread 1"),
        set(),
    ),
    "wake-up: a kernel that ends near a thread's gap does not wake a thread not synchronising": (
        {0: [step(0, 1000), launch(0, 10, 1), kernel("gemm", 15, 780, 1), op("aten::mm", 20, 100),
             op("aten::add", 800, 200)]},
        ("wake-up", "thread 1"),
        set(),
    ),
    "sync: a launch held by a full queue returns when a kernel launched before it ends": (
        {0: [step(0, 1000), launch(0, 10, 1), kernel("gemm", 15, 485, 1), launch(20, 485, 2),
             kernel("relu", 510, 390, 2), op("cudaDeviceSynchronize", 505, 400, cat="cuda_runtime")]},
        ("sync", "thread 1"),
        {("r0 gemm.end", "r0 cudaLaunchKernel.end", 5), ("r0 relu.end", "r0 cudaDeviceSynchronize.end", 5)},
    ),
    "launch: a stream's gap ends when the kernel's launch call ends": (
        {0: [step(0, 1000), launch(0, 10, 1), launch(300, 20, 2), op("cudaDeviceSynchronize", 320, 680, cat="cuda_runtime"),  # fmt: skip
             kernel("gemm", 15, 100, 1), kernel("relu", 330, 600, 2)]},
        ("launch", None),
        {("r0 cudaLaunchKernel.end", "r0 gap.end", 5), ("r0 cudaLaunchKernel.end", "r0 gap.end", 10)},  # fmt: skip
    ),
    "launch: a launch call of no length (old traces count whole µs) issues from the op around it": (  # fmt: skip
        {0: [step(0, 1000), op("aten::relu", 0, 20), launch(10, 0, 1), kernel("relu", 30, 100, 1),
             op("cudaDeviceSynchronize", 20, 980, cat="cuda_runtime")]},
        ("launch", None),
        {("r0 aten::relu.end", "r0 gap.end", 10)},
    ),
    "stream wait: a kernel waits for another stream's work through a CUDA event": (
        {0: WAITED},
        ("stream wait", "GPU 0 stream 7"),
        {("r0 gemm.end", "r0 gap.end", 5)},
    ),
    "launch: a kernel held by a stream wait keeps its launch's edge, with the wait's delay": (
        {0: WAITED},
        ("launch", "GPU 0 stream 7"),
        {("r0 cudaLaunchKernel.end", "r0 gap.end", 5)},
    ),
    "stream wait: work that ended before the gap began leaves it to the queue": (
        {0: [step(0, 1000), launch(0, 5, 1), kernel("gemm", 20, 500, 1, stream=OTHER),
             launch(6, 5, 5), kernel("add", 100, 500, 5), record(12, 2), *stream_wait(20, 3, on=OTHER, recorded=2),
             launch(30, 10, 4), kernel("relu", 605, 100, 4), op("cudaDeviceSynchronize", 45, 955, cat="cuda_runtime")]},
        ("queue", "GPU 0 stream 7"),
        {("r0 gap.start", "r0 gap.end", 5)},
    ),
    "sync: a stream sync with its Stream Sync record waits for that stream's, not the last": (
        [*TWO_STREAMS, call("cudaStreamSynchronize", 20, 485, 3), gpu_sync("Stream Sync", 20, 3, stream=STREAM)],  # fmt: skip
        ("sync", "thread 1"),
        {("r0 gemm.end", "r0 cudaStreamSynchronize.end", 90)},
    ),
    "sync: a stream sync without records waits for the stream whose work ended as it returned": (
        [*TWO_STREAMS, call("cudaStreamSynchronize", 20, 400, 3)],
        ("sync", "thread 1"),
        {("r0 gemm.end", "r0 cudaStreamSynchronize.end", 5)},
    ),
    "sync: an event sync with its Event Sync record waits for the work before the record": (
        [*TWO_STREAMS, record(12, 4), call("cudaEventSynchronize", 20, 490, 5),
         gpu_sync("Event Sync", 20, 5, wait_on_stream=OTHER, wait_on_cuda_event_record_corr_id=4)],  # fmt: skip
        ("sync", "thread 1"),
        {("r0 other.end", "r0 cudaEventSynchronize.end", 10)},
    ),
    "sync: an event sync without records waits for what its thread launched before the record": (  # fmt: skip
        [*TWO_STREAMS, record(12, 4), call("cudaEventSynchronize", 20, 490, 5)],
        ("sync", "thread 1"),
        {("r0 other.end", "r0 cudaEventSynchronize.end", 10)},
    ),
    "sync: a device sync waits for every stream's last work": (
        [*TWO_STREAMS, call("cudaDeviceSynchronize", 20, 490, 3)],
        ("sync", "thread 1"),
        {("r0 gemm.end", "r0 cudaDeviceSynchronize.end", 10), ("r0 other.end", "r0 cudaDeviceSynchronize.end", 10)},  # fmt: skip
    ),
    "sync: a blocking copy waits for the copy it launched": (
        [step(0, 600), launch(0, 10, 1), kernel("gemm", 15, 400, 1), call("cudaMemcpy", 20, 480, 2),
         complete_event("Memcpy DtoH (Device -> Pageable)", 415, 80, cat="gpu_memcpy", pid=0, tid=STREAM,
                        correlation=2, stream=STREAM, device=0)],  # fmt: skip
        ("sync", "thread 1"),
        {("r0 Memcpy DtoH (Device -> Pageable).end", "r0 cudaMemcpy.end", 5)},
    ),
    "stream wait: a sync record naming only the CUDA event's id, matched by the record call": (
        [step(0, 640), launch(0, 10, 1), kernel("gemm", 20, 500, 1, stream=OTHER), record(12, 2),
         call("cudaStreamWaitEvent", 20, 5, 3),
         gpu_sync("Stream Wait Event", 20, 3, stream=STREAM, wait_on_stream=-1,
                  wait_on_cuda_event_record_corr_id=-1, wait_on_cuda_event_id=19),
         launch(30, 10, 4), kernel("relu", 525, 100, 4), call("cudaDeviceSynchronize", 45, 585, 9)],  # fmt: skip
        ("stream wait", "GPU 0 stream 7"),
        {("r0 gemm.end", "r0 gap.end", 5)},
    ),
    "stream wait: matched by the record call before it where the trace has no sync events": (
        [step(0, 640), launch(0, 10, 1), kernel("gemm", 20, 500, 1, stream=OTHER), record(12, 2),
         call("cudaStreamWaitEvent", 20, 5, 3), launch(30, 10, 4), kernel("relu", 525, 100, 4),
         call("cudaDeviceSynchronize", 45, 585, 9)],  # fmt: skip
        ("stream wait", "GPU 0 stream 7"),
        {("r0 gemm.end", "r0 gap.end", 5)},
    ),
    "stream wait: inferred from timing where no record call is traced": (
        [step(0, 640), launch(0, 10, 1), kernel("gemm", 20, 500, 1, stream=OTHER),
         call("cudaStreamWaitEvent", 20, 5, 3), launch(30, 10, 4), kernel("relu", 525, 100, 4),
         call("cudaDeviceSynchronize", 45, 585, 9)],  # fmt: skip
        ("stream wait", "GPU 0 stream 7"),
        {("r0 gemm.end", "r0 gap.end", 5)},
    ),
    "stream wait: with no record call traced, the work launched on another stream before it": (
        [step(0, 720), launch(0, 10, 1), kernel("gemm", 20, 500, 1, stream=OTHER),
         call("cudaStreamWaitEvent", 20, 5, 3), launch(30, 10, 4), kernel("relu", 600, 100, 4),
         call("cudaDeviceSynchronize", 45, 665, 9)],  # fmt: skip
        ("stream wait", "GPU 0 stream 7"),
        {("r0 gemm.end", "r0 gap.end", 80)},
    ),
    "stream wait: no other stream's work launched before it, or ended within 50 µs of it going on": (  # fmt: skip
        [step(0, 720), call("cudaStreamWaitEvent", 0, 5, 3), launch(6, 10, 1),
         kernel("gemm", 20, 500, 1, stream=OTHER), launch(30, 10, 4), kernel("relu", 600, 100, 4),
         call("cudaDeviceSynchronize", 45, 665, 9)],  # fmt: skip
        ("stream wait", "GPU 0 stream 7"),
        set(),
    ),
    "sync: a cudaFree that returned once every stream's work had ended waited for all of it": (
        [*TWO_STREAMS, call("cudaFree", 20, 490, 3)],
        ("sync", "thread 1"),
        {("r0 gemm.end", "r0 cudaFree.end", 10), ("r0 other.end", "r0 cudaFree.end", 10)},
    ),
    "sync: a cudaFree that returned while work launched before it ran waited for none": (
        [*TWO_STREAMS, call("cudaFree", 20, 100, 3)],
        ("sync", "thread 1"),
        set(),
    ),
    "sync: an op's long own time that ended just after GPU work under way all along": (
        [step(0, 10_000), launch(0, 10, 1), kernel("long", 15, 8_000, 1), op("aten::cat", 20, 8_500)],  # fmt: skip
        ("sync", "thread 1"),
        {("r0 long.end", "r0 aten::cat.end", 505)},
    ),
    "sync: an annotation's long time is never read so (user code may sleep)": (
        [step(0, 10_000), launch(0, 10, 1), kernel("long", 15, 8_000, 1),
         op("sleep", 20, 8_500, cat="user_annotation")],  # fmt: skip
        ("sync", "thread 1"),
        set(),
    ),
    "queue: a kernel launched while the stream was busy waits behind the one before": (
        {0: [step(0, 1000), launch(0, 10, 1), launch(20, 10, 2), op("cudaDeviceSynchronize", 30, 970, cat="cuda_runtime"),  # fmt: skip
             kernel("gemm", 15, 500, 1), kernel("relu", 520, 400, 2)]},
        ("queue", None),
        {("r0 gap.start", "r0 gap.end", 5)},
    ),
    "untraced: a gap nothing ended is the thread's own time": (
        {0: [step(0, 1000), op("aten::mm", 0, 300), op("aten::add", 800, 200)]},
        ("untraced", None),
        {("r0 gap.start", "r0 gap.end", 500)},
    ),
    "work: an op's own time, less what it encloses": (
        {0: [step(0, 1000), op("aten::linear", 0, 1000), op("aten::mm", 100, 600)]},
        ("work", None),
        {("r0 aten::linear.start", "r0 aten::linear.end", 100), ("r0 aten::mm.start", "r0 aten::mm.end", 600),  # fmt: skip
         ("r0 aten::linear.start", "r0 aten::linear.end", 300)},
    ),
}  # fmt: skip


@pytest.mark.parametrize("ranks, looked_at, expected", BUILDERS.values(), ids=BUILDERS.keys())
def test_each_builder_gives_the_edges_of_its_dependency(tmp_path, ranks, looked_at, expected):
    assert edges_of(tmp_path, ranks, *looked_at) == expected


@pytest.fixture
def waited(tmp_path) -> pd.DataFrame:
    """The events of :data:`WAITED`: a kernel made to wait for another stream's."""
    write_doc(tmp_path / "rank0.json", trace_doc(WAITED, rank=0, world=1))
    return load_run(tmp_path, cache=False).events


def test_the_path_moves_to_the_stream_whose_work_a_kernel_waited_for(waited):
    path = critical_path(waited)
    held = path[path["reason"] == "stream wait"]
    assert held[["lane", "name", "dur_us"]].values.tolist() == [["GPU 0 stream 7", "relu", 5.0]]
    before = path.iloc[held.index[0] - 1]
    assert (before["lane"], before["name"], before["end_us"]) == ("GPU 0 stream 9", "gemm", held["start_us"].iat[0])  # fmt: skip


def test_without_the_waited_work_the_kernel_starts_once_launched(waited):
    # relu then starts 5 µs after its launch ends (the delay its wait measured) and runs
    # 45-145, the CPU's wait ends 5 µs later, the step 10 after
    assert what_if(waited, rank=0, name="gemm").iat[0] == pytest.approx(0.160)


NCCL = 20  # the stream of NCCL's kernels
GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
SYNC = op("cudaDeviceSynchronize", 45, 565, cat="cuda_runtime")
#: Two GPU ranks of a sharded step: each all-gathers on stream 20, and its compute stream 7
#: waits for the all-gather before its mm. Rank 1's all-gather waits on its stream for a long
#: kernel (10-410), so rank 0's all-gather waits for rank 1 until 415, and both end at 500.
HELD_ACROSS = {
    0: [step(0, 620), launch(0, 5, 1), kernel(GATHER, 20, 480, 1, stream=NCCL), record(6, 2),
        *stream_wait(12, 3, on=NCCL, recorded=2), launch(20, 5, 4), kernel("mm", 505, 100, 4), SYNC],
    1: [step(0, 620), launch(0, 5, 1), kernel("long", 10, 400, 1), record(6, 2),
        *stream_wait(12, 3, on=STREAM, recorded=2, stream=NCCL), launch(20, 5, 4),
        kernel(GATHER, 415, 85, 4, stream=NCCL), record(26, 5), *stream_wait(33, 6, on=NCCL, recorded=5),
        launch(40, 4, 7), kernel("mm", 505, 100, 7), SYNC],
}  # fmt: skip


def test_the_path_crosses_a_stream_wait_to_the_rank_whose_kernel_held_the_collective(tmp_path):
    for rank, events in HELD_ACROSS.items():
        write_doc(tmp_path / f"rank{rank}.json", trace_doc(events, rank=rank, world=2))
    events = load_run(tmp_path, cache=False).events
    path = critical_path(events)
    on_gpu = path[path["lane"].str.startswith("GPU")]
    assert on_gpu[["rank", "reason", "name"]].values.tolist() == [
        [1, "launch", "long"],
        [1, "work", "long"],
        [1, "stream wait", GATHER],
        [1, "transfer", GATHER],
        [0, "stream wait", "mm"],
        [0, "work", "mm"],
    ]
    # without the long kernel, rank 1's all-gather starts 5 µs after its launch (30 µs), both
    # end 85 µs later (115), each mm runs 120-220, each CPU wakes at 225, each step ends at 235
    assert what_if(events, rank=1, name="^long$").iat[0] == pytest.approx(0.235)


def test_every_interval_ends_after_its_own_start_and_starts_where_the_one_before_ended(tmp_path):
    write_doc(tmp_path / "rank0.json", trace_doc([step(0, 1000), op("aten::mm", 100, 300)]))
    graph = lane_intervals(load_run(tmp_path, cache=False).events).graph
    n = graph.intervals
    own = [d.code for d in DEPENDENCIES if d.own_start]
    from_own_start = np.isin(graph.dependency, own) & (graph.source == graph.target - 1)
    assert sorted(graph.target[from_own_start].tolist()) == [2 * i + 1 for i in range(n)]
    order = graph.dependency == LANE_ORDER.code
    assert (graph.source[order] + 1 == graph.target[order]).all()


def _graph(parts: list[Edges], starts, ends, own, ranks=None, lanes=None) -> Graph:
    """The graph of intervals measured at ``starts``/``ends`` (each on a lane of its own, unless
    ``lanes`` says), each with the dependency ``own`` from its own start."""
    n = len(starts)
    intervals = pd.DataFrame({
        "lane_id": np.arange(n) if lanes is None else lanes,
        "rank": np.zeros(n, dtype=np.int64) if ranks is None else ranks,
        "start_us": np.asarray(starts, float),
        "end_us": np.asarray(ends, float),
    })  # fmt: skip
    return Graph.of(parts, intervals, np.array([d.code for d in own], dtype=np.int8))


def test_the_last_arrival_binds_a_node_that_waited_for_two():
    # intervals 0 and 1 are work on two lanes, ending at 10 and 8; 2 waited for both, ends at 12
    graph = _graph([Edges.of([1, 3], [5, 5], WAKE_UP)], [0, 0, 5], [10, 8, 12], [WORK, WORK, UNTRACED])  # fmt: skip
    assert graph.source[graph.binding[5]] == 1  # the end of interval 0, the later of the two


def test_a_waits_edges_carry_its_delay_after_the_last_of_what_it_waited_for():
    graph = _graph([Edges.of([1, 3], [5, 5], WAKE_UP)], [0, 0, 5], [10, 8, 12], [WORK, WORK, UNTRACED])  # fmt: skip
    into = graph.target == 5
    assert sorted(graph.lag[into].tolist()) == [2.0, 2.0, 2.0]  # both wakers and its own start


def test_a_wait_that_began_after_what_it_waited_for_is_its_own_time():
    # interval 1 began at 12, after interval 0 ended at 10: it waited for nothing but itself
    graph = _graph([Edges.of([1], [3], WAKE_UP)], [0, 12], [10, 15], [WORK, UNTRACED])
    assert graph.dependency[graph.binding[3]] == UNTRACED.code


def test_a_tie_goes_to_the_nodes_own_rank():
    # a collective on ranks 0 and 1 whose arrivals tie: each rank's end is bound by its own
    arrivals = Edges.of([0, 2, 0, 2], [1, 1, 3, 3], TRANSFER, 5.0)
    graph = _graph([arrivals], [0, 0], [5, 5], [BEGIN, BEGIN], ranks=[0, 1])
    assert graph.source[graph.binding[1]] == 0 and graph.source[graph.binding[3]] == 2


#: Per case: one rank's events, where relu starts on stream 7 right as the kernel before it on
#: the stream ends and as something else it waited for arrives, and the edges into its start.
START_TIES = {
    "its launch returned as it started (its launch is no wait)": (
        # gemm ends at 415, relu's launch returns at 415 and relu starts then
        [step(0, 900), launch(0, 10, 1), kernel("gemm", 15, 400, 1), launch(405, 10, 2),
         kernel("relu", 415, 100, 2), op("cudaDeviceSynchronize", 420, 480, cat="cuda_runtime")],
        ["lane order", "launch"],
    ),
    "the work on another stream it was made to wait for ended as it started": (
        # prev (stream 7) and gemm (stream 9) both end at 520, when relu, made to wait for gemm,
        # starts right after prev
        [step(0, 640), launch(0, 4, 1), kernel("gemm", 20, 500, 1, stream=OTHER),
         launch(5, 4, 5), kernel("prev", 15, 505, 5), record(12, 2),
         *stream_wait(20, 3, on=OTHER, recorded=2), launch(30, 10, 4), kernel("relu", 520, 100, 4),
         op("cudaDeviceSynchronize", 45, 580, cat="cuda_runtime")],
        ["lane order", "launch", "stream wait"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("events, into_its_start", START_TIES.values(), ids=START_TIES.keys())
def test_a_tie_into_a_kernels_start_goes_to_its_lane_the_step_the_path_takes_back(tmp_path, events, into_its_start):  # fmt: skip
    write_doc(tmp_path / "rank0.json", trace_doc(events))
    events = load_run(tmp_path, cache=False).events
    lanes = lane_intervals(events)
    relu = int(events.index[events["name"] == "relu"][0])
    (row,) = np.flatnonzero(lanes.intervals["event"].to_numpy() == relu)
    graph = lanes.graph
    into = np.flatnonzero(graph.target == 2 * row)
    assert sorted(DEPENDENCIES[c].name for c in graph.dependency[into]) == into_its_start
    assert graph.dependency[graph.binding[2 * row]] == LANE_ORDER.code


def test_a_rank_that_ended_two_steps_at_one_moment_is_each_steps_own_last_or_not(tmp_path):
    # nested windows: rank 0 ends both at 1000 with one interval; rank 1 ends them at 1200 and
    # 400: rank 1 ended step 0 last, rank 0 step 1
    it = "iteration"

    def window(ts, dur):
        return op(it, ts, dur, cat="user_annotation")

    ranks = {
        0: [window(0, 1000), window(500, 500), op("aten::mm", 0, 1000)],
        1: [window(0, 1200), window(100, 300), op("aten::mm", 0, 1200)],
    }
    for rank, events in ranks.items():
        write_doc(tmp_path / f"rank{rank}.json", trace_doc(events, rank=rank, world=2))
    lanes = lane_intervals(load_run(tmp_path, cache=False).events, window=it)
    assert lanes.step_ends[0][0] == lanes.step_ends[1][0]  # rank 0's one interval ended both
    assert last_to_end(lanes.graph, lanes.step_ends, [0, 1]) == {0: 1, 1: 0}


def test_a_step_whose_end_is_no_node_of_the_graph_is_an_error_naming_it(tmp_path):
    write_doc(tmp_path / "rank0.json", trace_doc([step(0, 1000), op("aten::mm", 0, 1000)]))
    lanes = lane_intervals(load_run(tmp_path, cache=False).events)
    with pytest.raises(ValueError, match=r"step\(s\) \[7\]: no end of theirs is a node"):
        last_to_end(lanes.graph, lanes.step_ends, [1, 7])


def test_the_replay_keeps_every_constraint_when_the_binding_one_shrinks():
    # interval 2 waits for the ends of 0 (at 10) and 1 (at 8): without 0's work it waits for 1
    graph = _graph([Edges.of([1, 3], [5, 5], WAKE_UP)], [0, 0, 5], [10, 8, 12], [WORK, WORK, UNTRACED])  # fmt: skip
    assert replayed_times(graph)[5] == 12
    assert replayed_times(graph, np.array([0.0, 1.0, 1.0]))[5] == 10  # 8 + 2, no longer 0 + 2


def test_an_interval_a_what_if_removes_ends_as_it_begins():
    # interval 1 (4-9) waited on its lane for interval 0 (0-4) of another: removed, it lasts 0
    graph = _graph([Edges.of([1], [3], WAKE_UP)], [0, 4], [4, 9], [WORK, UNTRACED], lanes=[0, 1])
    value = replayed_times(graph, np.array([1.0, 0.0]))
    assert value[3] == value[2] == 4


def test_nodes_in_a_cycle_and_after_it_keep_their_measured_times():
    parts = [Edges.of([3], [1], WAKE_UP), Edges.of([1], [3], WAKE_UP)]
    graph = _graph(parts, [0, 0], [5, 6], [UNTRACED, UNTRACED])
    assert replayed_times(graph).tolist() == [0, 5, 0, 6]


def test_validate_finds_a_cycle_and_the_events_it_touches():
    parts = [Edges.of([3], [1], WAKE_UP), Edges.of([1], [3], WAKE_UP)]
    found = validate(_graph(parts, [0, 0], [5, 6], [UNTRACED, UNTRACED]), names=["a", "b"])
    assert found[["problem", "dependency"]].values.tolist() == [["cycle", "wake-up"]]
    assert found["nodes"].iat[0] == [1, 3] and found["events"].iat[0] == ["a", "b"]


def test_validate_finds_a_negative_lag():
    graph = _graph([Edges.of([0], [3], TRANSFER, -2.0)], [0, 4], [5, 9], [WORK, BEGIN])
    found = validate(graph)
    assert found[["problem", "dependency", "nodes"]].values.tolist() == [["negative lag", "transfer", [0, 3]]]  # fmt: skip


def test_validate_passes_a_graph_of_a_run():
    graph = _graph([Edges.of([1, 3], [5, 5], WAKE_UP)], [0, 0, 5], [10, 8, 12], [WORK, WORK, UNTRACED])  # fmt: skip
    assert validate(graph).empty


#: The module that may name a dependency: the registry.
REGISTRY = {"dependencies.py"}


def _interpreted_names(path: Path) -> list[str]:
    """Dependency names the module compares something with (``reason == "launch"``,
    ``rule in ("work", "queue")``, ``.isin(["wake-up"])``), with their line."""
    names = {d.name for d in DEPENDENCIES}
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "isin":
            operands = list(node.args)
        else:
            continue
        for operand in operands:
            leaves = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]  # fmt: skip
            for leaf in leaves:
                if isinstance(leaf, ast.Constant) and leaf.value in names:
                    found.append(f"{path.name}:{leaf.lineno} {leaf.value!r}")
    return found


def test_no_module_but_the_registry_interprets_a_dependency_by_its_name():
    modules = [p for p in (REPO / "helpers").rglob("*.py") if p.name not in REGISTRY]
    assert [hit for p in modules for hit in _interpreted_names(p)] == []


def test_the_check_finds_a_dependency_interpreted_by_name(tmp_path):
    module = tmp_path / "walker.py"
    module.write_text('if reason == "wake-up" or rule in ("queue", "x"):\n    pass\n')
    assert _interpreted_names(module) == ["walker.py:1 'wake-up'", "walker.py:1 'queue'"]


def _stacked(events: list[tuple[float, float]], begin: float, finish: float) -> list[tuple]:
    """The reference: a lane's intervals as a stack of its events gives them (push each at its
    start, the top labels the time until it ends), ``(start, end, event)``; -1 for a gap."""
    order = sorted(range(len(events)), key=lambda i: (events[i][0], -events[i][1]))
    out, stack = [], []
    cursor = min(events[order[0]][0], begin)

    def advance(to):
        nonlocal cursor
        while cursor < to:
            while stack and events[stack[-1]][1] <= cursor:
                stack.pop()
            stop = min(to, events[stack[-1]][1]) if stack else to
            label = stack[-1] if stack else -1
            if out and out[-1][2] == label:
                out[-1] = (out[-1][0], stop, label)
            else:
                out.append((cursor, stop, label))
            cursor = stop

    for i in order:
        advance(events[i][0])
        stack.append(i)
    advance(max(max(e for _, e in events), finish))
    return out


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 12)), min_size=1, max_size=14),
    st.integers(0, 10),
    st.integers(10, 40),
)
def test_a_lanes_intervals_are_labelled_by_the_event_on_top_of_its_stack(spans, begin, finish):
    events = [(float(s), float(s + d)) for s, d in spans]
    frame = pd.DataFrame({"start_us": [s for s, _ in events], "end_us": [e for _, e in events]})
    got = _flatten(frame, frame.index[:0], float(begin), float(finish))
    assert list(zip(got["start_us"], got["end_us"], got["event"])) == _stacked(events, begin, finish)  # fmt: skip


#: A real H200 trace of ours (torch 2.11.0+cu130, the GPU rehearsal's machine): one process, a
#: matmul on a side stream that the default stream waits for (``wait_event``), with CUDA sync
#: events recorded; torch records its CUDA events with ``cudaEventRecordWithFlags``, and every
#: "Stream Wait Event" came out with ``wait_on_stream`` -1.
H200_STREAMS = REPO / "tests" / "data" / "h200-streams"


def test_stream_waits_that_do_not_say_what_they_waited_for_are_followed_by_their_record_call():
    path = critical_path(load_run(H200_STREAMS, cache=False).events)
    held = path[path["reason"] == "stream wait"]
    assert len(held) == path["step"].nunique()  # each step's add waits for the side stream's mm
    assert held["waited_for"].str.contains("gemm.* · rank 0 · GPU 0 stream 20 \\(inferred\\)").all()  # fmt: skip


def test_each_dependencys_code_is_its_place_in_the_registry():
    assert [d.code for d in DEPENDENCIES] == list(range(len(DEPENDENCIES)))
    assert len({d.name for d in DEPENDENCIES}) == len(DEPENDENCIES)


@pytest.mark.parametrize("data", ["h200-streams", "pipeline-gpipe-3", "mesh-straggler"])
def test_each_builder_makes_only_the_dependencies_it_declares(data, monkeypatch):
    from helpers.analysis.path import builders

    made: dict[str, set] = {}

    def watched(builder):
        def build(run):
            found = builder.build(run)
            made.setdefault(builder.build.__name__, set()).update(e.dependency for e in found)
            return found

        return builders.Builder(build, builder.makes)

    declared = {b.build.__name__: set(b.makes) for b in builders.BUILDERS}
    monkeypatch.setattr(builders, "BUILDERS", tuple(watched(b) for b in builders.BUILDERS))
    lane_intervals(load_run(REPO / "tests" / "data" / data, cache=False).events)
    assert made.keys() == declared.keys()
    assert all(made[name] <= declared[name] for name in made), made
