"""The builders of the dependency graph (:mod:`.graph`): each reads a run's lanes cut into
intervals (:func:`.lanes.lane_intervals`) and returns the edges of what some intervals may have
waited for, every candidate it finds; it decides nothing (:func:`.graph.binding_edges` alone
picks, of a moment's edges, the one that held it). Which builder looks at an interval depends
only on what the interval is (:data:`INTERVAL_KINDS`):

1. a collective (an interval of its own, whatever ran inside it): matched on every rank,
   ``transfer`` (:func:`transfer_edges`, through a node of its own from every rank's arrival);
   else its own time;
2. the wait at the end of a send's or a receive's record: ``receive`` and ``send``
   (:func:`receive_edges`: from the send's issue and the receive's posting);
3. on a worker lane (a GPU stream, gloo's collective thread), a gap or an annotation with
   nothing under it: its next event's issuer (``launch``, :func:`worker_edges`: from the end of
   the kernel's launch or of gloo's ``c10d::`` call) and, on a GPU stream made to wait for a
   CUDA event, the other stream's work that the event followed (``stream wait``,
   :func:`.gpu_waits.stream_wait_edges`);
4. on a thread, a gap, an annotation with nothing under it or a collective's wait
   (:data:`WAIT_CALLS`): what ended close to its end on another CPU thread of its rank
   (``wake-up``, :func:`wake_edges`); a CUDA call that blocks
   (:data:`.gpu_waits.BLOCKING_CALLS`): the GPU work it waited for (``sync``,
   :func:`cuda_wait_edges`).

A rank's step also ends no sooner than the collectives it ran on gloo's thread in the step
(:func:`completion_edges`), a step ends when the last of its ranks ended it (``step end``,
:func:`.step_ends.step_end_edges`: through a node of its own), and a worker lane's event starts
no sooner than it was issued, even right after the event before it (a bound, lag 0, from
:func:`worker_edges`). The graph then adds
each interval's edge from its own start (:func:`own_dependencies`: its own time, a worker gap's
``queue``, a collective's ``begin``) and its lane's order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ...traces.kinds import COLLECTIVE_SPANS, GPU_CATEGORIES, name_matches
from .dependencies import (
    BEGIN,
    COMPLETION,
    LAUNCH,
    QUEUE,
    RECEIVE,
    SEND,
    STEP_END,
    STREAM_WAIT,
    SYNC,
    TRANSFER,
    UNTRACED,
    WAKE_UP,
    WORK,
    Dependency,
)
from .gpu_waits import BLOCKING_CALLS, blocked_op_edges, stream_wait_edges, sync_edges
from .graph import Edges, Graph
from .interval_arrays import IntervalArrays, first_row, last_rows
from .step_ends import step_end_edges
from .wakers import event_ends, find_wakers, main_lane_issuers, worker_event_issuers

__all__ = [
    "WAIT_CALLS",
    "LanesAndEvents",
    "Builder",
    "BUILDERS",
    "edges_of",
    "graph_of",
    "own_dependencies",
    "transfer_edges",
    "receive_edges",
    "worker_edges",
    "completion_edges",
    "wake_edges",
    "cuda_wait_edges",
]


@dataclass
class LanesAndEvents:
    """What every builder reads: the run's ``lanes`` (:class:`.lanes.Lanes`, before their
    graph), their events ``ev``, their intervals as ``arrays``, the run's ``cuda_sync`` events
    (``syncs``: what a stream or a CPU call waited for, where the trace recorded it), and what
    each interval is (``kind_of``: one of :data:`INTERVAL_KINDS` per interval); ``hubs``: how
    many nodes of their own the builders have made so far (:meth:`new_hub`)."""

    lanes: Any  # a .lanes.Lanes (which imports this module)
    ev: pd.DataFrame
    arrays: IntervalArrays
    syncs: pd.DataFrame
    kind_of: np.ndarray
    hubs: int = 0
    _ends: dict | None = field(default=None, init=False, repr=False)

    def event_ends(self) -> dict:
        """Where each event of the run ends, by rank (:func:`.wakers.event_ends`): made once,
        for the builders of wake-ups and of syncs alike."""
        if self._ends is None:
            self._ends = event_ends(self.arrays, self.ev, self.lanes.lanes["gpu"].to_numpy())
        return self._ends

    def new_hub(self) -> int:
        """A node of its own, past the intervals' and the hubs made before it
        (:attr:`.graph.Graph.hubs`: a collective's, a step's end)."""
        self.hubs += 1
        return 2 * len(self.arrays.start) + self.hubs - 1

    def rows(self, kind: str) -> np.ndarray:
        """The intervals of one kind (:data:`INTERVAL_KINDS`)."""
        return np.flatnonzero(self.kind_of == INTERVAL_KINDS.index(kind))


#: What an interval can be, for the builders: work of its own, a collective, the wait at the end
#: of a send's or a receive's record, a worker lane's wait (a gap, a bare annotation), a thread's
#: wait (a gap, a bare annotation, a CUDA call that can block, a collective's wait).
INTERVAL_KINDS = ("work", "collective", "point to point", "worker wait", "thread wait")

#: Ops that block their thread until a collective issued earlier has ended on another lane: a
#: functional collective's wait (DTensor's, tensor parallelism's).
WAIT_CALLS = r"^_?c10d_functional::wait_tensor$"


def graph_of(lanes, ev: pd.DataFrame, syncs: pd.DataFrame) -> Graph:
    """The dependency graph of ``lanes`` (:class:`.lanes.Lanes`), whose events are ``ev``, with
    the run's ``cuda_sync`` events ``syncs`` (none: a trace recorded without them): every
    builder of :data:`BUILDERS` on the intervals of its kind."""
    arrays = IntervalArrays.of(lanes.intervals)
    run = LanesAndEvents(lanes, ev, arrays, syncs, _interval_kinds(lanes, ev, arrays))
    parts = edges_of(run)
    return Graph.of(parts, lanes.intervals, own_dependencies(run, parts))


def edges_of(run: LanesAndEvents, across_ranks: bool = False) -> list[Edges]:
    """Every edge the builders of :data:`BUILDERS` find in ``run``; ``across_ranks``: only
    those of the builders whose dependencies join ranks, which the graph of a run read rank by
    rank joins its ranks with (:func:`.from_rank_parts.ports_graph`)."""
    return [edges for b in BUILDERS if b.across or not across_ranks for edges in b.build(run)]


def _interval_kinds(lanes, ev: pd.DataFrame, arrays: IntervalArrays) -> np.ndarray:
    """What each interval is (a position in :data:`INTERVAL_KINDS`)."""
    label = arrays.event
    pos = ev.index.get_indexer(label)
    has, at = pos >= 0, np.maximum(pos, 0)
    annotation = has & (ev["kind"] == "annotation").to_numpy()[at]
    blocks = has & (name_matches(ev, BLOCKING_CALLS) | name_matches(ev, WAIT_CALLS))[at]
    worker = lanes.lanes["worker"].to_numpy()[arrays.lane]
    kind = np.where(~has | annotation, np.where(worker, 3, 4), 0)
    kind[blocks] = 4  # a thread held in a call, on any lane
    kind[point_to_point_waits(lanes, arrays)] = 2
    kind[np.fromiter(lanes.keys, dtype=np.int64, count=len(lanes.keys))] = 1
    return kind


def own_dependencies(run: LanesAndEvents, parts: list[Edges]) -> np.ndarray:
    """Each interval's edge from its own start, as a dependency code: ``begin`` for a collective
    matched on every rank, ``queue`` for a worker lane's gap that waited for something (what it
    waited for had ended before it began: its previous event held it), ``untraced`` for another
    gap, ``work`` for an event (a collective not matched on every rank holds its rank for its
    own time)."""
    arrays = run.arrays
    waited = np.zeros(len(arrays.event), dtype=bool)
    for edges in parts:
        if edges.dependency.waits:
            waited[edges.target[edges.target % 2 == 1] // 2] = True
    gap = arrays.event < 0
    own = np.where(gap, UNTRACED.code, WORK.code)
    own[gap & waited & (run.kind_of == INTERVAL_KINDS.index("worker wait"))] = QUEUE.code
    own[np.fromiter(run.lanes.instance, dtype=np.int64, count=len(run.lanes.instance))] = BEGIN.code
    return own.astype(np.int8)


def transfer_edges(run: LanesAndEvents) -> list[Edges]:
    """``transfer``: each matched collective's interval on one rank ends when the last rank has
    arrived, plus the collective's transfer (its shortest duration across the ranks). Through a
    node of its own per collective (:attr:`.graph.Graph.hubs`: numbered past the intervals'), so
    that a collective of n ranks has 2n edges, not n²: an edge from every rank's arrival (its
    interval's start, in the order of the ranks) to it, and one from it to every rank's end.

    A collective that a rank left before another arrived (gloo's broadcast of 3 ranks or more: a
    receiver needs only the root's data) waited on that rank only for the ranks that had
    arrived by then: an edge from each of their arrivals to its end, its delay after the last of
    them as measured, and no node of its own."""
    lanes, arrays = run.lanes, run.arrays
    source, target, lag = [], [], []
    for instance, arrivals in lanes.arrivals.items():
        rows = np.asarray(arrivals, dtype=np.int64)
        arrived, ended = arrays.start[rows], arrays.end[rows]
        if (ended >= arrived.max()).all():
            transfer = lanes.transfer_us[instance]
            transfer = 0.0 if transfer != transfer else transfer  # no duration known
            hub = run.new_hub()
            source += [2 * j for j in arrivals] + [hub] * len(arrivals)
            target += [hub] * len(arrivals) + [2 * j + 1 for j in arrivals]
            lag += [0.0] * len(arrivals) + [transfer] * len(arrivals)
            continue
        for row, end in zip(rows.tolist(), ended.tolist()):
            came = arrived <= end
            source += (2 * rows[came]).tolist()
            target += [2 * row + 1] * int(came.sum())
            lag += [end - arrived[came].max()] * int(came.sum())
    return [Edges.of(source, target, TRANSFER, lag)]


def point_to_point_waits(lanes, arrays: IntervalArrays) -> np.ndarray:
    """The intervals that are the waits at the end of a send's or a receive's record
    (:attr:`.lanes.Lanes.records`: those the run pairs, :func:`..point_to_point.sends_and_receives`)."""
    if lanes.records is None or not len(lanes.records):
        return np.zeros(0, dtype=np.int64)
    rows = last_rows(arrays, np.asarray(lanes.records, dtype=np.int64))
    return rows[rows >= 0]


def _issue_edges(arrays: IntervalArrays, rows, issued, target, dependency, lag=None) -> list[Edges]:  # fmt: skip
    """The edges from calls (interval ``rows``) to what they issued (the ``target`` nodes, that
    began, or arrived, at ``issued``): from each call's end, or from its start where what it
    issued began before the call returned (a blocking copy, a send whose data arrived before
    ``c10d::send`` returned, gloo's thread starting a collective while its ``c10d::`` call goes
    on), marked :attr:`~.graph.Edges.during`."""
    rows, issued, target = (np.asarray(a) for a in (rows, issued, target))
    late = arrays.end[rows] > issued
    return [
        Edges.of(2 * rows[~late] + 1, target[~late], dependency, lag),
        Edges.of(2 * rows[late], target[late], dependency, lag, during=True),
    ]


def receive_edges(run: LanesAndEvents) -> list[Edges]:
    """``receive`` and ``send``: a send and its receive (the lanes' ``pairs``,
    :func:`..point_to_point.sends_and_receives`; a trace without peers has none) move data once
    both were issued: the send (the end of its ``c10d::send``, on the sender's lane) and the
    receive (the start of its ``c10d::recv_``). The wait at the end of the receive's record
    (``gloo:recv``, cut to the wait by :func:`..point_to_point.waits_in_records`) waited for
    both, and so did the wait at the end of the send's record: an edge from each to each. A
    wait that began once both were issued held only the transfer: its own start binds it."""
    arrays, pairs = run.arrays, run.lanes.pairs
    if pairs is None or pairs.empty:
        return []
    found: dict[Any, tuple[list, ...]] = {RECEIVE: ([], [], [], []), SEND: ([], [], [], [])}
    labels = pairs[["send", "receive", "receive_record", "send_record"]].to_numpy(dtype=np.int64)
    rows = np.where(labels >= 0, last_rows(arrays, labels.ravel()).reshape(labels.shape), -1)
    for sent, posted, *waits in rows.tolist():  # each event's last interval row (-1: none)
        if min(sent, posted, waits[0]) < 0:
            continue
        for dependency, wait in zip((RECEIVE, SEND), waits):
            if wait >= 0:
                senders, arrived, posts, target = found[dependency]
                senders.append(sent)
                # the wait was met by then: a call still running at that moment met it
                # during the call (a send waited for at the step's end was not)
                arrived.append(arrays.end[wait])
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
    # each rank's end of each step: its main lane's interval there (:mod:`.step_ends`)
    ended = {(int(arrays.rank[r]), step): r for step, rows in lanes.step_ends.items() for r in rows}
    source, target = [], []
    for rank, step, begin, end in lanes.steps[["rank", "step", "start_us", "end_us"]].itertuples(index=False):  # fmt: skip
        last = ended.get((int(rank), int(step)), -1)
        mine = collectives[arrays.rank[collectives] == rank]
        if last < 0 or arrays.end[last] != end or not len(mine):
            continue
        inside = mine[(arrays.start[mine] >= begin) & (arrays.start[mine] < end) & (arrays.end[mine] <= end)]  # fmt: skip
        source += (2 * inside + 1).tolist()
        target += [2 * last + 1] * len(inside)
    return [Edges.of(source, target, COMPLETION, 0.0)]


def worker_edges(run: LanesAndEvents) -> list[Edges]:
    """``launch``: on a worker lane, each gap (or bare annotation) before an event waited for
    the event's issuer (the kernel's launch call, gloo's ``c10d::`` call; else the interval of
    its rank's main lane that held the moment it started); a GPU stream may also have waited for
    another's work (:func:`.gpu_waits.stream_wait_edges`). Where all of it had ended before the
    gap began, the gap's own start binds it (``queue``: the lane's previous event held it). An
    event right after the one before it, with no gap, starts no sooner than its issue (an edge
    into its start, lag 0: what a what-if that removes the event before must meet)."""
    lanes, arrays = run.lanes, run.arrays
    worker = lanes.lanes["worker"].to_numpy()[arrays.lane]
    issuers = worker_event_issuers(run.ev, arrays)
    ev = run.ev
    kinds = ev["cat"].isin(GPU_CATEGORIES).to_numpy() | name_matches(ev, COLLECTIVE_SPANS)
    issued = worker & np.isin(arrays.event, ev.index[kinds])
    issuers = main_lane_issuers(arrays, issued, lanes.main_lanes(), issuers)
    rows = run.rows("worker wait")
    nxt = rows + 1
    follows = nxt < len(arrays.lane)
    follows[follows] = arrays.lane[nxt[follows]] == arrays.lane[rows[follows]]
    issuer = np.full(len(rows), -1, dtype=np.int64)
    issuer[follows] = [issuers.get(int(e), -1) for e in arrays.event[nxt[follows]]]
    known = issuer >= 0
    by, gap, starts = issuer[known], rows[known], arrays.start[nxt[known]]
    # the events right after another's end on their lane: bounds on their start
    first = np.flatnonzero(worker & (arrays.event >= 0))
    first = first[(first > 0) & (arrays.event[first] != arrays.event[first - 1])]
    first = first[(arrays.lane[first - 1] == arrays.lane[first]) & (run.kind_of[first - 1] != INTERVAL_KINDS.index("worker wait"))]  # fmt: skip
    bound_by = np.array([issuers.get(int(e), -1) for e in arrays.event[first]], dtype=np.int64)
    first, bound_by = first[bound_by >= 0], bound_by[bound_by >= 0]
    return [
        *_issue_edges(arrays, by, starts, 2 * gap + 1, LAUNCH),
        *_issue_edges(arrays, bound_by, arrays.start[first], 2 * first, LAUNCH, 0.0),
    ]


def wake_edges(run: LanesAndEvents) -> list[Edges]:
    """``wake-up``: on a thread, what each gap, annotation with nothing under it or
    collective's wait waited for: the event on another CPU thread of its rank that ended
    closest to its end (its waker, :func:`.wakers.find_wakers`; a thread outside a CUDA call
    does not wait for the GPU). One with no waker is its own time. (A CUDA call that blocks:
    :func:`.gpu_waits.sync_edges`.)"""
    rows = run.rows("thread wait")
    rows = rows[~np.isin(run.arrays.event[rows], run.ev.index[name_matches(run.ev, BLOCKING_CALLS)])]  # fmt: skip
    if not len(rows):
        return []
    waits = np.isin(run.kind_of, [INTERVAL_KINDS.index("worker wait"), INTERVAL_KINDS.index("thread wait")])  # fmt: skip
    wakers = find_wakers(run.arrays, rows, run.event_ends(), np.zeros(len(rows), dtype=bool), waits)  # fmt: skip
    woken = wakers >= 0
    return [Edges.of(2 * wakers[woken] + 1, 2 * rows[woken] + 1, WAKE_UP)]


def cuda_wait_edges(run: LanesAndEvents) -> list[Edges]:
    """``sync``: what each CUDA call that blocks a thread waited for on the GPU
    (:func:`.gpu_waits.sync_edges`)."""
    return sync_edges(run, run.rows("thread wait"))


@dataclass(frozen=True)
class Builder:
    """A builder of the graph: ``build`` finds the edges of the dependencies it ``makes`` (which
    intervals it looks at, its docstring and the module's list say). One that makes a
    dependency across ranks (:attr:`.dependencies.Dependency.across`) builds the graph of a run
    read rank by rank too: adding one is a row of :data:`BUILDERS`, for both graphs."""

    build: Callable[[LanesAndEvents], list[Edges]]
    makes: tuple[Dependency, ...]

    @property
    def across(self) -> bool:
        """Whether its edges may join two ranks."""
        return any(d.across for d in self.makes)


#: The builders, each of the intervals of its kind (see the module): the one list that the graph
#: of a whole run (:func:`graph_of`) and the graph across ranks of a run read rank by rank
#: (:func:`.from_rank_parts.ports_graph`) both select from (:func:`edges_of`).
BUILDERS = (
    Builder(transfer_edges, (TRANSFER,)),
    Builder(receive_edges, (RECEIVE, SEND)),
    Builder(worker_edges, (LAUNCH,)),
    Builder(stream_wait_edges, (STREAM_WAIT,)),
    Builder(wake_edges, (WAKE_UP,)),
    Builder(cuda_wait_edges, (SYNC,)),
    Builder(blocked_op_edges, (SYNC,)),
    Builder(completion_edges, (COMPLETION,)),
    Builder(step_end_edges, (STEP_END,)),
)
