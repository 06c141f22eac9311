"""A trace's JSON, decoded: the one place where the trace layer parses JSON.

Chrome and Kineto traces are one JSON object with a ``traceEvents`` list (or that list bare).
Two readers need it in two shapes, and both go through :func:`_parsed`, with the same handling
of the bare form, of bytes that are not UTF-8 (replaced) and of every failure (a
:class:`~helpers.traces.TraceError` that says, in words, what is wrong):

- the loader, :func:`decode`: straight into small typed records holding only the fields the
  loader uses (everything else is skipped while parsing). A file whose fields have unexpected
  types (a number where a name should be, a start time written as text) is decoded again by a
  lenient decoder that accepts any JSON value and keeps what it can;
- the merge, :func:`raw_events` and :func:`decode_event`: every event whole, kept as its raw
  JSON and decoded one at a time while the merged file is written;
- the memory reader, :func:`decode_memory`: the instant events ``[memory]`` that
  ``profile_memory=True`` writes, with their bytes and running totals.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import numpy as np

from ._error import NotATrace, TraceError

T = TypeVar("T")
_EMPTY = msgspec.Raw(b"")
_SPACE = re.compile(rb"[ \t\r\n]*")


class _Args(msgspec.Struct, frozen=True, gc=False):
    """The few ``args`` that become columns; the rest is skipped while parsing.

    ``correlation`` links a GPU event to the CUDA runtime call that launched it (both carry
    the same id); ``external_id`` links a GPU annotation to its CPU annotation; ``wait_stream``
    and ``wait_record`` say what a ``cuda_sync`` event waited for (the stream, and the
    correlation of the ``cudaEventRecord`` call that recorded the CUDA event on it). The others
    describe a collective (on ``record_param_comms`` and, in newer traces, on NCCL kernels);
    ``concrete`` (``Concrete Inputs``, with ``record_shapes=True``) gives a send's or a receive's
    peer and tag."""

    name: Any = None
    collective: Any = msgspec.field(default=None, name="Collective name")
    dims: msgspec.Raw = msgspec.field(default=_EMPTY, name="Input Dims")
    # a send's or a receive's peer and tag (``c10d::send``: tensors, group, peer, tag)
    concrete: msgspec.Raw = msgspec.field(default=_EMPTY, name="Concrete Inputs")
    stream: Any = None
    # integers as Kineto writes them, -1 when absent (other types: the lenient decoder)
    correlation: int = -1
    external_id: int = msgspec.field(default=-1, name="External id")
    in_nelems: int = msgspec.field(default=-1, name="In msg nelems")
    out_nelems: int = msgspec.field(default=-1, name="Out msg nelems")
    dtype: Any = None
    group: Any = msgspec.field(default=None, name="Process Group Name")
    group_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    group_size: int = msgspec.field(default=-1, name="Group size")
    seq: int = msgspec.field(default=-1, name="Seq")
    call_from: Any = msgspec.field(default=None, name="CallFrom")  # python_function: its caller
    # cuda_sync: the stream waited for, and the correlation of the cudaEventRecord waited on
    wait_stream: int = msgspec.field(default=-1, name="wait_on_stream")
    wait_record: int = msgspec.field(default=-1, name="wait_on_cuda_event_record_corr_id")


_NO_ARGS = _Args()
#: The key in a trace's ``args`` of each field of :class:`_Args`.
_ARG_KEYS = {f: (e or f) for f, e in zip(_Args.__struct_fields__, _Args.__struct_encode_fields__)}


class Event(msgspec.Struct, gc=False):
    """One event, with the fields the loader uses."""

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
    run_id: Any = None
    mergedRanks: Any = None
    world_size: Any = None
    backend: Any = None


class Doc(_Header, gc=False):
    """A trace as the loader reads it: what its header says, and its events (``UNSET`` when the
    file has no ``traceEvents`` at all: no trace)."""

    traceEvents: list[Event] | msgspec.UnsetType = msgspec.UNSET


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


class _RawDoc(msgspec.Struct, gc=False):
    """A trace's events, each kept as its raw JSON."""

    traceEvents: list[msgspec.Raw] = []


class _MemoryArgs(msgspec.Struct, frozen=True, gc=False):
    """The ``args`` of a ``[memory]`` event (any JSON value: checked when read)."""

    bytes: Any = msgspec.field(default=None, name="Bytes")
    allocated: Any = msgspec.field(default=None, name="Total Allocated")
    reserved: Any = msgspec.field(default=None, name="Total Reserved")
    device_type: Any = msgspec.field(default=None, name="Device Type")
    device_id: Any = msgspec.field(default=None, name="Device Id")
    address: Any = msgspec.field(default=None, name="Addr")


class MemoryEvent(msgspec.Struct, gc=False):
    """An event as the memory reader reads it: its name, time and memory ``args``."""

    name: Any = ""
    ts: Any = None
    tid: Any = None
    args: msgspec.Raw = _EMPTY  # decoded only for [memory] events (memory_args)


class MemoryDoc(_Header, gc=False):
    """A trace as the memory reader reads it: what its header says, and its events."""

    traceEvents: list[MemoryEvent] = []


