"""The builders of the dependency graph (:mod:`.graph`): each reads a run's lanes cut into
intervals (:func:`.lanes.lane_intervals`) and returns the edges of one dependency.

Each interval's end is decided by one rule, found in this order; the first that applies wins:

1. ``transfer``: a collective matched on several ranks (edges from every rank's arrival);
2. on a worker lane (a GPU stream, gloo's collective thread), a gap or an annotation with
   nothing under it: ``launch`` where its next event's issuer ended after the gap began (an
   edge from the issuer's end), ``queue`` where the issuer had ended before (the lane's own idle
   time, as measured), its own time where no issuer is found;
3. on a thread, a gap, an annotation with nothing under it or a CUDA synchronisation:
   ``wake-up`` where a waker ended close to its end (:func:`.wakers.find_wakers`), else its own
   time (``untraced`` for a gap);
4. anything else: its own time (``work``).

Every interval also gets the edge from its own start (its own time; ``begin`` for a wait) and
from the end of the interval before it on its lane (``lane order``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..traces.kinds import name_matches
from .graph import Edges, Graph
from .wakers import (
    IntervalArrays,
    event_ends,
    find_wakers,
    main_lane_issuers,
    worker_event_issuers,
)

if TYPE_CHECKING:
    from .lanes import Lanes

__all__ = [
    "SYNC_CALLS",
    "Ground",
    "Built",
    "graph_of",
    "transfer_edges",
    "worker_edges",
    "wake_edges",
]


@dataclass
class Ground:
    """What every builder reads: the run's ``lanes`` (:class:`.lanes.Lanes`, before their
    graph), their events ``ev`` and their intervals as ``arrays``. A builder is a function of
    it and of the intervals it may decide (``rows``) that returns what it :class:`Built`."""

    lanes: Lanes
    ev: pd.DataFrame
    arrays: IntervalArrays


@dataclass
class Built:
    """What a builder returns: the intervals it ``decided``, its ``edges``, and the intervals
    it leaves to a queue's own time (``queued``)."""

    decided: np.ndarray
    edges: list[Edges]
    queued: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


#: CUDA runtime calls that block the CPU until the GPU has done something.
SYNC_CALLS = r"^cuda(?:Stream|Device|Event)Synchronize$|^cudaMemcpy$"


def graph_of(lanes, ev: pd.DataFrame) -> Graph:
    """The dependency graph of ``lanes`` (:class:`.lanes.Lanes`), whose events are ``ev``."""
    iv = lanes.intervals
    arrays = IntervalArrays.of(iv)
    label = arrays.event
    pos = ev.index.get_indexer(label)
    has = pos >= 0
    kind = np.where(has, ev["kind"].astype(str).to_numpy()[np.maximum(pos, 0)], "")
    sync = np.where(has, name_matches(ev, SYNC_CALLS)[np.maximum(pos, 0)], False)
    worker = lanes.lanes["worker"].to_numpy()[arrays.lane]
    may_wait = ~has | (kind == "annotation") | sync
    own = np.where(has, "work", "untraced").astype(object)  # the own time of what is left
    decided = np.zeros(len(iv), dtype=bool)
    parts: list[Edges] = []
    run = Ground(lanes, ev, arrays)
    for build, rows in (
        (transfer_edges, None),
        (worker_edges, may_wait & worker),
        (wake_edges, may_wait & ~worker),
    ):
        built = build(run, np.flatnonzero(~decided if rows is None else rows & ~decided))
        decided[built.decided] = True
        own[built.queued] = "queue"
        parts += built.edges
    parts += _own_edges(arrays, decided, own)
    return Graph.of(parts, arrays.start, arrays.end, arrays.rank)


