"""Reading a run's traces for the report, and the report's sections.

The traces are read whole (:func:`helpers.load_run`) when they fit, else one rank at a time
(:func:`helpers.summarise_run`): a run of hundreds of ranks then needs about one rank's memory per
worker, and the report keeps the sections that need only steps, collectives and time per kind.
"""

from __future__ import annotations

import glob
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

import pandas as pd

from ..analysis import (
    RunSummary,
    collective_source,
    fsdp_phases,
    step_times,
    summarise_run,
    time_per_kind,
    waiting_per_group,
)
from ..jobs.runs import show_path
from ..traces import (
    DifferentRuns,
    NotATrace,
    TraceError,
    TraceHeader,
    load_run,
    load_trace,
    merge_traces,
    trace_files,
)
from ..traces.export import written_by_merge
from .cautions import Facts, cautions, facts_of_events, missing_ranks
from .flight import HANG, hang_section, records_beside, with_groups_from_dumps
from .held import HELD, held_section_of
from .memory import MEMORY_TITLE, memory_section
from .sections import (
    PIPELINE_TITLE,
    Section,
    gpu_section,
    groups_section,
    kinds_section,
    median_step,
    median_waiting,
    phases_section,
    pipeline_section,
    step_section,
    waiting_section,
)

__all__ = ["WHOLE_LIMIT_MB", "Report", "ReportError", "build_report", "trace_paths"]

#: Traces larger than this in all (MB of JSON, a gzip file counted at 8 times its size) are
#: read one rank at a time.
WHOLE_LIMIT_MB = 1024
CAUTIONS = "What the traces cannot tell"
STEP_TITLE = "Step time per rank"
WAITING_TITLE = "Waiting and the straggler"
T = TypeVar("T")
#: How the traces were read, and how the glance says it.
ReadMode = Literal["whole", "rank by rank"]
_READ_SAID: dict[ReadMode, str] = {
    "whole": "whole, in memory",
    "rank by rank": "rank by rank (too large to load whole)",
}


class ReportError(ValueError):
    """Input the report cannot use; the message names the file or argument and what to do."""


@dataclass
class Report:
    """The report of one run: ``glance`` (facts, in order), ``sections`` in reading order (what
    held the steps first, when the traces have steps; then what the traces cannot tell), the
    ``skipped`` files and why, how the traces were ``read`` ("whole" or "rank by rank"), the
    ``ranks`` found, the ``merged`` trace written for Perfetto (when asked for), and the
    sections that ``failed`` (title, what went wrong), each said among the cautions."""

    source: str
    glance: dict[str, str]
    sections: list[Section]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    read: ReadMode = "whole"
    ranks: list[int] = field(default_factory=list)
    merged: Path | None = None
    failed: list[tuple[str, str]] = field(default_factory=list)

    def section(self, title: str) -> Section:
        """The section called ``title``; a KeyError lists the titles there are."""
        for found in self.sections:
            if found.title == title:
                return found
        raise KeyError(f"no section {title!r}; this report has {[s.title for s in self.sections]}")


