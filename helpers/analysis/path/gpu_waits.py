"""What a CPU thread waited for on the GPU, and what a GPU stream waited for on another: the
builders of ``sync`` and ``stream wait`` edges (:mod:`.builders` runs them).

**The CPU waits for the GPU** (:func:`sync_edges`), in a CUDA call that blocks until GPU work
launched before it has ended:

- ``cudaDeviceSynchronize`` waited for every stream's last work;
- ``cudaStreamSynchronize`` for its stream's: the ``Stream Sync`` record says which stream
  where the trace has sync records (``enable_cuda_sync_events``); without, the stream whose
  last work ended closest to the call's end is taken, and the edge is *inferred*;
- ``cudaEventSynchronize`` for the work before the event's record: the ``Event Sync`` record
  says where; without, the last record call on the thread before it, and the last work
  launched from that thread before the record (*inferred*);
- a blocking copy (``cudaMemcpy``; ``cudaMemcpyAsync`` to pageable memory, ``.item()``,
  ``.cpu()``) for the copy it launched, where the call returned once the copy had ended;
- a launch held by a full launch queue, for the GPU work that ended as it returned
  (:func:`.wakers.find_wakers`).

**A stream waits for another** (:func:`stream_wait_edges`): each ``cudaStreamWaitEvent`` call
made the stream of the next work launched from its thread (or the stream its ``Stream Wait
Event`` record names) wait for the work before the CUDA event's record: the record its sync
record names by correlation, else the last record call on the same thread before the wait, and
the last work launched from that thread before the record (*inferred*: PyTorch's own events are
recorded with ``cudaEventRecordWithFlags``, which Kineto does not match; Kineto's pull requests
808 and 1318 match them the same way). NCCL's kernels wait for the compute stream this way.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...traces.kinds import GPU_CATEGORIES, name_matches
from .dependencies import STREAM_WAIT, SYNC
from .graph import Edges
from .wakers import (
    WAKE_TOLERANCE_US,
    IntervalArrays,
    event_ends,
    find_wakers,
    first_row,
    launched_on_a_gpu,
)

__all__ = ["GpuWork", "sync_edges", "stream_wait_edges", "launching_ops", "BLOCKING_CALLS"]

#: CUDA runtime calls that block the CPU until the GPU has done something.
BLOCKING_CALLS = r"^cuda(?:Stream|Device|Event)Synchronize$|^cudaMemcpy(?:Async)?$|^cu(?:da)?LaunchKernel(?:ExC)?$"  # fmt: skip
_RECORDS = r"^cudaEventRecord(?:WithFlags)?$"
_GPU = list(GPU_CATEGORIES)
_STREAM_WAITS = r"^cudaStreamWaitEvent$"


@dataclass
class GpuWork:
    """A run's GPU work launched from the CPU, per rank: each work's interval ``row`` (its last),
    ``stream``, ``launch`` (when its launch call began), ``end``, and ``lane`` (the lane of its
    launch call; -1 where the call is not in the trace), sorted by launch."""

    row: np.ndarray
    stream: np.ndarray
    launch: np.ndarray
    end: np.ndarray
    lane: np.ndarray

    @classmethod
    def of(cls, ev: pd.DataFrame, arrays: IntervalArrays, rank: int, calls: pd.DataFrame) -> GpuWork:  # fmt: skip
        """The GPU work of ``rank`` among ``ev``, whose launch calls are among ``calls``
        (the runtime calls of the rank, with ``lane_id``)."""
        work = launched_on_a_gpu(ev)
        work = work[(work["rank"] == rank).to_numpy()].sort_values("launch_us", kind="stable")
        rows = _last_rows(arrays, work.index.to_numpy(np.int64))
        lane_of = dict(zip(calls["start_us"].tolist(), calls["lane_id"].tolist()))
        lanes = np.array([lane_of.get(t, -1) for t in work["launch_us"].tolist()], dtype=np.int64)
        kept = rows >= 0
        return cls(
            rows[kept],
            work["stream"].to_numpy(dtype=float)[kept],
            work["launch_us"].to_numpy(dtype=float)[kept],
            arrays.end[rows[kept]],
            lanes[kept],
        )

    def last_before(self, t: float, stream: float | None = None, lane: int | None = None) -> int:
        """The position of the last work launched before ``t`` (on ``stream``, from ``lane``,
        where given); -1 for none."""
        mine = np.flatnonzero(self.launch < t)
        if stream is not None:
            mine = mine[self.stream[mine] == stream]
        if lane is not None:
            mine = mine[self.lane[mine] == lane]
        return int(mine[-1]) if len(mine) else -1

    def first_after(self, t: float, lane: int) -> int:
        """The position of the first work launched from ``lane`` after ``t``; -1 for none."""
        mine = np.flatnonzero((self.launch > t) & (self.lane == lane))
        return int(mine[0]) if len(mine) else -1


def _last_rows(arrays: IntervalArrays, events: np.ndarray) -> np.ndarray:
    """The last interval row of each of ``events`` (labels); -1 for an event without one."""
    at = np.flatnonzero(np.isin(arrays.event, events))[::-1]  # read backwards: the last first
    labels, first = np.unique(arrays.event[at], return_index=True)
    if not len(labels):
        return np.full(len(events), -1, dtype=np.int64)
    where = np.minimum(np.searchsorted(labels, events), len(labels) - 1)
    return np.where(labels[where] == events, at[first][where], -1).astype(np.int64)


def _calls(run, pattern: str | None = None) -> pd.DataFrame:
    """The run's CUDA runtime calls (matching ``pattern``) with their lane and last interval."""
    ev = run.ev
    calls = ev[(ev["kind"] == "cuda runtime").to_numpy()]
    if pattern is not None:
        calls = calls[name_matches(calls, pattern)]
    rows = _last_rows(run.arrays, calls.index.to_numpy(np.int64))
    calls = calls[rows >= 0].assign(row=rows[rows >= 0])
    return calls.assign(lane_id=run.arrays.lane[calls["row"].to_numpy()])


