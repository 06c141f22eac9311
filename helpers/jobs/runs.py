"""Where runs live and what is kept about them: the run folder, its manifest, and paths shown.

Every launch gets a folder ``traces/<experiment>/<run-id>/`` that is never reused::

    traces/ddp/20261122-101500-1a2b/
        run.json            the manifest (a RunRecord): command, ranks, times, exit codes, files
        logs/               what each rank printed (torchrun's per-rank log files)
        rank0_iter4_6.json  whatever the script wrote into RUN_DIR (traces, dumps, ...)
        node0/, node1/      on a multi-node run, one RUN_DIR per node
        .cache/             the trace loader's cache (safe to delete)

The launcher writes these folders, the trace loader reads them; both take the names
from here.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .._files import write_atomically
from .kineto_noise import NOISE

__all__ = [
    "REPO_ROOT",
    "TRACES_ROOT",
    "MANIFEST_NAME",
    "LOGS_DIR",
    "CACHE_DIR",
    "RunRecord",
    "new_run_dir",
    "show_path",
    "usable_cores",
    "LaunchError",
    "RankFailed",
    "RunTimedOut",
    "RendezvousTimedOut",
    "RunInterrupted",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
TRACES_ROOT = REPO_ROOT / "traces"
MANIFEST_NAME = "run.json"  # the manifest in every run folder
LOGS_DIR = "logs"  # torchrun's per-rank log files, in every node's folder
CACHE_DIR = ".cache"  # the trace loader's cache, in a folder of traces
# the profiler's memory timeline (export_memory_timeline) that a job may write beside its traces
MEMORY_TIMELINE_DIR = "memory-timeline"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cores or 1


def show_path(path: str | os.PathLike) -> str:
    """A path as a learner's screen should show it: relative to the repository when it is
    inside it (``traces/ddp/...``), else relative to the working folder, else as given."""
    path = Path(path)
    for base in (REPO_ROOT, Path.cwd()):
        try:
            return str(path.resolve().relative_to(base.resolve()))
        except ValueError:
            continue
    return str(path)


def shorten_paths(text: str) -> str:
    """``text`` with every path inside the repository written relative to it."""
    return text.replace(str(REPO_ROOT) + os.sep, "")


@dataclass
class RunRecord:
    """What one launch did: where it wrote, how each rank ended, what it printed.

    ``status`` is ``ok``, ``failed``, ``timeout``, ``rendezvous timeout``, ``interrupted``,
    ``stopped`` (a background run's ``stop()``), ``launcher died`` (the process that launched
    it ended first) or ``running``.
    ``exit_codes`` maps each global rank to its exit code: -15 means torchrun
    stopped the rank (SIGTERM) after another one failed; ``None`` means no code was
    reported (the run was killed on a timeout or an interrupt, or the rank's node
    was stopped by the launcher after another node failed).
    ``nodes`` maps each node (torchrun agent) to the global ranks it ran.
    ``files`` maps paths relative to ``run_dir`` to sizes in bytes.
    ``replayed_from`` names the recording a replayed run came from (recorded mode).
    ``cores`` is how many cores the launcher could run on (one machine's, that its ranks
    shared; None in a manifest written before it was kept).
    """

    experiment: str
    run_id: str
    run_dir: Path
    command: list[str]
    script: str
    args: list[str]
    nproc: int
    nnodes: int
    world_size: int
    backend: str
    device: str
    started: str
    ended: str | None = None
    seconds: float | None = None
    status: str = "running"
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    nodes: dict[int, list[int]] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    replayed_from: str | None = None
    cores: int | None = None
    output: dict[int, list[str]] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def lines(self, rank: int) -> list[str]:
        """What a rank printed (stdout, then stderr), without blank lines and profiler noise."""
        return [
            line for line in self.output.get(rank, []) if line.strip() and not NOISE.search(line)
        ]

    def paths(self, pattern: str = "*") -> list[Path]:
        """Files in the run folder matching a glob pattern (recursive), sorted."""
        return sorted(
            p
            for p in self.run_dir.rglob(pattern)
            if p.is_file() and CACHE_DIR not in p.relative_to(self.run_dir).parts
        )

    def relative_dir(self) -> str:
        """The run folder as a notebook should show it (see :func:`show_path`)."""
        return show_path(self.run_dir)

    def describe(self) -> str:
        """One line saying what ran where: ``train.py with 4 ranks on 2 nodes (cpu, gloo) ->
        traces/ddp/<run-id>`` (``on N nodes`` only when there is more than one)."""
        nodes = f" on {self.nnodes} nodes" if self.nnodes > 1 else ""
        return (
            f"{self.script} with {self.world_size} ranks{nodes} ({self.device}, "
            f"{self.backend}) -> {self.relative_dir()}"
        )

    def torchrun_command(self) -> str:
        """The command line of node 0's torchrun agent as it was run, paths inside the
        repository written relative to it."""
        return shorten_paths(" ".join(self.command))

    def __repr__(self) -> str:
        return (
            f"RunRecord({self.experiment}/{self.run_id}: {self.status}, "
            f"{self.world_size} ranks, {self.backend}, {len(self.files)} files)"
        )

    def to_json(self) -> dict:
        data = asdict(self)
        data["run_dir"] = self.relative_dir()
        data.pop("output")
        data["exit_codes"] = {str(k): v for k, v in self.exit_codes.items()}
        data["nodes"] = {str(k): v for k, v in self.nodes.items()}
        return data

    def save(self) -> Path:
        """Write the manifest ``run.json`` (atomically) and return its path."""
        self.files = _list_files(self.run_dir)
        path = self.run_dir / MANIFEST_NAME
        return write_atomically(path, json.dumps(self.to_json(), indent=2))

    @classmethod
    def load(cls, run_dir: str | Path) -> RunRecord:
        """Read the manifest of an earlier run from its folder."""
        run_dir = Path(run_dir)
        path = run_dir / MANIFEST_NAME
        if not path.is_file():
            raise FileNotFoundError(
                f"{show_path(path)}: no run manifest here; is this a run "
                f"folder made by helpers.launch()?"
            )
        return cls.from_json(json.loads(path.read_text()), run_dir)

    @classmethod
    def from_json(cls, data: dict, run_dir: Path) -> RunRecord:
        """The record that :meth:`to_json` wrote, its folder now ``run_dir``."""
        data = dict(data, run_dir=run_dir)
        data["exit_codes"] = {int(k): v for k, v in data["exit_codes"].items()}
        data["nodes"] = {int(k): v for k, v in data.get("nodes", {}).items()}
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


# ------------------------------------------------------------- how a run can end badly


class LaunchError(RuntimeError):
    """A run did not finish cleanly. ``record`` is its :class:`RunRecord`."""

    def __init__(self, message: str, record: RunRecord):
        super().__init__(message)
        self.record = record


class RankFailed(LaunchError):
    """A rank exited with a non-zero code; the other ranks were stopped."""

    def __init__(
        self, message: str, record: RunRecord, rank: int, exit_code: int, last_lines: list[str]
    ):
        super().__init__(message, record)
        self.rank = rank
        self.exit_code = exit_code
        self.last_lines = last_lines


class RunTimedOut(LaunchError):
    """The run was still going after its timeout and was killed as a whole."""


class RendezvousTimedOut(LaunchError):
    """Not every node joined the rendezvous before its join timeout."""


class RunInterrupted(LaunchError):
    """The kernel (or Ctrl-C) interrupted the run; every process was stopped."""


def _list_files(run_dir: Path) -> dict[str, int]:
    files = {}
    for p in sorted(run_dir.rglob("*")):
        rel = p.relative_to(run_dir)
        # the manifest itself, or its temporary file while a save writes it (.run.json.*.tmp)
        manifest = len(rel.parts) == 1 and p.name.lstrip(".").startswith(MANIFEST_NAME)
        if p.is_file() and CACHE_DIR not in rel.parts and not manifest:  # no cache, anywhere
            files[str(rel)] = p.stat().st_size
    return files


def new_run_dir(experiment: str, traces_root: str | Path | None = None) -> tuple[str, Path]:
    """Create ``traces/<experiment>/<run-id>/`` (never reusing one) and return ``(run_id, path)``.

    ``experiment`` must be a plain folder name, so that the run stays inside ``traces/``: up to
    100 letters, digits, ``-``, ``_`` or ``.``, not starting with ``.`` (not ``..``)."""
    if not isinstance(experiment, str) or not re.fullmatch(
        r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", experiment
    ):
        raise ValueError(
            f"experiment={experiment!r}: use a plain name of up to 100 letters, digits, '-', '_' "
            f"or '.', not starting with '.' (it becomes a folder in traces/)"
        )
    root = Path(traces_root) if traces_root is not None else TRACES_ROOT
    while True:
        run_id = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
        run_dir = root / experiment / run_id
        try:
            run_dir.mkdir(parents=True, exist_ok=False)
            return run_id, run_dir
        except FileExistsError:
            continue
