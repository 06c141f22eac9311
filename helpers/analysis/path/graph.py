"""The dependency graph under the critical path: each moment of a run's lanes and what it waited
for, one table of edges that the path (:mod:`.walk`), the replay (:mod:`.replay`), the path rank
by rank (:mod:`.rank_part`), the report and the figure all read.

**Nodes.** Interval ``i`` of :func:`.lanes.lane_intervals` (a stretch of one lane: an op's own
time, a collective, a gap) has two: ``2i``, its start, and ``2i + 1``, its end.

**Edges.** Rows of arrays: ``source`` node, ``target`` node, ``dependency`` (a code into
:data:`.dependencies.DEPENDENCIES`) and ``lag`` (µs): the target happens no sooner than ``lag``
after the source. The builders (:mod:`.builders`) add the edges of what each interval may have
waited for, every candidate they find; :meth:`Graph.of` adds the rest:

- every interval's end has one edge from its own start (:attr:`~.dependencies.Dependency.own_start`):
  its own time (``work``, ``untraced``, ``queue``) or, for a collective, ``begin`` (lag 0);
- every interval's start has one from the end of the one before it on its lane (``lane order``);
- a collective goes through a node of its own past the intervals' (a *hub*: every rank's arrival
  into it, and out of it to every rank's end, :func:`.builders.transfer_edges`), and so does a
  step's end (every rank's end of the step into it, :mod:`.step_ends`);
- the edges of a wait (:attr:`~.dependencies.Dependency.waits`) and the wait's own edge all carry
  the wait's *delay*: how long after the last of what it waited for (its own start included) it
  ended, as measured (:func:`wait_delays`). So a wait ends that long after whichever of its
  candidates comes last, as measured or once a what-if moves them.

**The last arrival decides.** Of a node's edges, the one whose source, measured, arrived last
(its time plus the lag) *binds* it: :func:`binding_edges` decides it once, for every node, with
:func:`latest`, the one implementation of the rule; ties go to the source on the node's own rank,
then to the dependency listed first, then to the edge made first (a step's end: the lowest
rank). The path walks back along binding edges (:meth:`Graph.came_from`); the replay
(:func:`replayed_times`) takes the latest of *all* a node's edges, so a what-if that shortens the
binding one still meets the others. :func:`validate` says where the graph is not what it should
be: negative lags, cycles.

**Adding a dependency** (a receive waiting for its send, say): a row in
:data:`.dependencies.DEPENDENCIES` (its name is the path's reason; its place in the table breaks
ties), a builder in :mod:`.builders` (a function of the run's :class:`~.builders.LanesAndEvents`
and the intervals it may hold, that returns its :class:`Edges`), its row in
:data:`.builders.BUILDERS` (which both the whole run's graph and, for a dependency that joins
ranks, the graph of a run read rank by rank select from), and rows of tiny traces and the edges
they must give in
``tests/test_graph.py``'s ``BUILDERS``, and a case with a known answer in
``tests/test_known_answers.py``. The path, the replay, the figure and the report then read it
with no change: none of them names a dependency (but where a step's path begins, the binding
edge of the step's end, :mod:`.step_ends`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .dependencies import BEGIN, DEPENDENCIES, LANE_ORDER, Dependency

__all__ = [
    "EXACT",
    "FROM_CALLS",
    "FROM_TIMING",
    "INFERRED_SAYS",
    "Edges",
    "Graph",
    "binding_edges",
    "latest",
    "wait_delays",
    "replayed_times",
    "validate",
]

_CODE = np.int8

#: How an edge was found: the trace says it (a sync record, a correlation id), or it was
#: inferred from the CUDA calls around the wait on its thread, or from the GPU's own timing
#: (what ended just before the wait did, where nothing in the trace says what it waited for).
EXACT, FROM_CALLS, FROM_TIMING = 0, 1, 2
#: What the path's ``waited_for`` adds for each way an edge was inferred.
INFERRED_SAYS = {EXACT: "", FROM_CALLS: " (inferred)", FROM_TIMING: " (inferred from timing)"}
_WAITS = np.array([d.waits for d in DEPENDENCIES], dtype=bool)
_OWN_START = np.array([d.own_start for d in DEPENDENCIES], dtype=bool)
_OWN_TIME = np.array([d.own_time for d in DEPENDENCIES], dtype=bool)
#: What an interval waited for, that goes with it when a what-if removes it.
_HELD = np.array([d.waits or d.collective for d in DEPENDENCIES], dtype=bool)


@dataclass
class Edges:
    """Some edges of the graph, as a builder returns them: ``source`` and ``target`` nodes, their
    ``dependency`` (one for all), each edge's ``lag`` (µs; None for the edges of a wait, whose
    lag is the wait's delay, :func:`wait_delays`), whether the target was issued *during*
    the source's interval, the source being its start (a call that returned after what it
    issued began: the path goes on in the call at the target's moment), and how it was found
    (``inferred``: :data:`EXACT`, :data:`FROM_CALLS` or :data:`FROM_TIMING`; the path says
    which)."""

    source: np.ndarray
    target: np.ndarray
    dependency: Dependency
    lag: np.ndarray | None = None
    during: bool = False
    inferred: int = EXACT

    @classmethod
    def of(
        cls, source, target, dependency: Dependency, lag=None, during=False, inferred=EXACT
    ) -> Edges:
        source = np.asarray(source, dtype=np.int64)
        if lag is not None:
            lag = np.broadcast_to(np.asarray(lag, dtype=float), source.shape).copy()
        return cls(source, np.asarray(target, dtype=np.int64), dependency, lag, during, inferred)


@dataclass
class Graph:
    """The graph of a run's intervals: ``source, target, dependency, lag, during, inferred`` per
    edge (arrays, :class:`Edges`), ``time`` per node (measured, µs), ``rank`` per node, and
    ``binding``: per node, the edge that decided it (-1: none, the first moment of a lane)."""

    source: np.ndarray
    target: np.ndarray
    dependency: np.ndarray
    lag: np.ndarray
    during: np.ndarray
    inferred: np.ndarray
    time: np.ndarray
    rank: np.ndarray
    binding: np.ndarray
    #: the nodes in an order where each comes after its sources, with those in a cycle (and
    #: after one) last, and how many those are: found by the first :func:`replayed_times` and
    #: kept (a graph's edges never change once it is made; an order of all its edges is one of
    #: any fewer, where no cycle is left out)
    order: tuple[list[int], int] | None = field(default=None, init=False, repr=False, compare=False)  # fmt: skip

    @classmethod
    def of(cls, parts: list[Edges], intervals: pd.DataFrame, own: np.ndarray) -> Graph:
        """The graph of ``intervals`` (:attr:`.lanes.Lanes.intervals`: ``lane_id, rank,
        start_us, end_us``, sorted by lane then time) from the builders' edges (``parts``),
        each interval's edge from its own start (``own``: the code of its dependency, one per
        interval) and its lane's order added, every wait's delay measured and the binding edges
        decided (:func:`binding_edges`)."""
        starts, ends = intervals["start_us"].to_numpy(float), intervals["end_us"].to_numpy(float)
        lane = intervals["lane_id"].to_numpy()
        rows = np.arange(len(starts))
        hubs = max((int(p.target.max()) + 1 for p in parts if len(p.target)), default=0)
        hubs = max(hubs - 2 * len(starts), 0)
        time = np.r_[np.ravel(np.column_stack([starts, ends])), np.full(hubs, -np.inf)]
        rank = np.r_[np.repeat(intervals["rank"].to_numpy(), 2), np.full(hubs, -1)]
        after = rows[1:][lane[1:] == lane[:-1]]
        parts = [
            *parts,
            Edges.of(2 * rows, 2 * rows + 1, BEGIN),  # own edges: their codes and lags below
            Edges.of(2 * after - 1, 2 * after, LANE_ORDER, 0.0),
        ]
        source = np.concatenate([p.source for p in parts])
        target = np.concatenate([p.target for p in parts])
        dependency = np.concatenate([np.full(len(p.source), p.dependency.code, _CODE) for p in parts])  # fmt: skip
        lag = np.concatenate([np.full(len(p.source), np.nan) if p.lag is None else p.lag for p in parts])  # fmt: skip
        during = np.concatenate([np.full(len(p.source), p.during) for p in parts])
        inferred = np.concatenate([np.full(len(p.source), p.inferred, np.int8) for p in parts])
        mine = slice(len(source) - len(after) - len(rows), len(source) - len(after))
        dependency[mine] = own
        # a hub's measured moment: the last arrival of what goes through it (lag 0)
        into = target >= 2 * len(starts)
        np.maximum.at(time, target[into], time[source[into]])
        delay = wait_delays(source, target, dependency, time[: 2 * len(starts)], during)
        waiting = ~np.isnan(delay)
        lag[mine] = np.where(_OWN_TIME[own], np.where(waiting, delay, ends - starts), 0.0)
        waits = _WAITS[dependency] & (target % 2 == 1)
        lag[waits] = delay[target[waits] // 2]
        # a wait issued during a call: that long into it (a bound into a start keeps its lag)
        issued = during & waits
        lag[issued] = time[target[issued]] - time[source[issued]]
        binding = binding_edges(source, target, dependency, lag, time, rank)
        return cls(source, target, dependency, lag, during, inferred, time, rank, binding)

    @property
    def intervals(self) -> int:
        """How many intervals the graph is of (their nodes come first: ``2i``, ``2i + 1``)."""
        return (len(self.time) - self.hubs) // 2

    @property
    def hubs(self) -> int:
        """How many nodes are past the intervals' (a collective's, that every rank's arrival
        goes into and every rank's end comes out of; a step's end, that every rank's end of the
        step goes into)."""
        return int((self.rank < 0).sum())

    def came_from(self, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where a walk back along each of ``edges`` (binding edges) goes on: the node the edge
        comes from (a hub's last arrival, :meth:`behind`), and when: that node's time, or, for
        an edge issued *during* its source's interval (a call still under way), its target's
        time, at which the walk enters the call. The whole run's walk and the path strung rank
        by rank both step back so."""
        edges = np.asarray(edges, dtype=np.int64)
        source = self.behind(self.source[edges])
        return source, np.where(self.during[edges], self.time[self.target[edges]], self.time[source])  # fmt: skip

    def behind(self, nodes: np.ndarray) -> np.ndarray:
        """``nodes``, each hub replaced by the node its binding edge comes from (a collective's
        last arrival, the rank that ended a step last)."""
        nodes = np.asarray(nodes)
        hub = nodes >= len(self.time) - self.hubs
        out = nodes.copy()
        out[hub] = self.source[self.binding[nodes[hub]]]
        return out