_FAST = msgspec.json.Decoder(Doc)
_MEMORY = msgspec.json.Decoder(MemoryDoc)
_MEMORY_ARGS = msgspec.json.Decoder(_MemoryArgs)
_LENIENT = msgspec.json.Decoder(_AnyDoc)
_RAW = msgspec.json.Decoder(_RawDoc)
_ANY = msgspec.json.Decoder()


def decode(path: Path, data: bytes | bytearray, notes: list[str]) -> Doc:
    """The trace in ``data`` (the bytes of ``path``; a bytearray is changed in place) as typed
    events; fields of unexpected types go through the lenient decoder, which is noted."""
    return _parsed(path, lambda text: _typed(text, notes), _as_document(data), notes)


def decode_memory(path: Path, data: bytes | bytearray) -> MemoryDoc:
    """The trace in ``data`` (the bytes of ``path``) with each event's name, time and
    ``args`` (plain JSON values, read by :mod:`.memory`)."""
    return _parsed(path, _MEMORY.decode, _as_document(data))


def memory_args(args: msgspec.Raw) -> _MemoryArgs | None:
    """The memory ``args`` of an event, or None when they are not a JSON object."""
    try:
        return _MEMORY_ARGS.decode(args)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None


def raw_events(path: Path, data: bytearray) -> list[msgspec.Raw]:
    """The events of the trace in ``data`` (the bytes of ``path``), each as its raw JSON: the
    file's bytes plus a small object per event, to be decoded one at a time
    (:func:`decode_event`)."""
    return _parsed(path, _RAW.decode, _as_document(data)).traceEvents


def decode_event(path: Path, raw: msgspec.Raw) -> object:
    """One of :func:`raw_events`, decoded whole: every field as the file has it."""
    return _parsed(path, _ANY.decode, raw)


def _as_document(data: bytes | bytearray) -> bytes | bytearray:
    """``data`` as a JSON object with ``traceEvents``: the bare-array form of the Chrome trace
    format is wrapped (a bytearray in place, without a second copy of the file)."""
    first = _SPACE.match(data).end()
    if data[first : first + 1] != b"[":
        return data
    if isinstance(data, bytes):
        return b'{"traceEvents":' + data + b"}"
    data[:0] = b'{"traceEvents":'
    data += b"}"
    return data


def _parsed(path: Path, parse: Callable[[Any], T], data: Any, notes: list[str] | None = None) -> T:
    """``parse(data)``, turning every failure into a TraceError naming ``path``. Bytes that are
    not valid UTF-8 are replaced, and noted in ``notes`` when given."""
    try:
        try:
            return parse(data)
        except UnicodeDecodeError:
            data = str(data, "utf-8", "replace")  # msgspec reads text as well
            if notes is not None:
                notes.append("bytes that are not valid UTF-8 were replaced with \ufffd")
            return parse(data)
    except msgspec.DecodeError as err:
        raise decode_error(path, err) from None
    except RecursionError:
        raise too_deep(path) from None


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
        expected_object = text.startswith("Expected `object`")
        if expected_object and where in ("", "$", "$.traceEvents[0]"):  # a config, timings
            return NotATrace(
                path,
                "is not a trace: a JSON "
                + ("list whose first entry is not an event" if where else "value")
                + ", not a Chrome/Kineto trace (a config, a file of timings?); name the trace "
                "files, or leave this one out",
            )
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


def _typed(data: bytes | bytearray | str, notes: list[str]) -> Doc:
    """The fast decoder's events, or the lenient one's when a field has an unexpected type."""
    try:
        return _FAST.decode(data)
    except msgspec.ValidationError:
        return _lenient(_LENIENT.decode(data), notes)


def finite_number(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is not a number or not finite."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond a float
        return None
    return number if np.isfinite(number) else None


def _text(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else str(value)


def _ident(value: Any) -> int | str:
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else _text(value)


def _lenient(doc: _AnyDoc, notes: list[str]) -> Doc:
    """Events of any JSON types as typed events: names as text, times as numbers where they
    parse (a start time that does not parse is left empty), ids as they are or as text."""
    events = []
    for e in doc.traceEvents:
        args = e.args if isinstance(e.args, dict) else {}
        dims, concrete = args.get("Input Dims"), args.get("Concrete Inputs")
        events.append(
            Event(
                ph=_text(e.ph),
                name=_text(e.name),
                cat=_text(e.cat),
                pid=_ident(e.pid),
                tid=_ident(e.tid),
                ts=finite_number(e.ts),
                dur=finite_number(e.dur) or 0.0,
                args=_Args(
                    name=args.get("name"),
                    collective=args.get("Collective name"),
                    stream=args.get("stream"),
                    dims=_EMPTY if dims is None else msgspec.Raw(msgspec.json.encode(dims)),
                    concrete=_EMPTY
                    if concrete is None
                    else msgspec.Raw(msgspec.json.encode(concrete)),
                    **{
                        f: args.get(_ARG_KEYS[f])
                        for f in _ARG_KEYS
                        if f not in ("name", "collective", "stream", "dims", "concrete")
                    },
                ),
            )
        )
    notes.append(
        "some fields had unexpected types and were read leniently (as text, or left "
        "empty where a number did not parse)"
    )
    header = {f: getattr(doc, f) for f in _Header.__struct_fields__}
    return Doc(traceEvents=events, **header)
