"""A file's complete events as columns: numpy arrays, and codes into lists of distinct values.

:func:`complete_events` keeps the events with a duration (``X`` events, ``B``/``E`` pairs joined
into one) and the metadata events; :func:`times` takes their start times and durations (without
the events that have none, or a negative one); :func:`columns_of`, :func:`comm_numbers` and
:func:`call_sites` take the text columns and the numbers of collectives, each in one C-level
pass over the decoded records where the types allow it; :func:`kind_codes` and :func:`lanes`
give each event its kind and its readable lane.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from ._error import TraceError
from ._json import Event
from ._steps import GPU_CATEGORIES
from .kinds import KIND_NAMES, event_kind


def _paired(events: list[Event]) -> tuple[list[Event], int]:
    """Complete events made from ``B``/``E`` pairs (per thread, in time order); returns them
    and the number of begins or ends left without a partner."""
    begin_end = sorted(
        (e for e in events if (e.ph == "B" or e.ph == "E") and e.ts is not None),
        key=attrgetter("ts"),
    )
    open_spans: dict[tuple, list[Event]] = {}
    out, unmatched = [], 0
    for e in begin_end:
        stack = open_spans.setdefault((e.pid, e.tid), [])
        if e.ph == "B":
            stack.append(e)
        elif stack:
            b = stack.pop()
            out.append(
                Event(
                    ph="X",
                    name=b.name or e.name,
                    cat=b.cat or e.cat,
                    pid=b.pid,
                    tid=b.tid,
                    ts=b.ts,
                    dur=e.ts - b.ts,
                    args=b.args,
                )
            )
        else:
            unmatched += 1
    return out, unmatched + sum(len(s) for s in open_spans.values())


def complete_events(events: list[Event], notes: list[str]) -> tuple[list[Event], list[Event]]:
    """The events with a duration (``X`` events, and ``B``/``E`` pairs joined into one) and
    the metadata events (``M``: thread and process names)."""
    phases = list(map(attrgetter("ph"), events))
    xs = list(compress(events, map("X".__eq__, phases)))
    meta = list(compress(events, map("M".__eq__, phases)))
    found = set(phases)
    if "B" in found or "E" in found:
        pairs, unmatched = _paired(events)
        xs += pairs
        notes.append(
            f"{len(pairs)} B/E pairs joined into complete events"
            + (f"; {unmatched} begins or ends without a partner left out" if unmatched else "")
        )
    return xs, meta


def times(
    path: Path, xs: list[Event], strict: bool, notes: list[str]
) -> tuple[list[Event], np.ndarray, np.ndarray, int]:
    """Start times and durations as arrays, without the events that have no start time or a
    negative duration (an error when ``strict``); returns ``(xs, ts, dur, skipped)``."""
    n = len(xs)
    try:
        ts = np.fromiter(map(attrgetter("ts"), xs), np.float64, n)
    except TypeError:  # a missing start time
        ts = np.array([np.nan if e.ts is None else e.ts for e in xs], dtype=np.float64)
    dur = np.fromiter(map(attrgetter("dur"), xs), np.float64, n)
    bad = np.isnan(ts) | (dur < 0)
    if not bad.any():
        return xs, ts, dur, 0
    problems = [(np.isnan(ts), "have no start time 'ts'"), (dur < 0, "have a negative duration")]
    for mask, problem in problems:
        if mask.any():
            first = xs[int(np.flatnonzero(mask)[0])].name
            if strict:
                raise TraceError(
                    path,
                    f"{int(mask.sum())} events {problem} (the first is "
                    f"{first!r}); the file is damaged. Load with "
                    f"strict=False to leave them out",
                )
            notes.append(f"{int(mask.sum())} events that {problem} were left out")
    keep = ~bad
    return [e for e, k in zip(xs, keep) if k], ts[keep], dur[keep], int(bad.sum())


def _codes(values: list, as_text: Callable[[Any], Any] | None = None) -> tuple[np.ndarray, list]:
    """Codes (int32, -1 for None) and the distinct values, in order of first appearance;
    ``as_text`` turns each distinct value into the text kept (None: keep as it is)."""
    try:
        lookup = dict.fromkeys(values)
    except TypeError:  # a list or an object where a name or id should be: keep it as text
        values = [v if v is None or isinstance(v, (str, int, float)) else str(v) for v in values]
        lookup = dict.fromkeys(values)
    distinct = [v for v in lookup if v is not None]
    if as_text is not None:
        texts = [as_text(v) for v in distinct]
        labels = list(dict.fromkeys(texts))  # two values can read the same (1 and "1")
        index = {t: i for i, t in enumerate(labels)}
        for v, t in zip(distinct, texts):
            lookup[v] = index[t]
    else:
        labels = distinct
        for i, v in enumerate(distinct):
            lookup[v] = i
    lookup[None] = -1
    return np.fromiter(map(lookup.__getitem__, values), np.int32, len(values)), labels


def code_dtype(distinct: int) -> type:
    """The smallest integer type for codes into ``distinct`` values (-1 marks a missing one)."""
    return np.int16 if distinct < 2**15 - 1 else np.int32


def compact(text: dict[str, tuple[np.ndarray, list]]) -> dict[str, tuple[np.ndarray, list]]:
    """The text columns in their smallest code type, with distinct values copied, so that no
    string keeps the memory of the decoded file alive once it is freed."""

    def copy(value: Any) -> Any:
        return value.encode().decode() if isinstance(value, str) else value

    return {
        column: (codes.astype(code_dtype(len(values)), copy=False), [copy(v) for v in values])
        for column, (codes, values) in text.items()
    }


def _integer(value: Any) -> int | None:
    """A number written as an int or as text: a GPU stream id (``"7"``, or ``"0x0"`` on ROCm), a
    send's peer (``"1"``); anything else left empty."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        try:
            number = int(str(value), 0)
        except ValueError:  # also text of more than 4,300 digits
            return None
    return number if -(2**63) <= number < 2**63 else None  # the column is int64


