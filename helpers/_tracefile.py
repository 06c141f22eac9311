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

import os
import re
import zlib
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from pathlib import Path
from typing import Any

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
    gpu_events_without_launch: int = 0  # GPU events whose CPU launch is not in the trace
    notes: list[str] = field(default_factory=list)


@dataclass
class FileColumns:
    """The complete events of one file: times as float64 arrays (absolute µs), text columns
    as ``(codes, values)`` with code -1 for a missing value, ``ranks`` per event for a merged
    file, the thread names from the file's metadata, each event's step, each GPU event's
    launch time, and the numbers that describe a collective."""

    header: TraceHeader
    start: np.ndarray
    dur: np.ndarray
    text: dict[str, tuple[np.ndarray, list]]
    ranks: np.ndarray | None
    thread_names: dict[tuple[str, str], str]
    step: np.ndarray  # the ProfilerStep#N each event starts in (GPU events: launched in), or -1
    launch: np.ndarray  # when the CPU launched each GPU event (absolute µs); NaN otherwise
    numbers: dict[str, np.ndarray]  # msg_bytes, group_size, seq of collectives; -1 if unknown
    skipped: int = 0


# ------------------------------------------------------------------ decoding the file

_EMPTY = msgspec.Raw(b"")


class _Args(msgspec.Struct, frozen=True, gc=False):
    """The few ``args`` that become columns; the rest is skipped while parsing.

    ``correlation`` links a GPU event to the CUDA runtime call that launched it (both carry
    the same id); ``external_id`` links a GPU annotation to its CPU annotation. The others
    describe a collective (on ``record_param_comms`` and, in newer traces, on NCCL kernels)."""

    name: Any = None
    collective: Any = msgspec.field(default=None, name="Collective name")
    dims: msgspec.Raw = msgspec.field(default=_EMPTY, name="Input Dims")
    stream: Any = None
    # integers as Kineto writes them, -1 when absent (other types: the lenient decoder)
    correlation: int = -1
    external_id: int = msgspec.field(default=-1, name="External id")
    in_nelems: int = msgspec.field(default=-1, name="In msg nelems")
    out_nelems: int = msgspec.field(default=-1, name="Out msg nelems")
    dtype: Any = None
    group: Any = msgspec.field(default=None, name="Process Group Name")
    group_size: int = msgspec.field(default=-1, name="Group size")
    seq: int = msgspec.field(default=-1, name="Seq")
    call_from: Any = msgspec.field(default=None, name="CallFrom")  # python_function: its caller


_NO_ARGS = _Args()
#: The key in a trace's ``args`` of each field of :class:`_Args`.
_ARG_KEYS = {f: (e or f) for f, e in zip(_Args.__struct_fields__, _Args.__struct_encode_fields__)}


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str | None = ""  # the legacy profiler writes null
    pid: int | str = ""
    tid: int | str = ""
    ts: float | None = None
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

# ------------------------------------------------------------------ bounds on input

#: The most bytes one trace file may hold, decompressed (``PDP_MAX_TRACE_MB`` overrides it).
MAX_TRACE_BYTES = 2 * 1024**3
#: The most a gzip file may expand, as a multiple of its compressed size, once it is over
#: ``RATIO_FROM_BYTES`` (``PDP_MAX_GZIP_RATIO`` overrides it). Real traces expand 10-30x; a
#: gzip bomb (a small file of repeated bytes) about 1,000x.
MAX_GZIP_RATIO = 200
RATIO_FROM_BYTES = 64 * 1024**2
MAX_RANK = 2**31 - 1  # ranks are int32 in the frames
_CHUNK = 1 << 16  # compressed bytes read at a time (the expansion is checked that often)
_SPACE = re.compile(rb"[ \t\r\n]*")


