"""Time covered by intervals, overlaps counted once: the arithmetic under every summary.

Events of one kind overlap (nested ops, collectives on several threads at once), so a sum of
durations would count the same moment twice. These functions join overlapping intervals
first; :mod:`helpers.analysis` and the timelines of
:mod:`helpers.drawing` all measure time with them. :func:`last_open` finds the innermost of
nested intervals open at each of many moments (the op around an allocation, a launch, a cut).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = [
    "merge_intervals", "busy_ms", "busy_ms_per_group", "covered_us", "uncovered_parts", "last_open",
]  # fmt: skip


def merge_intervals(starts, ends, gap: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Join intervals that overlap or lie less than ``gap`` apart; returns sorted (starts, ends)."""
    starts = np.asarray(starts, dtype=float)
    ends = np.asarray(ends, dtype=float)
    if starts.size == 0:
        return starts, ends
    _, block_starts, block_ends = _joined(starts, ends, np.zeros(starts.size, np.int64), gap)
    return block_starts, block_ends


def _joined(
    starts: np.ndarray, ends: np.ndarray, group: np.ndarray, gap: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Intervals joined where they overlap or lie less than ``gap`` apart, within each of their
    groups (int codes): ``(group, start, end)`` of each block, sorted by group and start. There
    must be at least one interval."""
    order = np.lexsort((starts, group))  # stable: by start within a group
    group, starts, ends = group[order], starts[order], ends[order]
    if group[0] == group[-1]:  # how far the intervals so far reach, within their group
        reach = np.maximum.accumulate(ends)
    else:
        reach = pd.Series(ends).groupby(group).cummax().to_numpy()
    # a block starts with each group, and where an interval begins after everything before it
    # in its group has ended
    new_block = np.ones(starts.size, dtype=bool)
    new_block[1:] = (group[1:] != group[:-1]) | (starts[1:] > reach[:-1] + gap)
    first = np.flatnonzero(new_block)
    return group[first], starts[first], np.maximum.reduceat(ends, first)


def busy_ms(starts_us, ends_us) -> float:
    """Wall time covered by a set of intervals (µs in), overlaps counted once, in ms."""
    block_starts, block_ends = merge_intervals(starts_us, ends_us)
    return float((block_ends - block_starts).sum() / 1e3)


def busy_ms_per_group(frame: pd.DataFrame, by: list[str], end_column: str = "end_us") -> pd.Series:
    """Wall time in ms per group of ``frame`` (from ``start_us`` to ``end_column``), overlaps
    within a group counted once: a Series indexed by the ``by`` columns (rows with a missing
    key are in no group). The same as :func:`busy_ms` of each group, computed for all groups
    at once."""
    if frame.empty:
        return pd.Series([], dtype=float, index=pd.MultiIndex.from_arrays([[]] * len(by), names=by))
    grouped = frame.groupby(by, observed=True)
    group = grouped.ngroup().to_numpy(dtype=float, na_value=np.nan)
    keys = grouped.size().index
    kept = ~np.isnan(group)
    if not kept.any():
        return pd.Series(np.zeros(len(keys)), index=keys)
    block_group, block_starts, block_ends = _joined(
        frame["start_us"].to_numpy(dtype=float)[kept],
        frame[end_column].to_numpy(dtype=float)[kept],
        group[kept].astype(np.int64),
        0.0,
    )
    busy = np.bincount(block_group, block_ends - block_starts, len(keys))
    return pd.Series(busy / 1e3, index=keys)


def covered_us(starts: np.ndarray, ends: np.ndarray, block_starts, block_ends) -> float:
    """µs of the intervals covered by the blocks.

    Args:
        starts: the intervals' starts (µs).
        ends: their ends (µs).
        block_starts: the blocks' starts: disjoint and sorted, as :func:`merge_intervals`
            returns them.
        block_ends: the blocks' ends.

    Returns:
        The µs of each interval that a block covers, summed over the intervals (a part
        covered partly counts that part).
    """
    if not len(block_starts) or not len(starts):
        return 0.0
    cumulative = np.concatenate([[0.0], np.cumsum(block_ends - block_starts)])

    def covered_until(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(block_starts, t, side="right")  # blocks starting at or before t
        last = np.maximum(i - 1, 0)
        partial = np.clip(np.minimum(t, block_ends[last]) - block_starts[last], 0, None)
        return np.where(i > 0, cumulative[last] + partial, 0.0)

    return float((covered_until(ends) - covered_until(starts)).sum())


def uncovered_parts(
    begin: float, end: float, holes: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """The parts of ``[begin, end]`` outside every one of ``holes`` (intervals, overlapping or
    not), in order: ``[begin, end]`` minus the holes."""
    parts, at = [], begin
    for a, b in sorted(holes):
        if b <= at or a >= end:
            continue
        if a > at:
            parts.append((at, a))
        at = max(at, b)
    if at < end:
        parts.append((at, end))
    return [p for p in parts if p[1] > p[0]]


def last_open(cand: np.ndarray, ends: np.ndarray, moments: np.ndarray, parent=None) -> np.ndarray:  # fmt: skip
    """For each of ``moments``, the innermost event open at it: the last event at or before its
    candidate that had not ended by it (-1: none).

    Args:
        cand: per moment, the position of the last event that started at or before it.
        ends: the events' ends, the events sorted by start, then longest first.
        moments: the moments asked about.
        parent: per event, the one open when it began; from an ended candidate the search jumps
            there (None: to the candidate found so far for that candidate, which is how the
            parents themselves are found, all at once).
    """
    while True:
        at = np.maximum(cand, 0)
        ended = (cand >= 0) & (ends[at] <= moments)
        if not ended.any():
            return cand
        cand = np.where(ended, (cand if parent is None else parent)[at], cand)
