"""The safe reader of a file of plain data (a Flight Recorder dump, a CUDA memory snapshot):
its dicts, lists, strings and numbers, or why it is refused.

Such a file is a pickle or JSON. A pickle can run any code when ``pickle.load`` reads it, so
this reader never hands a byte of one to ``pickle.load``:

- the file holds at most ``bounds.bytes``; a pickle's instructions are checked before it is
  loaded (:func:`check_pickle`): anything that would import or call is refused, dictionary keys
  must be strings, memo indices must be ones a pickler writes, and there are at most
  ``bounds.items`` instructions making at most ``bounds.containers`` lists, dicts and tuples
  (JSON: as many values and containers, counted before parsing);
- what was loaded must be plain data nested at most ``bounds.depth`` deep, with at most
  ``bounds.items`` values counted as a reader sees them (:func:`check_plain`).

The bounds are the caller's (:mod:`helpers.hangs.flight_recorder` reads its ``MAX_DUMP_*`` at
each read, :mod:`helpers.traces.snapshot` its ``MAX_SNAPSHOT_*``), with what the file should be
and the names of the settings that raise them, for the messages. A file that fails a check
raises :class:`Refused`, whose message says what is wrong; the caller names the file.
"""

from __future__ import annotations

import io
import json
import pickle
import pickletools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_INT_RANGE = (-(2**63), 2**64)  # what PyTorch writes: int64 and uint64


@dataclass(frozen=True)
class Bounds:
    """The limits of one read: ``bytes`` of the file, ``items`` (values, counting every
    reference, and a pickle's instructions), ``containers`` made, ``depth`` of nesting; what
    the file should be (``what``: "a Flight Recorder dump") and the prefix of the settings that
    hold the limits (``settings``: "helpers.hangs.flight_recorder.MAX_DUMP_"), for messages."""

    bytes: int
    items: int
    containers: int
    depth: int
    what: str
    settings: str

    def raise_it(self, limit: str) -> str:
        """How to raise one limit (``"ITEMS"``) for a file one trusts."""
        return f"raise {self.settings}{limit} for a file you trust"


class Refused(Exception):
    """A file that fails a check; the message says what is wrong (the caller names the file)."""


# The pickle instructions that build plain data; anything else (GLOBAL, STACK_GLOBAL, REDUCE,
# BUILD, INST, OBJ, NEWOBJ, EXT*, PERSID, sets, buffers) imports or calls, and is refused.
_SCALARS = {
    "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
    "NONE", "NEWTRUE", "NEWFALSE", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8", "EMPTY_LIST",
    "EMPTY_DICT", "EMPTY_TUPLE",
}  # fmt: skip
_STRINGS = {
    "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "SHORT_BINUNICODE", "BINUNICODE",
    "BINUNICODE8",
}  # fmt: skip
_CONTAINERS = {"EMPTY_LIST", "EMPTY_DICT", "EMPTY_TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"}
_CONTAINERS |= {"TUPLE", "LIST", "DICT"}
_STACK_OPS = {"MARK", "TUPLE1", "TUPLE2", "TUPLE3", "TUPLE", "LIST", "DICT", "APPENDS"}
_STACK_OPS |= {"SETITEMS", "APPEND", "SETITEM", "POP", "POP_MARK", "DUP"}
_MEMO_PUT = {"PUT", "BINPUT", "LONG_BINPUT"}
_MEMO_GET = {"GET", "BINGET", "LONG_BINGET"}
_NOT_A_STRING_KEY = "has a dictionary key that is not a string"


def _too_many_containers(bounds: Bounds) -> str:
    return (
        f"holds more than {bounds.containers:,} lists, dicts and tuples: not "
        f"{bounds.what}, or larger than any PyTorch writes ({bounds.raise_it('CONTAINERS')})"
    )