def _limit(variable: str, default: float, scale: float) -> float:
    """The limit the environment variable sets (in units of ``scale``), else ``default``."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        value = float(text) * scale
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise TraceError(
            None, f"{variable}={text!r} is not a positive number; unset it or give a number"
        )
    return value


def max_trace_bytes() -> int:
    """The size limit of one decompressed trace file: ``PDP_MAX_TRACE_MB`` (MiB) if set,
    else :data:`MAX_TRACE_BYTES`."""
    return int(_limit("PDP_MAX_TRACE_MB", MAX_TRACE_BYTES, 1024**2))


def _mib(size: float) -> str:
    return f"{size / 1024**2:,.{1 if size < 10 * 1024**2 else 0}f} MiB"


def _too_big(path: Path, size: str, limit: int) -> TraceError:
    return TraceError(
        path,
        f"{size}, over the limit of {_mib(limit)} for one trace file (a "
        f"decompression bomb, or a very big trace). If you trust the file and have the "
        f"memory, raise the limit: set the environment variable PDP_MAX_TRACE_MB (MiB) "
        f"before loading, e.g. os.environ['PDP_MAX_TRACE_MB'] = '"
        f"{max(2 * limit // 1024**2, 1)}'; or record fewer steps per file",
    )


def _gunzip(path: Path, f, limit: int, ratio: float) -> bytearray:
    """Decompress the gzip file ``f`` (one or more members) piece by piece, stopping as soon
    as the output passes ``limit`` bytes or ``ratio`` times the compressed bytes read."""
    out = bytearray()
    unzip, fed, read = zlib.decompressobj(wbits=31), False, 0
    pending = b""
    try:
        while True:
            if not pending:
                pending = f.read(_CHUNK)
                read += len(pending)
                if not pending:
                    if fed and not unzip.eof:  # output zlib still holds (at most one match)
                        out += unzip.flush()
                    break
            out += unzip.decompress(pending, 1 << 23)  # 8 MiB at most at a time
            fed, pending = True, unzip.unconsumed_tail
            if len(out) > limit:
                raise _too_big(path, f"decompresses to more than {_mib(len(out))}", limit)
            if len(out) > RATIO_FROM_BYTES and len(out) > ratio * read:
                raise TraceError(
                    path,
                    f"expands more than {ratio:.0f}x (from {_mib(read)} to over "
                    f"{_mib(len(out))}): a decompression bomb, not a trace (real "
                    f"traces expand 10-30x). If you trust it, set the environment variable "
                    f"PDP_MAX_GZIP_RATIO to a larger factor before loading",
                )
            if unzip.eof:  # another member may follow (concatenated gzip files)
                pending = unzip.unused_data
                while pending is not None and not pending.strip(b"\x00"):  # zero padding
                    more = f.read(_CHUNK)
                    read += len(more)
                    pending = more if more else None
                if pending is None:
                    return out
                pending = pending.lstrip(b"\x00")
                unzip, fed = zlib.decompressobj(wbits=31), False
    except zlib.error as e:
        raise TraceError(path, f"broken gzip data ({e}); re-copy or re-record the file") from None
    if fed and not unzip.eof:
        raise TraceError(
            path,
            "the gzip stream ends early: the file is truncated "
            "(was the rank killed while writing it?)",
        )
    return out


def read_bytes(path: Path) -> bytearray:
    """The (decompressed) bytes of a .json or .json.gz file, or a TraceError saying why not.

    The file is read into one buffer, without a second copy; gzip data is decompressed piece
    by piece and given up as soon as it passes :func:`max_trace_bytes` or expands more than
    :data:`MAX_GZIP_RATIO` times (``PDP_MAX_GZIP_RATIO``), so a small hostile file costs
    little memory."""
    if not path.exists():
        raise TraceError(path, "no such file")
    if path.is_dir():
        raise TraceError(path, "is a folder; use load_run() for a folder of traces")
    limit = max_trace_bytes()
    ratio = _limit("PDP_MAX_GZIP_RATIO", MAX_GZIP_RATIO, 1.0)
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if f.read(2) == b"\x1f\x8b":
                f.seek(0)
                data = _gunzip(path, f, limit, ratio)
            elif path.name.endswith(".gz"):
                raise TraceError(
                    path, "named .gz but is not gzip data; rename it or re-compress it"
                )
            elif size > limit:
                raise _too_big(path, f"is {_mib(size)}", limit)
            else:
                f.seek(0)
                data = bytearray(size)
                got = f.readinto(data)
                if got < size:  # the file shrank while being read
                    del data[got:]
    except OSError as e:
        raise TraceError(path, f"cannot be read ({e.strerror or e}); check the file") from None
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
    if "out of range" in text:  # a number such as 1e400 or 10**400
        where = text.partition(" - at ")[2]
        return TraceError(
            path,
            f"holds a number too large to read{' (at ' + where + ')' if where else ''}, such "
            f"as 1e400: the file is damaged or was edited; re-record it, or fix that value",
        )
    if isinstance(err, msgspec.ValidationError):
        where = text.partition(" - at ")[2].strip("`")
        if where.startswith("$.traceEvents["):
            return TraceError(
                path,
                f"{where[2:]} is not an event ({text.partition(' - ')[0]}): the file is "
                f"damaged or not a Chrome/Kineto trace; re-record it",
            )
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


def too_deep(path: Path) -> TraceError:
    """The TraceError of a file whose JSON is nested deeper than Python can follow."""
    return TraceError(
        path,
        "its JSON is nested too deeply (hundreds of levels of [ or {): not a profiler "
        "trace, whose events nest a few levels; is this file what you meant to load?",
    )


def is_bare_array(data: bytes | bytearray) -> bool:
    """Whether the JSON is an array (the bare form of the Chrome trace format), not an
    object; read without copying the data."""
    first = _SPACE.match(data).end()
    return data[first : first + 1] == b"["


def decode(path: Path, data: bytes | bytearray, notes: list[str]) -> _Doc:
    """Parse a trace file, turning every failure into a TraceError. Invalid UTF-8 is replaced
    (and noted); fields of unexpected types go through the lenient decoder."""
    if is_bare_array(data):  # the bare-array form of the Chrome trace format
        if isinstance(data, bytearray):  # in place: no second copy of the file
            data[:0] = b'{"traceEvents":'
            data += b"}"
        else:
            data = b'{"traceEvents":' + data + b"}"
    try:
        try:
            return _typed(data, notes)
        except UnicodeDecodeError:
            data = data.decode("utf-8", errors="replace")  # msgspec reads text as well
            notes.append("bytes that are not valid UTF-8 were replaced with \ufffd")
            return _typed(data, notes)
    except msgspec.DecodeError as err:
        raise decode_error(path, err) from None
    except RecursionError:
        raise too_deep(path) from None


def _typed(data: bytes | bytearray | str, notes: list[str]) -> _Doc:
    """The fast decoder's events, or the lenient one's when a field has an unexpected type."""
    try:
        return _FAST.decode(data)
    except msgspec.ValidationError:
        return _lenient(_LENIENT.decode(data), notes)


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond a float
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
                    **{
                        f: args.get(_ARG_KEYS[f])
                        for f in _ARG_KEYS
                        if f not in ("name", "collective", "stream", "dims")
                    },
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
        number = value
    else:
        try:
            number = int(str(value), 0)
        except ValueError:  # also text of more than 4,300 digits
            return None
    return number if -(2**63) <= number < 2**63 else None  # the column is int64


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
    of_event = _step_of_name(name)
    steps = np.flatnonzero(of_event >= 0)
    if not len(steps):
        return np.full(len(start), -1, np.int32)
    pos = np.searchsorted(start[steps], start, side="right") - 1
    inside = (pos >= 0) & (start < end[steps][np.clip(pos, 0, None)])
    return np.where(inside, of_event[steps][np.clip(pos, 0, None)], -1).astype(np.int32)


def _first_equal(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """For each of ``wanted``, the position in ``keys`` of the first equal key, or -1."""
    if not len(keys):
        return np.full(len(wanted), -1, np.int64)
    order = np.argsort(keys, kind="stable")
    pos = np.minimum(np.searchsorted(keys[order], wanted), len(keys) - 1)
    return np.where(keys[order][pos] == wanted, order[pos], -1)


def _rows_of(rows: np.ndarray, found: np.ndarray) -> np.ndarray:
    """``rows[found]`` where ``found`` >= 0, else -1."""
    if not len(rows):
        return np.full(len(found), -1, np.int64)
    return np.where(found >= 0, rows[np.maximum(found, 0)], -1)


def _launches(
    step: np.ndarray,
    start: np.ndarray,
    gpu: np.ndarray,
    correlation: np.ndarray,
    external_id: np.ndarray,
    ranks: np.ndarray | None,
) -> tuple[np.ndarray, int]:
    """Give every GPU event the step of the CPU event that launched it (in place on ``step``).

    A kernel, memcpy or memset carries the ``correlation`` id of the CUDA runtime call that
    launched it (the ``ac2g`` flow arrows of the trace join the same pairs); a GPU annotation
    carries the ``External id`` of its CPU annotation. Returns the launch time of each GPU
    event (NaN for CPU events and for GPU events whose launch is not in the trace: their step
    becomes -1) and the number of GPU events without a launch. In a merged file ids repeat
    across ranks, so each rank is matched on its own."""
    launch = np.full(len(step), np.nan)
    if not gpu.any():
        return launch, 0
    groups = (
        [np.arange(len(step))]
        if ranks is None
        else [np.flatnonzero(ranks == r) for r in np.unique(ranks)]
    )
    missing = 0
    for rows in groups:
        kernels = rows[gpu[rows]]
        if not len(kernels):
            continue
        cpu = rows[~gpu[rows]]
        by_correlation = cpu[correlation[cpu] >= 0]
        source = _rows_of(
            by_correlation, _first_equal(correlation[by_correlation], correlation[kernels])
        )
        if (source < 0).any():  # GPU annotations, and traces without correlation ids
            rest = np.flatnonzero((source < 0) & (external_id[kernels] >= 0))
            by_external = cpu[external_id[cpu] >= 0]
            found = _first_equal(external_id[by_external], external_id[kernels[rest]])
            source[rest] = _rows_of(by_external, found)
        linked = source >= 0
        step[kernels] = np.where(linked, step[np.maximum(source, 0)], -1)
        launch[kernels[linked]] = start[source[linked]]
        missing += int((~linked).sum())
    return launch, missing


def _step_of_name(name: tuple[np.ndarray, list]) -> np.ndarray:
    """N for each ``ProfilerStep#N`` event, -1 for every other event."""
    numbers = np.array(
        [int(m.group(1)) if (m := STEP_NAME.match(v)) else -1 for v in name[1]] + [-1],
        dtype=np.int64,
    )
    return numbers[name[0]]


