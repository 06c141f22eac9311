"""Reading one trace file into columns: the part of loading done once per file.

:func:`read_columns` turns a ``.json`` / ``.json.gz`` Chrome or Kineto trace into a
:class:`FileColumns` (its header, and its complete events as numpy arrays and codes). It runs
in the calling process or in a worker process of a parallel load, so everything it returns
pickles. The public API is in :mod:`helpers.traces`.

Speed: the file is decoded by msgspec straight into small typed records (only the fields
the loader uses; everything else is skipped while parsing), and each column is taken from
those records in one C-level pass. A file whose fields have unexpected types (a number where
a name should be, a start time written as text) is decoded again by a lenient decoder that
accepts any JSON value and keeps what it can.
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np
import pandas as pd

RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"})


class TraceError(ValueError):
    """A trace file (or a set of them) that cannot be used. ``path`` names the file."""

    def __init__(self, path: str | Path | None, problem: str):
        self.path = None if path is None else Path(path)
        self.problem = problem
        from .runs import show_path

        super().__init__(f"{show_path(self.path)}: {problem}" if self.path is not None else problem)

    def __reduce__(self):  # rebuilt from (path, problem) when it comes back from a worker
        return TraceError, (self.path, self.problem)


class TraceWarning(UserWarning):
    """A trace was loaded, but not exactly as written (bytes replaced, events left out)."""


@dataclass
class TraceHeader:
    """What a trace says about itself (all optional in foreign traces), and what loading it
    had to change (``notes``)."""

    path: Path
    rank: int
    rank_source: str  # "distributedInfo", "file name", "argument", "assumed" or "merged file"
    world_size: int | None = None
    backend: str | None = None
    process_groups: list = field(default_factory=list, repr=False)
    host: str | None = None
    run_id: str | None = None
    base_time_ns: int | None = None
    schema_version: int | None = None
    pids: list = field(default_factory=list)
    events: int = 0
    start_us: float = float("nan")
    end_us: float = float("nan")
    notes: list[str] = field(default_factory=list)


@dataclass
class FileColumns:
    """The complete events of one file: times as float64 arrays (absolute µs), text columns
    as ``(codes, values)`` with code -1 for a missing value, ``ranks`` per event for a merged
    file, the thread names from the file's metadata, and each event's step."""

    header: TraceHeader
    start: np.ndarray
    dur: np.ndarray
    text: dict[str, tuple[np.ndarray, list]]
    ranks: np.ndarray | None
    thread_names: dict[tuple[str, str], str]
    step: np.ndarray  # the ProfilerStep#N each event starts in, -1 outside steps
    skipped: int = 0


# ------------------------------------------------------------------ decoding the file

_EMPTY = msgspec.Raw(b"")


class _Args(msgspec.Struct, frozen=True, gc=False):
    """The few ``args`` that become columns; the rest is skipped while parsing."""

    name: Any = None
    collective: Any = msgspec.field(default=None, name="Collective name")
    dims: msgspec.Raw = msgspec.field(default=_EMPTY, name="Input Dims")
    stream: Any = None


_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: Union[str, None] = ""  # the legacy profiler writes null
    pid: Union[int, str] = ""
    tid: Union[int, str] = ""
    ts: Union[float, None] = None
    dur: float = 0.0
    args: _Args = _NO_ARGS


class _Header(msgspec.Struct, gc=False):
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    schemaVersion: Any = None
    host_name: Any = None
    run_id: Any = None
    mergedRanks: Any = None
    world_size: Any = None
    backend: Any = None


class _Doc(_Header, gc=False):
    traceEvents: list[_Event] = []


class _AnyEvent(msgspec.Struct, gc=False):
    ph: Any = ""
    name: Any = ""
    cat: Any = ""
    pid: Any = ""
    tid: Any = ""
    ts: Any = None
    dur: Any = 0.0
    args: Any = None


class _AnyDoc(_Header, gc=False):
    traceEvents: list[_AnyEvent] = []


_FAST = msgspec.json.Decoder(_Doc)
_LENIENT = msgspec.json.Decoder(_AnyDoc)


def read_bytes(path: Path) -> bytes:
    """The (decompressed) bytes of a .json or .json.gz file, or a TraceError saying why not."""
    if not path.exists():
        raise TraceError(path, "no such file")
    if path.is_dir():
        raise TraceError(path, "is a folder; use load_run() for a folder of traces")
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except EOFError:
            raise TraceError(
                path,
                "the gzip stream ends early: the file is truncated "
                "(was the rank killed while writing it?)",
            ) from None
        except (OSError, zlib.error) as e:
            raise TraceError(
                path, f"broken gzip data ({e}); re-copy or re-record the file"
            ) from None
    elif path.name.endswith(".gz"):
        raise TraceError(path, "named .gz but is not gzip data; rename it or re-compress it")
    if not data or data.isspace():
        raise TraceError(
            path,
            "the file is empty (the profiler never wrote it, or the rank died "
            "before exporting); re-run that rank",
        )
    return data


def decode_error(path: Path, err: msgspec.DecodeError) -> TraceError:
    """The TraceError that says, in words, why ``path`` did not parse."""
    text = str(err)
    if isinstance(err, msgspec.ValidationError):
        return TraceError(
            path,
            "has no 'traceEvents' list of events: not a Chrome/Kineto trace "
            "(written by prof.export_chrome_trace or a trace handler?)",
        )
    if "truncated" in text:
        return TraceError(
            path,
            "the JSON stops before it is complete: the file is truncated "
            "(was the rank killed while writing it?); re-run, or drop this "
            "file and load the others with strict=False",
        )
    return TraceError(path, f"not valid JSON ({text}); is this a profiler trace?")


def decode(path: Path, data: bytes, notes: list[str]) -> _Doc:
    """Parse a trace file, turning every failure into a TraceError. Invalid UTF-8 is replaced
    (and noted); fields of unexpected types go through the lenient decoder."""
    if data.lstrip()[:1] == b"[":  # the bare-array form of the Chrome trace format
        data = b'{"traceEvents":' + data + b"}"
    try:
        try:
            return _FAST.decode(data)
        except UnicodeDecodeError:
            data = data.decode("utf-8", errors="replace").encode()
            notes.append("bytes that are not valid UTF-8 were replaced with \ufffd")
            return _FAST.decode(data)
    except msgspec.ValidationError:
        try:
            return _lenient(_LENIENT.decode(data), notes)
        except msgspec.DecodeError as err:
            raise decode_error(path, err) from None
    except msgspec.DecodeError as err:
        raise decode_error(path, err) from None


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if np.isfinite(number) else None


def _lenient(doc: _AnyDoc, notes: list[str]) -> _Doc:
    """Events of any JSON types as typed events: names as text, times as numbers where they
    parse (a start time that does not parse is left empty), ids as they are or as text."""

    def text(value: Any) -> str:
        return "" if value is None else value if isinstance(value, str) else str(value)

    def ident(value: Any) -> int | str:
        return (
            value if isinstance(value, (int, str)) and not isinstance(value, bool) else text(value)
        )

    events = []
    for e in doc.traceEvents:
        args = e.args if isinstance(e.args, dict) else {}
        dims = args.get("Input Dims")
        events.append(
            _Event(
                ph=text(e.ph),
                name=text(e.name),
                cat=text(e.cat),
                pid=ident(e.pid),
                tid=ident(e.tid),
                ts=_number(e.ts),
                dur=_number(e.dur) or 0.0,
                args=_Args(
                    name=args.get("name"),
                    collective=args.get("Collective name"),
                    stream=args.get("stream"),
                    dims=_EMPTY if dims is None else msgspec.Raw(msgspec.json.encode(dims)),
                ),
            )
        )
    notes.append(
        "some fields had unexpected types and were read leniently (as text, or left "
        "empty where a number did not parse)"
    )
    header = {f: getattr(doc, f) for f in _Header.__struct_fields__}
    return _Doc(traceEvents=events, **header)


# ------------------------------------------------------------ events with a duration


def _paired(events: list[_Event]) -> tuple[list[_Event], int]:
    """Complete events made from ``B``/``E`` pairs (per thread, in time order); returns them
    and the number of begins or ends left without a partner."""
    begin_end = sorted(
        (e for e in events if (e.ph == "B" or e.ph == "E") and e.ts is not None),
        key=attrgetter("ts"),
    )
    open_spans: dict[tuple, list[_Event]] = {}
    out, unmatched = [], 0
    for e in begin_end:
        stack = open_spans.setdefault((e.pid, e.tid), [])
        if e.ph == "B":
            stack.append(e)
        elif stack:
            b = stack.pop()
            out.append(
                _Event(
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


def complete_events(events: list[_Event], notes: list[str]) -> tuple[list[_Event], list[_Event]]:
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


def _times(path: Path, xs: list[_Event], strict: bool, notes: list[str]):
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


# ------------------------------------------------------------------------- columns


def _codes(values: list, as_text=None) -> tuple[np.ndarray, list]:
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


def _compact(text: dict[str, tuple[np.ndarray, list]]) -> dict[str, tuple[np.ndarray, list]]:
    """The text columns in their smallest code type, with distinct values copied, so that no
    string keeps the memory of the decoded file alive once it is freed."""

    def copy(value):
        return value.encode().decode() if isinstance(value, str) else value

    return {
        column: (codes.astype(code_dtype(len(values)), copy=False), [copy(v) for v in values])
        for column, (codes, values) in text.items()
    }


def _stream_id(value: Any) -> int | None:
    """A GPU stream id as a number: ints as they are, text such as ``"7"`` or ``"0x0"``
    (ROCm) parsed; anything else left empty."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(str(value), 0)
    except ValueError:
        return None


