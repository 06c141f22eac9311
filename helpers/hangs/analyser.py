"""PyTorch's own Flight Recorder analyser, run safely on a folder of dumps, and its verdict
read back: ``python -m torch.distributed.flight_recorder.fr_trace``.

It loads every file it is given with a plain ``pickle.load``, which runs any code a pickle
carries; so it is only ever given fresh pickles of what this package's checked reader read
(``flight_recorder``'s docstring says how).
"""

from __future__ import annotations

import pickle
import re
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .flight_recorder import DUMP_PREFIX, FlightRecorderError, load_records_and_dumps
from .groups import Mismatch, group_descriptions, group_members, group_states, job_ranks
from .positions import collective_calls, positions, ranks_said

__all__ = [
    "AnalyserFinding",
    "AnalyserVerdict",
    "analyse_with_pytorch",
    "pytorch_verdicts",
    "verdicts_compared",
]

_KINDS = {
    "COLLECTIVE_TYPE_MISMATCH": "different collective",
    "SIZE_OR_SYNTAX_MISMATCH": "different sizes",
    "NOT_ALL_RANKS_JOINED": "missing",
}


@dataclass
class AnalyserFinding:
    """One collective PyTorch's analyser reports as wrong: its group (name and description),
    its sequence number in that group, the analyser's error type and the ranks it blames."""

    group: str
    desc: str
    seq: int
    error_type: str | None
    culprits: list[int]

    @property
    def kind(self) -> str | None:
        """The error type in :class:`Mismatch`'s words."""
        return _KINDS.get(self.error_type or "", self.error_type)


@dataclass
class AnalyserVerdict:
    """What PyTorch's Flight Recorder analyser said: every collective it reports as wrong
    (``findings``, one per process group at most, in its order), the first one's sequence
    number, culprit ranks and error type, and its whole output."""

    seq: int | None
    culprits: list[int]
    error_type: str | None
    output: str
    findings: list[AnalyserFinding] = field(default_factory=list)

    @property
    def kind(self) -> str | None:
        """The first finding's error type in :class:`Mismatch`'s words."""
        return _KINDS.get(self.error_type or "", self.error_type)


_NO_TABULATE = "tabulate is not installed. Proceeding without it.\n"
# Each finding's first line in fr_trace's output (torch 2.14, components/utils.py)
_FINDING = re.compile(
    r"^(?:Collective sequence number: (\d+) has errors"
    r"|Not all ranks joining collective, sequence number: (\d+)"
    r"|Input/output mismatch in the collective sequence number: (\d+))$",
    re.M,
)


def _findings(output: str) -> list[AnalyserFinding]:
    """The analyser's findings, read from its output."""
    starts = list(_FINDING.finditer(output))
    found = []
    for m, end in zip(starts, [s.start() for s in starts[1:]] + [len(output)]):
        block = output[m.start() : end]
        group = re.search(r"^group info: ([^:\n]*):?(.*)$", block, re.M)
        culprit = re.search(r"Culprit rank (\d+); Error type: (\w+)", block)
        missing = re.search(r"^missing ranks: \{([\d, ]+)\}", block, re.M)
        if m.group(2):
            error, culprits = "NOT_ALL_RANKS_JOINED", missing.group(1) if missing else ""
        else:
            error = culprit.group(2) if culprit else "SIZE_OR_SYNTAX_MISMATCH"
            culprits = culprit.group(1) if culprit else ""
        found.append(
            AnalyserFinding(
                group.group(1) if group else "",
                group.group(2) if group else "",
                int(m.group(1) or m.group(2) or m.group(3)),
                error,
                [int(r) for r in culprits.split(",") if r.strip()],
            )
        )
    return found


def _for_the_analyser(dumps: dict[int, dict], members: dict[str, list[int]], desc: dict) -> dict:
    """Copies of the dumps as PyTorch's analyser needs them: an ``entries`` list even where the
    rank recorded nothing, and each rank's groups in ``pg_config`` (torch 2.14's gloo dumps
    list a wrong group there, and the analyser then fails with a KeyError)."""
    fixed = {}
    for rank, dump in dumps.items():
        config = {
            g: {"name": g, "desc": desc.get(g, ""), "ranks": str(ranks)}
            for g, ranks in members.items()
            if rank in ranks
        }
        fixed[rank] = {**dump, "entries": dump.get("entries", []), "pg_config": config}
    return fixed