def _shape_text(dims: bytes) -> str | None:
    """An ``Input Dims`` value as compact text (its JSON without spaces); None when absent."""
    return dims.translate(None, b" \t\r\n").decode(errors="replace") if dims else None


def thread_names(meta: list[Event]) -> dict[tuple[str, str], str]:
    """The thread names that the metadata events give, by ``(pid, tid)`` as text.

    A thread can be named twice: with the name it inherited from the thread that started it
    (the main thread's, ``python``), and with the one it gave itself (gloo's
    ``pt_gloo_runloop``), in either order; its own name wins."""
    found: dict[tuple[str, str], list[str]] = {}
    for e in meta:
        if e.name == "thread_name" and e.args.name is not None:
            found.setdefault((str(e.pid), str(e.tid)), []).append(str(e.args.name))
    return {key: _own_name(names, found.get((key[0], key[0]))) for key, names in found.items()}


def _own_name(names: list[str], main: list[str] | None) -> str:
    """Of a thread's ``names``, the last that is not the main thread's (``main``) own label."""
    inherited = {_label(n) for n in main or ()} if len(names) > 1 else set()
    own = [n for n in names if _label(n) not in inherited]
    return (own or names)[-1]


def _label(name: str) -> str:
    """What a thread name says beyond its id: ``python`` of ``thread 12 (python)``."""
    return name[name.rfind("(") + 1 : -1] if name.endswith(")") and "(" in name else name


def _ids(xs: list[Event], field_name: str) -> tuple[np.ndarray, list]:
    """Codes of a pid or tid column: fast when every id is an int, as Kineto writes them."""
    try:
        ids = np.fromiter(map(attrgetter(field_name), xs), np.int64, len(xs))
    except (TypeError, ValueError, OverflowError):  # text ids, or ints beyond 64 bits: as text
        return _codes(list(map(attrgetter(field_name), xs)), str)
    codes, distinct = pd.factorize(ids)
    return codes.astype(np.int32), [str(v) for v in distinct]


def _sparse(
    xs: list[Event], field_name: str, as_text: Callable[[Any], Any]
) -> tuple[np.ndarray, list]:
    """Codes of a column that most events leave empty (collective, stream)."""
    values = list(map(attrgetter(field_name), xs))
    if values.count(None) == len(values):
        return np.full(len(xs), -1, np.int32), []
    return _codes(values, as_text)


