"""Flight Recorder dumps: what each rank's collectives were when a job hung.

PyTorch's Flight Recorder keeps, in every process, a ring buffer of the last collectives its
process groups ran (``TORCH_FR_BUFFER_SIZE`` entries, 2000 by default): a sequence number per
group, the operation (``gloo:all_reduce``), the tensor sizes, a state and a time.
``torch._C._distributed_c10d._dump_fr_trace()`` returns it as a pickle; the lesson's script
writes it to ``RUN_DIR/fr_<rank>``, the names PyTorch's own analyser
(``python -m torch.distributed.flight_recorder.fr_trace``) expects.

- :func:`load_flight_records` reads every rank's dump into one DataFrame (one row per
  collective per rank); every missing or damaged dump is a :class:`FlightRecorderError` naming
  the file and the rank.
- :func:`first_mismatch` compares the ranks' sequences and names the first collective where
  they disagree.
- :func:`analyse_with_pytorch` runs PyTorch's analyser on the same dumps and reads its verdict.

A dump is a pickle (``_dump_fr_trace``) or JSON (``_dump_fr_trace_json``, the same entries;
prefer it: reading JSON cannot run code). A pickle can run any code when it is loaded with
``pickle.load``, which is what PyTorch's analyser does. So every public function here reads a
dump with this module's own reader, and nothing else ever reads it:

- the file holds at most :data:`MAX_DUMP_BYTES`; a pickle's instructions are checked before
  it is loaded: anything that would import or call (a class, a function, ``__reduce__``) is
  refused, dictionary keys must be strings, memo indices must be ones a pickler writes, and
  there are at most :data:`MAX_DUMP_ITEMS` instructions making at most
  :data:`MAX_DUMP_CONTAINERS` lists, dicts and tuples (JSON: as many values and containers);
- what was loaded must be plain data (dicts, lists, tuples, strings, numbers, None) nested at
  most :data:`MAX_DUMP_DEPTH` deep, with at most :data:`MAX_DUMP_ITEMS` values counted as the
  analysis would see them (a value referred to twice counts twice: a small file of shared
  references cannot expand into billions);
- :func:`analyse_with_pytorch` hands PyTorch's analyser fresh copies of that plain data, written
  into a private temporary folder, never the files themselves.

Every dump that fails a check is a :class:`FlightRecorderError` naming the file, within seconds.
"""

from __future__ import annotations

import io
import json
import pickle
import pickletools
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from .runs import show_path

__all__ = [
    "DUMP_PREFIX",
    "MAX_DUMP_BYTES",
    "MAX_DUMP_ITEMS",
    "MAX_DUMP_CONTAINERS",
    "MAX_DUMP_DEPTH",
    "FlightRecorderError",
    "load_flight_records",
    "Mismatch",
    "first_mismatch",
    "AnalyserVerdict",
    "analyse_with_pytorch",
]

DUMP_PREFIX = "fr_"  # dumps are named fr_<rank>
_DUMP_NAME = re.compile(rf"^{DUMP_PREFIX}(0|[1-9][0-9]{{0,8}})$")  # one name per rank

# The bounds of a dump, read at each read (raise them for a larger dump you trust). Measured: a
# full buffer of 2,000 gloo collectives with 29-frame stack traces is a pickle of 0.35 MB and
# 192,000 instructions, holds 292,000 values and nests 5 deep; as JSON (no stack traces) it is
# 0.9 MB. Within these bounds the worst file we made took 2 s and 170 MB to refuse.
MAX_DUMP_BYTES = 64 * 2**20
MAX_DUMP_ITEMS = 2_000_000  # values, counting every reference (and a pickle's instructions)
MAX_DUMP_CONTAINERS = 250_000  # lists, dicts and tuples made (18,000 in the dump above)
MAX_DUMP_DEPTH = 32  # containers inside containers
_INT_RANGE = (-(2**63), 2**64)  # what PyTorch writes: int64 and uint64


class FlightRecorderError(ValueError):
    """A Flight Recorder dump that cannot be used. ``path`` and ``rank`` name it."""

    def __init__(self, path: str | Path | None, problem: str, rank: int | None = None):
        self.path = None if path is None else Path(path)
        self.rank = rank
        self.problem = problem
        where = show_path(self.path) if self.path is not None else ""
        if rank is not None:
            where = f"{where} (rank {rank})" if where else f"rank {rank}"
        super().__init__(f"{where}: {problem}" if where else problem)


