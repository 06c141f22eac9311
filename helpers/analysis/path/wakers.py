"""What ended each wait of :mod:`.lanes`: a waiting interval's *waker* (the event on another lane
of its rank that ended closest to the interval's end) and a worker lane's event's *issuer* (the
kernel's launch, the gloo collective's ``c10d::`` call)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ...traces.kinds import COLLECTIVE_SPANS, GPU_CATEGORIES, name_matches
from .interval_arrays import IntervalArrays, every_last_row, last_rows

__all__ = ["WAKE_TOLERANCE_US", "LONG_WAIT_SHARE"]

#: How close to a waiting interval's end its waker must end (µs, either side): a thread resumes
#: microseconds after what it waited for, a few ms on a crowded CPU, and gloo's thread may close
#: a collective's span a little after the thread waiting for it has gone on (no later than the
#: wait lasted).
WAKE_TOLERANCE_US = 3000.0
#: A long wait may end this share of its length after its waker (a rank that waited seconds in
#: a collective that timed out, then took a few ms to raise; on 2 cores, a main thread that
#: waited 151 ms in DDP's forward resumed 3.2 ms after gloo's broadcast ended): the tolerance
#: before the end grows with the wait.
LONG_WAIT_SHARE = 0.03


def event_ends(arrays: IntervalArrays, ev: pd.DataFrame, gpu_lane: np.ndarray) -> dict:
    """Per rank, each event's last interval (where the event ends), sorted by its end (ties in
    the intervals' order):
    ``(ends, rows, lane_ids, on_a_gpu_lane, the event's start, its launch)`` (the launch: NaN
    for an event not launched from the CPU)."""
    rows = every_last_row(arrays)
    labels = arrays.event[rows]
    began = ev["start_us"].reindex(labels).to_numpy()
    launched = ev["launch_us"].reindex(labels).to_numpy()
    order = np.argsort(arrays.end[rows], kind="stable")
    rank = arrays.rank[rows][order]
    found = {}
    for r in np.unique(rank).tolist():
        at = order[rank == r]
        lane = arrays.lane[rows[at]]
        found[r] = (arrays.end[rows[at]], rows[at], lane, gpu_lane[lane], began[at], launched[at])
    return found


#: The most (waiting interval, candidate waker) pairs :func:`find_wakers` looks at in one go.
_PAIRS_AT_ONCE = 2_000_000


def find_wakers(iv: IntervalArrays, rows: np.ndarray, ends: dict, sync: np.ndarray, waits: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """For each of ``rows``, the interval on another lane of its rank whose event ended closest
    to the row's end (-1: none): after the row began, at most the tolerance (or
    :data:`LONG_WAIT_SHARE` of the row) before its end, and at most the tolerance or the row's own length after it (a span
    closed late), of an event that began before the row ended and, on a GPU, was launched
    before the row began (a call is not woken by what it launched itself). An end after the row's counts
    half a microsecond farther; of equal ones, the one first in ``ends``' order wins.

    Args:
        iv: the run's intervals, as arrays.
        rows: the intervals to find a waker for.
        ends: per rank, its events' ends, sorted, each with its interval, lane, whether it is
            on a GPU and when its event began.
        sync: per row, whether it is a CUDA synchronisation: only work on a GPU wakes one,
            and only an event on a CPU thread wakes any other (a thread that is not inside a
            synchronisation call does not wait for the GPU: a kernel that ended near the end
            of its gap is a coincidence).
        waits: per interval of the run, whether it is itself a wait (None: none is): one
            wakes a row only if it ended by the row's end (two waits on two threads, each
            ending just after the other's, would wake each other: a cycle).
    """
    found = np.full(len(rows), -1, dtype=np.int64)
    for rank in np.unique(iv.rank[rows]):
        if rank not in ends:
            continue
        times, their_rows, lanes, gpu, began, launched = ends[rank]
        mine = np.flatnonzero(iv.rank[rows] == rank)  # positions in rows
        start, end = iv.start[rows[mine]], iv.end[rows[mine]]
        before = np.maximum(WAKE_TOLERANCE_US, LONG_WAIT_SHARE * (end - start))
        lo = np.searchsorted(times, np.maximum(start, end - before), side="right")
        hi = np.searchsorted(times, end + np.minimum(WAKE_TOLERANCE_US, end - start), side="right")
        counts = np.maximum(hi - lo, 0)
        bounds = np.searchsorted(np.cumsum(counts), np.arange(_PAIRS_AT_ONCE, counts.sum(), _PAIRS_AT_ONCE))  # fmt: skip
        for part in np.split(np.arange(len(mine)), bounds):
            chunk, n = mine[part], counts[part]
            owner = np.repeat(np.arange(len(chunk)), n)  # one row per (row, candidate)
            at = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n - lo[part], n)
            this_end, this_lane = iv.end[rows[chunk]][owner], iv.lane[rows[chunk]][owner]
            this_start = iv.start[rows[chunk]][owner]
            distance = np.abs(times[at] - this_end) + np.where(times[at] > this_end, 0.5, 0.0)
            ok = (lanes[at] != this_lane) & (began[at] < this_end) & (gpu[at] == sync[chunk][owner]) & ~(launched[at] >= this_start)  # fmt: skip
            if waits is not None:
                ok &= ~(waits[their_rows[at]] & (times[at] > this_end))
            order = np.lexsort((at, np.where(ok, distance, np.inf), owner))
            first = order[np.r_[True, owner[order][1:] != owner[order][:-1]]] if len(order) else order  # fmt: skip
            first = first[ok[first]]
            found[chunk[owner[first]]] = their_rows[at[first]]
    return found


def launched_on_a_gpu(ev: pd.DataFrame) -> pd.DataFrame:
    """The events on a GPU (kernels, copies, NCCL's kernels) whose launch is in the trace."""
    return ev[ev["cat"].isin(GPU_CATEGORIES).to_numpy() & ev["launch_us"].notna().to_numpy()]


def launch_calls(work: pd.DataFrame, among: pd.DataFrame) -> np.ndarray:
    """Per GPU event of ``work`` (:func:`launched_on_a_gpu`), the label of its launch among the
    CUDA runtime calls of ``among``: the call of its rank that began at its ``launch_us`` (of
    calls that began at one moment, the last); -1 where there is none."""
    runtime = among[(among["kind"] == "cuda runtime").to_numpy()]
    call = dict(zip(zip(runtime["rank"].tolist(), runtime["start_us"].tolist()), runtime.index.tolist()))  # fmt: skip
    keys = zip(work["rank"].tolist(), work["launch_us"].tolist())
    return np.array([call.get(k, -1) for k in keys], dtype=np.int64)


def worker_event_issuers(ev: pd.DataFrame, arrays: IntervalArrays) -> dict[int, int]:
    """``{event label: interval row}`` for the events of worker lanes: a GPU event's launch (the
    CUDA runtime call that started at its ``launch_us``), a gloo collective's latest ``c10d::``
    call that began before it on its rank (the row of the issuer's last interval, by the
    intervals' index, :func:`.interval_arrays.last_rows`)."""
    gpu = launched_on_a_gpu(ev)
    calls = launch_calls(gpu, ev)
    rows = last_rows(arrays, calls)
    found = dict(zip(gpu.index[rows >= 0].tolist(), rows[rows >= 0].tolist()))
    no_interval = (rows < 0) & (calls >= 0)  # a call of no length (old traces count whole µs)
    found.update(_holding(arrays, ev, dict(zip(gpu.index[no_interval].tolist(), calls[no_interval].tolist()))))  # fmt: skip
    calls = ev[name_matches(ev, r"^c10d::")]
    spans = ev[name_matches(ev, COLLECTIVE_SPANS)]
    for rank, mine in spans.groupby("rank"):
        theirs = calls[(calls["rank"] == rank).to_numpy()].sort_values("start_us")
        at = np.searchsorted(theirs["start_us"].to_numpy(), mine["start_us"].to_numpy(), "right")
        issuer = np.where(at > 0, theirs.index.to_numpy()[np.maximum(at - 1, 0)] if len(theirs) else -1, -1)  # fmt: skip
        rows = last_rows(arrays, issuer.astype(np.int64))
        found.update(zip(mine.index[rows >= 0].tolist(), rows[rows >= 0].tolist()))
    return found


def _holding(arrays: IntervalArrays, ev: pd.DataFrame, calls: dict[int, int]) -> dict[int, int]:
    """For launch ``calls`` that have no interval of their own (``{event: call}``), the interval
    of the call's thread that holds the moment it was made (the op around it), where its
    thread has intervals (found from another event of that rank and lane)."""
    found: dict[int, int] = {}
    if not calls:
        return found
    made = ev.loc[list(calls.values()), ["rank", "lane", "start_us"]].assign(event=list(calls))
    for (rank, lane), mine in made.groupby(["rank", "lane"], observed=True):
        near = ev.index[(ev["rank"] == rank).to_numpy() & (ev["lane"] == lane).to_numpy()]
        known = last_rows(arrays, near.to_numpy(np.int64))
        known = known[known >= 0]
        if not len(known):
            continue
        on_lane = np.flatnonzero(arrays.lane == arrays.lane[known[0]])
        at = np.searchsorted(arrays.start[on_lane], mine["start_us"].to_numpy(), "right") - 1
        held = at >= 0
        found.update(zip(mine["event"].to_numpy()[held].tolist(), on_lane[at[held]].tolist()))
    return found


def main_lane_issuers(
    iv: IntervalArrays, issued: np.ndarray, main: dict, issuers: dict[int, int]
) -> dict[int, int]:
    """``issuers`` completed for the worker lanes' issued events whose issuer is not in the
    trace (a gloo span with no ``c10d::`` call, a kernel with no launch): the interval of their
    rank's main lane that held the moment they started, where the issue must have come from.

    Args:
        iv: the run's intervals, as arrays.
        issued: per interval, whether it is an event issued to a worker lane (GPU work, a
            collective's span on gloo's thread).
        main: per rank, its main lane.
        issuers: event (its row label in the events) -> the interval that issued it, as
            far as the trace says.

    Returns:
        ``issuers`` with the missing ones added.
    """
    found = dict(issuers)
    rows = np.flatnonzero(issued & (iv.event >= 0))
    labels, first = np.unique(iv.event[rows], return_index=True)  # an event's first interval
    rows = rows[first]
    lanes = np.array([main.get(r, -1) for r in iv.rank[rows].tolist()], dtype=np.int64)
    missing = np.array([label not in found for label in labels.tolist()], dtype=bool)
    rows, labels, lanes = rows[missing & (lanes >= 0)], labels[missing & (lanes >= 0)], lanes[missing & (lanes >= 0)]  # fmt: skip
    for lane in np.unique(lanes):
        mine = np.flatnonzero(iv.lane == lane)
        wanted = lanes == lane
        at = np.searchsorted(iv.start[mine], iv.start[rows[wanted]], side="left") - 1
        held = at >= 0
        found.update(zip(labels[wanted][held].tolist(), mine[at[held]].tolist()))
    return found
