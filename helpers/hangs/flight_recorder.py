"""Flight Recorder dumps: what each rank's collectives were when a job hung.

PyTorch's Flight Recorder keeps, in every process, a ring buffer of the last collectives its
process groups ran (``TORCH_FR_BUFFER_SIZE`` entries, 2000 by default): a sequence number per
group, the operation (``gloo:all_reduce``), the tensor sizes, a state and a time.
``torch._C._distributed_c10d._dump_fr_trace()`` returns it as a pickle; the lesson's script
writes it to ``RUN_DIR/fr_<rank>``. PyTorch's own dumps are named by ``TORCH_FR_DUMP_TEMP_FILE``
and the rank (``nccl_trace_rank_0``, torchtitan's ``rank_0``): a prefix and the rank, as PyTorch's
analyser (``python -m torch.distributed.flight_recorder.fr_trace``) reads them. Every function here
takes the prefix the files of a folder share, or ``prefix=``.

- :func:`load_flight_records` reads every rank's dump into one DataFrame (one row per
  collective per rank); every missing or damaged dump is a :class:`FlightRecorderError` naming
  the file and the rank.
- :func:`first_mismatch` compares the ranks' sequences and names the first collective where
  they disagree.
- :func:`analyse_with_pytorch` runs PyTorch's analyser on the same dumps and reads its verdict.

A dump is a pickle (``_dump_fr_trace``) or JSON (``_dump_fr_trace_json``, the same entries;
prefer it: reading JSON cannot run code). A pickle can run any code when it is loaded with
``pickle.load``, which is what PyTorch's analyser does. So every public function here reads a
dump with the package's own reader (``helpers.hangs._dumpreader``), and nothing else ever reads it:

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

import pickle
import re
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..jobs.runs import show_path
from ._dumpreader import Bounds, Refused, read_dump

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

DUMP_PREFIX = "fr_"  # this series names its dumps fr_<rank>
# A dump's name: a prefix then the rank, as PyTorch's analyser reads it (its loader's pattern,
# ranks without leading zeros). PyTorch writes the path in TORCH_FR_DUMP_TEMP_FILE followed by
# the rank: nccl_trace_rank_<rank> in its tutorial, rank_<rank> in torchtitan's comm_traces.
_DUMP_NAME = re.compile(r"^([\w\-]*?)(0|[1-9][0-9]{0,8})$")

# The bounds of a dump, read at each read (raise them for a larger dump you trust). Measured: a
# full buffer of 2,000 gloo collectives with 29-frame stack traces is a pickle of 0.35 MB and
# 192,000 instructions, holds 292,000 values and nests 5 deep; as JSON (no stack traces) it is
# 0.9 MB. Within these bounds the worst file we made took 2 s and 170 MB to refuse.
MAX_DUMP_BYTES = 64 * 2**20
MAX_DUMP_ITEMS = 2_000_000  # values, counting every reference (and a pickle's instructions)
MAX_DUMP_CONTAINERS = 250_000  # lists, dicts and tuples made (18,000 in the dump above)
MAX_DUMP_DEPTH = 32  # containers inside containers


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


def _bounds() -> Bounds:
    """The bounds of a dump as they are now (read at each read, so that raising them works)."""
    return Bounds(MAX_DUMP_BYTES, MAX_DUMP_ITEMS, MAX_DUMP_CONTAINERS, MAX_DUMP_DEPTH)


def _read_dump(path: Path, rank: int) -> dict:
    """One dump read safely (see the module's docstring): its plain data, or an error naming
    the file and the rank."""
    try:
        return read_dump(path, _bounds())
    except Refused as err:
        raise FlightRecorderError(path, str(err), rank) from None


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


def _dump_paths(
    folder: str | Path, expect_ranks: Iterable[int] | None = None, prefix: str | None = None
) -> dict[int, Path]:
    """``{rank: path}`` of the dumps ``<prefix><rank>`` in ``folder``, by rank. Without
    ``prefix``, the one prefix the folder's names share (``fr_`` where that is one of several,
    as this series names them); an error naming the folder when there are no dumps, when
    several prefixes leave it unclear which files are dumps, or when a rank of ``expect_ranks``
    has none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FlightRecorderError(folder, "no such folder")
    by_prefix: dict[str, dict[int, Path]] = {}
    for p in sorted(folder.iterdir()):
        if p.is_file() and (m := _DUMP_NAME.match(p.name)):
            by_prefix.setdefault(m.group(1), {})[int(m.group(2))] = p
    if prefix is None and len(by_prefix) > 1 and DUMP_PREFIX not in by_prefix:
        raise FlightRecorderError(
            folder,
            f"files named with {len(by_prefix)} prefixes "
            f"({', '.join(repr(k) for k in sorted(by_prefix))}): say which names the "
            f"Flight Recorder dumps with prefix=",
        )
    if prefix is None:
        prefix = DUMP_PREFIX if len(by_prefix) != 1 else next(iter(by_prefix))
    dumps = by_prefix.get(prefix, {})
    missing = sorted(set(expect_ranks or ()) - set(dumps))
    if missing:
        raise FlightRecorderError(
            folder,
            f"no Flight Recorder dump from rank "
            f"{', '.join(map(str, missing))} ({prefix}<rank>): did "
            f"that rank die before it could write one?",
        )
    if not dumps:
        raise FlightRecorderError(
            folder,
            f"no Flight Recorder dumps ({prefix}<rank>) here: PyTorch names them "
            f"TORCH_FR_DUMP_TEMP_FILE followed by the rank; give that prefix with prefix=",
        )
    return dict(sorted(dumps.items()))