def _records_by_call(syncs: pd.DataFrame, kind: str) -> dict[tuple[int, float], tuple]:
    """The sync records of one ``kind`` (``Stream Sync``, ...) by their call's ``(rank,
    start)``: ``(stream, wait_stream, waits_for_us)`` (NaN where unknown)."""
    mine = syncs[(syncs["name"] == kind).to_numpy() & syncs["launch_us"].notna().to_numpy()]
    keys = zip(mine["rank"].tolist(), mine["launch_us"].tolist())
    values = zip(*(mine[c].to_numpy(dtype=float) for c in ("stream", "wait_stream", "waits_for_us")))  # fmt: skip
    return dict(zip(keys, values))


class _Found:
    """Edges found, exact and inferred, of one dependency."""

    def __init__(self):
        self.exact: tuple[list, list] = ([], [])
        self.inferred: tuple[list, list] = ([], [])

    def add(self, source: int, target: int, inferred: bool) -> None:
        sources, targets = self.inferred if inferred else self.exact
        sources.append(source)
        targets.append(target)

    def edges(self, dependency, lag=None) -> list[Edges]:
        return [
            Edges.of(*self.exact, dependency, lag),
            Edges.of(*self.inferred, dependency, lag, inferred=True),
        ]


def sync_edges(run, rows: np.ndarray) -> list[Edges]:
    """``sync``: for each of ``rows`` (a thread's intervals) that is a CUDA call that blocks, an
    edge from the end of each GPU work it waited for (see the module)."""
    arrays, syncs = run.arrays, run.syncs
    calls = _calls(run, BLOCKING_CALLS)
    calls = calls[np.isin(calls["row"].to_numpy(), rows)]
    if calls.empty:
        return []
    stream_syncs = _records_by_call(syncs, "Stream Sync")
    event_syncs = _records_by_call(syncs, "Event Sync")
    records = _calls(run, _RECORDS)
    found, left = _Found(), []
    all_calls = _calls(run)
    for rank, mine in calls.groupby("rank", observed=True):
        work = GpuWork.of(run.ev, arrays, int(rank), all_calls[(all_calls["rank"] == rank).to_numpy()])  # fmt: skip
        streams = np.unique(work.stream[~np.isnan(work.stream)])
        for name, start, end, row, lane in zip(*(mine[c].tolist() for c in ("name", "start_us", "end_us", "row", "lane_id"))):  # fmt: skip
            target = 2 * row + 1
            if name == "cudaDeviceSynchronize":
                for stream in streams:
                    if (at := work.last_before(start, stream)) >= 0:
                        found.add(2 * work.row[at] + 1, target, False)
            elif name == "cudaStreamSynchronize":
                stream = stream_syncs.get((rank, start), (np.nan,))[0]
                if stream == stream:
                    at = work.last_before(start, stream)
                else:
                    at = _closest(work, streams, start, end)
                if at >= 0:
                    found.add(2 * work.row[at] + 1, target, stream != stream)
            elif name == "cudaEventSynchronize":
                _, on, recorded = event_syncs.get((rank, start), (np.nan, np.nan, np.nan))
                if on == on and on >= 0 and recorded == recorded:
                    at = work.last_before(recorded, on)
                    inferred = False
                else:
                    at = _after_last_record(work, records, rank, lane, start)
                    inferred = True
                if at >= 0:
                    found.add(2 * work.row[at] + 1, target, inferred)
            elif name.startswith("cudaMemcpy"):
                at = np.flatnonzero(work.launch == start)
                if len(at) and work.end[at[0]] <= end:  # it returned once its copy had ended
                    found.add(2 * work.row[at[0]] + 1, target, False)
            else:  # a launch held by a full launch queue
                left.append(row)
    edges = found.edges(SYNC)
    if left:
        left = np.asarray(left, dtype=np.int64)
        ends = event_ends(run.lanes.intervals, run.ev, run.lanes.lanes["gpu"].to_numpy())
        wakers = find_wakers(arrays, left, ends, np.ones(len(left), dtype=bool))
        edges.append(Edges.of(2 * wakers[wakers >= 0] + 1, 2 * left[wakers >= 0] + 1, SYNC))
    return edges


