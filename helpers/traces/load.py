"""Load profiler traces (Kineto / Chrome JSON, one file per rank) into pandas, and check them.

- :func:`load_trace` reads one file into a :class:`Trace` (header + events DataFrame).
- :func:`load_run` reads every rank of a run (a folder, a list of files or a ``RunRecord``)
  into one :class:`RunTraces` with a ``rank`` column and one time axis.
- :func:`trace_files` lists the trace files of a folder.

Writing traces out (one merged file for Perfetto, nodes' folders gathered into one) is
:mod:`.export`.

Every problem with a file raises :class:`TraceError`, which names the file and says what is
wrong; a file that loads but not exactly as written (bad bytes replaced, events left out)
gives a :class:`TraceWarning`. Times are microseconds everywhere: ``start_us``/``end_us``
are absolute (µs since the Unix epoch), ``rel_us`` is µs since the earliest event of the
run, so ranks on one host line up.

Big runs: files are decoded in parallel worker processes when there are many large ones,
a progress bar (tqdm) appears when a load takes more than a couple of seconds, and the
result is cached next to the traces (``.cache/``), so loading the same unchanged run again
is a fraction of the first time. ``ranks=`` and ``steps=`` load only part of a run.

Inside, each layer imports only the ones below it: this module, then the cache
(:mod:`._cache`), the run's frame (:mod:`._frame`), reading files
(:mod:`._file`), and what one file goes through (bytes, JSON, header, columns,
steps).
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import _cache
from ._error import DifferentRuns, NotATrace, TraceError, TraceWarning
from ._file import FileColumns, read_file, read_files
from ._frame import frame
from ._header import TraceHeader, rank_in_name
from ..jobs.runs import CACHE_DIR, LOGS_DIR, MANIFEST_NAME, MEMORY_TIMELINE_DIR, show_path

__all__ = [
    "TraceError",
    "NotATrace",
    "DifferentRuns",
    "check_one_run",
    "TraceWarning",
    "TraceHeader",
    "Trace",
    "RunTraces",
    "load_trace",
    "load_run",
    "trace_files",
    "run_files",
]


@dataclass
class Trace:
    """One trace file: its header and its complete events (one row each)."""

    header: TraceHeader
    events: pd.DataFrame
    skipped_events: int = 0


@dataclass
class RunTraces:
    """The traces of one run: ``events`` (all ranks, one time axis), ``headers`` (one per file)
    and ``skipped`` (``(file, problem)`` pairs left out in lenient mode)."""

    events: pd.DataFrame
    headers: list[TraceHeader]
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        """The ranks loaded, in order."""
        return sorted({h.rank for h in self.headers})


def _warn_notes(headers: Iterable[TraceHeader]) -> None:
    """A TraceWarning for each file that was not loaded exactly as written."""
    for h in headers:
        if h.notes:
            warnings.warn(TraceWarning(f"{show_path(h.path)}: " + "; ".join(h.notes)), stacklevel=3)


def load_trace(
    path: str | Path,
    rank: int | None = None,
    *,
    strict: bool = True,
    steps: tuple[int, int] | None = None,
) -> Trace:
    """Read one trace file (``.json`` or ``.json.gz``) into a :class:`Trace`.

    Args:
        path: the file (one that cannot be read raises a :class:`TraceError` naming it).
        rank: which rank wrote it, when neither ``distributedInfo`` nor the file name says (a
            trace that says nothing is taken as rank 0, one process: ``header.rank_source`` is
            then ``"assumed"``).
        strict: raise on events without a start time or with a negative duration (default), or
            leave them out and count them.
        steps: ``(first, last)``: only the events inside ``ProfilerStep#first`` .. ``#last``.

    The DataFrame has one row per complete event, sorted by start: ``rank, name, cat, kind,
    pid, tid, lane, start_us, dur_us, end_us, collective, shapes, stream, step, rel_us``
    (µs since the trace's first event), ``launch_us`` and, for collectives where the trace
    records them, ``process_group, msg_bytes, group_size, seq``; ``call_from`` is where a
    Python function was called from (``file:line``; traces made with ``with_stack=True``);
    ``wait_stream`` and ``waits_for_us`` say what a ``cuda_sync`` event (recorded with
    ``enable_cuda_sync_events``) waited for: the stream, and when the CUDA event it waited on
    was recorded there (the start of its ``cudaEventRecord`` call); ``peer`` and ``tag`` are a
    send's or a receive's (``c10d::send``, ``c10d::recv_``) peer (its rank in the op's process
    group) and tag, in traces recorded with ``record_shapes=True``.
    ``step`` is the ``ProfilerStep#N`` an event starts in (``<NA>`` outside every step),
    except for GPU events: they carry the step whose CPU code launched them (a kernel often
    runs after its step's CPU work has ended), and ``launch_us`` is when that launch happened
    (``start_us - launch_us`` is the time the kernel waited in its stream's queue). A GPU event
    whose launch is not in the trace has no step either, ``<NA>``
    (``header.gpu_events_without_launch`` counts them). A file written by
    :func:`~helpers.traces.merge_traces` loads with each event's own rank.
    """
    part = read_file(Path(path), rank, strict, steps, single=True)
    _warn_notes([part.header])
    return Trace(part.header, frame([part]), part.skipped)


def trace_files(folder: str | Path) -> list[Path]:
    """The trace files under a folder: ``*.json`` and ``*.json.gz``, recursively, sorted;
    the run manifest, torchrun's logs, the loader's cache and a memory timeline's folder are
    left out."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TraceError(folder, "no such folder")
    files = [
        p
        for p in folder.rglob("*")
        if p.is_file()
        and (p.name.endswith(".json") or p.name.endswith(".json.gz"))
        and p.name != MANIFEST_NAME
        and not {LOGS_DIR, CACHE_DIR, MEMORY_TIMELINE_DIR} & set(p.relative_to(folder).parts[:-1])
    ]
    return sorted(files)


def run_files(source: Any) -> tuple[list[tuple[Path, int | None]], Path | None]:
    """``(path, rank or None)`` for each trace file of ``source`` (a RunRecord, a run folder,
    a list of files or ``{rank: file}``), and its folder when it is one; a TraceError when
    there is no file."""
    if hasattr(source, "run_dir"):  # a RunRecord
        source = source.run_dir
    if isinstance(source, dict):
        return [(Path(p), r) for r, p in source.items()], None
    if isinstance(source, (str, os.PathLike)):
        items = [(p, None) for p in trace_files(source)]
        if not items:
            raise TraceError(
                source,
                "no trace files (*.json, *.json.gz) in this folder; did the "
                "profiled ranks run to the end of their active window?",
            )
        return items, Path(source)
    items = [(Path(p), None) for p in source]
    if not items:
        raise TraceError(None, "no trace files given")
    return items, None


def _wanted(
    items: list[tuple[Path, int | None]], wanted: set[int] | None
) -> list[tuple[Path, int | None]]:
    """Leave out, before reading them, files whose name says they are of a rank not wanted."""
    if wanted is None:
        return items
    return [
        (p, r)
        for p, r in items
        if r in wanted or r is None and ((n := rank_in_name(p.name)) is None or n in wanted)
    ]


def load_run(
    source: Any,
    *,
    strict: bool = True,
    ranks: Iterable[int] | None = None,
    steps: tuple[int, int] | None = None,
    same_run: bool = True,
    expect_ranks: Iterable[int] | None = None,
    workers: int | None = None,
    cache: bool = True,
    progress: bool | None = None,
) -> RunTraces:
    """Load every rank's trace of one run into a :class:`RunTraces`.

    Args:
        source: a run folder, a ``RunRecord``, a list of files, or ``{rank: file}``.
        strict: raise :class:`TraceError` on the first bad file (default), or skip bad files
            and list them in ``.skipped`` (whatever is wrong with a file, it is a TraceError). A
            JSON file that is no trace at all (:class:`NotATrace`, a manifest) is always skipped
            and listed; a run with no trace at all is a TraceError.
        ranks: only these ranks (files named ``rank<N>...`` of other ranks are not even read).
        steps: ``(first, last)``: only events inside ``ProfilerStep#first`` .. ``#last``.
        same_run: check that the files come from one run (world size, backend, run id, times).
        expect_ranks: ranks that must be there; a missing one raises a TraceError naming it.
        workers: processes decoding files at once (default: one per core for big runs, else 1).
        cache: keep the result in ``.cache/`` of a run folder and reuse it while no file changes.
        progress: a progress bar (tqdm's: a text line on stderr, a widget in Jupyter with
            ipywidgets): True shows it, False never; by default it appears only when the load
            takes over 2 s, in a terminal or a notebook, and not while ``PDP_NO_PROGRESS=1``.

    ``events`` gets ``rel_us``: µs since the earliest event of the whole run.

    Input is bounded: a file over 2 GiB decompressed, or a gzip file that expands more
    than 200x, is refused with a TraceError before it takes the memory (set the
    environment variables ``PDP_MAX_TRACE_MB`` / ``PDP_MAX_GZIP_RATIO`` to allow more).
    """
    wanted = None if ranks is None else set(ranks)  # read once: ranks may be an iterator
    items, folder = run_files(source)
    items = _wanted(items, wanted)
    options = {
        "strict": strict,
        "ranks": None if wanted is None else sorted(wanted),
        "steps": steps,
    }
    cache_file = _cache.cache_file(folder, items, options) if cache and folder else None
    cached = _cache.read(cache_file) if cache_file else None
    if cached is not None:
        run = RunTraces(*cached)
    else:
        run = _load_files(items, strict, wanted, steps, workers, progress)
        if cache_file:
            _cache.write(cache_file, run.events, run.headers, run.skipped)
    _check_expected(run.headers, expect_ranks, folder)
    check_one_run(run.headers, same_run)
    _note_the_job(run, folder)
    return run


def _note_the_job(run: RunTraces, folder: Path | None) -> None:
    """Put in ``run.events.attrs`` what the analyses read of the job: the most process groups a
    rank is in, and the job's size (:func:`helpers.matched_collectives` pairs sends and receives
    by their times only where every rank is here); and the cores its machine had, where the
    run's manifest says (:func:`helpers.what_if` re-times ops by their shares of them)."""
    manifest = folder / MANIFEST_NAME if folder is not None else None
    if manifest is not None and manifest.is_file():
        with contextlib.suppress(ValueError, OSError):
            cores = json.loads(manifest.read_text()).get("cores")
            if isinstance(cores, int) and cores > 0:
                run.events.attrs["cores"] = cores
    groups = [h.process_groups for h in run.headers if h.process_groups is not None]
    if groups:
        run.events.attrs["process_groups"] = max(groups)
    sizes = [h.world_size for h in run.headers if h.world_size is not None]
    if sizes:
        run.events.attrs["world_size"] = max(sizes)


def _load_files(
    items: Sequence[tuple[Path, int | None]],
    strict: bool,
    wanted: set[int] | None,
    steps: tuple[int, int] | None,
    workers: int | None,
    progress: bool | None,
) -> RunTraces:
    """The run read from its files (no cache): a TraceError on the first bad file when
    ``strict``, else the bad ones listed in ``skipped``."""
    parts: list[FileColumns] = []
    skipped: list[tuple[Path, str]] = []
    for (path, _), result in zip(items, read_files(items, strict, steps, workers, progress)):
        if isinstance(result, TraceError):
            if strict and not isinstance(result, NotATrace):
                raise result
            skipped.append((path, result.problem))
        elif result.header.merged:
            skipped.append((path, "a merged trace (merge_traces'), not one rank's own file"))
        elif wanted is None or result.header.rank in wanted:
            if result.skipped:
                skipped.append((path, f"{result.skipped} events left out"))
            parts.append(result)
    if not parts:
        raise TraceError(
            None,
            "no usable trace among: " + "; ".join(f"{show_path(p)} ({why})" for p, why in skipped),
        )
    headers = sorted((p.header for p in parts), key=lambda h: (h.rank, h.start_us))
    _warn_notes(headers)
    return RunTraces(frame(parts), headers, skipped)


def _check_expected(
    headers: Sequence[TraceHeader], expect_ranks: Iterable[int] | None, folder: Path | None
) -> None:
    """A TraceError naming the ranks of ``expect_ranks`` that no file is of."""
    if expect_ranks is None:
        return
    missing = sorted(set(expect_ranks) - {h.rank for h in headers})
    if missing:
        raise TraceError(
            folder,
            f"no trace from rank{'s' if len(missing) > 1 else ''} "
            f"{', '.join(map(str, missing))}: check that "
            f"{'they' if len(missing) > 1 else 'it'} profiled and "
            f"that every node's folder was gathered",
        )


def check_one_run(headers: Sequence[TraceHeader], same_run: bool = True) -> None:
    """A :class:`DifferentRuns` when the files whose ``headers`` these are cannot be one run:
    two claim one rank (they may share it only as two windows of one process), or, with
    ``same_run``, their world size, backend or run id disagree, or their ranks did not run at
    the same time. The loader and a rank-by-rank summary decide it here, alike."""
    _check_ranks(headers)
    if same_run:
        _check_same_run(headers)


def _check_ranks(headers: Sequence[TraceHeader]) -> None:
    """Two files may share a rank only as two windows of one process (same pid, no overlap)."""
    by_rank: dict[int, list[TraceHeader]] = {}
    for h in headers:
        by_rank.setdefault(h.rank, []).append(h)
    for rank, same in by_rank.items():
        same.sort(key=lambda h: h.start_us)
        for a, b in zip(same, same[1:]):
            if set(a.pids) != set(b.pids) or b.start_us < a.end_us:
                raise DifferentRuns(
                    b.path,
                    f"claims rank {rank}, like {show_path(a.path)}; two "
                    f"files of one rank must be separate windows of one "
                    f"process. Remove the duplicate, or pass files as "
                    f"{{rank: path}}",
                )


def _check_same_run(headers: Sequence[TraceHeader]) -> None:
    """A TraceError when the files say they are of different runs, or when the ranks did not
    run at the same time."""
    first = headers[0]
    for h in headers[1:]:
        for attr in ("world_size", "backend", "run_id"):
            x, y = getattr(first, attr), getattr(h, attr)
            if x is not None and y is not None and x != y:
                raise DifferentRuns(
                    h.path,
                    f"comes from a different run than {show_path(first.path)} "
                    f"({attr} {y!r} vs {x!r}); load each run's folder on "
                    f"its own",
                )
    spans: dict[int, tuple[float, float]] = {}
    for h in headers:
        lo, hi = spans.get(h.rank, (np.inf, -np.inf))
        spans[h.rank] = (min(lo, h.start_us), max(hi, h.end_us))
    if len(spans) > 1:
        latest_start = max(s for s, _ in spans.values())
        earliest_end = min(e for _, e in spans.values())
        if latest_start > earliest_end:
            late = max(spans, key=lambda r: spans[r][0])
            early = min(spans, key=lambda r: spans[r][1])
            path = next(h.path for h in headers if h.rank == late)
            gap = (latest_start - earliest_end) / 1e6
            raise DifferentRuns(
                path,
                f"rank {late} starts {gap:.3f} s after rank {early} has "
                f"finished: the ranks were not running at the same time, so "
                f"these look like files of different runs. Load each run on "
                f"its own, or pass same_run=False if this is intended",
            )