def build_report(
    traces: str | Path | Sequence[str | Path],
    *,
    skip_bad: bool = False,
    whole_limit_mb: float = WHOLE_LIMIT_MB,
    progress: bool | None = None,
    merged: str | Path | None = None,
    critical: bool = True,
) -> Report:
    """The report of one run, from its per-rank traces.

    Args:
        traces: a folder (searched below too, as several nodes' folders are), files or
            patterns such as ``run/rank*.json.gz``, or one merged file of several ranks.
        skip_bad: leave out files that cannot be read, and list them, instead of stopping at
            the first.
        whole_limit_mb: traces larger than this in all (MB of JSON, a gzip file counted at 8
            times its size) are read one rank at a time.
        progress: tqdm's bar (default: only when the work takes over 2 s and someone watches).
        merged: also write every rank into this one trace for Perfetto, from the same read.
        critical: open with what held the steps (the critical path and a what-if); without, a
            run of hundreds of ranks read rank by rank is read about twice as fast.

    Returns:
        The :class:`Report`.

    Raises:
        ReportError: input it cannot use (the message says what is wrong, names the file
            where one is at fault, and what to do).
    """
    paths = [traces] if isinstance(traces, (str, Path)) else list(traces)
    files = trace_paths(paths)
    size_mb = sum(f.stat().st_size * (8 if f.name.endswith(".gz") else 1) for f in files) / 1e6
    whole = size_mb <= whole_limit_mb
    if merged is not None and not whole:
        raise ReportError("--merged: these traces are too large to load whole for one merged file")
    try:
        with warnings.catch_warnings(record=True) as caught:  # said in the report instead
            warnings.simplefilter("always", UserWarning)
            if whole:
                read = _read_whole(files, skip_bad, progress, merged)
            else:
                read = _read_rank_by_rank(files, skip_bad, progress, critical)
            return _assemble(", ".join(show_path(p) for p in paths), read, caught, critical)
    except TraceError as err:
        raise ReportError(f"{err}{_what_to_do(err, skip_bad)}") from None


def _what_to_do(err: TraceError, skip_bad: bool) -> str:
    """What to add to the loader's message for the command's user."""
    if isinstance(err, DifferentRuns):
        return "\n  These look like two runs in one folder: give the report one run's files."
    if err.path is not None and not skip_bad and not isinstance(err, NotATrace):
        return "\n  With --skip-bad the report leaves this file out and reports on the others."
    return ""


def trace_paths(paths: Sequence[str | Path]) -> list[Path]:
    """The trace files named by ``paths``: files as they are, folders' trace files below them,
    patterns' matches; a :class:`ReportError` for a path that names none."""
    if not paths:
        raise ReportError("no traces given: name a folder of per-rank traces, or the files")
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = trace_files(path)
            if not found:
                raise ReportError(
                    f"{show_path(path)}: no trace files (*.json, *.json.gz) in this folder or "
                    "below it; name the folder your profiler's on_trace_ready wrote to"
                )
            files += found
        elif path.is_file():
            files.append(path)
        elif any(c in str(path) for c in "*?["):  # a pattern the shell did not expand
            matched = sorted(Path(p) for p in glob.glob(str(path)))
            if not matched:
                raise ReportError(f"{path}: this pattern matches no file")
            files += [p for p in matched if p.is_file()]
        else:
            raise ReportError(f"{show_path(path)}: no such file or folder")
    return files


@dataclass
class _Read:
    """What either way of reading gives the sections: ``events`` (all of them, or the steps and
    collectives a rank-by-rank read keeps), time per kind, the headers' facts, files skipped."""

    events: pd.DataFrame
    kinds: pd.DataFrame
    world: int | None
    backends: list[str]
    gpu_without_launch: int = 0
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    summary: RunSummary | None = None  # read rank by rank: what was kept of each rank
    read: list[Path] = field(default_factory=list)  # the trace files whose events are here
    merged: Path | None = None  # the trace written for Perfetto, when asked for
    records: pd.DataFrame | None = None  # the Flight Recorder's dumps beside the traces


def _header_facts(headers: Sequence[TraceHeader]) -> dict:
    """What the files' headers say of the job: world size, backends, GPU events unlaunched."""
    return {
        "world": max((h.world_size or 0 for h in headers), default=0) or None,
        "backends": sorted({h.backend for h in headers if h.backend}),
        "gpu_without_launch": sum(h.gpu_events_without_launch for h in headers),
    }