def load_flight_records(
    folder: str | Path, expect_ranks: Iterable[int] | None = None, prefix: str | None = None
) -> pd.DataFrame:
    """Every rank's dump in ``folder`` (files ``<prefix><rank>``: ``fr_0``, or PyTorch's
    ``nccl_trace_rank_0``; without ``prefix``, the one the names share) as one DataFrame, one
    row per collective per rank, sorted by rank and sequence number.

    Columns: ``rank, seq, op`` (``gloo:all_reduce``), ``collective`` (``all_reduce``),
    ``input_sizes, output_sizes, dtypes, state, retired, group, p2p, created_ns`` and
    ``created_ms`` (ms since the earliest entry of any rank).
    expect_ranks: ranks whose dump must be there; a missing one is an error naming it.
    Each dump is read safely (see the module's docstring).
    """
    rows = [
        row
        for rank, path in _dump_paths(folder, expect_ranks, prefix).items()
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


_NO_TABULATE = "tabulate is not installed. Proceeding without it.\n"


def analyse_with_pytorch(
    folder: str | Path, timeout: float = 120, prefix: str | None = None
) -> AnalyserVerdict:
    """PyTorch's verdict on the dumps ``<prefix><rank>`` in ``folder`` (as
    :func:`load_flight_records` finds them): the first collective that
    ``python -m torch.distributed.flight_recorder.fr_trace`` reports as wrong.

    The analyser loads every file it is given with a plain ``pickle.load``, which runs any code
    a pickle carries. So it is never given these files: each dump is read with this module's
    safe reader (a bad one is a :class:`FlightRecorderError` naming it), and the analyser reads
    fresh pickles of that plain data, written into a private temporary folder (removed after).
    timeout: seconds the analyser may take.
    """
    folder = Path(folder)
    found = _dump_paths(folder, prefix=prefix)
    dumps = {rank: _read_dump(path, rank) for rank, path in found.items()}
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
    output = (done.stdout + done.stderr).replace(checked, str(folder))
    # fr_trace logs that an optional package is missing; it changes nothing in the verdict
    output = output.replace(_NO_TABULATE, "").strip()
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
