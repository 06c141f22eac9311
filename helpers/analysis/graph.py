"""The dependency graph under the critical path: each moment of a run's lanes and what it waited
for, one table of edges that the path (:mod:`.critical_path`), the replay (:mod:`.replay`), the
path rank by rank (:mod:`.path_by_rank`), the report and the figure all read.

**Nodes.** Interval ``i`` of :func:`.lanes.lane_intervals` (a stretch of one lane: an op's own
time, a collective, a gap) has two: ``2i``, its start, and ``2i + 1``, its end.

**Edges.** Rows of arrays: ``source`` node, ``target`` node, ``dependency`` (a code into
:data:`DEPENDENCIES`) and ``lag`` (µs): the target happens no sooner than ``lag`` after the
source. Every interval's end has exactly one edge from its own start (its own time, or 0 for a
wait: a wait ends no sooner than it began); an interval's start has one edge from the end of the
interval before it on its lane; a wait's end has one edge more from each thing it waited for.

**The last arrival decides.** Of a node's edges, the one whose source, measured, arrived last
(its time plus the lag) *binds* it: :func:`binding_edges` decides it once, for every node, ties
going to the source on the node's own rank, then to the dependency listed first. The path walks
back along binding edges; the replay (:func:`retime`) takes the latest of *all* a node's edges,
so a what-if that shortens the binding one still meets the others.

**The dependencies** (:data:`DEPENDENCIES`, one row each; the path's ``reason`` is the row's
name):

- ``work``: an event's own time (its time less the events inside it);
- ``untraced``: time on a lane with no event that nothing is found to have ended (Python between
  ops, a sleep, a slow input pipeline);
- ``queue``: a worker lane's gap before an event issued earlier: the lane's previous event held
  it;
- ``wake-up``: a thread that waited (a gap, an annotation with nothing under it, a CUDA
  synchronisation, a functional collective's ``wait_tensor``) until something on another lane
  of its rank ended: its *waker* (gloo's thread finishing a collective, the autograd thread's
  op, a kernel), the few µs between;
- ``stream wait``: a GPU stream's gap until the work on another stream that it was made to
  wait for ended (``cudaStreamWaitEvent`` on a CUDA event recorded after that work; the trace
  says so with ``enable_cuda_sync_events``);
- ``launch``: a worker lane's gap (a GPU stream, gloo's collective thread) until its next event
  was issued (a kernel's launch, a gloo collective's ``c10d::`` call);
- ``transfer``: a collective matched on several ranks ends when the last rank has arrived, plus
  its transfer (its shortest duration across the ranks): an edge from each rank's arrival;
- ``receive``: a receive's wait ends when the later of its send (on another rank) and its own
  posting happened, plus the transfer: an edge from each; ``send``: a send's wait, likewise;
- ``completion``: a rank's step ends no sooner than the collectives it ran on gloo's thread in
  it (lag 0; the measured step ended later, so it binds only where a what-if moves the rest
  earlier);
- ``begin``: a wait ends no sooner than it began (lag 0);
- ``lane order``: an interval starts where the one before it on its lane ended.

**Adding a dependency** (a receive waiting for its send, say): a
row in :data:`DEPENDENCIES` (its name is the path's reason; its place in the table breaks ties),
a builder in :mod:`.edges` (a function of the run's :class:`~.edges.Ground` and the intervals it
may decide, that returns what it :class:`~.edges.Built`: those it decided and its
:class:`Edges`), its place in :func:`.edges.graph_of`'s order, and rows of tiny traces and the
edges they must give in ``tests/test_graph.py``'s ``BUILDERS``. The path, the replay, the figure and the report then read it with no
change: none of them names a dependency.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Dependency",
    "DEPENDENCIES",
    "DEPENDENCY",
    "Edges",
    "Graph",
    "binding_edges",
    "latest",
    "retime",
    "dependency_names",
    "segment_kind",
    "own_reason",
    "UNTRACED",
    "UNTRACED_NAME",
    "COLLECTIVE_KIND",
]


@dataclass(frozen=True)
class Dependency:
    """One kind of dependency between two moments of a run.

    name: the word for it, and the path's ``reason`` for a segment it decides.
    segment_kind: the ``kind`` the path gives such a segment; None: the kind of its event.
    own_time: its edge runs from an interval's start to its end and carries the interval's
        duration (a what-if that shortens the interval's events shortens it).
    removable: a what-if can remove it by naming its event: the report offers it as a fix.
    dotted: the figure draws it dotted (time that is no work of the rank's own).
    means: what it is, in words.
    names_next: its segment is named after the event that starts after the gap (a launch:
        the kernel launched), not the gap.
    collective: it ends when the last of several ranks arrived: the path takes the transfer,
        on the rank that arrived last, and goes on there (always a segment, even of no time,
        so that the move is seen).
    """

    name: str
    segment_kind: str | None
    own_time: bool
    removable: bool
    dotted: bool
    means: str
    names_next: bool = False
    collective: bool = False


#: The dependencies, one row each: the order breaks ties between edges that arrive together.
DEPENDENCIES: tuple[Dependency, ...] = (
    Dependency("transfer", "communication", False, False, False,
               "a collective on one rank, held until the last rank arrived, then its transfer",
               collective=True),
    Dependency("receive", "communication", False, False, False,
               "a receive's wait on one rank, held until its send was issued on another (or, "
               "where the data was there first, until it was posted), then the transfer",
               collective=True),
    Dependency("send", "communication", False, False, False,
               "a send's wait on one rank, held until its receive was posted on another (or, "
               "where that was first, until it was issued), then the transfer",
               collective=True),
    Dependency("wake-up", "wake-up", False, False, True,
               "a thread's wait, until what it waited for on another lane ended"),
    Dependency("stream wait", "stream wait", False, False, True,
               "a GPU stream's gap, until the work on another stream it was made to wait for "
               "(a CUDA event recorded there) ended", names_next=True),
    Dependency("launch", "launch", False, False, True,
               "a worker lane's gap, until its next event was issued", names_next=True),
    Dependency("completion", "wake-up", False, False, True,
               "a rank's step, until the collectives it ran on a CPU worker lane in it ended"),
    Dependency("work", None, True, True, False, "an event's own time"),
    Dependency("queue", "queue", True, False, True,
               "a worker lane's gap behind an event issued earlier: its previous event held it"),
    Dependency("untraced", "untraced", True, False, True,
               "time with no event, that nothing is found to have ended"),
    Dependency("begin", None, False, False, False, "a wait ends no sooner than it began"),
    Dependency("lane order", None, False, False, False,
               "an interval starts where the one before it on its lane ended"),
)  # fmt: skip
#: Each dependency's code (its position in :data:`DEPENDENCIES`), by name.
DEPENDENCY: dict[str, int] = {d.name: code for code, d in enumerate(DEPENDENCIES)}
#: The codes of the edges from an interval's own start to its end: its own time, or a wait's
#: ``begin`` (an interval that a what-if removes keeps only this edge: it ends as it begins).
OWN_EDGES = [c for c, d in enumerate(DEPENDENCIES) if d.own_time or d.name == "begin"]


#: The reason, and the kind, of a stretch of a lane with no event; and the name the path gives it.
UNTRACED = "untraced"
UNTRACED_NAME = "(untraced)"
#: The kind of a collective's segment on the path (the dependency that ends when the last of
#: several ranks arrived).
COLLECTIVE_KIND = next(d.segment_kind for d in DEPENDENCIES if d.collective)


def own_reason(dependency: Dependency, label: int) -> str:
    """The reason of a segment of an interval's own time: its dependency's name where that is
    own time, else (a wait taken as its own time) ``work`` for an event, ``untraced`` for a gap."""
    if dependency.own_time:
        return dependency.name
    return "work" if label >= 0 else UNTRACED


def segment_kind(reason: str) -> str | None:
    """The kind the path gives a segment of ``reason`` (None: the kind of its event)."""
    return _SEGMENT_KIND.get(reason)


_SEGMENT_KIND = {d.name: d.segment_kind for d in DEPENDENCIES}
#: The kind of a worker lane's gap behind earlier work (a GPU stream's, gloo's thread's).
QUEUE = _SEGMENT_KIND["queue"]


def dependency_names(predicate) -> tuple[str, ...]:
    """The names of the dependencies for which ``predicate(dependency)`` holds (the figure's
    dotted reasons, the kinds a what-if cannot remove, ...)."""
    return tuple(d.name for d in DEPENDENCIES if predicate(d))


@dataclass
class Edges:
    """Some edges of the graph, as a builder returns them: ``source`` and ``target`` nodes, the
    ``dependency`` by name (one for all) and each edge's ``lag`` (µs)."""

    source: np.ndarray
    target: np.ndarray
    dependency: str
    lag: np.ndarray

    @classmethod
    def of(cls, source, target, dependency: str, lag) -> Edges:
        source = np.asarray(source, dtype=np.int64)
        lag = np.broadcast_to(np.asarray(lag, dtype=float), source.shape).copy()
        return cls(source, np.asarray(target, dtype=np.int64), dependency, lag)


@dataclass
class Graph:
    """The graph of a run's intervals: ``source, target, dependency, lag`` per edge (arrays),
    ``time`` per node (measured, µs), ``rank`` per node, and ``binding``: per node, the edge
    that decided it (-1: none, the first moment of a lane)."""

    source: np.ndarray
    target: np.ndarray
    dependency: np.ndarray
    lag: np.ndarray
    time: np.ndarray
    rank: np.ndarray
    binding: np.ndarray

    @classmethod
    def of(cls, parts: list[Edges], starts: np.ndarray, ends: np.ndarray, ranks: np.ndarray) -> Graph:  # fmt: skip
        """The graph of intervals measured at ``starts``/``ends`` on ``ranks``, from the
        builders' edges; its binding edges decided (:func:`binding_edges`)."""
        time = np.ravel(np.column_stack([starts, ends]))
        rank = np.repeat(np.asarray(ranks), 2)
        source = np.concatenate([p.source for p in parts]) if parts else np.zeros(0, np.int64)
        target = np.concatenate([p.target for p in parts]) if parts else np.zeros(0, np.int64)
        codes = [np.full(len(p.source), DEPENDENCY[p.dependency], np.int8) for p in parts]
        dependency = np.concatenate(codes) if parts else np.zeros(0, np.int8)
        lag = np.concatenate([p.lag for p in parts]) if parts else np.zeros(0)
        binding = binding_edges(source, target, dependency, lag, time, rank)
        return cls(source, target, dependency, lag, time, rank, binding)

    def decided_by(self, node: int) -> int:
        """The dependency code of ``node``'s binding edge (-1: none)."""
        edge = self.binding[node]
        return int(self.dependency[edge]) if edge >= 0 else -1


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
    :data:`DEPENDENCIES`; -1 for a node without edges.

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


def retime(graph: Graph, shrink: np.ndarray | None = None) -> np.ndarray:
    """Every node's time with each interval's own time multiplied by ``shrink`` (one factor per
    interval; 1 keeps it, 0 removes it: its end then only waits for its start): a max-plus pass
    over every edge, in an order where each node comes after its sources (nodes left in a cycle,
    measured times that contradict each other by a wake-up's tolerance, keep their measured
    time and come last)."""
    n = len(graph.time)
    lag = graph.lag.copy()
    keep = np.ones(len(lag), dtype=bool)
    if shrink is not None:
        own = np.isin(graph.dependency, OWN_EDGES)
        lag[own] *= shrink[graph.target[own] // 2]
        removed = shrink[graph.target // 2] == 0.0
        keep = ~(removed & (graph.target % 2 == 1) & ~np.isin(graph.dependency, OWN_EDGES))
    source, target, lag = graph.source[keep], graph.target[keep], lag[keep]
    order = np.argsort(target, kind="stable")
    source, target, lag = source[order], target[order], lag[order]
    first = np.searchsorted(target, np.arange(n + 1))
    value = graph.time.copy()
    for node in _topological(n, source, target, first):
        lo, hi = first[node], first[node + 1]
        if hi > lo:
            value[node] = max(value[s] + g for s, g in zip(source[lo:hi].tolist(), lag[lo:hi].tolist()))  # fmt: skip
    return value


def _topological(n: int, source: np.ndarray, target: np.ndarray, first: np.ndarray) -> list[int]:
    """The nodes in an order where each comes after its sources (Kahn's algorithm); nodes left
    in a cycle come last, in their own order. ``first``: where each node's edges begin in
    ``source``/``target`` (sorted by target)."""
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
    if len(order) < n:
        placed = np.zeros(n, dtype=bool)
        placed[order] = True
        order += np.flatnonzero(~placed).tolist()
    return order