def _in_steps(
    path: Path,
    start: np.ndarray,
    end: np.ndarray,
    name: tuple[np.ndarray, list],
    step: np.ndarray,
    gpu: np.ndarray,
    steps: tuple[int, int],
) -> np.ndarray:
    """Which events belong to ``ProfilerStep#first`` .. ``#last`` (inclusive): CPU events that
    start inside those steps, GPU events launched in them (wherever they run)."""
    first, last = steps
    numbers = _step_of_name(name)
    found = sorted(set(numbers[numbers >= 0].tolist()))
    inside = (numbers >= first) & (numbers <= last)
    if not inside.any():
        raise TraceError(
            path,
            f"steps={steps}: no ProfilerStep#{first}..#{last} here; steps "
            f"present: {found or 'none (was a schedule used?)'}",
        )
    t0, t1 = start[inside].min(), end[inside].max()
    return np.where(gpu, (step >= first) & (step <= last), (start >= t0) & (start < t1))


def _ids(xs: list[_Event], field_name: str) -> tuple[np.ndarray, list]:
    """Codes of a pid or tid column: fast when every id is an int, as Kineto writes them."""
    try:
        ids = np.fromiter(map(attrgetter(field_name), xs), np.int64, len(xs))
    except (TypeError, ValueError, OverflowError):  # text ids, or ints beyond 64 bits: as text
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