def transfer_edges(run: Ground, rows: np.ndarray) -> Built:
    """``transfer``: each matched collective's interval on one rank ends when the last rank has
    arrived, plus the collective's transfer: an edge from every rank's arrival (its interval's
    start), in the order of the ranks' arrivals."""
    lanes = run.lanes
    source, target, lag = [], [], []
    for instance, arrivals in lanes.arrivals.items():
        transfer = lanes.transfer_us[instance]
        transfer = 0.0 if transfer != transfer else transfer  # no duration known
        for row in arrivals:
            source += [2 * j for j in arrivals]
            target += [2 * row + 1] * len(arrivals)
            lag += [transfer] * len(arrivals)
    found = np.fromiter(lanes.instance, dtype=np.int64, count=len(lanes.instance))
    return Built(found, [Edges.of(source, target, "transfer", lag)])


def worker_edges(run: Ground, rows: np.ndarray) -> Built:
    """On a worker lane, each gap (or bare annotation) before an event: ``launch`` from the
    event's issuer (the kernel's launch call, gloo's ``c10d::`` call; else the interval of its
    rank's main lane that held the moment it started) where the issuer ended after the gap began;
    ``queue`` where it had ended before (the lane's previous event held the gap). A gap with no
    event after it, or an event with no issuer, is left to its own time."""
    lanes, arrays = run.lanes, run.arrays
    issuers = worker_event_issuers(run.ev, lanes.intervals)
    worker = lanes.lanes["worker"].to_numpy()[arrays.lane]
    main = {r: i for i, r, m in zip(lanes.lanes.index, lanes.lanes["rank"], lanes.lanes["main"]) if m}  # fmt: skip
    issuers = main_lane_issuers(arrays, worker, main, issuers)
    nxt = rows + 1
    follows = nxt < len(arrays.lane)
    follows[follows] = arrays.lane[nxt[follows]] == arrays.lane[rows[follows]]
    issuer = np.full(len(rows), -1, dtype=np.int64)
    issuer[follows] = [issuers.get(int(e), -1) for e in arrays.event[nxt[follows]]]
    known = issuer >= 0
    queued = known & (arrays.end[np.maximum(issuer, 0)] <= arrays.start[rows])
    issued = known & ~queued
    launched, by = rows[issued], issuer[issued]
    edges = Edges.of(2 * by + 1, 2 * launched + 1, "launch", arrays.end[launched] - arrays.end[by])
    return Built(launched, [edges], rows[queued])


def wake_edges(run: Ground, rows: np.ndarray) -> Built:
    """``wake-up``: on a thread, each gap, annotation with nothing under it or CUDA
    synchronisation that ended when something on another lane of its rank ended (its waker,
    :func:`.wakers.find_wakers`; for a synchronisation, only work on a GPU): an edge from the
    waker's end. The others are left to their own time."""
    if not len(rows):
        return Built(rows, [])
    lanes, ev, arrays = run.lanes, run.ev, run.arrays
    ends = event_ends(lanes.intervals, ev, lanes.lanes["gpu"].to_numpy())
    label = arrays.event[rows]
    sync = np.isin(label, ev.index[name_matches(ev, SYNC_CALLS)])
    wakers = find_wakers(arrays, rows, ends, sync)
    woken, by = rows[wakers >= 0], wakers[wakers >= 0]
    edges = Edges.of(2 * by + 1, 2 * woken + 1, "wake-up", arrays.end[woken] - arrays.end[by])
    return Built(woken, [edges])


def _own_edges(arrays: IntervalArrays, decided: np.ndarray, own: np.ndarray) -> list[Edges]:
    """Every interval's edge from its own start (its own time by ``own``'s name where nothing
    else decided it, ``begin`` where something did), and from the end of the interval before it
    on its lane (``lane order``)."""
    n = len(arrays.lane)
    rows = np.arange(n)
    parts = [Edges.of(2 * rows[decided], 2 * rows[decided] + 1, "begin", 0.0)]
    for name in ("work", "untraced", "queue"):
        mine = rows[~decided & (own == name)]
        parts.append(Edges.of(2 * mine, 2 * mine + 1, name, arrays.end[mine] - arrays.start[mine]))
    after = rows[1:][arrays.lane[1:] == arrays.lane[:-1]]
    parts.append(Edges.of(2 * (after - 1) + 1, 2 * after, "lane order", 0.0))
    return parts
