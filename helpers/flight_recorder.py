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

Dumps are pickles, which can run code when loaded: this module loads only plain data (dicts,
lists, strings, numbers) and refuses anything else.
"""

from __future__ import annotations

import io
import pickle
from collections import Counter
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import pandas as pd

from .runs import show_path

__all__ = [
    "DUMP_PREFIX",
    "FlightRecorderError",
    "load_flight_records",
    "Mismatch",
    "first_mismatch",
    "AnalyserVerdict",
    "analyse_with_pytorch",
]

DUMP_PREFIX = "fr_"  # dumps are named fr_<rank>
_DUMP_NAME = re.compile(rf"^{DUMP_PREFIX}(\d+)$")


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


class _PlainData(pickle.Unpickler):
    """Unpickles dicts, lists, tuples, strings and numbers only: no class, no function."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _read_dump(path: Path, rank: int) -> dict:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise FlightRecorderError(path, f"cannot be read ({err.strerror})", rank) from None
    if not data:
        raise FlightRecorderError(
            path, "is empty: the rank did not finish writing its dump (was it killed first?)", rank
        )
    try:
        dump = _PlainData(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as err:
        raise FlightRecorderError(
            path,
            f"is not a complete Flight Recorder dump ({err}); the file is damaged or truncated",
            rank,
        ) from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        raise FlightRecorderError(
            path,
            "has no 'entries' list: not a dump of torch._C._distributed_c10d._dump_fr_trace()",
            rank,
        )
    return dump


def _rows(dump: dict, path: Path, rank: int) -> list[dict]:
    rows = []
    for entry in dump["entries"]:
        try:
            group = entry.get("process_group") or ("", "")
            rows.append(
                {
                    "rank": rank,
                    "seq": int(entry["collective_seq_id"]),
                    "op": str(entry["profiling_name"]),
                    "collective": str(entry["profiling_name"]).split(":")[-1],
                    "input_sizes": str(entry.get("input_sizes")),
                    "output_sizes": str(entry.get("output_sizes")),
                    "dtypes": ",".join(entry.get("input_dtypes") or []),
                    "state": entry.get("state"),
                    "retired": entry.get("retired"),
                    "group": f"{group[0]}:{group[1]}",
                    "p2p": bool(entry.get("is_p2p")),
                    "created_ns": int(entry["time_created_ns"]),
                }
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise FlightRecorderError(
                path, f"an entry lacks {err} or has the wrong type: the dump is damaged", rank
            ) from None
    return rows


def load_flight_records(
    folder: str | Path, expect_ranks: Iterable[int] | None = None
) -> pd.DataFrame:
    """Every rank's dump in ``folder`` (files ``fr_<rank>``) as one DataFrame, one row per
    collective per rank, sorted by rank and sequence number.

    Columns: ``rank, seq, op`` (``gloo:all_reduce``), ``collective`` (``all_reduce``),
    ``input_sizes, output_sizes, dtypes, state, retired, group, p2p, created_ns`` and
    ``created_ms`` (ms since the earliest entry of any rank).
    expect_ranks: ranks whose dump must be there; a missing one is an error naming it.
    """
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
    rows = [
        row
        for rank, path in sorted(dumps.items())
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
    """Run ``python -m torch.distributed.flight_recorder.fr_trace`` on the dumps in ``folder``
    and read its verdict (the first collective it reports as wrong)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.flight_recorder.fr_trace",
        str(folder),
        "--prefix",
        DUMP_PREFIX,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    output = (done.stdout + done.stderr).strip()
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