def _ints(xs: list[_Event], field_name: str) -> np.ndarray:
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


def _ints_of_rows(xs: list[_Event], field_name: str, rows: np.ndarray) -> np.ndarray:
    """:func:`_ints` of the events at ``rows`` only; -1 for every other event."""
    out = np.full(len(xs), -1, np.int64)
    if len(rows):
        out[rows] = _ints([xs[i] for i in rows], field_name)
    return out


def _link_rows(cat: tuple[np.ndarray, list]) -> dict[str, np.ndarray]:
    """The events whose ids can link a GPU event to its launch (the others are not read):
    ``correlation`` on GPU events and runtime/driver calls, ``External id`` on annotations
    (a GPU annotation and its CPU annotation share it). None of them in a CPU-only trace."""
    codes, cats = cat
    gpu = [c in GPU_CATEGORIES for c in cats]
    if not any(gpu):
        return {"correlation": np.array([], np.int64), "external_id": np.array([], np.int64)}
    launches = [g or "runtime" in c or "driver" in c for c, g in zip(cats, gpu)]
    annotations = [c in ("gpu_user_annotation", "user_annotation") for c in cats]
    if "gpu_user_annotation" not in cats:
        annotations = [False] * len(cats)

    def rows(wanted: list[bool]) -> np.ndarray:
        return np.flatnonzero(np.append(np.asarray(wanted, bool), False)[codes])

    return {"correlation": rows(launches), "external_id": rows(annotations)}