def _closest(work: GpuWork, streams: np.ndarray, start: float, end: float) -> int:
    """Of each stream's last work launched before ``start``, the one that ended closest to
    ``end`` (at most the wake tolerance after it); -1 for none."""
    best, distance = -1, np.inf
    for stream in streams:
        at = work.last_before(start, stream)
        if at >= 0 and work.end[at] <= end + WAKE_TOLERANCE_US and abs(end - work.end[at]) < distance:  # fmt: skip
            best, distance = at, abs(end - work.end[at])
    return best


def _after_last_record(work: GpuWork, records: pd.DataFrame, rank, lane: int, t: float) -> int:
    """The last work launched from ``lane`` before the last record call on ``lane`` before
    ``t`` (the work a CUDA event recorded there followed); -1 for none."""
    mine = records[(records["rank"] == rank).to_numpy() & (records["lane_id"] == lane).to_numpy()]
    before = mine["start_us"].to_numpy()
    before = before[before < t]
    if not len(before):
        return -1
    return work.last_before(before.max(), lane=lane)


def stream_wait_edges(run) -> list[Edges]:
    """``stream wait``: for each ``cudaStreamWaitEvent`` call, an edge from the end of the work
    the CUDA event followed to the first work launched after the call on the stream made to
    wait (into the gap before it; where none, into its start, lag 0: a bound that a what-if
    must meet)."""
    arrays, syncs = run.arrays, run.syncs
    waits = _calls(run, _STREAM_WAITS)
    if waits.empty:
        return []
    records = _calls(run, _RECORDS)
    wait_records = _records_by_call(syncs, "Stream Wait Event")
    all_calls = _calls(run)
    gap_before = _gap_before(run)
    into_gaps, into_starts, unmatched = _Found(), _Found(), 0
    for rank, mine in waits.groupby("rank", observed=True):
        work = GpuWork.of(run.ev, arrays, int(rank), all_calls[(all_calls["rank"] == rank).to_numpy()])  # fmt: skip
        for start, lane in zip(mine["start_us"].tolist(), mine["lane_id"].tolist()):
            stream, on, recorded = wait_records.get((rank, start), (np.nan, np.nan, np.nan))
            if on == on and on >= 0 and recorded == recorded:
                waited, inferred = work.last_before(recorded, on), False
            else:
                waited, inferred = _after_last_record(work, records, rank, lane, start), True
            held = _first_on(work, stream, start, lane)
            if held < 0:
                continue  # no work launched after it in the trace: it held nothing here
            if waited < 0:
                unmatched += 1
                continue
            if work.stream[waited] == work.stream[held]:
                continue  # a stream made to wait for itself waits for nothing
            first = first_row(arrays, work.row[held])
            if work.end[waited] > arrays.start[first]:
                continue  # it began before that work ended: it did not wait for it
            gap = gap_before.get(first, -1)
            if gap >= 0:
                into_gaps.add(2 * work.row[waited] + 1, 2 * gap + 1, inferred)
            else:
                into_starts.add(2 * work.row[waited] + 1, 2 * first, inferred)
    if unmatched:
        warnings.warn(
            f"{unmatched} of the {len(waits)} stream waits (cudaStreamWaitEvent) in these traces "
            "could not be matched to the work they waited for (no record call before them on "
            "their thread, and no sync record that says which): the critical path counts the "
            "time such a stream was held as its own queue",
            stacklevel=2,
        )
    return [*into_gaps.edges(STREAM_WAIT), *into_starts.edges(STREAM_WAIT, 0.0)]