def analyse_with_pytorch(
    folder: str | Path, timeout: float = 120, prefix: str | None = None
) -> AnalyserVerdict:
    """PyTorch's verdict on the dumps ``<prefix><rank>`` in ``folder`` (as
    :func:`load_flight_records` finds them): every collective that
    ``python -m torch.distributed.flight_recorder.fr_trace`` reports as wrong.

    The analyser loads every file it is given with a plain ``pickle.load``, which runs any code
    a pickle carries. So it is never given these files: each dump is read with this module's
    safe reader (a bad one is a :class:`FlightRecorderError` naming it), and the analyser reads
    fresh pickles of that plain data, written into a private temporary folder (removed after),
    each listing its rank's groups as :func:`group_members` finds them.
    timeout: seconds the analyser may take.
    """
    return pytorch_verdicts([folder], timeout, prefix)[0]


#: The analyser's ``main`` run on each folder in turn, in one process: a line ``<marker> <i>``
#: on both streams before folder i's output, and ``<marker> <i> exit <code>`` on standard
#: output after it (the marker is drawn at random per run: a dump cannot forge it).
_ONE_PROCESS = """
import sys, traceback
from torch.distributed.flight_recorder.fr_trace import main
marker, prefix = sys.argv[1:3]
for i, folder in enumerate(sys.argv[3:]):
    for stream in (sys.stdout, sys.stderr):
        print(f"\\n{marker} {i}", file=stream, flush=True)
    try:
        main([folder, "--prefix", prefix])
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except Exception:
        traceback.print_exc()
        code = 1
    sys.stderr.flush()
    print(f"\\n{marker} {i} exit {code}", flush=True)
"""


def pytorch_verdicts(
    folders: Sequence[str | Path], timeout: float = 120, prefix: str | None = None
) -> list[AnalyserVerdict]:
    """:func:`analyse_with_pytorch` of each of ``folders``, in order, from one process of
    PyTorch's analyser (starting one, which imports torch, takes most of its time).
    ``timeout``: seconds the analyser may take per folder, all folders together.

    Raises:
        FlightRecorderError: naming the first folder whose dumps are bad (every folder's dumps
            are read first), else the folder the analyser failed on or ran out of time on.
    """
    folders = [Path(f) for f in folders]
    if not folders:
        return []
    marker = f"=== fr_trace {secrets.token_hex(8)} folder"
    with tempfile.TemporaryDirectory(prefix="fr-checked-") as checked:  # mode 0700
        copies = [Path(checked) / str(i) for i in range(len(folders))]
        for folder, copy in zip(folders, copies):
            records, dumps = load_records_and_dumps(folder, None, prefix)
            dumps = _for_the_analyser(dumps, group_members(records), group_descriptions(records))
            copy.mkdir()
            for rank, dump in dumps.items():
                (copy / f"{DUMP_PREFIX}{rank}").write_bytes(pickle.dumps(dump, protocol=4))
        command = [sys.executable, "-c", _ONE_PROCESS, marker, DUMP_PREFIX, *map(str, copies)]
        limit = timeout * len(folders)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=limit, cwd=checked)  # fmt: skip
        except subprocess.TimeoutExpired as late:
            said = (late.stdout or b"").decode(errors="replace")
            at = max(_each_folders_output(said, "", marker)[0], default=0)
            raise FlightRecorderError(
                folders[at], f"PyTorch's analyser did not finish in {limit:g} s; raise timeout="
            ) from None
    parts, codes = _each_folders_output(done.stdout, done.stderr, marker)
    verdicts = []
    for i, (folder, copy) in enumerate(zip(folders, copies)):
        code = codes.get(i, done.returncode or 1)
        output = parts[i] if i in parts else done.stderr  # the process ended before it
        # fr_trace logs that an optional package is missing; it changes nothing in the verdict
        output = output.replace(str(copy), str(folder)).replace(_NO_TABULATE, "").strip()
        if code != 0:
            last = "\n".join(output.splitlines()[-5:])
            raise FlightRecorderError(folder, f"PyTorch's analyser failed (exit code {code}):\n{last}")  # fmt: skip
        findings = _findings(output)
        first = findings[0] if findings else None
        verdicts.append(
            AnalyserVerdict(first.seq, first.culprits, first.error_type, output, findings)
            if first
            else AnalyserVerdict(None, [], None, output)
        )
    return verdicts