def _shape_text(dims: bytes) -> str | None:
    return dims.translate(None, b" \t\r\n").decode(errors="replace") if dims else None


def _thread_names(meta: list[_Event]) -> dict[tuple[str, str], str]:
    return {
        (str(e.pid), str(e.tid)): str(e.args.name)
        for e in meta
        if e.name == "thread_name" and e.args.name is not None
    }


def _step_numbers(start: np.ndarray, end: np.ndarray, name: tuple[np.ndarray, list]) -> np.ndarray:
    """The ``ProfilerStep#N`` each event (sorted by start) starts in; -1 outside every step."""
    numbers = np.array(
        [int(m.group(1)) if (m := STEP_NAME.match(v)) else -1 for v in name[1]] + [-1],
        dtype=np.int64,
    )
    of_event = numbers[name[0]]
    steps = np.flatnonzero(of_event >= 0)
    if not len(steps):
        return np.full(len(start), -1, np.int32)
    pos = np.searchsorted(start[steps], start, side="right") - 1
    inside = (pos >= 0) & (start < end[steps][np.clip(pos, 0, None)])
    return np.where(inside, of_event[steps][np.clip(pos, 0, None)], -1).astype(np.int32)


def _window_of_steps(
    path: Path, xs: list[_Event], ts: np.ndarray, dur: np.ndarray, steps: tuple[int, int]
):
    """Only the events that start inside ``ProfilerStep#first`` .. ``#last`` (inclusive)."""
    first, last = steps
    found = {
        int(m.group(1)): i
        for i, e in enumerate(xs)
        if e.name.startswith("ProfilerStep#") and (m := STEP_NAME.match(e.name))
    }
    inside = [i for n, i in found.items() if first <= n <= last]
    if not inside:
        raise TraceError(
            path,
            f"steps={steps}: no ProfilerStep#{first}..#{last} here; steps "
            f"present: {sorted(found) or 'none (was a schedule used?)'}",
        )
    keep = (ts >= ts[inside].min()) & (ts < (ts[inside] + dur[inside]).max())
    return [e for e, k in zip(xs, keep) if k], ts[keep], dur[keep]