class _Refused(Exception):
    """A dump that fails a check; the message says what is wrong (the caller names the file)."""


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
_MEMO_PUT = {"PUT", "BINPUT", "LONG_BINPUT"}
_MEMO_GET = {"GET", "BINGET", "LONG_BINGET"}


def _check_pickle(data: bytes) -> None:
    """Refuse a pickle that would import or call anything, key a dict by anything but a string,
    store at a memo index no pickler writes (the unpickler allocates room for every index below
    it), make more than MAX_DUMP_CONTAINERS containers or take more than MAX_DUMP_ITEMS
    instructions, before a byte of it is unpickled.

    The check follows the unpickler's stack, knowing of each value only whether it is a string:
    a dict's keys are the only values hashed while loading, and hashing a string is safe (a
    tuple nested deep as a key crashes the interpreter; numbers can be made to collide)."""
    stack: list[bool] = []  # is each value on the stack a string?
    marks: list[list[bool]] = []  # the stacks put aside by MARK
    memo: dict[int, bool] = {}
    limit, containers = MAX_DUMP_ITEMS, MAX_DUMP_CONTAINERS
    try:
        for count, (op, arg, position) in enumerate(pickletools.genops(data)):
            if count >= limit:
                raise _Refused(
                    f"holds more than {limit:,} pickle instructions: not a dump, or "
                    f"larger than any buffer PyTorch keeps (raise "
                    f"helpers.flight_recorder.MAX_DUMP_ITEMS for a dump you trust)"
                )
            name = op.name
            if name in _CONTAINERS:
                containers -= 1
                if containers < 0:
                    raise _Refused(_too_many_containers())
            if name in _SCALARS:
                stack.append(False)
            elif name in _STRINGS:
                stack.append(True)
            elif name == "MARK":
                marks.append(stack)
                stack = []
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(name[-1])
                if len(stack) < n:
                    raise IndexError
                del stack[-n:]
                stack.append(False)
            elif name in ("TUPLE", "LIST", "DICT"):
                if name == "DICT" and not all(stack[0::2]):
                    raise _Refused("has a dictionary key that is not a string")
                stack = marks.pop()
                stack.append(False)
            elif name in ("APPENDS", "SETITEMS"):
                if name == "SETITEMS" and not all(stack[0::2]):
                    raise _Refused("has a dictionary key that is not a string")
                stack = marks.pop()
                if not stack:
                    raise IndexError
            elif name == "APPEND":
                if len(stack) < 2:
                    raise IndexError
                stack.pop()
            elif name == "SETITEM":
                if len(stack) < 3:
                    raise IndexError
                if not stack[-2]:
                    raise _Refused("has a dictionary key that is not a string")
                del stack[-2:]
            elif name == "POP":
                if stack:
                    stack.pop()
                else:
                    stack = marks.pop()
            elif name == "POP_MARK":
                stack = marks.pop()
            elif name == "DUP":
                stack.append(stack[-1])
            elif name in _MEMO_PUT:
                if not 0 <= arg <= count:  # the unpickler makes room for every index below it
                    raise _Refused(f"is damaged: it stores a value at memo index {arg:,}")
                memo[arg] = stack[-1]
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in _MEMO_GET:
                stack.append(memo[arg])
            elif name == "FRAME":
                if arg > len(data) - position:
                    raise _Refused("is not a complete Flight Recorder dump (a frame is cut short)")
            elif name in ("PROTO", "STOP"):
                pass
            elif name == "GLOBAL":
                raise _Refused(
                    f"refusing to load {str(arg).replace(' ', '.')}: a Flight Recorder dump "
                    f"holds plain data only, this file would import code"
                )
            else:
                raise _Refused(
                    f"refusing to load it: it uses the pickle instruction {name}, which "
                    f"imports or calls code; a Flight Recorder dump holds plain data only"
                )
    except (IndexError, KeyError) as err:
        raise _Refused(
            f"is not a complete Flight Recorder dump (its pickle refers to values it never "
            f"made: {type(err).__name__}); the file is damaged"
        ) from None
    except ValueError as err:  # pickletools: an unknown instruction, or the data ends early
        raise _Refused(
            f"is not a complete Flight Recorder dump ({err}); the file is damaged or truncated"
        ) from None