def _call_sites(xs: list[_Event], cat: tuple[np.ndarray, list]) -> tuple[np.ndarray, list]:
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
    xs: list[_Event], collective: np.ndarray
) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, list]]:
    """What a collective's args say about it, per event (-1 where unknown): ``msg_bytes``, its
    message size as nccl-tests counts it (the larger of input and output, so the whole buffer
    of an all-gather or a reduce-scatter), ``group_size`` and the sequence number ``seq``;
    and its process group as a text column. Only the events with a collective name (codes
    ``collective`` >= 0) are read."""
    named = np.flatnonzero(collective >= 0)
    columns = {c: np.full(len(xs), -1, np.int64) for c in ("msg_bytes", "group_size", "seq")}
    group = np.full(len(xs), -1, np.int32)
    if not len(named):
        return columns, (group, [])
    mine = [xs[i] for i in named]
    for column, values in _comm_numbers(mine).items():
        columns[column][named] = values
    codes, groups = _sparse(mine, "args.group", str)
    group[named] = codes
    return columns, (group, groups)


def _comm_numbers(xs: list[_Event]) -> dict[str, np.ndarray]:
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


# ------------------------------------------------------------------------ one file


def rank_in_name(name: str) -> int | None:
    """The N of ``rank<N>`` in a file name; None when there is none, -1 when N has more
    digits than any rank (it is then no rank at all)."""
    m = RANK_IN_NAME.search(name)
    if m is None:
        return None
    return int(m.group(1)) if len(m.group(1)) <= 10 else -1