def _ids(xs: list[_Event], field_name: str) -> tuple[np.ndarray, list]:
    """Codes of a pid or tid column: fast when every id is an int, as Kineto writes them."""
    try:
        ids = np.fromiter(map(attrgetter(field_name), xs), np.int64, len(xs))
    except (TypeError, ValueError):
        return _codes(list(map(attrgetter(field_name), xs)), str)
    codes, distinct = pd.factorize(ids)
    return codes.astype(np.int32), [str(v) for v in distinct]


def _sparse(xs: list[_Event], field_name: str, as_text) -> tuple[np.ndarray, list]:
    """Codes of a column that most events leave empty (collective, stream)."""
    values = list(map(attrgetter(field_name), xs))
    if values.count(None) == len(values):
        return np.full(len(xs), -1, np.int32), []
    return _codes(values, as_text)


def columns_of(xs: list[_Event]) -> dict[str, tuple[np.ndarray, list]]:
    """The text columns of a list of complete events, as codes and distinct values."""
    dims = b"\x00".join(map(attrgetter("args.dims"), xs)).split(b"\x00") if xs else []
    return {
        "name": _codes(list(map(attrgetter("name"), xs))),
        "cat": _codes(list(map(attrgetter("cat"), xs))),
        "pid": _ids(xs, "pid"),
        "tid": _ids(xs, "tid"),
        "collective": _sparse(xs, "args.collective", str),
        "shapes": _codes([d or None for d in dims], _shape_text),
        "stream": _sparse(xs, "args.stream", _stream_id),
    }


