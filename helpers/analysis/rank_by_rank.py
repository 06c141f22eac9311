"""Analyses of a run too large to load whole: one rank at a time, in bounded memory.

:func:`helpers.load_run` builds one DataFrame of every event of every rank: a run of hundreds of
ranks with traces of 100 MB each does not fit in a laptop's memory that way. Most analyses of the
series need far less than every event. Step times need the steps; time per kind needs each
rank's events only while its row is computed; waiting in collectives needs the collectives of
every rank (the only part where ranks meet), a few thousand rows per rank.

:func:`summarise_run` reads one rank's file at a time (in ``workers`` processes at once), keeps
of it its steps, its collectives and its row of time per kind, and lets the rest go; the
:class:`RunSummary` it returns answers ``step_times()``, ``time_per_kind()``,
``collective_waits()``, ``waiting_per_step()`` and ``find_straggler()`` with the very functions of
:mod:`helpers.analysis`, run on those parts, so that the tables are
the same as from the whole run in memory (the tests compare them). Memory peaks at what the
workers hold, about one rank's DataFrame each, plus the parts kept.

Each rank's events are kept as Parquet beside its file (:func:`helpers.traces.rank_events`), and
so are the parts kept of them, so a second pass reads only those; other engines read the same
files: ``examples/rank_by_rank_on_dask.py`` hands :func:`kept_of_file` and :func:`summary_of` to
a Dask cluster, for a job whose traces are too many for one machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..jobs.runs import usable_cores
from ..traces import NotATrace, TraceHeader, check_one_run, run_files
from ..traces.export import written_by_merge
from ..traces.kinds import name_matches
from ..traces.rank_files import (
    each_in_processes,
    header_note,
    header_of_note,
    rank_trace,
    read_rank_part,
    worker_failure,
    write_rank_part,
)
from .arrival import GPU_SYNCS
from .collectives import NCCL_KERNELS, collective_waits, find_straggler, waiting_per_step
from .path.from_rank_parts import path_summary_of_parts
from .path.rank_part import CHAIN_COLUMNS, PORT_COLUMNS, RankAsked, rank_part
from .steps import step_times, time_per_kind

__all__ = [
    "RunSummary",
    "summarise_run",
    "kept_of_rank",
    "kept_of_file",
    "summary_of",
]


@dataclass
class RunSummary:
    """What :func:`summarise_run` kept of a run: ``steps`` and ``collectives`` (those events of
    every rank, with every column of the loader), ``kind_ms`` (time per kind, one row per rank),
    ``pieces`` and ``ports`` (each rank's part of the critical path,
    :func:`helpers.analysis.path.rank_part.rank_part`: its pieces by rank, every rank's ports in
    one table), the ``files`` read and their ``bytes``,
    each file's ``headers`` (as :func:`helpers.load_run` gives them), and how to read a rank
    again (``cache``, and the ``given`` rank of each file, where the caller gave one)."""

    steps: pd.DataFrame
    collectives: pd.DataFrame
    kind_ms: pd.DataFrame
    pieces: dict[int, pd.DataFrame] = field(default_factory=dict)
    ports: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=PORT_COLUMNS))
    files: list[Path] = field(default_factory=list)
    bytes: int = 0
    headers: list[TraceHeader] = field(default_factory=list)
    cache: bool = True
    given: dict[Path, int | None] = field(default_factory=dict)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.kind_ms.index)

    def step_times(self) -> pd.DataFrame:
        """:func:`helpers.step_times` of the whole run."""
        return step_times(self.steps)

    def time_per_kind(self) -> pd.DataFrame:
        """:func:`helpers.time_per_kind` of the whole run."""
        return self.kind_ms

    def collective_waits(self, names: str | None = None) -> pd.DataFrame:
        """:func:`helpers.collective_waits` of the whole run."""
        return collective_waits(self.collectives, names)

    def waiting_per_step(self, names: str | None = None) -> pd.DataFrame:
        """:func:`helpers.waiting_per_step` of the whole run."""
        return waiting_per_step(self.collectives, names)

    def find_straggler(self, names: str | None = None) -> int:
        """:func:`helpers.find_straggler` of the whole run."""
        return find_straggler(self.collectives, names)

    def path_summary(self, leave_out: Sequence[int] = (), trail: list[tuple] | None = None) -> pd.DataFrame:  # fmt: skip
        """:func:`helpers.path_summary` by kind and name of the run's critical path, strung
        together from each rank's part (:mod:`helpers.analysis.path.from_rank_parts`); the steps in
        ``leave_out`` left out. A rank whose part the whole run takes otherwise than the rank
        read alone did is read once more (:meth:`part_again`), where its file is known.
        ``trail``: a list to fill with the path's time in the walk's order
        (:func:`~helpers.analysis.path.from_rank_parts.path_summary_of_parts`)."""
        again = self.part_again if self.headers else None
        return path_summary_of_parts(self.pieces, self.ports, self.steps, self.collectives, leave_out, again, trail)  # fmt: skip

    def part_again(self, rank: int, asked: RankAsked) -> tuple[pd.DataFrame, pd.DataFrame]:
        """``rank``'s part of the path made again as ``asked``: its file read once more (from
        its Parquet cache where it was kept)."""
        (header,) = [h for h in self.headers if h.rank == rank]
        return rank_part(rank_trace(header.path, self.cache, self.given.get(Path(header.path))).events, asked)  # fmt: skip


def kept_of_rank(events: pd.DataFrame, path: bool = True) -> tuple[pd.DataFrame, ...]:
    """What the run-wide analyses need of one rank's ``events``: its steps, its collectives
    (gloo's and NCCL's CPU spans, NCCL kernels, and the CUDA synchronisations on their threads
    that say when a rank's data was ready, :func:`helpers.analysis.arrival.data_ready`), its
    row of time per kind and its part of the critical path (its pieces and its ports,
    :func:`helpers.analysis.path.rank_part.rank_part`; none without ``path``)."""
    steps = events[(events["kind"] == "step").to_numpy()]
    communication = (events["kind"] == "communication").to_numpy()
    lanes = events.loc[communication, "lane"].astype(str).unique()
    syncs = name_matches(events, GPU_SYNCS) & events["lane"].astype(str).isin(lanes).to_numpy()
    collectives = events[communication | name_matches(events, NCCL_KERNELS) | syncs]
    if path:
        chains, ports = rank_part(events)
    else:
        chains, ports = pd.DataFrame(columns=CHAIN_COLUMNS), pd.DataFrame(columns=PORT_COLUMNS)
    return steps, collectives, time_per_kind(events), chains, ports


def kept_of_file(
    path: str | Path, cache: bool = True, rank: int | None = None, critical: bool = True
) -> tuple[Any, ...] | None:
    """:func:`kept_of_rank` of one rank's file, and the file's header (the rest of its events
    are let go); None for a file ``merge_traces`` wrote (even of one rank) and for a JSON file
    that is no trace (a manifest), which :func:`helpers.load_run` leaves out too. With
    ``cache`` the parts are kept too, in one Parquet file (the steps' and the collectives' rows;
    the row of time per kind and the header in its metadata), so that a second pass reads only
    that. Without ``critical``, no chains of the critical path (faster).

    Args:
        path: the rank's trace file.
        cache: read and keep the parts as Parquet beside it.
        rank: the rank, where the file does not say it.
        critical: also keep the rank's chains of the critical path.
    """
    path = Path(path)
    rows = read_rank_part(path, "kept", rank) if cache else None
    chains = read_rank_part(path, "chains", rank) if cache and critical else None
    ports = read_rank_part(path, "ports", rank) if cache and critical else None
    if not critical:
        chains, ports = pd.DataFrame(columns=CHAIN_COLUMNS), pd.DataFrame(columns=PORT_COLUMNS)
    found = rows is not None and chains is not None and ports is not None
    if found and {"kind_ms", "header"} <= set(rows.attrs):
        is_step = (rows["kind"] == "step").to_numpy()
        kinds, header = _kinds_of_note(rows.attrs["kind_ms"]), rows.attrs["header"]
        return rows[is_step], rows[~is_step], kinds, chains, ports, header_of_note(header, path)
    try:
        trace = rank_trace(path, cache, rank)
    except NotATrace:  # a recording's manifest, left out as load_run leaves it out
        return None
    if trace.header.merged:
        return None
    steps, collectives, kinds, chains, ports = kept_of_rank(trace.events, critical)
    if cache:
        rows = pd.concat([steps, collectives], ignore_index=True)
        rows.attrs = {"kind_ms": kinds.to_dict(orient="split"), "header": header_note(trace.header)}
        write_rank_part(path, "kept", rank, rows)
        if critical:
            write_rank_part(path, "chains", rank, chains)
            write_rank_part(path, "ports", rank, ports)
    return steps, collectives, kinds, chains, ports, trace.header


def _kinds_of_note(note: dict) -> pd.DataFrame:
    """The row of time per kind that :func:`kept_of_file` kept in a cache's metadata, as
    :func:`helpers.time_per_kind` gave it."""
    return pd.DataFrame(
        note["data"],
        index=pd.Index(note["index"], dtype=np.int32, name="rank"),
        columns=pd.Index(note["columns"], dtype="str"),
        dtype=float,
    )


def summarise_run(
    source: Any,
    *,
    workers: int | None = None,
    cache: bool = True,
    progress: bool | None = None,
    critical: bool = True,
) -> RunSummary:
    """Read a run's traces one rank at a time and keep what the run-wide analyses need (see
    the module's docstring).

    Args:
        source: a RunRecord, a run folder (its trace files, as :func:`helpers.load_run` finds
            them), a list of files, one per rank, or ``{rank: file}``; a merged file of several
            ranks is left out, as ``load_run`` does (one that :func:`merge_traces` wrote is not
            even read), and so is a JSON file that is no trace (:class:`NotATrace`, a
            recording's manifest).
        workers: processes reading files at once (default: the usable cores, each holding one
            rank's DataFrame at a time).
        cache: keep each rank's events (:func:`helpers.traces.rank_events`) and the parts of them kept
            (:func:`kept_of_file`) as Parquet, so that a second pass reads only the parts.
        progress: tqdm's bar (default: only when the work takes over 2 s and someone watches).
        critical: also keep each rank's chains of the critical path (without: the summary's
            ``path_summary`` is empty, and the pass faster).

    Returns:
        A :class:`RunSummary`.
    """
    items = [(path, rank) for path, rank in run_files(source)[0] if not written_by_merge(path)]
    files = [path for path, _ in items]
    workers = max(1, min(workers or usable_cores(), len(files)))
    jobs = [(path, cache, rank, critical) for path, rank in items]
    parts = each_in_processes(kept_of_file, jobs, workers, "summarising trace files", progress)
    for path, part in zip(files, parts):
        if isinstance(part, BaseException):
            raise worker_failure(part, path)
    summary = summary_of(parts, files)
    summary.cache, summary.given = cache, {Path(p): r for p, r in items}
    return summary


def summary_of(parts: Sequence[tuple], files: Sequence[str | Path] = ()) -> RunSummary:
    """The :func:`kept_of_file` parts of every rank (computed here, or by any engine that maps
    it over the ranks, Dask's included) joined into one :class:`RunSummary`; a part that is None
    (a merged file, see :func:`summarise_run`) is left out with its file. The files must be of
    one run, as :func:`helpers.load_run` checks them (:func:`helpers.traces.check_one_run`):
    else a :class:`helpers.traces.DifferentRuns` names the file at odds."""
    files = [Path(p) for p, part in zip(files, parts) if part is not None] if files else []
    parts = [part for part in parts if part is not None]
    steps = pd.concat([p[0] for p in parts], ignore_index=True)
    collectives = pd.concat([p[1] for p in parts], ignore_index=True)
    kinds = pd.concat([p[2] for p in parts]).fillna(0.0).sort_index()
    pieces = {int(p[3]["rank"].iat[0]): p[3] for p in parts if len(p) > 3 and len(p[3])}
    ports = [p[4] for p in parts if len(p) > 4 and len(p[4])]
    ports = pd.concat(ports, ignore_index=True) if ports else pd.DataFrame(columns=PORT_COLUMNS)
    headers = [p[5] for p in parts if len(p) > 5]
    if headers:
        check_one_run(headers)
    sizes = [h.world_size for h in headers if h.world_size is not None]
    if sizes:  # the matching of collectives reads it, as in a run loaded whole
        collectives.attrs["world_size"] = max(sizes)
    size = sum(p.stat().st_size for p in files)
    return RunSummary(steps, collectives, kinds, pieces, ports, files, size, headers)