def _is_rank(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_RANK


def _rank_of(doc: _Doc, path: Path, rank: int | None, single: bool) -> tuple[int, str]:
    """The rank that wrote the file and where it was read: the argument, the trace's
    ``distributedInfo``, the file name; a TraceError when one of them is not a rank."""
    pass_it = "pass its rank: load_trace(path, rank=N) or load_run({rank: path, ...})"
    if rank is not None:
        try:
            number = int(rank)  # numpy integers too
        except (TypeError, ValueError, OverflowError):
            number = -1
        if not _is_rank(number):
            raise TraceError(path, f"rank={rank!r} is not a rank (an int from 0 to {MAX_RANK})")
        return number, "argument"
    info = doc.distributedInfo
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        if not _is_rank(info["rank"]):
            raise TraceError(
                path,
                f"its distributedInfo says rank {str(info['rank'])[:30]}, which is no rank "
                f"(0 to {MAX_RANK}): the header is damaged; {pass_it}",
            )
        return info["rank"], "distributedInfo"
    number = rank_in_name(path.name)
    if number is not None:
        if not _is_rank(number):
            raise TraceError(
                path,
                f"the rank in its file name has more digits than any rank (0 to {MAX_RANK}); "
                f"rename the file, or {pass_it}",
            )
        return number, "file name"
    if single:
        return 0, "assumed"
    raise TraceError(
        path,
        "cannot tell which rank wrote it: no 'distributedInfo' in the trace "
        "and no 'rank<N>' in the file name. Pass the ranks: "
        "load_run({rank: path, ...})",
    )


def _base_time_ns(doc: _Doc, path: Path) -> int | None:
    """``baseTimeNanoseconds`` as an int (None when absent or not a number); a TraceError
    when it is beyond any time in 64-bit nanoseconds."""
    base = doc.baseTimeNanoseconds
    if not (isinstance(base, int) and not isinstance(base, bool)):  # int: exact, as Kineto writes
        number = _number(base)
        if number is None:
            return None
        base = int(number)
    if abs(base) >= 2**63:
        raise TraceError(
            path,
            f"its baseTimeNanoseconds ({str(base)[:30]}...) is beyond any time in 64-bit "
            f"nanoseconds: the header is damaged; re-record the trace, or delete that key "
            f"(times are then read as they are)",
        )
    return base


def _scalar(value: Any, *types: type) -> Any:
    """``value`` when it is one of ``types`` (bools are not ints), else None: header fields
    of other shapes are dropped rather than carried into comparisons and the cache."""
    if isinstance(value, bool) and bool not in types:
        return None
    return value if isinstance(value, types) else None


def _shallow(value: Any, depth: int = 16) -> bool:
    """Whether a decoded JSON value nests at most ``depth`` levels (checked without recursion)."""
    level = [value]
    for _ in range(depth):
        level = [
            item
            for v in level
            if isinstance(v, (list, dict))
            for item in (v.values() if isinstance(v, dict) else v)
        ]
        if not level:
            return True
    return False


def _world_size(value: Any) -> int | None:
    return value if _is_rank(value) and value > 0 else None


def _merged_pids(doc: _Doc, path: Path) -> None:
    """A merged file's events have their rank as pid; a TraceError naming one that does not."""
    for pid in {e.pid for e in doc.traceEvents}:
        if not _is_rank(pid):
            raise TraceError(
                path,
                f"is a merged trace (it has 'mergedRanks') but an event's pid, "
                f"{str(pid)[:40]!r}, is not a rank number: it was not written by "
                f"merge_traces, or was edited. Load the per-rank files instead",
            )


def _header(doc: _Doc, path: Path, rank: int | None, single: bool) -> TraceHeader:
    """What the trace says about itself, each field checked for its type and range."""
    if doc.mergedRanks:
        _merged_pids(doc, path)
        return TraceHeader(
            path=path,
            rank=-1,
            rank_source="merged file",
            world_size=_world_size(doc.world_size),
            backend=_scalar(doc.backend, str),
            base_time_ns=_base_time_ns(doc, path),
        )
    rank, source = _rank_of(doc, path, rank, single)
    info = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    groups = info.get("pg_config")
    return TraceHeader(
        path=path,
        rank=rank,
        rank_source=source,
        world_size=_world_size(info.get("world_size")),
        backend=_scalar(info.get("backend"), str),
        process_groups=groups if isinstance(groups, list) and _shallow(groups) else [],
        host=_scalar(doc.host_name, str),
        run_id=_scalar(doc.run_id, str, int, float),
        base_time_ns=_base_time_ns(doc, path),
        schema_version=_scalar(doc.schemaVersion, int),
    )


def _rows_of_columns(text: dict, numbers: dict, rows: np.ndarray) -> tuple[dict, dict]:
    """The text columns and the numbers at ``rows`` (an order or a mask)."""
    text = {column: (codes[rows], values) for column, (codes, values) in text.items()}
    return text, {column: values[rows] for column, values in numbers.items()}


def _describe(
    header: TraceHeader, start, dur, pid: tuple[np.ndarray, list], notes: list[str], unlaunched: int
) -> None:
    """Fill in what the header says of the events loaded: count, pids, span, notes."""
    if unlaunched:
        notes.append(
            f"{unlaunched} GPU events have no CPU launch in the trace (launched before the "
            f"profiler's window, or a trace without correlation ids); their step is -1"
        )
    pids = [pid[1][c] for c in np.unique(pid[0]) if c >= 0]
    header.events, header.pids, header.notes = len(start), sorted(pids), notes
    header.gpu_events_without_launch = unlaunched
    header.start_us, header.end_us = float(start.min()), float((start + dur).max())


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
    start += (header.base_time_ns or 0) / 1000.0
    text = columns_of(xs)
    numbers, text["process_group"] = comm_numbers(xs, text["collective"][0])
    text["call_from"] = _call_sites(xs, text["cat"])
    linked = _link_rows(text["cat"])
    correlation = _ints_of_rows(xs, "args.correlation", linked["correlation"])
    external_id = _ints_of_rows(xs, "args.external_id", linked["external_id"])
    thread_names = _thread_names(meta)
    del doc, xs, meta  # free the decoded file before the columns are kept
    order = np.lexsort((-(start + dur), start))  # by start; a parent before its children
    start, dur, correlation, external_id = (
        a[order] for a in (start, dur, correlation, external_id)
    )
    text, numbers = _rows_of_columns(text, numbers, order)
    ranks = None
    if header.rank_source == "merged file":
        pid_codes, pids = text["pid"]
        ranks = np.asarray([int(p) for p in pids], dtype=np.int32)[pid_codes]
    gpu_codes, cats = text["cat"]
    gpu = np.array([c in GPU_CATEGORIES for c in cats] + [False])[gpu_codes]
    steps_of = _step_numbers(start, start + dur, text["name"])
    launch, unlaunched = _launches(steps_of, start, gpu, correlation, external_id, ranks)
    del correlation, external_id
    if steps is not None:
        keep = _in_steps(path, start, start + dur, text["name"], steps_of, gpu, steps)
        start, dur, steps_of, launch = start[keep], dur[keep], steps_of[keep], launch[keep]
        text, numbers = _rows_of_columns(text, numbers, keep)
        ranks = None if ranks is None else ranks[keep]
        unlaunched = int((gpu[keep] & np.isnan(launch)).sum())
    _describe(header, start, dur, text["pid"], notes, unlaunched)
    return FileColumns(
        header, start, dur, _compact(text), ranks, thread_names, steps_of, launch, numbers, skipped
    )


def read_file(
    path: Path,
    rank: int | None = None,
    strict: bool = True,
    steps: tuple[int, int] | None = None,
    single: bool = False,
) -> FileColumns:
    """:func:`read_columns`, with every failure a :class:`TraceError` naming the file: input
    that got past the checks (or a bug it uncovers) ends here too, with the exception's type
    in the message, so that one file can never take a whole load down with a raw error."""
    try:
        return read_columns(path, rank, strict, steps, single)
    except TraceError:
        raise
    except RecursionError:
        raise too_deep(path) from None
    except MemoryError:
        raise TraceError(
            path,
            "ran out of memory while reading it: load fewer ranks (ranks=) or steps "
            "(steps=), or use a machine with more memory",
        ) from None
    except Exception as err:
        raise TraceError(
            path,
            f"could not be read ({type(err).__name__}: {str(err)[:200]}): the file is "
            f"damaged or not a profiler trace; re-record it, or load the others with "
            f"strict=False",
        ) from err
