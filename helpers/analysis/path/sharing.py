"""What work that shared a machine gives back or takes when a what-if changes the run
(:func:`.replay.what_if`): the re-timing keeps every op as long as it was, which is wrong where
ops ran beside others on the same cores or the same GPU.

- **A machine's cores** (:func:`with_shared_cores`): ranks of one machine share its cores. An op
  that ran while more ops were runnable than there were cores got a share of a core and took
  longer; one that ran while a rank slept had a core to itself. So each op is re-timed by how many
  ran beside it: its *work* is its time weighted by its share of a core (``cores`` over the ops
  running, at most 1), and in the changed run it lasts as long as that work takes at the shares
  it now meets, found by re-timing again until the times settle. Only ops of the ``compute``
  kind count as running (an annotation, a data loader's fetch or a collective's span may be a
  wait or a sleep, which takes no core); the machine's cores are the run's manifest's, or this
  machine's for a run without GPU work (:func:`machine_cores`).
- **A GPU** (:func:`sharing_the_gpu`): a rank's streams share its GPU's SMs. A stream that waited
  while ready (a queue) beside work the what-if shortens waited for room that work held, and a
  kernel that ran beside it shared the SMs: they are given back their overlap with it (all of a
  queue's, :data:`SHARED_GPU` of a kernel's). Only the rank's own streams: another process's
  kernels share the GPU by turns.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from ...jobs.runs import usable_cores
from ...traces.kinds import GPU_WORK_CATEGORIES
from .lanes import Lanes

__all__ = ["SHARED_GPU", "SETTLE_ROUNDS", "machine_cores", "sharing_the_gpu", "with_shared_cores"]

#: The share of the time a kernel overlapped another stream's kernel of its process that it
#: would have lost had it run alone: two kernels that share a GPU's SMs each get about half.
SHARED_GPU = 0.5
#: How many times the changed run is re-timed for the ops' shares of the cores to settle.
SETTLE_ROUNDS = 5


def machine_cores(events: pd.DataFrame, cores: int | None) -> int | None:
    """The cores the run's ranks shared: ``cores`` where given (0: none said, every op kept
    as long as it was), else what the launcher recorded (``events.attrs["cores"]``,
    :func:`helpers.load_run` reads it from the run's manifest), else, for a run without GPU
    work (a laptop's or a workshop's, read where it ran), this machine's; None for a GPU job
    whose manifest does not say (its node is not this machine)."""
    if cores is not None:
        return cores or None
    if "cores" in events.attrs:
        return events.attrs["cores"]
    gpu = events["cat"].isin(GPU_WORK_CATEGORIES).any()
    return None if gpu else usable_cores()


def _running(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The number of intervals ``(starts, ends)`` under way between consecutive moments: the
    moments, sorted, and the count from each to the next."""
    moments = np.concatenate([starts, ends])
    steps = np.concatenate([np.ones(len(starts)), -np.ones(len(ends))])
    order = np.argsort(moments, kind="stable")
    moments, count = moments[order], np.cumsum(steps[order])
    return moments, count


def _share_integral(starts: np.ndarray, ends: np.ndarray, cores: int) -> Callable[[np.ndarray], np.ndarray]:  # fmt: skip
    """The integral over time of the share of a core each running interval gets (``cores`` over
    the intervals running, at most 1), as a function of the moment."""
    if not len(starts):  # nothing runs: a whole core for anything
        return lambda t: np.asarray(t, dtype=float)
    moments, count = _running(starts, ends)
    share = np.minimum(1.0, cores / np.maximum(count, 1.0))
    integral = np.r_[0.0, np.cumsum(share[:-1] * np.diff(moments))]
    return lambda t: np.interp(t, moments, integral)


def with_shared_cores(
    lanes: Lanes,
    runnable: np.ndarray,
    shrink: np.ndarray,
    cores: int,
    replay: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
) -> np.ndarray:
    """``shrink`` with each ``runnable`` interval's own time re-timed by the share of the
    ``cores`` it meets in the changed run (see the module). An interval the change removes
    (``shrink`` 0) runs nowhere; an unchanged run comes back as it was (every interval meets its
    measured share).

    Args:
        lanes: the run's lanes.
        runnable: per interval, whether it takes a core while it runs (an op's own time).
        shrink: per interval, the share of its own time the what-if gives it.
        cores: the machine's cores.
        replay: the intervals' ``(starts, ends)`` re-timed with a ``shrink``.
    """
    iv = lanes.intervals
    # µs since the run's first interval: at a trace's clock (~1e15 µs), a float's step is a
    # quarter of a µs, and an op shorter than that would seem to get no share of a core
    origin = float(iv["start_us"].min()) if len(iv) else 0.0
    starts, ends = iv["start_us"].to_numpy(float) - origin, iv["end_us"].to_numpy(float) - origin
    rows = np.flatnonzero(runnable & (ends > starts))
    if not len(rows):
        return shrink
    measured = _share_integral(starts[rows], ends[rows], cores)
    work = measured(ends[rows]) - measured(starts[rows])  # each one's core-time
    own = ends[rows] - starts[rows]
    factor = shrink.copy()
    kept = shrink[rows] > 0
    for round_ in range(SETTLE_ROUNDS):
        new_starts = replay(factor)[0] - origin
        guess = new_starts[rows] + own * factor[rows]
        now = _share_integral(new_starts[rows][kept], guess[kept], cores)
        share = (now(guess) - now(new_starts[rows])) / np.maximum(guess - new_starts[rows], 1e-9)  # fmt: skip
        wanted = np.where(kept, shrink[rows] * work / np.maximum(share, 1e-9) / own, 0.0)
        # after the first round, halfway: the shares move with the times and may swing back
        factor[rows] = wanted if round_ == 0 else 0.5 * (factor[rows] + wanted)
    return factor


def sharing_the_gpu(lanes: Lanes, shrink: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``shrink``, and how much ``sooner`` each wait ends (µs per interval), with the GPU time
    that the work ``shrink`` shortens took from the rest of its rank's GPU given back: a stream's
    gap beside it that nothing but its own time held (a queue: its next work was launched and
    its stream's work before it done, yet it had not begun) waited for room on the GPU that
    work held, so it ends sooner by their overlap; a kernel that ran beside it shared the GPU's
    SMs, and loses :data:`SHARED_GPU` of their overlap. Only the rank's own streams: another
    process's kernels share the GPU by turns, not at once (and the replay of an unchanged run
    is untouched)."""
    iv = lanes.intervals
    sooner = np.zeros(len(iv))
    gpu = lanes.lanes["gpu"].to_numpy()[iv["lane_id"].to_numpy()]
    shrunk = np.flatnonzero(gpu & (shrink < 1.0))
    if not len(shrunk):
        return shrink, sooner
    shrink = shrink.copy()
    graph = lanes.graph
    ends_of = graph.binding[1 : 2 * graph.intervals : 2]  # what held each interval's end
    queued = graph.source[ends_of] == graph.target[ends_of] - 1  # its own time: a gap, a queue
    starts, ends = iv["start_us"].to_numpy(float), iv["end_us"].to_numpy(float)
    lane, rank, event = iv["lane_id"].to_numpy(), iv["rank"].to_numpy(), iv["event"].to_numpy()
    for r in np.unique(rank[shrunk]):
        theirs = shrunk[rank[shrunk] == r]
        theirs = theirs[np.argsort(starts[theirs], kind="stable")]
        latest_end = np.maximum.accumulate(ends[theirs])
        for i in np.flatnonzero(gpu & (rank == r) & (shrink == 1.0) & (ends > starts)):
            near = theirs[np.searchsorted(latest_end, starts[i], "right") : np.searchsorted(starts[theirs], ends[i], "left")]  # fmt: skip
            near = near[lane[near] != lane[i]]
            overlap = np.minimum(ends[near], ends[i]) - np.maximum(starts[near], starts[i])
            freed = float((np.clip(overlap, 0.0, None) * (1.0 - shrink[near])).sum())
            if event[i] < 0:
                sooner[i] = freed if queued[i] else 0.0
            else:
                shrink[i] = max(0.0, 1.0 - SHARED_GPU * freed / (ends[i] - starts[i]))
    return shrink, sooner