# ------------------------------------------------------------------------ one file


def _rank_of(doc: _Doc, path: Path, rank: int | None, single: bool) -> tuple[int, str]:
    if rank is not None:
        return int(rank), "argument"
    info = doc.distributedInfo
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"], "distributedInfo"
    m = RANK_IN_NAME.search(path.name)
    if m:
        return int(m.group(1)), "file name"
    if single:
        return 0, "assumed"
    raise TraceError(
        path,
        "cannot tell which rank wrote it: no 'distributedInfo' in the trace "
        "and no 'rank<N>' in the file name. Pass the ranks: "
        "load_run({rank: path, ...})",
    )


def _base_time_ns(doc: _Doc) -> int | None:
    base = doc.baseTimeNanoseconds
    if isinstance(base, int) and not isinstance(base, bool):
        return base  # exact, as Kineto writes it
    number = _number(base)
    return None if number is None else int(number)


def _header(doc: _Doc, path: Path, rank: int | None, single: bool) -> TraceHeader:
    if doc.mergedRanks:
        return TraceHeader(
            path=path,
            rank=-1,
            rank_source="merged file",
            world_size=doc.world_size,
            backend=doc.backend,
            base_time_ns=_base_time_ns(doc),
        )
    rank, source = _rank_of(doc, path, rank, single)
    info = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    return TraceHeader(
        path=path,
        rank=rank,
        rank_source=source,
        world_size=info.get("world_size"),
        backend=info.get("backend"),
        process_groups=info.get("pg_config") or [],
        host=doc.host_name,
        run_id=doc.run_id,
        base_time_ns=_base_time_ns(doc),
        schema_version=doc.schemaVersion,
    )


def read_columns(
    path: Path,
    rank: int | None = None,
    strict: bool = True,
    steps: tuple[int, int] | None = None,
    single: bool = False,
) -> FileColumns:
    """Read one trace file into :class:`FileColumns` (see :func:`helpers.traces.load_trace`
    for the arguments); every problem is a :class:`TraceError` naming the file."""
    notes: list[str] = []
    doc = decode(path, read_bytes(path), notes)
    xs, meta = complete_events(doc.traceEvents, notes)
    if not xs:
        empty = " (its traceEvents list is empty)" if not doc.traceEvents else ""
        raise TraceError(
            path,
            f"holds no events with a duration (ph X, or B/E pairs){empty}: "
            f"nothing to load. Did the profiler record anything?",
        )
    header = _header(doc, path, rank, single)
    xs, start, dur, skipped = _times(path, xs, strict, notes)
    if steps is not None:
        xs, start, dur = _window_of_steps(path, xs, start, dur, steps)
    start += (header.base_time_ns or 0) / 1000.0
    text = columns_of(xs)
    order = np.lexsort((-(start + dur), start))  # by start; a parent before its children
    start, dur = start[order], dur[order]
    text = {column: (codes[order], values) for column, (codes, values) in text.items()}
    pid_codes, pids = text["pid"]
    ranks = None
    if header.rank_source == "merged file":
        ranks = np.asarray([int(p) for p in pids], dtype=np.int32)[pid_codes]
    header.events, header.pids, header.notes = len(xs), sorted(pids), notes
    header.start_us, header.end_us = float(start.min()), float((start + dur).max())
    steps_of = _step_numbers(start, start + dur, text["name"])
    thread_names = _thread_names(meta)
    del doc, xs, meta  # free the decoded file before the columns are kept
    return FileColumns(header, start, dur, _compact(text), ranks, thread_names, steps_of, skipped)
