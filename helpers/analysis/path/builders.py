"""The builders of the dependency graph (:mod:`.graph`): each reads a run's lanes cut into
intervals (:func:`.lanes.lane_intervals`) and returns the edges of what some intervals may have
waited for, every candidate it finds; it decides nothing (:func:`.graph.binding_edges` alone
picks, of a moment's edges, the one that held it). Which builder looks at an interval depends
only on what the interval is:

1. a collective matched on several ranks: ``transfer`` (:func:`transfer_edges`, an edge from
   every rank's arrival);
2. the wait at the end of a send's or a receive's record: ``receive`` and ``send``
   (:func:`receive_edges`: from the send's issue and the receive's posting);
3. on a worker lane (a GPU stream, gloo's collective thread), a gap or an annotation with
   nothing under it: what its next event waited for (:func:`worker_edges`): its issuer
   (``launch``, from the end of the kernel's launch or of gloo's ``c10d::`` call) and, on a GPU
   stream made to wait for a CUDA event, the other stream's work that the event followed
   (``stream wait``);
4. on a thread, a gap, an annotation with nothing under it, a CUDA call that can block
   (:data:`SYNC_CALLS`) or a collective's wait (:data:`WAIT_CALLS`): what ended close to its
   end on another lane of its rank (:func:`wake_edges`, :func:`.wakers.find_wakers`): GPU work
   for a CUDA call (``sync``), an event on another CPU thread for the others (``wake-up``).

A rank's step also ends no sooner than the collectives it ran on gloo's thread in the step
(:func:`completion_edges`), and a worker lane's event starts no sooner than it was issued, even
right after the event before it (a bound, lag 0, from :func:`worker_edges`). The graph then adds
each interval's edge from its own start (:func:`own_dependencies`: its own time, a worker gap's
``queue``, a collective's ``begin``) and its lane's order.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ...traces.kinds import name_matches
from .dependencies import (
    BEGIN,
    COMPLETION,
    LAUNCH,
    QUEUE,
    RECEIVE,
    SEND,
    STREAM_WAIT,
    SYNC,
    TRANSFER,
    UNTRACED,
    WAKE_UP,
    WORK,
)
from .graph import Edges, Graph
from .wakers import (
    IntervalArrays,
    event_ends,
    find_wakers,
    first_row,
    launched_on_a_gpu,
    main_lane_issuers,
    worker_event_issuers,
)

__all__ = [
    "SYNC_CALLS",
    "WAIT_CALLS",
    "STREAM_WAIT_EVENT",
    "LanesAndEvents",
    "BUILDERS",
    "graph_of",
    "own_dependencies",
    "transfer_edges",
    "receive_edges",
    "worker_edges",
    "stream_waits",
    "unmatched_stream_waits",
    "completion_edges",
    "wake_edges",
]


@dataclass
class LanesAndEvents:
    """What every builder reads: the run's ``lanes`` (:class:`.lanes.Lanes`, before their
    graph), their events ``ev``, their intervals as ``arrays``, the run's ``cuda_sync`` events
    (``syncs``: what a stream or a CPU call waited for, where the trace recorded it), and what
    each interval is (``kind_of``: one of :data:`INTERVAL_KINDS` per interval)."""

    lanes: Any  # a .lanes.Lanes (which imports this module)
    ev: pd.DataFrame
    arrays: IntervalArrays
    syncs: pd.DataFrame
    kind_of: np.ndarray

    def rows(self, kind: str) -> np.ndarray:
        """The intervals of one kind (:data:`INTERVAL_KINDS`)."""
        return np.flatnonzero(self.kind_of == INTERVAL_KINDS.index(kind))


#: What an interval can be, for the builders: work of its own, a matched collective, the wait at
#: the end of a send's or a receive's record, a worker lane's wait (a gap, a bare annotation), a
#: thread's wait (a gap, a bare annotation, a CUDA call that can block, a collective's wait).
INTERVAL_KINDS = ("work", "collective", "point to point", "worker wait", "thread wait")

#: CUDA runtime calls that can block the CPU until the GPU has done something: the
#: synchronisations, a copy (to pageable host memory even ``cudaMemcpyAsync`` returns only once
#: the copy is done), and a launch (it blocks while the stream's launch queue is full).
SYNC_CALLS = r"^cuda(?:Stream|Device|Event)Synchronize$|^cudaMemcpy(?:Async)?$|^cu(?:da)?LaunchKernel(?:ExC)?$"
#: Ops that block their thread until a collective issued earlier has ended on another lane: a
#: functional collective's wait (DTensor's, tensor parallelism's).
WAIT_CALLS = r"^_?c10d_functional::wait_tensor$"


def graph_of(lanes, ev: pd.DataFrame, syncs: pd.DataFrame) -> Graph:
    """The dependency graph of ``lanes`` (:class:`.lanes.Lanes`), whose events are ``ev``, with
    the run's ``cuda_sync`` events ``syncs`` (none: a trace recorded without them): every
    builder of :data:`BUILDERS` on the intervals of its kind."""
    arrays = IntervalArrays.of(lanes.intervals)
    run = LanesAndEvents(lanes, ev, arrays, syncs, _interval_kinds(lanes, ev, arrays))
    parts = [edges for build in BUILDERS for edges in build(run)]
    return Graph.of(parts, lanes.intervals, own_dependencies(run, parts))


def _interval_kinds(lanes, ev: pd.DataFrame, arrays: IntervalArrays) -> np.ndarray:
    """What each interval is (a position in :data:`INTERVAL_KINDS`)."""
    label = arrays.event
    pos = ev.index.get_indexer(label)
    has, at = pos >= 0, np.maximum(pos, 0)
    annotation = has & (ev["kind"] == "annotation").to_numpy()[at]
    sync = has & name_matches(ev, SYNC_CALLS)[at]
    waits = has & name_matches(ev, WAIT_CALLS)[at]
    worker = lanes.lanes["worker"].to_numpy()[arrays.lane]
    may_wait = ~has | annotation | sync | waits
    kind = np.where(may_wait, np.where(worker, 3, 4), 0)
    kind[point_to_point_waits(lanes, arrays)] = 2
    kind[np.fromiter(lanes.instance, dtype=np.int64, count=len(lanes.instance))] = 1
    return kind


def own_dependencies(run: LanesAndEvents, parts: list[Edges]) -> np.ndarray:
    """Each interval's edge from its own start, as a dependency code: ``begin`` for a matched
    collective, ``queue`` for a worker lane's gap that waited for something (what it waited for
    had ended before it began: its previous event held it), ``untraced`` for another gap,
    ``work`` for an event."""
    arrays = run.arrays
    waited = np.zeros(len(arrays.event), dtype=bool)
    for edges in parts:
        if edges.dependency.waits:
            waited[edges.target[edges.target % 2 == 1] // 2] = True
    gap = arrays.event < 0
    own = np.where(gap, UNTRACED.code, WORK.code)
    own[gap & waited & (run.kind_of == INTERVAL_KINDS.index("worker wait"))] = QUEUE.code
    own[run.rows("collective")] = BEGIN.code
    return own.astype(np.int8)


def transfer_edges(run: LanesAndEvents) -> list[Edges]:
    """``transfer``: each matched collective's interval on one rank ends when the last rank has
    arrived, plus the collective's transfer (its shortest duration across the ranks): an edge
    from every rank's arrival (its interval's start), in the order of the ranks' arrivals."""
    lanes = run.lanes
    source, target, lag = [], [], []
    for instance, arrivals in lanes.arrivals.items():
        transfer = lanes.transfer_us[instance]
        transfer = 0.0 if transfer != transfer else transfer  # no duration known
        for row in arrivals:
            source += [2 * j for j in arrivals]
            target += [2 * row + 1] * len(arrivals)
            lag += [transfer] * len(arrivals)
    return [Edges.of(source, target, TRANSFER, lag)]