def columns_of(xs: list[Event]) -> dict[str, tuple[np.ndarray, list]]:
    """The text columns of a list of complete events, as codes and distinct values."""
    dims = b"\x00".join(map(attrgetter("args.dims"), xs)).split(b"\x00") if xs else []
    return {
        "name": _codes(list(map(attrgetter("name"), xs))),
        "cat": _codes(list(map(attrgetter("cat"), xs))),
        "pid": _ids(xs, "pid"),
        "tid": _ids(xs, "tid"),
        "collective": _sparse(xs, "args.collective", str),
        "shapes": _codes([d or None for d in dims], _shape_text),
        "stream": _sparse(xs, "args.stream", _integer),
    }


def _ints(xs: list[Event], field_name: str) -> np.ndarray:
    """A column of non-negative integers (ids, counts) as int64, -1 where missing or not one
    (the fast decoder gives ints, -1 when absent; the lenient one gives anything)."""
    try:
        return np.fromiter(map(attrgetter(field_name), xs), np.int64, len(xs))
    except (TypeError, ValueError, OverflowError):
        values = map(attrgetter(field_name), xs)
        return np.array(
            [v if type(v) is int and 0 <= v < 2**63 else -1 for v in values], dtype=np.int64
        )


#: Bytes per element of the dtypes a collective's ``dtype`` arg names (c10's ScalarType names).
DTYPE_BYTES = {
    "Double": 8, "Long": 8, "ComplexFloat": 8, "UInt64": 8, "ComplexDouble": 16,
    "Float": 4, "Int": 4, "UInt32": 4, "Half": 2, "BFloat16": 2, "Short": 2, "UInt16": 2,
    "Char": 1, "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
    "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1,
}  # fmt: skip


def ints_of_rows(xs: list[Event], field_name: str, rows: np.ndarray) -> np.ndarray:
    """:func:`_ints` of the events at ``rows`` only; -1 for every other event."""
    out = np.full(len(xs), -1, np.int64)
    if len(rows):
        out[rows] = _ints([xs[i] for i in rows], field_name)
    return out


def call_sites(xs: list[Event], cat: tuple[np.ndarray, list]) -> tuple[np.ndarray, list]:
    """Where each Python function was called from (``file:line``, the ``CallFrom`` arg that
    ``with_stack=True`` writes), as a text column; only ``python_function`` events have one."""
    codes = np.full(len(xs), -1, np.int32)
    if "python_function" not in cat[1]:
        return codes, []
    rows = np.flatnonzero(cat[0] == cat[1].index("python_function"))
    sites, values = _sparse([xs[i] for i in rows], "args.call_from", str)
    codes[rows] = sites
    return codes, values


def comm_numbers(
    xs: list[Event], collective: np.ndarray, name: tuple[np.ndarray, list]
) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, list]]:
    """What a collective's args say about it, per event (-1 where unknown): ``msg_bytes``, its
    message size as nccl-tests counts it (the larger of input and output, so the whole buffer
    of an all-gather or a reduce-scatter), ``group_size`` and the sequence number ``seq``;
    and its process group as a text column: its name, and its ranks when the trace gives them
    (``0 [0, 1]``), so that groups that share a name on different ranks (one per node of a
    mesh) stay apart. Only the events with a collective name (codes ``collective`` >= 0) are
    read; and a send's or a receive's ``peer`` and ``tag`` (:func:`peers_and_tags`, from the
    ``name`` column)."""
    named = np.flatnonzero(collective >= 0)
    columns = {c: np.full(len(xs), -1, np.int64) for c in ("msg_bytes", "group_size", "seq")}
    columns.update(peers_and_tags(xs, name))
    group = np.full(len(xs), -1, np.int32)
    if not len(named):
        return columns, (group, [])
    mine = [xs[i] for i in named]
    for column, values in _comm_numbers(mine).items():
        columns[column][named] = values
    labels = [_group_label(e.args.group, e.args.group_ranks) for e in mine]
    codes, groups = _codes(labels)
    group[named] = codes
    return columns, (group, groups)


def _group_label(name: Any, ranks: Any) -> str | None:
    """A collective's process group as text: its name, then its ranks when known."""
    if name is None:
        return None
    return f"{name} {ranks}" if isinstance(ranks, (str, list)) and ranks else str(name)


