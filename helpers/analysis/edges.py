"""The builders of the dependency graph (:mod:`.graph`): each reads a run's lanes cut into
intervals (:func:`.lanes.lane_intervals`) and returns the edges of one dependency.

Each interval's end is decided by one rule, found in this order; the first that applies wins:

1. ``transfer``: a collective matched on several ranks (edges from every rank's arrival);
   ``receive`` and ``send``: the wait at the end of a receive or of a send (edges from the
   send's issue and the receive's posting);
2. on a worker lane (a GPU stream, gloo's collective thread), a gap or an annotation with
   nothing under it, held by the latest of what its next event waited for: its issuer
   (``launch``, an edge from the issuer's end) and, on a GPU stream made to wait for a CUDA
   event, the other stream's work that the event followed (``stream wait``); ``queue`` where
   all of them had ended before the gap began (the lane's own idle time, as measured), its own
   time where none is found;
3. on a thread, a gap, an annotation with nothing under it, a CUDA call that can block
   (:data:`SYNC_CALLS`) or a collective's wait (:data:`WAIT_CALLS`): ``wake-up`` where a waker
   ended close to its end
   (:func:`.wakers.find_wakers`: for a CUDA call, GPU work launched before it; for the others,
   an event on another CPU thread of the rank: a thread outside a CUDA call does not wait for
   the GPU), else its own time (``untraced`` for a gap);
4. anything else: its own time (``work``).

A rank's step also ends no sooner than the collectives it ran on gloo's thread in the step
(``completion``, edges that decide nothing). Every interval also gets the edge from its own start (its own time; ``begin`` for a wait) and
from the end of the interval before it on its lane (``lane order``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..traces.kinds import name_matches
from .graph import Edges, Graph
from .wakers import (
    IntervalArrays,
    event_ends,
    find_wakers,
    launched_on_a_gpu,
    main_lane_issuers,
    worker_event_issuers,
)

__all__ = [
    "SYNC_CALLS",
    "WAIT_CALLS",
    "Ground",
    "Built",
    "graph_of",
    "transfer_edges",
    "receive_edges",
    "worker_edges",
    "stream_waits",
    "unmatched_stream_waits",
    "completion_edges",
    "wake_edges",
]


@dataclass
class Ground:
    """What every builder reads: the run's ``lanes`` (:class:`.lanes.Lanes`, before their
    graph), their events ``ev``, their intervals as ``arrays``, and the run's ``cuda_sync``
    events (``syncs``: what a stream or a CPU call waited for, where the trace recorded it). A
    builder is a function of it and of the intervals it may decide (``rows``) that returns what
    it :class:`Built`."""

    lanes: Any  # a .lanes.Lanes (which imports this module)
    ev: pd.DataFrame
    arrays: IntervalArrays
    syncs: pd.DataFrame


@dataclass
class Built:
    """What a builder returns: the intervals it ``decided``, its ``edges``, and the intervals
    it leaves to a queue's own time (``queued``)."""

    decided: np.ndarray
    edges: list[Edges]
    queued: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


#: CUDA runtime calls that can block the CPU until the GPU has done something: the
#: synchronisations, a copy (to pageable host memory even ``cudaMemcpyAsync`` returns only once
#: the copy is done), and a launch (it blocks while the stream's launch queue is full).
SYNC_CALLS = r"^cuda(?:Stream|Device|Event)Synchronize$|^cudaMemcpy(?:Async)?$|^cu(?:da)?LaunchKernel(?:ExC)?$"
#: Ops that block their thread until a collective issued earlier has ended on another lane: a
#: functional collective's wait (DTensor's, tensor parallelism's).
WAIT_CALLS = r"^_?c10d_functional::wait_tensor$"


def graph_of(lanes, ev: pd.DataFrame, syncs: pd.DataFrame) -> Graph:
    """The dependency graph of ``lanes`` (:class:`.lanes.Lanes`), whose events are ``ev``, with
    the run's ``cuda_sync`` events ``syncs`` (none: a trace recorded without them)."""
    iv = lanes.intervals
    arrays = IntervalArrays.of(iv)
    label = arrays.event
    pos = ev.index.get_indexer(label)
    has, at = pos >= 0, np.maximum(pos, 0)
    annotation = has & (ev["kind"] == "annotation").to_numpy()[at]
    sync = has & name_matches(ev, SYNC_CALLS)[at]
    waits = has & name_matches(ev, WAIT_CALLS)[at]
    worker = lanes.lanes["worker"].to_numpy()[arrays.lane]
    may_wait = ~has | annotation | sync | waits
    own = np.where(has, _OWN.index("work"), _OWN.index("untraced"))  # what is left: its own time
    decided = np.zeros(len(iv), dtype=bool)
    parts: list[Edges] = []
    run = Ground(lanes, ev, arrays, syncs)
    for build, rows in (
        (transfer_edges, None),
        (receive_edges, None),
        (worker_edges, may_wait & worker),
        (wake_edges, may_wait & ~worker),
    ):
        built = build(run, np.flatnonzero(~decided if rows is None else rows & ~decided))
        decided[built.decided] = True
        own[built.queued] = _OWN.index("queue")
        parts += built.edges
    parts += completion_edges(run, np.flatnonzero(decided)).edges
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