def point_to_point_waits(lanes, arrays: IntervalArrays) -> np.ndarray:
    """The intervals that are the waits at the end of a send's or a receive's record, of the
    lanes' ``pairs`` (:func:`.point_to_point.sends_and_receives`)."""
    pairs = lanes.pairs
    if pairs is None or pairs.empty:
        return np.zeros(0, dtype=np.int64)
    last_row = dict(zip(arrays.event.tolist(), range(len(arrays.event))))
    records = pairs[["receive_record", "send_record"]].to_numpy(dtype=np.int64).ravel()
    return np.array([last_row[r] for r in records.tolist() if r in last_row], dtype=np.int64)


def _issue_edges(arrays: IntervalArrays, rows, issued, target, dependency, lag=None) -> list[Edges]:  # fmt: skip
    """The edges from calls (interval ``rows``) to what they issued (the ``target`` nodes, that
    began, or arrived, at ``issued``): from each call's end, or from its start where what it
    issued began before the call returned (a blocking copy, a send whose data arrived before
    ``c10d::send`` returned, gloo's thread starting a collective while its ``c10d::`` call goes
    on), marked :attr:`~.graph.Edges.during`."""
    rows, issued, target = (np.asarray(a) for a in (rows, issued, target))
    late = arrays.end[rows] > issued
    return [
        Edges.of(2 * rows[~late] + 1, target[~late], dependency, None if lag is None else lag),
        Edges.of(
            2 * rows[late], target[late], dependency, None if lag is None else lag, during=True
        ),
    ]


