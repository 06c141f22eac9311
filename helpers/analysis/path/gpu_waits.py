"""What a CPU thread waited for on the GPU, and what a GPU stream waited for on another: the
builders of ``sync`` and ``stream wait`` edges (:mod:`.builders` runs them).

**The CPU waits for the GPU** (:func:`sync_edges`), in a CUDA call that blocks until GPU work
launched before it has ended:

- ``cudaDeviceSynchronize`` waited for every stream's last work, and so did a ``cudaFree``
  that returned once all of it had ended (it may synchronise the device, and does unless the
  memory came from the stream-ordered allocator: *inferred from timing*);
- ``cudaStreamSynchronize`` for its stream's: the ``Stream Sync`` record says which stream
  where the trace has sync records (``enable_cuda_sync_events``); without, the stream whose
  last work ended closest to the call's end is taken, and the edge is *inferred*;
- ``cudaEventSynchronize`` for the work before the event's record: the ``Event Sync`` record
  says where; without, the last record call on the thread before it, and the last work
  launched from that thread before the record (*inferred*);
- a blocking copy (``cudaMemcpy``; ``cudaMemcpyAsync`` to pageable memory, ``.item()``,
  ``.cpu()``) for the copy it launched, where the call returned once the copy had ended;
- a launch held by a full launch queue, for the GPU work that ended as it returned
  (:func:`.wakers.find_wakers`);
- an op that waited inside, in a call the profiler did not record (the caching allocator
  giving memory back waits for the device): a long stretch of an op's own time that ended
  just after GPU work of its rank, under way all along, ended (:func:`blocked_op_edges`,
  *inferred from timing*).

**A stream waits for another** (:func:`stream_wait_edges`): each ``cudaStreamWaitEvent`` call
made the stream of the next work launched from its thread (or the stream its ``Stream Wait
Event`` record names) wait for the work before the CUDA event's record: the record its sync
record names by correlation, else the last record call on the same thread before the wait, and
the last work launched from that thread before the record (*inferred*: PyTorch's own events are
recorded with ``cudaEventRecordWithFlags``, which Kineto does not match; Kineto's pull requests
808 and 1318 match them the same way). NCCL's kernels wait for the compute stream this way.
Where neither says it (no record call is traced, or its call carries no stream and the work
before it ran on the waiting stream itself), the GPU's own timing does: the stream's next work
began later than its launch and the stream's previous work allowed, within
:data:`STREAM_WAIT_BOUND_US` after work on another stream of the rank ended: that is the work
it waited for (*inferred from timing*). Only the rank's own streams are looked at: two
processes sharing a GPU slow each other's kernels without any wait between them.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from ..arrival import GPU_SYNCS
from .dependencies import STREAM_WAIT, SYNC
from .gpu_work import FoundEdges, GpuWork, records_by_call, runtime_calls
from .graph import EXACT, FROM_CALLS, FROM_TIMING, Edges
from .interval_arrays import first_row
from .wakers import WAKE_TOLERANCE_US, find_wakers

__all__ = [
    "sync_edges",
    "stream_wait_edges",
    "blocked_op_edges",
    "BLOCKING_CALLS",
    "STREAM_WAIT_BOUND_US",
    "BLOCKED_OP_MIN_US",
    "BLOCKED_OP_BOUND_US",
]

#: CUDA runtime calls that block the CPU until the GPU has done something: the synchronisations
#: (:data:`helpers.analysis.arrival.GPU_SYNCS`), and copies, launches and frees, which may.
BLOCKING_CALLS = GPU_SYNCS + r"|^cudaMemcpy(?:Async)?$|^cu(?:da)?LaunchKernel(?:ExC)?$|^cudaFree(?:Host)?$"  # fmt: skip
#: How soon after the work it waited for ended a stream's next work begins (µs): on the shared
#: V100 and H200 traces, a kernel that no launch or earlier work of its stream held began 1 to
#: 15 µs after another stream's work ended (9 in 10), then nothing until about 90 µs.
STREAM_WAIT_BOUND_US = 50.0
#: The shortest stretch of an op's own time read as a wait for the GPU inside it (µs) ...
BLOCKED_OP_MIN_US = 5000.0
#: ... where it ended at most this long after GPU work of its rank ended (µs): on 4 V100s, a
#: ``cudaFree`` that synchronised the device returned 1.0 ms after the NCCL kernel it waited for.
BLOCKED_OP_BOUND_US = 1500.0
_RECORDS = r"^cudaEventRecord(?:WithFlags)?$"
_STREAM_WAITS = r"^cudaStreamWaitEvent$"


def sync_edges(run, rows: np.ndarray) -> list[Edges]:
    """``sync``: for each of ``rows`` (a thread's intervals) that is a CUDA call that blocks, an
    edge from the end of each GPU work it waited for (see the module) that ended by the end its
    lane gives the call (events that overlap without nesting cut a call short there)."""
    arrays, syncs = run.arrays, run.syncs
    calls = runtime_calls(run, BLOCKING_CALLS).query("row in @rows")
    if calls.empty:
        return []
    calls = calls.assign(end_us=arrays.end[calls["row"].to_numpy()])
    stream_syncs = records_by_call(syncs, "Stream Sync")
    event_syncs = records_by_call(syncs, "Event Sync")
    records = runtime_calls(run, _RECORDS)
    found, left = FoundEdges(), []
    all_calls = runtime_calls(run)
    for rank, mine in calls.groupby("rank", observed=True):
        work = GpuWork.of(run.ev, arrays, int(rank), all_calls[(all_calls["rank"] == rank).to_numpy()])  # fmt: skip
        streams = np.unique(work.stream[~np.isnan(work.stream)])
        for name, start, end, row, lane in zip(*(mine[c].tolist() for c in ("name", "start_us", "end_us", "row", "lane_id"))):  # fmt: skip
            target = 2 * row + 1
            if name == "cudaDeviceSynchronize":
                for stream in streams:
                    if (at := work.last_before(start, stream)) >= 0:
                        found.add(2 * work.row[at] + 1, target, EXACT)
            elif name.startswith("cudaFree"):  # it synchronised if all had ended on its return
                lasts = [work.last_before(start, stream) for stream in streams]
                lasts = [at for at in lasts if at >= 0]
                if all(work.end[at] <= end for at in lasts):
                    for at in lasts:
                        found.add(2 * work.row[at] + 1, target, FROM_TIMING)
            elif name == "cudaStreamSynchronize":
                stream = stream_syncs.get((rank, start), (np.nan,))[0]
                if stream == stream:
                    at = work.last_before(start, stream)
                else:
                    at = _closest(work, streams, start, end)
                if at >= 0:
                    found.add(
                        2 * work.row[at] + 1, target, FROM_CALLS if stream != stream else EXACT
                    )
            elif name == "cudaEventSynchronize":
                _, on, recorded = event_syncs.get((rank, start), (np.nan, np.nan, np.nan))
                if on == on and on >= 0 and recorded == recorded:
                    at, how = work.last_before(recorded, on), EXACT
                else:
                    at, how = _after_last_record(work, records, rank, lane, start), FROM_CALLS
                if at >= 0:
                    found.add(2 * work.row[at] + 1, target, how)
            elif name.startswith("cudaMemcpy"):
                at = np.flatnonzero(work.launch == start)
                if len(at) and work.end[at[0]] <= end:  # it returned once its copy had ended
                    found.add(2 * work.row[at[0]] + 1, target, EXACT)
            else:  # a launch held by a full launch queue
                left.append(row)
    edges = found.edges(SYNC)
    if left:
        left = np.asarray(left, dtype=np.int64)
        wakers = find_wakers(arrays, left, run.event_ends(), np.ones(len(left), dtype=bool))
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


def _recorded_before(work: GpuWork, records: pd.DataFrame, rank, lane: int, t: float, waiting: float) -> int:  # fmt: skip
    """The work a stream wait at ``t`` on ``lane`` waited for, from the calls around it: the
    last work launched from ``lane``, on a stream other than the ``waiting`` one, before the
    last record call on ``lane`` before ``t`` or, where none is traced, before ``t`` itself
    (c10d and torch's ``wait_stream`` record the event on the thread just before the wait);
    -1 for none."""
    mine = records[(records["rank"] == rank).to_numpy() & (records["lane_id"] == lane).to_numpy()]
    before = mine["start_us"].to_numpy()
    before = before[before < t]
    at = work.launch < (before.max() if len(before) else t)
    at = np.flatnonzero(at & (work.lane == lane) & (work.stream != waiting))
    return int(at[-1]) if len(at) else -1


def stream_wait_edges(run) -> list[Edges]:
    """``stream wait``: for each ``cudaStreamWaitEvent`` call, an edge from the end of the work
    the CUDA event followed to the first work launched after the call on the stream made to
    wait (into the gap before it; where none, into its start, lag 0: a bound that a what-if
    must meet): the work its sync record names; else the work before the last record call on
    its thread, and the work that ended just before it on another stream of its rank (see the
    module), each an edge (the one that ended last binds)."""
    arrays, syncs = run.arrays, run.syncs
    waits = runtime_calls(run, _STREAM_WAITS)
    if waits.empty:
        return []
    records = runtime_calls(run, _RECORDS)
    wait_records = records_by_call(syncs, "Stream Wait Event")
    all_calls = runtime_calls(run)
    gap_before = _gap_before(run)
    into_gaps, into_starts, unmatched = FoundEdges(), FoundEdges(), 0
    for rank, mine in waits.groupby("rank", observed=True):
        work = GpuWork.of(run.ev, arrays, int(rank), all_calls[(all_calls["rank"] == rank).to_numpy()])  # fmt: skip
        for start, lane in zip(mine["start_us"].tolist(), mine["lane_id"].tolist()):
            stream, on, recorded = wait_records.get((rank, start), (np.nan, np.nan, np.nan))
            held = _first_on(work, stream, start, lane)
            if held < 0:
                continue  # no work launched after it in the trace: it held nothing here
            first = first_row(arrays, work.row[held])
            gap = gap_before.get(first, -1)
            if on == on and on >= 0 and recorded == recorded:
                found = [(work.last_before(recorded, on), EXACT)]
            else:
                found = [
                    (
                        _recorded_before(work, records, rank, lane, start, work.stream[held]),
                        FROM_CALLS,
                    ),
                    (
                        _ended_just_before(work, held, arrays.start[gap] if gap >= 0 else np.inf),
                        FROM_TIMING,
                    ),  # fmt: skip
                ]
            # a stream made to wait for itself waits for nothing
            found = [(at, how) for at, how in found if at >= 0 and work.stream[at] != work.stream[held]]  # fmt: skip
            if not found:  # it may have held its stream, for what is not known
                unmatched += gap >= 0 and _held_past_its_launch(work, held, arrays.start[gap])
            # nor did it wait for work that ended after the stream went on
            found = [(at, how) for at, how in found if work.end[at] <= arrays.start[first]]
            for at, how in found:
                if gap >= 0:
                    into_gaps.add(2 * work.row[at] + 1, 2 * gap + 1, how)
                else:
                    into_starts.add(2 * work.row[at] + 1, 2 * first, how)
    if unmatched:
        warnings.warn(
            f"{unmatched} of the {len(waits)} stream waits (cudaStreamWaitEvent) in these traces "
            "held their stream, and what they waited for could not be found (no sync record "
            "says it, no record call before them on their thread does, and no other stream's "
            "work ended just before the stream went on): the critical path counts the time such "
            "a stream was held as its own queue",
            stacklevel=2,
        )
    return [*into_gaps.edges(STREAM_WAIT), *into_starts.edges(STREAM_WAIT, 0.0)]


def _ready(work: GpuWork, held: int, gap_start: float) -> float:
    """When the ``held`` work could have begun but for a wait: once its launch returned and its
    stream's previous work had ended (``gap_start``: when the gap before it began)."""
    issued = work.issued[held]
    return max(gap_start, issued) if issued == issued else gap_start


def _held_past_its_launch(work: GpuWork, held: int, gap_start: float) -> bool:
    """Whether the ``held`` work began later than its launch and its stream allowed (by more
    than :data:`STREAM_WAIT_BOUND_US`): something held its stream."""
    return bool(work.start[held] - _ready(work, held, gap_start) > STREAM_WAIT_BOUND_US)


def _ended_just_before(work: GpuWork, held: int, gap_start: float) -> int:
    """The work on another stream of the rank that ended last within
    :data:`STREAM_WAIT_BOUND_US` before the ``held`` work began, and after both its launch
    returned and its stream's previous work ended (``gap_start``: the gap before it began then;
    inf for no gap): what the held work waited for, by the GPU's timing; -1 for none."""
    begin, ready = work.start[held], _ready(work, held, gap_start)
    mine = np.flatnonzero(
        (work.stream != work.stream[held])
        & (work.end <= begin)
        & (work.end >= begin - STREAM_WAIT_BOUND_US)
        & (work.end > ready)
    )
    return int(mine[np.argmax(work.end[mine])]) if len(mine) else -1


def blocked_op_edges(run) -> list[Edges]:
    """``sync``, inferred from timing: each stretch of an op's own time on a CPU thread (a CPU
    op's, not an annotation's: user code may sleep) at least :data:`BLOCKED_OP_MIN_US` long that
    ended at most :data:`BLOCKED_OP_BOUND_US` after GPU work of its rank ended, work under way
    since before the stretch began, waited for that work (the last of such to end) in a call the
    profiler did not record."""
    arrays, ev = run.arrays, run.ev
    rows = run.rows("work")
    table = run.lanes.lanes
    cpu = ~(table["worker"].to_numpy() | table["gpu"].to_numpy())[arrays.lane[rows]]
    long = (arrays.end[rows] - arrays.start[rows]) >= BLOCKED_OP_MIN_US
    rows = rows[cpu & long]
    ops = ev.index[(ev["cat"] == "cpu_op").to_numpy() & (ev["kind"] != "cuda runtime").to_numpy()]
    rows = rows[np.isin(arrays.event[rows], ops)]
    if not len(rows):
        return []
    all_calls = runtime_calls(run)
    found = FoundEdges()
    for rank in np.unique(arrays.rank[rows]):
        work = GpuWork.of(ev, arrays, int(rank), all_calls[(all_calls["rank"] == rank).to_numpy()])  # fmt: skip
        for row in rows[arrays.rank[rows] == rank].tolist():
            begin, end = arrays.start[row], arrays.end[row]
            under_way = np.flatnonzero((work.start < begin) & (work.end <= end) & (work.end >= end - BLOCKED_OP_BOUND_US))  # fmt: skip
            if len(under_way):
                at = under_way[np.argmax(work.end[under_way])]
                found.add(2 * work.row[at] + 1, 2 * row + 1, FROM_TIMING)
    return found.edges(SYNC)


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
