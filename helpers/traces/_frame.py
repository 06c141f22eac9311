"""One DataFrame from the columns of many files: the part of loading done once per run.

:func:`frame` merges the files' :class:`._file.FileColumns` (each sorted by start)
into one frame sorted by start, column by column, letting each file's arrays go as the run's
fill, so a big run needs little more than its frame's memory. Text columns (the lanes among
them) become categorical columns over one list of distinct values; each event's kind
(:mod:`helpers.traces.kinds`) was found with its file's columns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from ._memory import give_back_freed_memory
from ._columns import code_dtype
from ._file import FileColumns
from .kinds import KIND_NAMES

#: The text columns of every file, kept as categorical columns of the frame.
TEXT_COLUMNS = (
    "name", "cat", "pid", "tid", "lane", "collective", "shapes", "stream", "process_group",
    "call_from",
)  # fmt: skip
#: The numeric columns that describe a collective (from ``record_param_comms`` / kernel args).
COMM_NUMBERS = ("msg_bytes", "group_size", "seq")
#: The integer columns, <NA> where unknown: those of a collective, the stream that a
#: ``cuda_sync`` event waited for, and a send's or a receive's peer and tag.
NUMBERS = (*COMM_NUMBERS, "wait_stream", "peer", "tag")
#: The frame's columns, in order.
COLUMNS = (
    "rank", "name", "cat", "kind", "pid", "tid", "lane", "start_us", "dur_us", "end_us",
    "collective", "shapes", "stream", "step", "rel_us", "launch_us", "process_group",
    "call_from", *NUMBERS, "waits_for_us",
)  # fmt: skip


def frame(parts: Sequence[FileColumns]) -> pd.DataFrame:
    """One DataFrame for the events of several files, sorted by start (each file arrives
    sorted, so the merge is cheap); built column by column, each file's array going as the
    run's fills, so that memory peaks not far above the frame's own size."""
    n = sum(len(p.start) for p in parts)
    for part in parts:  # a rank per event, for the merge below
        if part.ranks is None:
            part.ranks = np.full(len(part.start), part.header.rank, np.int32)
    start = _fill(parts, _take("start"), n, np.float64, None)
    where = None  # the row of each file's events in the run, files one after the other
    if len(parts) > 1:
        order = np.argsort(start, kind="stable")
        start = start[order]
        where = np.empty(n, np.int32 if n < 2**31 else np.int64)
        where[order] = np.arange(n, dtype=where.dtype)
        del order
    columns = {
        "rank": _fill(parts, _take("ranks"), n, np.int32, where),
        "kind": _fill(parts, _take("kind"), n, np.int8, where),
        "dur_us": _fill(parts, _take("dur"), n, np.float64, where),
        "step": _fill(parts, _take("step"), n, np.int32, where),
        "launch_us": _fill(parts, _take("launch"), n, np.float64, where),
        "waits_for_us": _fill(parts, _take("waits_for"), n, np.float64, where),
        **{c: _fill(parts, _take_number(c), n, np.int64, where) for c in NUMBERS},
    }
    text = {c: _codes(parts, c, n, where) for c in TEXT_COLUMNS}
    del where
    text["lane"] = _by_first_appearance(*text["lane"])
    stream_lut = np.array([-1 if v is None else v for v in text["stream"][1]] + [-1], np.int64)
    stream = stream_lut[text.pop("stream")[0]]
    for column in TEXT_COLUMNS:  # each column's codes go as its categorical is made
        if column in text:
            columns[column] = _categorical(*text.pop(column))
    if len(parts) > 1:
        give_back_freed_memory()
    step = columns["step"]
    columns.update(
        kind=pd.Categorical.from_codes(columns["kind"], categories=KIND_NAMES),
        start_us=start,
        end_us=start + columns["dur_us"],
        rel_us=start - (start[0] if n else 0.0),
        stream=pd.arrays.IntegerArray(stream, stream < 0),
        step=pd.arrays.IntegerArray(step, step < 0),
        **{c: pd.arrays.IntegerArray(columns[c], columns[c] < 0) for c in NUMBERS},
    )
    return pd.DataFrame({c: columns.pop(c) for c in COLUMNS}, copy=False)


def _fill(
    parts: Sequence[FileColumns],
    take: Callable[[FileColumns], np.ndarray],
    n: int,
    dtype: type,
    where: np.ndarray | None,
) -> np.ndarray:
    """One array of ``n`` from a per-file array, each file's at its rows ``where`` if given
    (else one file after the other). ``take(part)`` returns the part's array and lets it go;
    with several files the memory freed is handed back to the system
    (:func:`give_back_freed_memory`), for the run's arrays to use."""
    out = np.empty(n, dtype=dtype)
    pos = 0
    for part in parts:
        chunk = take(part)
        rows = slice(pos, pos + len(chunk))
        out[rows if where is None else where[rows]] = chunk
        pos += len(chunk)
        del chunk
    if len(parts) > 1:  # one file's pages, handed back, would only be taken again for the next
        give_back_freed_memory()
    return out


def _take(attribute: str) -> Callable[[FileColumns], np.ndarray]:
    """A ``take`` for :func:`_fill`: the part's array, which the part no longer holds."""

    def take(part: FileColumns) -> np.ndarray:
        value = getattr(part, attribute)
        setattr(part, attribute, None)
        return value

    return take


def _take_number(column: str) -> Callable[[FileColumns], np.ndarray]:
    """A ``take`` for :func:`_fill`: one of the part's numbers, which the part no longer holds."""

    def take(part: FileColumns) -> np.ndarray:
        return part.numbers.pop(column)

    return take


def _codes(
    parts: Sequence[FileColumns], column: str, n: int, where: np.ndarray | None
) -> tuple[np.ndarray, list]:
    """Codes into one list of distinct values for a text column of every file."""
    index: dict = {}
    luts = {}
    for part in parts:
        _, values = part.text[column]
        luts[id(part)] = np.array(
            [index.setdefault(v, len(index)) for v in values] + [-1], np.int32
        )

    def take(part: FileColumns) -> np.ndarray:
        codes, _ = part.text.pop(column)
        return luts[id(part)][codes]

    return _fill(parts, take, n, code_dtype(len(index)), where), list(index)


def _by_first_appearance(codes: np.ndarray, values: list) -> tuple[np.ndarray, list]:
    """The same text column with its distinct values in the order the rows first show them."""
    seen = pd.unique(codes[codes >= 0])
    recode = np.full(len(values) + 1, -1, codes.dtype)  # the last entry is for code -1
    recode[seen] = np.arange(len(seen))
    return recode[codes], [values[i] for i in seen]


def _categorical(codes: np.ndarray, values: list) -> pd.Categorical:
    """A categorical column of text values from codes (-1: missing)."""
    return pd.Categorical.from_codes(codes, categories=pd.Index(values, dtype="str"))