def receive_edges(run: LanesAndEvents) -> list[Edges]:
    """``receive`` and ``send``: a send and its receive (the lanes' ``pairs``,
    :func:`.point_to_point.sends_and_receives`; a trace without peers has none) move data once
    both were issued: the send (the end of its ``c10d::send``, on the sender's lane) and the
    receive (the start of its ``c10d::recv_``). The wait at the end of the receive's record
    (``gloo:recv``, cut to the wait by :func:`.point_to_point.waits_in_records`) waited for
    both, and so did the wait at the end of the send's record: an edge from each to each. A
    wait that began once both were issued held only the transfer: its own start binds it."""
    arrays, pairs = run.arrays, run.lanes.pairs
    if pairs is None or pairs.empty:
        return []
    last_row = dict(zip(arrays.event.tolist(), range(len(arrays.event))))  # an event's last row
    found: dict[Any, tuple[list, ...]] = {RECEIVE: ([], [], [], []), SEND: ([], [], [], [])}
    labels = pairs[["send", "receive", "receive_record", "send_record"]].to_numpy(dtype=np.int64)
    for send, receive, *records in labels.tolist():
        sent, posted = last_row.get(send, -1), last_row.get(receive, -1)
        waits = [last_row.get(r, -1) if r >= 0 else -1 for r in records]
        if min(sent, posted, waits[0]) < 0:
            continue
        for dependency, wait in zip((RECEIVE, SEND), waits):
            if wait >= 0:
                senders, arrived, posts, target = found[dependency]
                senders.append(sent)
                arrived.append(arrays.end[waits[0]])  # the data had arrived by then
                posts.append(2 * first_row(arrays, posted))
                target.append(2 * wait + 1)
    edges = []
    for dependency, (senders, arrived, posts, target) in found.items():
        edges += _issue_edges(arrays, senders, arrived, target, dependency)
        edges.append(Edges.of(posts, target, dependency))
    return edges


def completion_edges(run: LanesAndEvents) -> list[Edges]:
    """``completion``: a rank's step ends no sooner than the collectives it ran on a CPU worker
    lane (gloo's thread) within the step have ended, whether or not its thread waited for them
    (a ``work.wait()`` that found the collective done leaves no mark in the trace, yet a what-if
    that shortens the work before it must meet it): an edge from each such collective's end to
    the end of the rank's main lane's last interval in the step, with no delay. It holds
    nothing as measured (the step ended later, or at that moment); a what-if may make it."""
    lanes, arrays = run.lanes, run.arrays
    collectives = run.rows("collective")
    gpu = lanes.lanes["gpu"].to_numpy()
    collectives = collectives[~gpu[arrays.lane[collectives]]]
    main = lanes.main_lanes()
    source, target = [], []
    for rank, steps in lanes.steps.groupby("rank"):
        lane = main.get(rank)
        mine = collectives[arrays.rank[collectives] == rank]
        if lane is None or not len(mine):
            continue
        on_lane = np.flatnonzero(arrays.lane == lane)
        ends = arrays.end[on_lane]
        for begin, end in zip(steps["start_us"], steps["end_us"]):
            last = on_lane[np.searchsorted(ends, end) : np.searchsorted(ends, end, side="right")]
            inside = mine[(arrays.start[mine] >= begin) & (arrays.start[mine] < end) & (arrays.end[mine] <= end)]  # fmt: skip
            if len(last) and len(inside):
                source += (2 * inside + 1).tolist()
                target += [2 * int(last[-1]) + 1] * len(inside)
    return [Edges.of(source, target, COMPLETION, 0.0)]