def _read_whole(
    files: list[Path], skip_bad: bool, progress: bool | None, merged: str | Path | None
) -> _Read:
    """Every event of the run, in memory (and, with ``merged``, written into one trace)."""
    if len(files) == 1 and merged is None:  # one rank's file, or one merged file of several
        trace = load_trace(files[0])
        events, headers, skipped = trace.events, [trace.header], []
    else:
        ranks = [f for f in files if not written_by_merge(f)] or files
        run = load_run(ranks, strict=not skip_bad, progress=progress, cache=False)
        events, headers, skipped = run.events, run.headers, run.skipped
        merged = merge_traces(run, merged) if merged is not None else None
    records = records_beside({Path(h.path).parent for h in headers}, warn=True)
    if len(headers) > 1 or merged is not None:
        events = with_groups_from_dumps(events, records)
    return _Read(
        events,
        time_per_kind(events),
        **_header_facts(headers),
        skipped=skipped,
        read=sorted({Path(h.path) for h in headers}),
        merged=merged,
        records=records,
    )


def _read_rank_by_rank(
    files: list[Path], skip_bad: bool, progress: bool | None, critical: bool
) -> _Read:
    """What :func:`summarise_run` keeps of each rank: steps, collectives and time per kind
    (no GPU details, no phases: they need every event). With ``skip_bad``, a file that cannot
    be read is left out and the pass starts again without it."""
    files = [f for f in files if not written_by_merge(f)]
    skipped: list[tuple[Path, str]] = []
    while True:
        if not files:
            raise ReportError(
                "no per-rank file to read one rank at a time (a merged file of several ranks "
                "is too large to read whole): give the report the ranks' own files"
            )
        try:
            summary = summarise_run(files, cache=False, progress=progress, critical=critical)
            break
        except TraceError as err:
            bad = err.path is not None and err.path in files and not isinstance(err, DifferentRuns)
            if not (skip_bad and bad):
                raise
            files.remove(err.path)
            skipped.append((err.path, err.problem))
    events = pd.concat([summary.steps, summary.collectives], ignore_index=True)
    facts = _header_facts(summary.headers)
    records = records_beside({Path(f).parent for f in summary.files})
    return _Read(events, summary.kind_ms, **facts, skipped=skipped, summary=summary, read=summary.files, records=records)  # fmt: skip


def _assemble(source: str, read: _Read, caught: list, critical: bool) -> Report:
    """The report from what was read: the glance, then the sections in reading order. A section
    that fails is left out and said among the cautions (which one, why, what to do): the rest
    of the report is still written."""
    events = read.events
    mode: ReadMode = "whole" if read.summary is None else "rank by rank"
    whole = mode == "whole"
    failed: list[tuple[str, str]] = []
    ranks = sorted(int(r) for r in events["rank"].unique())
    steps = events[events["kind"] == "step"]
    has_steps = not steps.empty
    gpu = "gpu kernel" in read.kinds.columns and bool(read.kinds["gpu kernel"].sum() > 0)
    glance = _glance(read.read, ranks, read.world, read.backends)
    glance.update(_more_at_a_glance(events, steps, gpu, mode))
    names = collective_source(events).pattern  # decided here, once, for every section
    times = _guarded(STEP_TITLE, failed, step_times, events) if has_steps else None
    waiting = _guarded(WAITING_TITLE, failed, median_waiting, events, has_steps, names)
    step_ms = median_step(times)
    missing = len(missing_ranks(ranks, read.world))
    said = {title for title, _ in failed}  # sections whose figures could not be read
    sections: list[Section | None] = []
    sections.append(_guarded(HANG, failed, hang_section, read.records, read.world))
    if critical and has_steps and STEP_TITLE not in said:
        sections.append(_guarded(HELD, failed, held_section_of, events, read.summary, times, names, read.world))  # fmt: skip
    if STEP_TITLE not in said:
        sections.append(_guarded(STEP_TITLE, failed, step_section, times))
    if WAITING_TITLE not in said:
        sections.append(_guarded(WAITING_TITLE, failed, waiting_section, waiting, step_ms, missing))  # fmt: skip
    sections.append(_guarded("Time per kind", failed, kinds_section, read.kinds))
    if whole and events["process_group"].nunique() > 1:
        sections.append(_guarded("Waiting per process group", failed, _groups, events, names))
    if gpu and whole:
        sections.append(_guarded("The GPU", failed, gpu_section, events, names))
    if has_steps and whole:
        sections.append(_guarded("A sharded job's phases", failed, _phases, events))
        sections.append(_guarded(PIPELINE_TITLE, failed, pipeline_section, events))
    if whole:
        sections.append(_guarded(MEMORY_TITLE, failed, memory_section, read.read, events))
    facts = Facts(
        ranks=ranks,
        world_size=read.world,
        has_steps=has_steps,
        folders=len({f.parent for f in read.read}),
        gpu_without_launch=read.gpu_without_launch,
        skipped=[(show_path(p), why) for p, why in read.skipped],
        notes=_notes(caught),
        waiting=waiting,
        step_ms=step_ms,
        rank_by_rank=not whole,
        failed=list(dict.fromkeys(failed)),
        **(_guarded(CAUTIONS, failed, facts_of_events, events, names, gpu, whole) or {}),
    )
    caution = Section(CAUTIONS, "\n".join(f"- {c}" for c in cautions(facts)))
    written = [s for s in sections if s is not None]
    first = [s for s in written if s.title in (HANG, HELD)]
    rest = [s for s in written if s.title not in (HANG, HELD)]
    return Report(source, glance, [*first, caution, *rest], facts.skipped, mode, ranks, read.merged, facts.failed)  # fmt: skip