def _each_folders_output(stdout: str, stderr: str, marker: str) -> tuple[dict[int, str], dict[int, int]]:  # fmt: skip
    """Per folder the analyser began, its output (its standard output, then its standard
    error, as one run of the analyser gives them); per folder it finished, its exit code. A
    marker's line begins with a newline of its own, which is no part of the output before it."""
    line_of = re.compile(rf"^{re.escape(marker)} (\d+)(?: exit (-?\d+))?$")
    parts: dict[int, str] = {}
    codes: dict[int, int] = {}
    for stream in (stdout, stderr):
        said: dict[int, list[str]] = {}
        at = None
        for line in stream.splitlines(keepends=True):
            mark = line_of.match(line.rstrip("\n"))
            if mark is None:
                if at is not None:
                    said[at].append(line)
                continue
            if at is not None and said[at] and said[at][-1].endswith("\n"):
                said[at][-1] = said[at][-1][:-1]  # the marker's own newline
            at = int(mark.group(1)) if mark.group(2) is None else None
            if at is not None:
                said.setdefault(at, [])
            elif stream is stdout:
                codes[int(mark.group(1))] = int(mark.group(2))
        for i, lines in said.items():
            parts[i] = parts.get(i, "") + "".join(lines)
    return parts, codes


def verdicts_compared(
    records: pd.DataFrame,
    mismatch: Mismatch | None,
    verdict: AnalyserVerdict,
    ranks: list[int] | None = None,
) -> str:
    """PyTorch's analyser's first finding (``verdict``) beside :func:`first_mismatch`'s
    (``mismatch``, on the same ``records``), as one sentence: that they agree, or what each
    says and why they differ, as far as the dumps show it.

    The reasons looked for: the analyser blames a rank whose entry is gone from its dump though
    it has later ones in the group (it called the collective: the analyser reads a missing
    entry as never called); a rank that waits in another group (a victim: the analyser reports
    every group alike); a rank without a dump (the analyser cannot see it); and collectives
    every member called, where only NCCL's completion states show a failure.

    Args:
        records: the dumps' rows (:func:`load_flight_records`).
        mismatch: :func:`first_mismatch`'s verdict on them (None: it found nothing).
        verdict: :func:`analyse_with_pytorch`'s on the same dumps.
        ranks: the job's ranks, as given to :func:`first_mismatch` (default: from the dumps).
    """
    ours = "nothing wrong" if mismatch is None else _said(mismatch.group, mismatch.desc, mismatch.seq, mismatch.kind, mismatch.culprits)  # fmt: skip
    if not verdict.findings:
        theirs = "PyTorch's analyser finds nothing wrong"
        if mismatch is None:
            return f"{theirs}, nor does first_mismatch."
        if mismatch.no_dumps:
            why = f"it cannot see rank(s) {mismatch.no_dumps}, which left no dump"
        elif mismatch.kind in ("never completed", "failed"):
            why = "it compares what each rank called, and every member called it; only NCCL's completion states show where a rank stopped"  # fmt: skip
        else:
            why = "it found no group whose members disagree"
        return f"{theirs}; first_mismatch says {ours}: {why}."
    first = verdict.findings[0]
    theirs = _said(first.group, first.desc, first.seq, first.kind, first.culprits)
    if mismatch is not None and (first.group, first.seq, first.culprits) == (mismatch.group, mismatch.seq, mismatch.culprits):  # fmt: skip
        return f"PyTorch's analyser agrees: {theirs}."
    job = job_ranks(records, ranks)
    at = positions(collective_calls(records), records.attrs.get("progress"))
    waiting_in = group_states(records, job).set_index("group")["culprits_waiting_in"]
    evicted = [r for r in first.culprits if (r, first.group, first.seq) not in at.seen and at.called(r, first.group, first.seq)]  # fmt: skip
    victims = {r: g for r, g in waiting_in.get(first.group, {}).items() if r in first.culprits}
    why = []
    if evicted:
        why.append(f"{ranks_said(evicted)} called it: the entry is gone from the dump, which holds later ones in that group, and the analyser reads a missing entry as never called")  # fmt: skip
    if victims:
        where = ", ".join(f"rank {r} in group {g}" for r, g in victims.items())
        why.append(f"{ranks_said(list(victims))} {'waits' if len(victims) == 1 else 'wait'} in another group ({where}): {'a victim' if len(victims) == 1 else 'victims'}, and the analyser reports every group alike, not which one started the hang")  # fmt: skip
    if not why:
        why.append("the analyser reports the groups in the order it meets them; first_mismatch takes the first, in the program's order, whose culprit waits nowhere else")  # fmt: skip
    return f"PyTorch's analyser's first finding is {theirs}; first_mismatch says {ours}. They differ because {'; '.join(why)}."  # fmt: skip


def _said(group: str | None, desc: str, seq: int | None, kind: str | None, culprits: list[int]) -> str:  # fmt: skip
    """A verdict in a few words: "group 74 (ep), collective 20537, missing: rank(s) [12]"."""
    where = f"group {group} ({desc or 'no description'}), " if group is not None else ""
    return f"{where}collective {seq}, {kind}: rank(s) {culprits}"