def _comm_numbers(xs: list[Event]) -> dict[str, np.ndarray]:
    """``msg_bytes``, ``group_size`` and ``seq`` of each of ``xs`` (all collectives)."""
    elements = np.maximum(_ints(xs, "args.in_nelems"), _ints(xs, "args.out_nelems"))
    dtypes = list(map(attrgetter("args.dtype"), xs))
    size = np.array(
        [DTYPE_BYTES.get(d, -1) if isinstance(d, str) else -1 for d in dtypes]
        if dtypes.count(None) < len(dtypes)
        else np.full(len(xs), -1),
        np.int64,
    )
    known = (elements >= 0) & (size > 0) & (elements < 2**62 // 16)
    return {
        "msg_bytes": np.where(known, elements * np.maximum(size, 0), -1),
        "group_size": _ints(xs, "args.group_size"),
        "seq": _ints(xs, "args.seq"),
    }


#: The ops of a send and a receive whose ``Concrete Inputs`` are ``[tensors, group, peer, tag]``.
POINT_TO_POINT_OPS = ("c10d::send", "c10d::recv_")


def peers_and_tags(xs: list[Event], name: tuple[np.ndarray, list]) -> dict[str, np.ndarray]:
    """``peer`` and ``tag`` of each send and receive op (:data:`POINT_TO_POINT_OPS`), read from
    its ``Concrete Inputs`` (a trace recorded with ``record_shapes=True``); -1 for every other
    event, and where the trace does not say. The peer is the rank in the op's process group."""
    out = {c: np.full(len(xs), -1, np.int64) for c in ("peer", "tag")}
    codes = [name[1].index(n) for n in POINT_TO_POINT_OPS if n in name[1]]
    for row in np.flatnonzero(np.isin(name[0], codes)).tolist():
        raw = xs[row].args.concrete
        try:
            values = msgspec.json.decode(raw) if raw else None
        except (msgspec.DecodeError, UnicodeDecodeError):
            continue
        if isinstance(values, list) and len(values) == 4:
            for column, value in zip(("peer", "tag"), values[2:]):
                number = _integer(value)
                out[column][row] = number if number is not None and number >= 0 else -1
    return out


def kind_codes(name: tuple[np.ndarray, list], cat: tuple[np.ndarray, list]) -> np.ndarray:
    """The kind of every event (int8 codes into :data:`helpers.traces.kinds.KIND_NAMES`), from its
    name and category columns, classifying each distinct (name, category) pair once."""
    width = len(cat[1]) + 1  # code -1 (no category) becomes 0
    inverse, pairs = pd.factorize(name[0].astype(np.int64) * width + cat[0] + 1)
    names, cats = name[1] + [""], [""] + cat[1]
    lookup = np.array(
        [KIND_NAMES.index(event_kind(names[p // width], cats[p % width])) for p in pairs],
        dtype=np.int8,
    )
    return lookup[inverse]


def lanes(
    ranks: np.ndarray,
    pid: tuple[np.ndarray, list],
    tid: tuple[np.ndarray, list],
    cat: tuple[np.ndarray, list],
    names: dict[tuple[str, str], str],
    merged: bool,
) -> tuple[np.ndarray, list]:
    """A readable lane per event, as a text column: per (rank, pid, tid), the thread's name
    from ``names`` (:func:`thread_names`) in a merged file, ``GPU p stream t`` for GPU events,
    else the thread's name or ``thread t``, with the pid when a rank has several processes."""
    gpu_cat = np.array([c in GPU_CATEGORIES for c in cat[1]] + [False])
    n_pid, n_tid = len(pid[1]) + 1, len(tid[1]) + 1
    key = ((ranks.astype(np.int64) * n_pid + pid[0] + 1) * n_tid + tid[0] + 1) * 2 + gpu_cat[cat[0]]
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
        named = names.get((p, t))
        if merged and named:
            labels.append(named)
        elif g:
            labels.append(f"GPU {p} stream {t}")
        else:
            base = named or f"thread {t}"
            labels.append(f"{base} (pid {p})" if cpu_pids.get(r, 0) > 1 and num else base)
    codes, values = pd.factorize(np.array(labels, dtype=object))
    return codes[inverse].astype(np.int32), list(values)