class _PickleStack:
    """The unpickler's stack as :func:`check_pickle` follows it, knowing of each value only
    whether it is a string. A missing value raises IndexError or KeyError, as in the
    unpickler."""

    def __init__(self, data: bytes, bounds: Bounds):
        self.data = data
        self.bounds = bounds
        self.containers = bounds.containers  # how many more lists, dicts and tuples may be made
        self.stack: list[bool] = []  # is each value on the stack a string?
        self.marks: list[list[bool]] = []  # the stacks put aside by MARK
        self.memo: dict[int, bool] = {}

    def step(self, name: str, arg: Any, position: int, count: int) -> None:
        """Follow instruction number ``count``, ``name`` with ``arg`` at byte ``position``."""
        if name in _CONTAINERS:
            self.containers -= 1
            if self.containers < 0:
                raise Refused(_too_many_containers(self.bounds))
        if name in _SCALARS:
            self.stack.append(False)
        elif name in _STRINGS:
            self.stack.append(True)
        elif name in _STACK_OPS:
            self._reshape(name)
        elif name in _MEMO_PUT:
            if not 0 <= arg <= count:  # the unpickler makes room for every index below it
                raise Refused(f"is damaged: it stores a value at memo index {arg:,}")
            self.memo[arg] = self.stack[-1]
        elif name == "MEMOIZE":
            self.memo[len(self.memo)] = self.stack[-1]
        elif name in _MEMO_GET:
            self.stack.append(self.memo[arg])
        elif name == "FRAME":
            if arg > len(self.data) - position:
                raise Refused(f"is not a complete {_kind(self.bounds)} (a frame is cut short)")
        elif name not in ("PROTO", "STOP"):
            raise Refused(_refusal(name, arg, self.bounds))

    def _reshape(self, name: str) -> None:
        """The instructions that build containers of the values on the stack, or move them."""
        if name == "MARK":
            self.marks.append(self.stack)
            self.stack = []
        elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(name[-1])
            if len(self.stack) < n:
                raise IndexError
            del self.stack[-n:]
            self.stack.append(False)
        elif name in ("TUPLE", "LIST", "DICT"):
            if name == "DICT" and not all(self.stack[0::2]):
                raise Refused(_NOT_A_STRING_KEY)
            self.stack = self.marks.pop()
            self.stack.append(False)
        elif name in ("APPENDS", "SETITEMS"):
            if name == "SETITEMS" and not all(self.stack[0::2]):
                raise Refused(_NOT_A_STRING_KEY)
            self.stack = self.marks.pop()
            if not self.stack:
                raise IndexError
        else:
            self._take(name)

    def _take(self, name: str) -> None:
        """APPEND, SETITEM, POP, POP_MARK, DUP."""
        if name == "APPEND":
            if len(self.stack) < 2:
                raise IndexError
            self.stack.pop()
        elif name == "SETITEM":
            if len(self.stack) < 3:
                raise IndexError
            if not self.stack[-2]:
                raise Refused(_NOT_A_STRING_KEY)
            del self.stack[-2:]
        elif name == "POP":
            if self.stack:
                self.stack.pop()
            else:
                self.stack = self.marks.pop()
        elif name == "POP_MARK":
            self.stack = self.marks.pop()
        else:  # DUP
            self.stack.append(self.stack[-1])


def _kind(bounds: Bounds) -> str:
    """What the file should be, without its article: "Flight Recorder dump"."""
    return bounds.what.split(" ", 1)[-1]


def _refusal(name: str, arg: Any, bounds: Bounds) -> str:
    """Why an instruction that imports or calls is refused."""
    if name == "GLOBAL":
        return (
            f"refusing to load {str(arg).replace(' ', '.')}: {bounds.what} "
            f"holds plain data only, this file would import code"
        )
    return (
        f"refusing to load it: it uses the pickle instruction {name}, which "
        f"imports or calls code; {bounds.what} holds plain data only"
    )


def check_pickle(data: bytes, bounds: Bounds) -> None:
    """Refuse a pickle that would import or call anything, key a dict by anything but a string,
    store at a memo index no pickler writes (the unpickler allocates room for every index below
    it), make more than ``bounds.containers`` containers or take more than ``bounds.items``
    instructions, before a byte of it is unpickled.

    The check follows the unpickler's stack, knowing of each value only whether it is a string:
    a dict's keys are the only values hashed while loading, and hashing a string is safe (a
    tuple nested deep as a key crashes the interpreter; numbers can be made to collide)."""
    limit = bounds.items
    stack = _PickleStack(data, bounds)
    try:
        for count, (op, arg, position) in enumerate(pickletools.genops(data)):
            if count >= limit:
                raise Refused(
                    f"holds more than {limit:,} pickle instructions: not {bounds.what}, or "
                    f"larger than any PyTorch writes ({bounds.raise_it('ITEMS')})"
                )
            stack.step(op.name, arg, position, count)
    except (IndexError, KeyError) as err:
        raise Refused(
            f"is not a complete {_kind(bounds)} (its pickle refers to values it never "
            f"made: {type(err).__name__}); the file is damaged"
        ) from None
    except ValueError as err:  # pickletools: an unknown instruction, or the data ends early
        raise Refused(
            f"is not a complete {_kind(bounds)} ({err}); the file is damaged or truncated"
        ) from None