def wait_delays(source, target, dependency, time, during) -> np.ndarray:
    """Per interval, how long after the last of what it waited for it ended: its end less the
    latest of its start and its wait edges' sources (:attr:`.dependencies.Dependency.waits`; a
    source that issued it ``during`` its interval counts at the wait's end: it issued it then),
    as measured; never below 0 (a source that ended after the wait had ended, a span closed
    late, arrives after it: the replay says so); NaN for an interval with no wait edge.

    Args:
        source: each edge's source node.
        target: each edge's target node.
        dependency: each edge's dependency code.
        time: each node's measured time (µs).
        during: per edge, whether its target was issued during its source's interval.
    """
    n = len(time) // 2
    waits = _WAITS[dependency] & (target % 2 == 1)  # into a start: a bound with its own lag
    last = np.full(n, -np.inf)
    source, target, during = source[waits], target[waits], during[waits]
    np.maximum.at(last, target // 2, np.where(during, time[target], time[source]))
    waiting = np.isfinite(last)
    delay = np.full(n, np.nan)
    delay[waiting] = np.maximum(time[1::2][waiting] - np.maximum(last[waiting], time[0::2][waiting]), 0.0)  # fmt: skip
    return delay


def latest(arrival: np.ndarray, group: np.ndarray, *tie_breaks: np.ndarray) -> np.ndarray:
    """For each group, the position of its latest ``arrival`` (the last arrival decides), ties
    going to the smallest ``tie_breaks`` in order, then to the first position: one position per
    group, in the order of the sorted group ids."""
    if not len(group):
        return np.zeros(0, dtype=np.int64)
    keys = [np.arange(len(group))[::-1], *[-t for t in tie_breaks[::-1]], arrival, group]
    order = np.lexsort(keys)
    last = np.r_[group[order][1:] != group[order][:-1], True]
    return order[last]


def binding_edges(source, target, dependency, lag, time, rank) -> np.ndarray:
    """Per node, the edge that decided it at the measured times: the one whose source arrived
    last (its time plus the lag), ties going to a source on the node's own rank (clocks of two
    machines may disagree by more than the gap), then to the dependency listed first in
    :data:`.dependencies.DEPENDENCIES`, then to the edge listed first; -1 for a node without
    edges.

    Args:
        source: each edge's source node.
        target: each edge's target node.
        dependency: each edge's dependency code.
        lag: each edge's lag (µs).
        time: each node's measured time (µs).
        rank: each node's rank.
    """
    binding = np.full(len(time), -1, dtype=np.int64)
    if not len(source):
        return binding
    alone = np.bincount(target, minlength=len(time))[target] == 1  # most nodes: one edge
    binding[target[alone]] = np.flatnonzero(alone)
    edges = np.flatnonzero(~alone)  # the others' edges, in their order
    source, target = source[edges], target[edges]
    arrival = time[source] + lag[edges]
    other_rank = (rank[source] != rank[target]).astype(np.int64)
    chosen = latest(arrival, target, other_rank, dependency[edges].astype(np.int64))
    binding[target[chosen]] = edges[chosen]
    return binding


def replayed_times(graph: Graph, shrink: np.ndarray | None = None, sooner: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Every node's time with each interval's own time multiplied by ``shrink`` (one factor per
    interval; 1 keeps it, 0 removes it: its end then only waits for its start) and, given
    ``sooner`` (µs per interval), each edge into an interval's end that much shorter (never
    below 0: a wait that lasted that much less): a max-plus pass over every edge, in an order
    where each node comes after its sources (nodes in a cycle, :func:`validate`, and those after
    them keep their measured time: no order satisfies them)."""
    n = len(graph.time)
    lag = graph.lag.copy()
    if sooner is not None:
        into_end = (graph.target % 2 == 1) & (graph.target < 2 * graph.intervals)
        cut = np.zeros(len(lag))
        cut[into_end] = sooner[graph.target[into_end] // 2]
        lag = np.where(cut > 0, np.maximum(lag - cut, 0.0), lag)
    keep = np.ones(len(lag), dtype=bool)
    if shrink is not None:
        own = _OWN_START[graph.dependency]
        lag[own] *= shrink[graph.target[own] // 2]
        shrink = np.r_[shrink, np.ones(graph.hubs)]  # a hub is no interval: nothing removes it
        # what a removed interval waited for goes with it (a step's end still waits for its
        # collectives, whatever ended the step)
        removed = shrink[graph.target // 2] == 0.0
        keep = ~(removed & (graph.target % 2 == 1) & _HELD[graph.dependency])
    source, target, lag = graph.source[keep], graph.target[keep], lag[keep]
    order = np.argsort(target, kind="stable")
    source, target, lag = source[order], target[order], lag[order]
    first = np.searchsorted(target, np.arange(n + 1))
    ordered, stuck = _order(graph)
    if stuck and not keep.all():  # a cycle: without some of its edges, it may be gone
        ordered, left = _topological(n, source, target, first)
        stuck = len(left)
    value = graph.time.tolist()  # floats in lists: a node at a time, as fast as Python goes
    sources, lags, first = source.tolist(), lag.tolist(), first.tolist()
    for node in ordered[: n - stuck]:
        lo, hi = first[node], first[node + 1]
        if hi == lo + 1:  # most nodes: one edge
            value[node] = value[sources[lo]] + lags[lo]
        elif hi > lo:
            value[node] = max([value[s] + g for s, g in zip(sources[lo:hi], lags[lo:hi])])
    return np.array(value)


def validate(graph: Graph, names: list[str] | None = None) -> pd.DataFrame:
    """What is wrong with ``graph``: one row per finding, ``problem`` (``negative lag``: an edge
    that lets its target happen before its source; ``cycle``: nodes that wait, through their
    edges, for themselves, which no order of the run can satisfy), ``dependency``, the
    ``nodes`` touched and, given each interval's name in ``names``, the ``events``. An empty
    table: the graph is a graph of a run (HTA's critical path refuses both)."""
    rows = []
    for e in np.flatnonzero(graph.lag < 0):
        rows.append(("negative lag", DEPENDENCIES[graph.dependency[e]].name, [int(graph.source[e]), int(graph.target[e])]))  # fmt: skip
    ordered, left = _order(graph)
    stuck = np.array(ordered[len(ordered) - left :], dtype=np.int64)
    for cycle in _cycles(stuck, graph):
        kinds = sorted({DEPENDENCIES[graph.dependency[e]].name for e in cycle})
        nodes = sorted({int(graph.target[e]) for e in cycle})
        rows.append(("cycle", ", ".join(kinds), nodes))
    found = pd.DataFrame(rows, columns=["problem", "dependency", "nodes"])
    if names is not None:
        named = [*names, *["(a hub: a collective's or a step's end)"] * graph.hubs]
        found["events"] = [[named[node // 2] if node < 2 * len(names) else named[-1] for node in nodes] for nodes in found["nodes"]]  # fmt: skip
    return found


def _order(graph: Graph) -> tuple[list[int], int]:
    """:attr:`Graph.order`, found the first time it is asked for."""
    if graph.order is None:
        n = len(graph.time)
        every = np.argsort(graph.target, kind="stable")
        starts = np.searchsorted(graph.target[every], np.arange(n + 1))
        ordered, stuck = _topological(n, graph.source[every], graph.target[every], starts)
        graph.order = (ordered, len(stuck))
    return graph.order


def _cycles(stuck: np.ndarray, graph: Graph) -> list[list[int]]:
    """One cycle of edges per group of ``stuck`` nodes (those Kahn's order could not place):
    from each, follow an edge whose source is stuck too until a node comes back."""
    left = set(stuck.tolist())
    into: dict[int, list[int]] = {}
    for e in np.flatnonzero(np.isin(graph.target, stuck) & np.isin(graph.source, stuck)):
        into.setdefault(int(graph.target[e]), []).append(int(e))
    cycles = []
    for node in sorted(left):  # the smallest left first (a min() each time: n² on many nodes)
        if node not in left:
            continue
        seen, edges = {}, []
        while node not in seen and node in left and node in into:
            seen[node] = len(edges)
            edge = into[node][0]
            edges.append(edge)
            node = int(graph.source[edge])
        if node in seen:
            cycles.append(edges[seen[node] :])
        left -= set(seen) | {node}
    return cycles


def _topological(n: int, source, target, first) -> tuple[list[int], np.ndarray]:
    """The nodes in an order where each comes after its sources (Kahn's algorithm), those left
    in a cycle last, in their own order; and those left (an array). ``first``: where each
    node's edges begin in ``source``/``target`` (sorted by target)."""
    waiting = np.diff(first)
    by_source = np.argsort(source, kind="stable")
    followers_of = target[by_source].tolist()
    starts = np.searchsorted(source[by_source], np.arange(n + 1)).tolist()
    waiting = waiting.tolist()
    ready = deque(i for i in range(n) if waiting[i] == 0)
    order: list[int] = []
    while ready:
        node = ready.popleft()
        order.append(node)
        for f in followers_of[starts[node] : starts[node + 1]]:
            waiting[f] -= 1
            if waiting[f] == 0:
                ready.append(f)
    stuck = np.zeros(0, dtype=np.int64)
    if len(order) < n:
        placed = np.zeros(n, dtype=bool)
        placed[order] = True
        stuck = np.flatnonzero(~placed)
        order += stuck.tolist()
    return order, stuck
