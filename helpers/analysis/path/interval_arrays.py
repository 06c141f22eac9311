"""A run's intervals (:func:`.lanes.lane_intervals`) as arrays, for the loops of the builders
that look at them one by one, and an event's first and last interval rows."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

__all__ = ["IntervalArrays", "event_rows", "first_row", "last_rows", "every_last_row"]


@dataclass
class IntervalArrays:
    """The intervals' columns as arrays, for the loops that look at them one by one."""

    rank: np.ndarray
    lane: np.ndarray
    start: np.ndarray
    end: np.ndarray
    event: np.ndarray

    #: the index of each event's last interval row: the events' labels, sorted, and their
    #: rows (made the first time :func:`last_rows` or :func:`every_last_row` is asked, once
    #: for all the builders; the arrays are not to be written once it is made)
    last_index: tuple[np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False, compare=False)  # fmt: skip

    @classmethod
    def of(cls, iv: pd.DataFrame) -> IntervalArrays:
        return cls(*(iv[c].to_numpy() for c in ("rank", "lane_id", "start_us", "end_us", "event")))


def event_rows(iv: pd.DataFrame, keep: str) -> pd.DataFrame:
    """The intervals of events (not gaps), one per event: its first or last (``keep``), in the
    intervals' order, each with its row as its label."""
    return iv[iv["event"].to_numpy() >= 0].drop_duplicates("event", keep=keep)


def first_row(arrays: IntervalArrays, row: int) -> int:
    """The first interval row of the event whose interval is ``row``."""
    while row > 0 and arrays.event[row - 1] == arrays.event[row] and arrays.lane[row - 1] == arrays.lane[row]:  # fmt: skip
        row -= 1
    return row


def last_rows(arrays: IntervalArrays, events: np.ndarray) -> np.ndarray:
    """The last interval row of each of ``events`` (labels); -1 for an event without one (a
    label below 0, no event, included)."""
    labels, rows = _last_index(arrays)
    if not len(labels):
        return np.full(len(events), -1, dtype=np.int64)
    where = np.minimum(np.searchsorted(labels, events), len(labels) - 1)
    return np.where(labels[where] == events, rows[where], -1).astype(np.int64)


def every_last_row(arrays: IntervalArrays) -> np.ndarray:
    """Every event's last interval row, in the intervals' order."""
    return np.sort(_last_index(arrays)[1])


def _last_index(arrays: IntervalArrays) -> tuple[np.ndarray, np.ndarray]:
    """:attr:`IntervalArrays.last_index`, made the first time it is asked for."""
    if arrays.last_index is None:
        at = np.flatnonzero(arrays.event >= 0)[::-1]  # read backwards: the last first
        labels, first = np.unique(arrays.event[at], return_index=True)
        arrays.last_index = (labels, at[first])
    return arrays.last_index