class _PlainData(pickle.Unpickler):
    """Unpickles dicts, lists, tuples, strings and numbers only: no class, no function.
    Only for data that :func:`check_pickle` passed (this refusal is the second wall)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def from_pickle(data: bytes, bounds: Bounds) -> Any:
    check_pickle(data, bounds)
    try:
        return _PlainData(io.BytesIO(data)).load()
    except Exception as err:  # whatever the unpickler says of bad data, the file is bad
        raise Refused(
            f"is not a complete {_kind(bounds)} ({type(err).__name__}: {err}); "
            f"the file is damaged or truncated"
        ) from None


def from_json(data: bytes, bounds: Bounds) -> Any:
    # Upper bounds, counted before any value is made: each value after the first follows a
    # comma or opens a container; each container opens with a bracket.
    containers = data.count(b"[") + data.count(b"{")
    values = data.count(b",") + containers + 1
    if values > bounds.items:
        raise Refused(
            f"holds up to {values:,} JSON values, more than {bounds.settings}ITEMS "
            f"({bounds.items:,}): not {bounds.what}, or larger than any PyTorch writes"
        )
    if containers > bounds.containers:
        raise Refused(_too_many_containers(bounds))
    try:
        return json.loads(data)
    except RecursionError:
        raise Refused(f"nests deeper than {bounds.depth} levels: not {bounds.what}") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise Refused(
            f"is not a complete {_kind(bounds)} (JSON: {err}); the file is damaged or truncated"
        ) from None


def _walked(
    values: Any, counts: dict[int, int], heights: dict[int, int], what: str
) -> tuple[int, int]:
    """``(values in it, all levels; containers nested in it)`` of a container whose own
    containers were all walked; refuses a value that is not plain data."""
    count, height = len(values), 1
    for value in values:
        if isinstance(value, (dict, list, tuple)):
            count += counts[id(value)]
            height = max(height, heights[id(value)] + 1)
        elif isinstance(value, int):  # bool too
            if not _INT_RANGE[0] <= value < _INT_RANGE[1]:
                raise Refused(f"holds a number beyond 64 bits: not {what}")
        elif not (value is None or isinstance(value, (str, bytes, float))):
            raise Refused(f"holds a {type(value).__name__}: not plain data")
    return count, height


def check_plain(value: Any, bounds: Bounds) -> None:
    """Refuse anything but plain data, containers nested more than ``bounds.depth`` deep (or in
    themselves), or more than ``bounds.items`` values counted as a reader sees them: a container
    referred to N times counts N times. Each container is walked once, its count and height
    kept (so a small file of shared references is refused in a few steps), without recursion."""
    if not isinstance(value, (dict, list, tuple)):
        return  # a single value: not what the caller wants, which the caller says
    depth_limit, limit = bounds.depth, bounds.items
    counts: dict[int, int] = {}  # id of a container walked: the values in it, all levels
    heights: dict[int, int] = {}  # id of a container walked: the containers nested in it
    open_: set[int] = set()  # the containers being walked: the one walked now and its parents
    todo: list[tuple[Any, int, bool]] = [(value, 1, False)]  # (container, depth, walked?)
    while todo:
        container, depth, walked = todo.pop()
        values = container.values() if isinstance(container, dict) else container
        key = id(container)
        if walked:
            open_.discard(key)
            count, height = _walked(values, counts, heights, bounds.what)
            if count > limit:
                raise Refused(
                    f"holds more than {limit:,} values once shared references are counted as "
                    f"a reader sees them: not {bounds.what} ({bounds.raise_it('ITEMS')})"
                )
            counts[key], heights[key] = count, height
        elif key in open_ or depth > depth_limit:
            raise Refused(
                f"nests deeper than {depth_limit} levels, or holds itself: not {bounds.what}"
            )
        elif key not in counts:
            open_.add(key)
            todo.append((container, depth, True))
            todo.extend(
                (value, depth + 1, False)
                for value in values
                if isinstance(value, (dict, list, tuple)) and id(value) not in counts
            )


def read_plain_data(path: Path, bounds: Bounds) -> Any:
    """The plain data of the pickle or JSON file at ``path``, read safely (see the module's
    docstring), or :class:`Refused` saying why not."""
    limit = bounds.bytes
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as err:
        raise Refused(f"cannot be read ({err.strerror})") from None
    if not data:
        raise Refused("is empty: the process did not finish writing it (was it killed first?)")
    if len(data) > limit:
        raise Refused(
            f"is larger than {limit:,} bytes: not {bounds.what}, or larger than any PyTorch "
            f"writes ({bounds.raise_it('BYTES')})"
        )
    is_json = data.lstrip()[:1] == b"{"
    plain = from_json(data, bounds) if is_json else from_pickle(data, bounds)
    check_plain(plain, bounds)
    return plain