class _PlainData(pickle.Unpickler):
    """Unpickles dicts, lists, tuples, strings and numbers only: no class, no function.
    Only for data that :func:`_check_pickle` passed (this refusal is the second wall)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _from_pickle(data: bytes) -> Any:
    _check_pickle(data)
    try:
        return _PlainData(io.BytesIO(data)).load()
    except Exception as err:  # whatever the unpickler says of bad data, the file is bad
        raise _Refused(
            f"is not a complete Flight Recorder dump ({type(err).__name__}: {err}); "
            f"the file is damaged or truncated"
        ) from None


def _too_many_containers() -> str:
    return (
        f"holds more than {MAX_DUMP_CONTAINERS:,} lists, dicts and tuples: not a dump, or "
        f"larger than any buffer PyTorch keeps (raise "
        f"helpers.flight_recorder.MAX_DUMP_CONTAINERS for a dump you trust)"
    )


def _from_json(data: bytes) -> Any:
    # Upper bounds, counted before any value is made: each value after the first follows a
    # comma or opens a container; each container opens with a bracket.
    containers = data.count(b"[") + data.count(b"{")
    values = data.count(b",") + containers + 1
    if values > MAX_DUMP_ITEMS:
        raise _Refused(
            f"holds up to {values:,} JSON values, more than MAX_DUMP_ITEMS "
            f"({MAX_DUMP_ITEMS:,}): not a dump, or larger than any buffer PyTorch keeps"
        )
    if containers > MAX_DUMP_CONTAINERS:
        raise _Refused(_too_many_containers())
    try:
        return json.loads(data)
    except RecursionError:
        raise _Refused(f"nests deeper than {MAX_DUMP_DEPTH} levels: not a dump") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise _Refused(
            f"is not a complete Flight Recorder dump (JSON: {err}); the file is damaged or "
            f"truncated"
        ) from None


def _check_plain(dump: Any) -> None:
    """Refuse anything but plain data, containers nested more than MAX_DUMP_DEPTH deep (or in
    themselves), or more than MAX_DUMP_ITEMS values counted as a reader sees them: a container
    referred to N times counts N times. Each container is walked once, its count and height
    kept (so a small file of shared references is refused in a few steps), without recursion."""
    if not isinstance(dump, (dict, list, tuple)):
        return  # a single value: not a dump, which the caller says
    depth_limit, limit = MAX_DUMP_DEPTH, MAX_DUMP_ITEMS
    counts: dict[int, int] = {}  # id of a container walked: the values in it, all levels
    heights: dict[int, int] = {}  # id of a container walked: the containers nested in it
    open_: set[int] = set()  # the containers being walked: the one walked now and its parents
    todo: list[tuple[Any, int, bool]] = [(dump, 1, False)]  # (container, depth, walked?)
    while todo:
        container, depth, walked = todo.pop()
        values = container.values() if isinstance(container, dict) else container
        key = id(container)
        if walked:
            open_.discard(key)
            count, height = len(values), 1
            for value in values:
                if isinstance(value, (dict, list, tuple)):
                    count += counts[id(value)]
                    height = max(height, heights[id(value)] + 1)
                elif isinstance(value, int):  # bool too
                    if not _INT_RANGE[0] <= value < _INT_RANGE[1]:
                        raise _Refused("holds a number beyond 64 bits: not a dump")
                elif not (value is None or isinstance(value, (str, bytes, float))):
                    raise _Refused(f"holds a {type(value).__name__}: not plain data")
            if count > limit:
                raise _Refused(
                    f"holds more than {limit:,} values once shared references are counted as "
                    f"a reader sees them: not a dump (a dump of 2,000 collectives with stack "
                    f"traces holds about 300,000)"
                )
            counts[key], heights[key] = count, height
        elif key in open_ or depth > depth_limit:
            raise _Refused(
                f"nests deeper than {depth_limit} levels (a dump nests 5 deep), or holds "
                f"itself: not a dump"
            )
        elif key not in counts:
            open_.add(key)
            todo.append((container, depth, True))
            todo.extend(
                (value, depth + 1, False)
                for value in values
                if isinstance(value, (dict, list, tuple)) and id(value) not in counts
            )


def _read_dump(path: Path, rank: int) -> dict:
    """One dump read safely (see the module's docstring): its plain data, or an error naming
    the file and the rank."""
    limit = MAX_DUMP_BYTES
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as err:
        raise FlightRecorderError(path, f"cannot be read ({err.strerror})", rank) from None
    if not data:
        raise FlightRecorderError(
            path, "is empty: the rank did not finish writing its dump (was it killed first?)", rank
        )
    if len(data) > limit:
        raise FlightRecorderError(
            path,
            f"is larger than {limit:,} bytes: not a Flight Recorder dump, or larger than any "
            f"buffer PyTorch keeps (raise helpers.flight_recorder.MAX_DUMP_BYTES for a dump "
            f"you trust)",
            rank,
        )
    try:
        dump = _from_json(data) if data.lstrip()[:1] == b"{" else _from_pickle(data)
        _check_plain(dump)
    except _Refused as err:
        raise FlightRecorderError(path, str(err), rank) from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        raise FlightRecorderError(
            path,
            "has no 'entries' list: not a dump of torch._C._distributed_c10d._dump_fr_trace()",
            rank,
        )
    return dump


def _int64(value: Any) -> int:
    """An integer field of an entry, which must fit the DataFrame's int64 column."""
    if not isinstance(value, int) or not -(2**63) <= value < 2**63:
        raise ValueError(f"{value!r:.40} is not a 64-bit integer")
    return value


def _rows(dump: dict, path: Path, rank: int) -> list[dict]:
    rows = []
    for entry in dump["entries"]:
        try:
            group = entry.get("process_group") or ("", "")
            rows.append(
                {
                    "rank": rank,
                    "seq": _int64(entry["collective_seq_id"]),
                    "op": str(entry["profiling_name"]),
                    "collective": str(entry["profiling_name"]).split(":")[-1],
                    "input_sizes": str(entry.get("input_sizes")),
                    "output_sizes": str(entry.get("output_sizes")),
                    "dtypes": ",".join(entry.get("input_dtypes") or []),
                    "state": entry.get("state"),
                    "retired": entry.get("retired"),
                    "group": f"{group[0]}:{group[1]}",
                    "p2p": bool(entry.get("is_p2p")),
                    "created_ns": _int64(entry["time_created_ns"]),
                }
            )
        except KeyError as err:
            raise FlightRecorderError(
                path, f"an entry lacks {err}: the dump is damaged", rank
            ) from None
        except (TypeError, ValueError, AttributeError, IndexError) as err:
            raise FlightRecorderError(
                path, f"an entry has a field of the wrong type ({err}): the dump is damaged", rank
            ) from None
    return rows


def _dump_paths(folder: str | Path, expect_ranks: Iterable[int] | None = None) -> dict[int, Path]:
    """``{rank: path}`` of the dumps ``fr_<rank>`` in ``folder``, by rank; an error naming the
    folder when there are none, or when a rank of ``expect_ranks`` has none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FlightRecorderError(folder, "no such folder")
    dumps = {
        int(m.group(1)): p
        for p in sorted(folder.iterdir())
        if p.is_file() and (m := _DUMP_NAME.match(p.name))
    }
    missing = sorted(set(expect_ranks or ()) - set(dumps))
    if missing:
        raise FlightRecorderError(
            folder,
            f"no Flight Recorder dump from rank "
            f"{', '.join(map(str, missing))} ({DUMP_PREFIX}<rank>): did "
            f"that rank die before it could write one?",
        )
    if not dumps:
        raise FlightRecorderError(folder, f"no Flight Recorder dumps ({DUMP_PREFIX}<rank>) here")
    return dict(sorted(dumps.items()))


def load_flight_records(
    folder: str | Path, expect_ranks: Iterable[int] | None = None
) -> pd.DataFrame:
    """Every rank's dump in ``folder`` (files ``fr_<rank>``) as one DataFrame, one row per
    collective per rank, sorted by rank and sequence number.

    Columns: ``rank, seq, op`` (``gloo:all_reduce``), ``collective`` (``all_reduce``),
    ``input_sizes, output_sizes, dtypes, state, retired, group, p2p, created_ns`` and
    ``created_ms`` (ms since the earliest entry of any rank).
    expect_ranks: ranks whose dump must be there; a missing one is an error naming it.
    Each dump is read safely (see the module's docstring).
    """
    rows = [
        row
        for rank, path in _dump_paths(folder, expect_ranks).items()
        for row in _rows(_read_dump(path, rank), path, rank)
    ]
    records = pd.DataFrame(
        rows,
        columns=[
            "rank",
            "seq",
            "op",
            "collective",
            "input_sizes",
            "output_sizes",
            "dtypes",
            "state",
            "retired",
            "group",
            "p2p",
            "created_ns",
        ],
    )
    records = records.sort_values(["rank", "seq"], ignore_index=True)
    records["created_ms"] = (records["created_ns"] - records["created_ns"].min()) / 1e6
    return records


@dataclass
class Mismatch:
    """Where the ranks' collectives first disagree.

    ``seq``: the sequence number; ``kind``: ``"different collective"``, ``"different sizes"``
    or ``"missing"`` (some ranks never called it); ``calls``: what each rank called there
    (``None`` where it called nothing); ``culprits``: the ranks that differ from the others.
    """

    seq: int
    kind: str
    calls: dict[int, str | None]
    culprits: list[int]

    def __str__(self) -> str:
        said = "; ".join(f"rank {r}: {c or 'nothing'}" for r, c in self.calls.items())
        return f"collective {self.seq}: {self.kind} ({said}); differs on rank(s) {self.culprits}"


def first_mismatch(records: pd.DataFrame) -> Mismatch | None:
    """The first sequence number at which the ranks did not all call the same collective with
    the same sizes, or None when they agree on everything recorded. The majority is taken as
    the expected call (on a tie, the lowest rank's)."""
    ranks = sorted(records["rank"].unique())
    calls = records.assign(call=records["op"] + " " + records["input_sizes"]).pivot_table(
        index="seq", columns="rank", values="call", aggfunc="first"
    )
    calls = calls.reindex(columns=ranks)
    for seq, row in calls.iterrows():
        if row.notna().all() and row.nunique() == 1:
            continue
        seen = {int(r): (None if pd.isna(v) else v) for r, v in row.items()}
        counts = Counter(v for v in seen.values() if v is not None)
        top = max(counts.values())
        expected = next(v for v in seen.values() if counts.get(v) == top)  # lowest rank on a tie
        culprits = [r for r, v in seen.items() if v != expected]
        if None in seen.values():
            kind = "missing"
        else:
            ops = {v.split(" ", 1)[0] for v in counts}
            kind = "different collective" if len(ops) > 1 else "different sizes"
        return Mismatch(int(seq), kind, seen, culprits)
    return None


@dataclass
class AnalyserVerdict:
    """What PyTorch's Flight Recorder analyser said: the sequence number it flagged, the
    culprit ranks, its error type, and its whole output."""

    seq: int | None
    culprits: list[int]
    error_type: str | None
    output: str

    @property
    def kind(self) -> str | None:
        """The error type in :class:`Mismatch`'s words."""
        return {
            "COLLECTIVE_TYPE_MISMATCH": "different collective",
            "SIZE_OR_SYNTAX_MISMATCH": "different sizes",
            "NOT_ALL_RANKS_JOINED": "missing",
        }.get(self.error_type or "", self.error_type)


def analyse_with_pytorch(folder: str | Path, timeout: float = 120) -> AnalyserVerdict:
    """PyTorch's verdict on the dumps ``fr_<rank>`` in ``folder``: the first collective that
    ``python -m torch.distributed.flight_recorder.fr_trace`` reports as wrong.

    The analyser loads every file it is given with a plain ``pickle.load``, which runs any code
    a pickle carries. So it is never given these files: each dump is read with this module's
    safe reader (a bad one is a :class:`FlightRecorderError` naming it), and the analyser reads
    fresh pickles of that plain data, written into a private temporary folder (removed after).
    timeout: seconds the analyser may take.
    """
    folder = Path(folder)
    dumps = {rank: _read_dump(path, rank) for rank, path in _dump_paths(folder).items()}
    with tempfile.TemporaryDirectory(prefix="fr-checked-") as checked:  # mode 0700
        for rank, dump in dumps.items():
            (Path(checked) / f"{DUMP_PREFIX}{rank}").write_bytes(pickle.dumps(dump, protocol=4))
        command = [
            sys.executable,
            "-m",
            "torch.distributed.flight_recorder.fr_trace",
            checked,
            "--prefix",
            DUMP_PREFIX,
        ]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, cwd=checked
            )
        except subprocess.TimeoutExpired:
            raise FlightRecorderError(
                folder, f"PyTorch's analyser did not finish in {timeout:g} s; raise timeout="
            ) from None
    output = (done.stdout + done.stderr).replace(checked, str(folder)).strip()
    if done.returncode != 0:
        last = "\n".join(output.splitlines()[-5:])
        raise FlightRecorderError(
            folder, f"PyTorch's analyser failed (exit code {done.returncode}):\n{last}"
        )
    if m := re.search(r"Collective sequence number: (\d+) has errors", output):
        seq = int(m.group(1))
        culprit = re.search(r"Culprit rank (\d+); Error type: (\w+)", output)
        culprits, error = ([int(culprit.group(1))], culprit.group(2)) if culprit else ([], None)
        return AnalyserVerdict(seq, culprits, error, output)
    if m := re.search(r"Not all ranks joining collective, sequence number: (\d+)", output):
        missing = re.search(r"missing ranks: \{([\d, ]+)\}", output)
        culprits = [int(r) for r in missing.group(1).split(",")] if missing else []
        return AnalyserVerdict(int(m.group(1)), culprits, "NOT_ALL_RANKS_JOINED", output)
    return AnalyserVerdict(None, [], None, output)