def _more_at_a_glance(events: pd.DataFrame, steps: pd.DataFrame, gpu: bool, mode: ReadMode) -> dict:  # fmt: skip
    """The glance's lines on the device, the steps, the time the traces cover and how read."""
    return {
        "device": "GPU (CUDA kernels in the traces)" if gpu else "CPU (no GPU kernels)",
        "steps": _steps_text(steps),
        "time covered": f"{(events['end_us'].max() - events['start_us'].min()) / 1e6:.2f} s",
        "read": _READ_SAID[mode],
    }


def _guarded(title: str, failed: list[tuple[str, str]], make: Callable[..., T], *args, **kwargs) -> T | None:  # fmt: skip
    """``make(*args, **kwargs)``, or None when it fails: the section ``title`` is then left out
    of the report and its failure added to ``failed`` (title, what went wrong)."""
    try:
        return make(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 -- one section's failure must not lose the report
        failed.append((title, f"{type(err).__name__}: {err}".strip().splitlines()[0]))
        return None


def _groups(events: pd.DataFrame, names: str) -> Section | None:
    """The section on waiting per process group; None where no collective inside a step names
    its group."""
    try:
        per_group = waiting_per_group(events, names)
    except ValueError:  # no collective inside a step names its group
        return None
    return groups_section(per_group)


def _phases(events: pd.DataFrame) -> Section | None:
    """A sharded job's phases; None for a job that is not sharded."""
    phases = fsdp_phases(events)
    return None if phases.empty else phases_section(phases)


def _notes(caught: list[warnings.WarningMessage]) -> list[str]:
    """The warnings' messages, each once, in order."""
    return list(
        dict.fromkeys(str(w.message) for w in caught if issubclass(w.category, UserWarning))
    )


def _glance(files: list[Path], ranks: list[int], world: int | None, backends: list[str]) -> dict:
    size = sum(f.stat().st_size for f in files) / 1e6
    return {
        "trace files": f"{len(files)} ({size:.1f} MB on disk)",
        "ranks found": f"{len(ranks)}: {_ranges(ranks)}",
        "world size": str(world) if world else "not recorded in the traces",
        "backend": ", ".join(backends) or "not recorded in the traces",
    }


def _steps_text(steps: pd.DataFrame) -> str:
    numbers = sorted({int(s) for s in steps["step"].dropna()})
    return f"{len(numbers)}: ProfilerStep#{_ranges(numbers)}" if numbers else "no step markers"


def _ranges(numbers: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    parts, numbers = [], sorted(numbers)
    for n in numbers:
        if parts and n == parts[-1][1] + 1:
            parts[-1][1] = n
        else:
            parts.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in parts) or "none"
