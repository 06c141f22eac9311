"""One DataFrame from the columns of many files: the part of loading done once per run.

:func:`frame` merges the files' :class:`~helpers._tracefile.FileColumns` (each sorted by start)
into one frame sorted by start, column by column, letting each file's arrays go as the run's
fill, so a big run needs little more than its frame's memory. Text columns become categorical
columns over one list of distinct values; each event gets its kind (:mod:`helpers.kinds`) and a
readable lane.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from ._tracecolumns import code_dtype
from ._tracefile import FileColumns
from ._tracesteps import GPU_CATEGORIES
from .kinds import KIND_NAMES, event_kind

#: The text columns of every file, kept as categorical columns of the frame.
TEXT_COLUMNS = (
    "name", "cat", "pid", "tid", "collective", "shapes", "stream", "process_group", "call_from",
)  # fmt: skip
#: The numeric columns that describe a collective (from ``record_param_comms`` / kernel args).
COMM_NUMBERS = ("msg_bytes", "group_size", "seq")


def frame(parts: Sequence[FileColumns]) -> pd.DataFrame:
    """One DataFrame for the events of several files, sorted by start (each file arrives
    sorted, so the merge is cheap); built column by column to keep memory low."""
    n = sum(len(p.start) for p in parts)
    merged = any(p.ranks is not None for p in parts)
    thread_names = {
        (p.header.rank if p.ranks is None else int(pid),) + (pid, tid): label
        for p in parts
        for (pid, tid), label in p.thread_names.items()
    }
    for part in parts:  # a rank per event, for the merge below
        if part.ranks is None:
            part.ranks = np.full(len(part.start), part.header.rank, np.int32)
    start = _fill(parts, _take("start"), n, np.float64, None)
    order = np.argsort(start, kind="stable") if len(parts) > 1 else None
    start = start if order is None else start[order]
    dur = _fill(parts, _take("dur"), n, np.float64, order)
    rank = _fill(parts, _take("ranks"), n, np.int32, order)
    step = _fill(parts, _take("step"), n, np.int32, order)
    launch = _fill(parts, _take("launch"), n, np.float64, order)
    numbers = {c: _fill(parts, _take_number(c), n, np.int64, order) for c in COMM_NUMBERS}
    text = {c: _codes(parts, c, n, order) for c in TEXT_COLUMNS}
    del order
    kind = _kinds(text["name"], text["cat"])
    name = _categorical(*text["name"])
    end = start + dur
    stream_lut = np.array([-1 if v is None else v for v in text["stream"][1]] + [-1], np.int64)
    stream = stream_lut[text["stream"][0]]
    events = pd.DataFrame(
        {
            "rank": rank,
            "name": name,
            "cat": _categorical(*text["cat"]),
            "kind": kind,
            "pid": _categorical(*text["pid"]),
            "tid": _categorical(*text["tid"]),
            "lane": _lanes(rank, text["pid"], text["tid"], text["cat"], thread_names, merged),
            "start_us": start,
            "dur_us": dur,
            "end_us": end,
            "collective": _categorical(*text["collective"]),
            "shapes": _categorical(*text["shapes"]),
            "stream": pd.arrays.IntegerArray(stream, stream < 0),
            "step": pd.arrays.IntegerArray(step, step < 0),
            "rel_us": start - (start[0] if n else 0.0),
            "launch_us": launch,
            "process_group": _categorical(*text["process_group"]),
            "call_from": _categorical(*text["call_from"]),
            **{c: pd.arrays.IntegerArray(v, v < 0) for c, v in numbers.items()},
        },
        copy=False,
    )
    return events


def _fill(
    parts: Sequence[FileColumns],
    take: Callable[[FileColumns], np.ndarray],
    n: int,
    dtype: type,
    order: np.ndarray | None,
) -> np.ndarray:
    """One array of ``n`` from a per-file array, in ``order`` if given. ``take(part)`` returns
    the part's array and lets it go, so that memory is freed as the run's array fills."""
    out = np.empty(n, dtype=dtype)
    pos = 0
    for part in parts:
        chunk = take(part)
        out[pos : pos + len(chunk)] = chunk
        pos += len(chunk)
        del chunk
    return out if order is None else out[order]


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
    parts: Sequence[FileColumns], column: str, n: int, order: np.ndarray | None
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

    return _fill(parts, take, n, code_dtype(len(index)), order), list(index)


def _categorical(codes: np.ndarray, values: list) -> pd.Categorical:
    """A categorical column of text values from codes (-1: missing)."""
    return pd.Categorical.from_codes(codes, categories=pd.Index(values, dtype="str"))


def _kinds(name: tuple[np.ndarray, list], cat: tuple[np.ndarray, list]) -> pd.Categorical:
    """The kind of every event, classifying each distinct (name, category) pair once."""
    width = len(cat[1]) + 1  # code -1 (no category) becomes 0
    inverse, pairs = pd.factorize(name[0].astype(np.int64) * width + cat[0] + 1)
    names, cats = name[1] + [""], [""] + cat[1]
    lookup = np.array(
        [KIND_NAMES.index(event_kind(names[p // width], cats[p % width])) for p in pairs],
        dtype=np.int8,
    )
    return pd.Categorical.from_codes(lookup[inverse], categories=KIND_NAMES)


def _lanes(
    rank: np.ndarray, pid: tuple, tid: tuple, cat: tuple, thread_names: dict, merged: bool
) -> pd.Categorical:
    """A readable lane per (rank, pid, tid): the thread's name if the trace gives one,
    ``GPU p stream t`` for GPU events, else ``thread t`` (with the pid when a rank has
    several processes)."""
    gpu_cat = np.array([c in GPU_CATEGORIES for c in cat[1]] + [False])
    n_pid, n_tid = len(pid[1]) + 1, len(tid[1]) + 1
    key = ((rank.astype(np.int64) * n_pid + pid[0] + 1) * n_tid + tid[0] + 1) * 2 + gpu_cat[cat[0]]
    inverse, keys = pd.factorize(key)
    lanes = pd.DataFrame(
        {
            "rank": keys // (2 * n_tid * n_pid),
            "gpu": (keys % 2).astype(bool),
            "pid": [pid[1][i] if i >= 0 else "" for i in (keys // (2 * n_tid)) % n_pid - 1],
            "tid": [tid[1][i] if i >= 0 else "" for i in (keys // 2) % n_tid - 1],
        }
    )
    numeric = lanes["pid"].str.fullmatch(r"-?\d+")
    cpu_pids = lanes[~lanes["gpu"] & numeric].groupby("rank")["pid"].nunique()
    labels = []
    for r, p, t, g, num in zip(lanes["rank"], lanes["pid"], lanes["tid"], lanes["gpu"], numeric):
        named = thread_names.get((r, p, t))
        if merged and named:
            labels.append(named)
        elif g:
            labels.append(f"GPU {p} stream {t}")
        else:
            base = named or f"thread {t}"
            labels.append(f"{base} (pid {p})" if cpu_pids.get(r, 0) > 1 and num else base)
    codes, values = pd.factorize(np.array(labels, dtype=object))
    return _categorical(codes[inverse].astype(np.int32), list(values))