def worker_edges(run: LanesAndEvents) -> list[Edges]:
    """On a worker lane, what each gap (or bare annotation) before an event waited for: the
    event's issuer (``launch``: the kernel's launch call, gloo's ``c10d::`` call; else the
    interval of its rank's main lane that held the moment it started) and the other streams'
    work it was made to wait for (``stream wait``, :func:`stream_waits`). Where all of them
    had ended before the gap began, the gap's own start binds it (``queue``: the lane's previous
    event held it). An event right after the one before it, with no gap, starts no sooner than
    its issue (an edge into its start, lag 0: what a what-if that removes the event before must
    meet)."""
    lanes, arrays = run.lanes, run.arrays
    worker = lanes.lanes["worker"].to_numpy()[arrays.lane]
    issuers = worker_event_issuers(run.ev, lanes.intervals)
    issuers = main_lane_issuers(arrays, worker, lanes.main_lanes(), issuers)
    rows = run.rows("worker wait")
    nxt = rows + 1
    follows = nxt < len(arrays.lane)
    follows[follows] = arrays.lane[nxt[follows]] == arrays.lane[rows[follows]]
    issuer = np.full(len(rows), -1, dtype=np.int64)
    issuer[follows] = [issuers.get(int(e), -1) for e in arrays.event[nxt[follows]]]
    known = issuer >= 0
    by, gap, starts = issuer[known], rows[known], arrays.start[nxt[known]]
    held, waited = stream_waits(run, rows)  # positions in rows, and the rows they waited for
    # the events right after another's end on their lane: bounds on their start
    first = np.flatnonzero(worker & (arrays.event >= 0))
    first = first[(first > 0) & (arrays.event[first] != arrays.event[first - 1])]
    first = first[(arrays.lane[first - 1] == arrays.lane[first]) & (run.kind_of[first - 1] != INTERVAL_KINDS.index("worker wait"))]  # fmt: skip
    bound_by = np.array([issuers.get(int(e), -1) for e in arrays.event[first]], dtype=np.int64)
    first, bound_by = first[bound_by >= 0], bound_by[bound_by >= 0]
    return [
        *_issue_edges(arrays, by, starts, 2 * gap + 1, LAUNCH),
        Edges.of(2 * waited + 1, 2 * rows[held] + 1, STREAM_WAIT),
        *_issue_edges(arrays, bound_by, arrays.start[first], 2 * first, LAUNCH, 0.0),
    ]