def _first_on(work: GpuWork, stream: float, t: float, lane: int) -> int:
    """The first work launched after ``t`` on ``stream`` (where known), else from ``lane``."""
    if stream == stream and stream >= 0:
        mine = np.flatnonzero((work.launch > t) & (work.stream == stream))
        return int(mine[0]) if len(mine) else -1
    return work.first_after(t, lane)


def _gap_before(run) -> dict[int, int]:
    """Per interval whose lane's interval before it is a worker lane's wait (a gap), that gap."""
    rows = run.rows("worker wait")
    after = rows + 1
    ok = after < len(run.arrays.lane)
    rows, after = rows[ok], after[ok]
    same = run.arrays.lane[after] == run.arrays.lane[rows]
    return dict(zip(after[same].tolist(), rows[same].tolist()))


def launching_ops(ev: pd.DataFrame) -> pd.Series:
    """Per GPU event of ``ev`` whose launch is in the trace (indexed by its label), the name of
    the op that launched it: the innermost event on its launch call's thread that encloses the
    call and is no CUDA runtime call (an ``aten::`` op, a ``record_function`` annotation);
    missing where none does."""
    work = launched_on_a_gpu(ev)
    if work.empty:
        return pd.Series(dtype=object)
    runtime = (ev["kind"] == "cuda runtime").to_numpy()
    calls = ev[runtime]
    call_of = dict(zip(zip(calls["rank"].tolist(), calls["start_us"].tolist()), zip(calls["lane"].astype(str).tolist(), calls["end_us"].tolist())))  # fmt: skip
    keep = ~runtime & ~ev["kind"].isin(("step", "other")).to_numpy() & ~ev["cat"].isin(_GPU).to_numpy()  # fmt: skip
    ops = ev[keep]
    queries = pd.DataFrame(
        [
            (label, rank, *call_of[(rank, t)], t)
            for label, rank, t in zip(
                work.index.tolist(), work["rank"].tolist(), work["launch_us"].tolist()
            )
            if (rank, t) in call_of
        ],  # fmt: skip
        columns=["label", "rank", "lane", "end", "start"],
    )
    found = []
    for (rank, lane), asked in queries.groupby(["rank", "lane"]):
        mine = ops[(ops["rank"] == rank).to_numpy() & (ops["lane"].astype(str) == lane).to_numpy()]
        if mine.empty:
            continue
        order = np.lexsort((-mine["end_us"].to_numpy(), mine["start_us"].to_numpy()))
        starts, ends = mine["start_us"].to_numpy()[order], mine["end_us"].to_numpy()[order]
        names = mine["name"].astype(str).to_numpy()[order]
        parent = _enclosing(np.arange(len(starts)) - 1, starts, ends, np.nextafter(starts, np.inf), None)  # fmt: skip
        at = np.searchsorted(starts, asked["start"].to_numpy(), side="right") - 1
        at = _enclosing(at, starts, ends, asked["end"].to_numpy(), parent)
        held = at >= 0
        found += list(zip(asked["label"].to_numpy()[held], names[at[held]]))
    return pd.Series(dict(found), dtype=object)


def _enclosing(cand: np.ndarray, starts, ends, until: np.ndarray, parent) -> np.ndarray:
    """For each candidate event (sorted by start, then longest first; -1: none), the first of
    it and its ancestors that lasts until ``until``, jumping from one that does not to its
    ``parent`` (None: to the answer found so far for that event, how the parents themselves are
    found, all at once)."""
    while True:
        at = np.maximum(cand, 0)
        short = (cand >= 0) & (ends[at] < until)
        if not short.any():
            return cand
        cand = np.where(short, (cand if parent is None else parent)[at], cand)