def receive_edges(run: Ground, rows: np.ndarray) -> Built:
    """``receive`` and ``send``: a send and its receive (the lanes' ``pairs``,
    :func:`.point_to_point.sends_and_receives`; a trace without peers has none) move data once
    both were issued: the send (the end of its ``c10d::send``, on the sender's lane) and the
    receive (the start of its ``c10d::recv_``). The wait at the end of the receive's record
    (``gloo:recv``, cut to the wait by :func:`.point_to_point.waits_in_records`) ends when the
    later of the two had happened, plus the transfer: an edge from each, both with the measured
    time from the later one to the wait's end; the wait at the end of the send's record ends
    likewise. Only a wait that began before both were issued is held so: one that began later
    (an ``irecv`` waited for after other work, a send waited for at the end of the step) held
    only the transfer, its own time."""
    arrays, pairs = run.arrays, run.lanes.pairs
    if pairs is None or pairs.empty:
        return Built(rows[:0], [])
    last_row = dict(zip(arrays.event.tolist(), range(len(arrays.event))))  # an event's last row
    may = np.zeros(len(arrays.event), dtype=bool)
    may[rows] = True
    found: dict[str, tuple[list, list, list]] = {"receive": ([], [], []), "send": ([], [], [])}
    labels = pairs[["send", "receive", "receive_record", "send_record"]].to_numpy(dtype=np.int64)
    for send, receive, *records in labels.tolist():
        sent, posted = last_row.get(send, -1), last_row.get(receive, -1)
        waits = [last_row.get(r, -1) if r >= 0 else -1 for r in records]
        if min(sent, posted, waits[0]) < 0:
            continue
        posted = _first_row(arrays, posted)
        # both issued (a send op can end after its data arrived: never later than the wait's end)
        arrived = min(max(arrays.end[sent], arrays.start[posted]), arrays.end[waits[0]])
        for name, wait in zip(("receive", "send"), waits):
            if wait < 0 or not may[wait] or arrays.start[wait] >= arrived:
                continue  # a wait that began once both were issued held only the transfer
            source, target, lag = found[name]
            source += [2 * sent + 1, 2 * posted]
            target += [2 * wait + 1] * 2
            lag += [max(arrays.end[wait] - arrived, 0.0)] * 2
    edges = [Edges.of(s, t, name, lag) for name, (s, t, lag) in found.items()]
    decided = np.unique(np.concatenate([e.target for e in edges]) // 2)
    return Built(decided, edges)


def completion_edges(run: Ground, rows: np.ndarray) -> Built:
    """``completion``: a rank's step ends no sooner than the collectives it ran on a CPU worker
    lane (gloo's thread) within the step have ended, whether or not its thread waited for them
    (a ``work.wait()`` that found the collective done leaves no mark in the trace, yet a what-if
    that shortens the work before it must meet it): an edge from each such collective's end to
    the end of the rank's main lane's last interval in the step, with no delay. It decides
    nothing (``rows`` unused): the measured step ended later, or at that moment."""
    lanes, arrays = run.lanes, run.arrays
    collectives = np.fromiter(lanes.instance, dtype=np.int64, count=len(lanes.instance))
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
    return Built(rows[:0], [Edges.of(source, target, "completion", 0.0)])


def worker_edges(run: Ground, rows: np.ndarray) -> Built:
    """On a worker lane, each gap (or bare annotation) before an event, held by the latest of
    what the event waited for: its issuer (``launch``: the kernel's launch call, gloo's
    ``c10d::`` call; else the interval of its rank's main lane that held the moment it started)
    and the other streams' work it was made to wait for (``stream wait``,
    :func:`stream_waits`). Where that latest ended after the gap began, its edge carries the
    measured delay and decides the gap, and the others are kept with no delay (a what-if that
    shortens the binding one still meets them); where all had ended before, ``queue`` (the
    lane's previous event held the gap). A gap with no event after it, or an event that waited
    for nothing found, is left to its own time."""
    lanes, arrays = run.lanes, run.arrays
    issuers = worker_event_issuers(run.ev, lanes.intervals)
    worker = lanes.lanes["worker"].to_numpy()[arrays.lane]
    issuers = main_lane_issuers(arrays, worker, lanes.main_lanes(), issuers)
    nxt = rows + 1
    follows = nxt < len(arrays.lane)
    follows[follows] = arrays.lane[nxt[follows]] == arrays.lane[rows[follows]]
    issuer = np.full(len(rows), -1, dtype=np.int64)
    issuer[follows] = [issuers.get(int(e), -1) for e in arrays.event[nxt[follows]]]
    known = issuer >= 0
    launch_end = np.where(known, arrays.end[np.maximum(issuer, 0)], -np.inf)
    held, waited = stream_waits(run, rows)  # positions in rows, and the rows they waited for
    wait_end = np.full(len(rows), -np.inf)
    np.maximum.at(wait_end, held, arrays.end[waited])
    latest = np.maximum(launch_end, wait_end)
    queued = np.isfinite(latest) & (latest <= arrays.start[rows])
    decided = np.isfinite(latest) & ~queued
    gap_end = arrays.end[rows]

    def lag(position: np.ndarray, source_end: np.ndarray) -> np.ndarray:
        """The measured delay where the source is the latest of a decided gap, else none (and
        never more than the measured one: a source that ended after the gap did not hold it)."""
        measured = gap_end[position] - source_end
        binds = decided[position] & (source_end == latest[position])
        return np.where(binds, measured, np.minimum(measured, 0.0))

    launched = np.flatnonzero(decided & known)
    by = issuer[launched]
    edges = [
        Edges.of(2 * by + 1, 2 * rows[launched] + 1, "launch", lag(launched, arrays.end[by])),
        Edges.of(2 * waited + 1, 2 * rows[held] + 1, "stream wait", lag(held, arrays.end[waited])),
    ]
    return Built(rows[decided], edges, rows[queued])


def stream_waits(run: Ground, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The gaps of ``rows`` before an event that its GPU stream was made to wait for other
    streams' work (``cudaStreamWaitEvent``, recorded as a ``cuda_sync`` event "Stream Wait
    Event" with ``enable_cuda_sync_events``): the first work launched on the stream after the
    wait was issued could not start before the last work launched on the waited stream before
    the CUDA event was recorded there had ended. Returns pairs: the position in ``rows`` of the
    gap before the held event, and the interval row of the work it waited for (as HTA's
    critical path reads them); none in a trace recorded without the sync events."""
    none = np.zeros(0, dtype=np.int64)
    syncs = run.syncs
    unmatched, waits = unmatched_stream_waits(syncs), int((syncs["name"] == STREAM_WAIT).sum())
    if unmatched:
        warnings.warn(
            f"{unmatched} of the {waits} stream waits in these traces (cuda_sync "
            f'"{STREAM_WAIT}") do not say which stream\'s event they waited for (the '
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
        first_row = row_of.get(after.index[first])
        gap = None if first_row is None else gap_of.get(_first_row(arrays, first_row))
        source = row_of.get(before.index[last])
        if gap is not None and source is not None:
            held.append(gap)
            waited.append(source)
    return np.asarray(held, dtype=np.int64), np.asarray(waited, dtype=np.int64)


#: The name of a ``cuda_sync`` event of a GPU stream made to wait for a CUDA event.
STREAM_WAIT = "Stream Wait Event"


def unmatched_stream_waits(events: pd.DataFrame) -> int:
    """How many of ``events``' stream waits (``cuda_sync`` "Stream Wait Event") do not say which
    stream's event they waited for: the profiler could not match the event to its record."""
    waits = (events["cat"] == "cuda_sync").to_numpy() & (events["name"] == STREAM_WAIT).to_numpy()
    return int((waits & events["wait_stream"].isna().to_numpy()).sum())


def _first_row(arrays: IntervalArrays, row: int) -> int:
    """The first interval row of the event whose interval is ``row``."""
    while row > 0 and arrays.event[row - 1] == arrays.event[row] and arrays.lane[row - 1] == arrays.lane[row]:  # fmt: skip
        row -= 1
    return row


def wake_edges(run: Ground, rows: np.ndarray) -> Built:
    """``wake-up``: on a thread, each gap, annotation with nothing under it or CUDA
    synchronisation that ended when something on another lane of its rank ended (its waker,
    :func:`.wakers.find_wakers`: for a synchronisation, work on a GPU; for the others, an event
    on another CPU thread): an edge from the waker's end. The others are left to their own
    time."""
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


#: The dependencies of an interval's own time, by the codes :func:`graph_of` gives them.
_OWN = ("work", "untraced", "queue")


def _own_edges(arrays: IntervalArrays, decided: np.ndarray, own: np.ndarray) -> list[Edges]:
    """Every interval's edge from its own start (its own time, ``own`` the position of its
    dependency in :data:`_OWN`, where nothing else decided it; ``begin`` where something did),
    and from the end of the interval before it on its lane (``lane order``)."""
    n = len(arrays.lane)
    rows = np.arange(n)
    parts = [Edges.of(2 * rows[decided], 2 * rows[decided] + 1, "begin", 0.0)]
    for code, name in enumerate(_OWN):
        mine = rows[~decided & (own == code)]
        parts.append(Edges.of(2 * mine, 2 * mine + 1, name, arrays.end[mine] - arrays.start[mine]))
    after = rows[1:][arrays.lane[1:] == arrays.lane[:-1]]
    parts.append(Edges.of(2 * (after - 1) + 1, 2 * after, "lane order", 0.0))
    return parts