def stream_waits(run: LanesAndEvents, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The gaps of ``rows`` before an event that its GPU stream was made to wait for other
    streams' work (``cudaStreamWaitEvent``, recorded as a ``cuda_sync`` event "Stream Wait
    Event" with ``enable_cuda_sync_events``): the first work launched on the stream after the
    wait was issued could not start before the last work launched on the waited stream before
    the CUDA event was recorded there had ended. Returns pairs: the position in ``rows`` of the
    gap before the held event, and the interval row of the work it waited for (as HTA's
    critical path reads them); none in a trace recorded without the sync events."""
    none = np.zeros(0, dtype=np.int64)
    syncs = run.syncs
    unmatched, waits = unmatched_stream_waits(syncs), int((syncs["name"] == STREAM_WAIT_EVENT).sum())  # fmt: skip
    if unmatched:
        warnings.warn(
            f"{unmatched} of the {waits} stream waits in these traces (cuda_sync "
            f'"{STREAM_WAIT_EVENT}") do not say which stream\'s event they waited for (the '
            "profiler left wait_on_stream at -1, as it did on torch 2.11 with CUDA 13; torch "
            "2.14.1 also records its CUDA events with cudaEventRecordWithFlags): the critical "
            "path cannot follow them, and the time a stream was held by one counts as its own "
            "queue",
            stacklevel=2,
        )
    syncs = syncs[
        syncs["stream"].notna().to_numpy()
        & syncs["wait_stream"].notna().to_numpy()
        & syncs["waits_for_us"].notna().to_numpy()
        & syncs["launch_us"].notna().to_numpy()
    ]
    if syncs.empty or not len(rows):
        return none, none
    ev, arrays = run.ev, run.arrays
    work = launched_on_a_gpu(ev).sort_values("launch_us", kind="stable")
    row_of = dict(zip(arrays.event.tolist(), range(len(arrays.event))))  # an event's last row
    by_stream = {key: g for key, g in work.groupby(["rank", "stream"], observed=True)}
    gap_of = {int(r) + 1: p for p, r in enumerate(rows.tolist())}  # the event's row -> its gap
    held, waited = [], []
    for rank, stream, issued, on, recorded in zip(
        syncs["rank"], syncs["stream"], syncs["launch_us"], syncs["wait_stream"], syncs["waits_for_us"]
    ):  # fmt: skip
        after, before = by_stream.get((rank, stream)), by_stream.get((rank, on))
        if after is None or before is None:
            continue
        first = np.searchsorted(after["launch_us"].to_numpy(), issued, side="right")
        last = np.searchsorted(before["launch_us"].to_numpy(), recorded, side="left") - 1
        if first >= len(after) or last < 0:
            continue
        first_of = row_of.get(after.index[first])
        gap = None if first_of is None else gap_of.get(first_row(arrays, first_of))
        source = row_of.get(before.index[last])
        if gap is not None and source is not None and arrays.end[source] <= arrays.end[rows[gap]]:
            held.append(gap)
            waited.append(source)
    return np.asarray(held, dtype=np.int64), np.asarray(waited, dtype=np.int64)


#: The name of a ``cuda_sync`` event of a GPU stream made to wait for a CUDA event.
STREAM_WAIT_EVENT = "Stream Wait Event"


def unmatched_stream_waits(events: pd.DataFrame) -> int:
    """How many of ``events``' stream waits (``cuda_sync`` "Stream Wait Event") do not say which
    stream's event they waited for: the profiler could not match the event to its record."""
    waits = (events["cat"] == "cuda_sync").to_numpy() & (events["name"] == STREAM_WAIT_EVENT).to_numpy()  # fmt: skip
    return int((waits & events["wait_stream"].isna().to_numpy()).sum())


def wake_edges(run: LanesAndEvents) -> list[Edges]:
    """On a thread, what each gap, annotation with nothing under it, CUDA call that can block
    or collective's wait waited for: the event on another lane of its rank that ended closest
    to its end (its waker, :func:`.wakers.find_wakers`): for a CUDA call, work on a GPU
    (``sync``); for the others, an event on another CPU thread (``wake-up``). One with no
    waker is its own time."""
    rows = run.rows("thread wait")
    if not len(rows):
        return []
    lanes, ev, arrays = run.lanes, run.ev, run.arrays
    ends = event_ends(lanes.intervals, ev, lanes.lanes["gpu"].to_numpy())
    sync = np.isin(arrays.event[rows], ev.index[name_matches(ev, SYNC_CALLS)])
    wakers = find_wakers(arrays, rows, ends, sync)
    woken = wakers >= 0
    return [
        Edges.of(2 * wakers[woken & ~sync] + 1, 2 * rows[woken & ~sync] + 1, WAKE_UP),
        Edges.of(2 * wakers[woken & sync] + 1, 2 * rows[woken & sync] + 1, SYNC),
    ]


#: The builders, each of the intervals of its kind (see the module).
BUILDERS = (transfer_edges, receive_edges, worker_edges, wake_edges, completion_edges)
