"""The report of two runs compared (``python -m helpers.report BEFORE/ AFTER/``): did the change
work, by how much beyond the steps' noise, where on the critical path, which ops and kernels."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

from ..analysis import compare_runs, memory_of_runs, memory_verdict
from ..drawing import plot_run_comparison, run_comparison_alt
from ..jobs.runs import show_path
from ..traces import TraceError, load_run, rank_in_name
from .build import Report, ReportError, trace_paths
from .sections import Section, figure_png

__all__ = ["build_comparison", "are_two_runs"]

VERDICT = "Did the change work"
WHERE = "Where the change came from"
OPS = "Ops and kernels that came, went or changed"
MEMORY = "Memory: did the peak fall, did growth stop"
NOT_SHARED = "What the runs do not share, and files left out"
#: The rows of the tables shown (the largest changes).
ROWS = 15


def are_two_runs(paths: Sequence[str | Path]) -> bool:
    """Whether ``paths`` are two folders that each hold a run of their own: their files' names
    share a rank (``rank0`` in both). Two folders of different ranks are one run's nodes."""
    if len(paths) != 2 or not all(Path(p).is_dir() for p in paths):
        return False
    ranks = [{rank_in_name(f.name) for f in trace_paths([p])} - {None} for p in paths]
    return bool(ranks[0] & ranks[1])


def build_comparison(before: str | Path, after: str | Path) -> Report:
    """Two runs of a job compared: the verdict with the steps' shift and its interval, and a
    figure of what moved on the critical path; the path's change per rank, kind and op; the ops
    and kernels that came, went or changed; each rank's memory peak and growth; what differs.

    Raises:
        ReportError: a folder that is no run (no traces, no steps), said with the folder.
    """
    runs, skipped = [], []
    for folder, label in ((before, "before"), (after, "after")):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # the files left out are listed
                read = load_run(folder, cache=False)
        except TraceError as err:
            raise ReportError(f"the {label} run: {err}") from None
        runs.append(read.events)
        skipped += [(show_path(path), why) for path, why in read.skipped]
        if not (runs[-1]["kind"] == "step").any():
            raise ReportError(
                f"{show_path(Path(folder))}: the {label} run has no profiler steps to compare; "
                "profile both runs with a schedule and prof.step() after each step"
            )
    try:
        compared = compare_runs(*runs)
    except ValueError as err:  # too few steps for an interval
        where = f"{show_path(Path(before))} against {show_path(Path(after))}"
        raise ReportError(f"{where}: {err}") from None
    steps = compared.steps.round(2)
    figure = figure_png(plot_run_comparison(compared))
    sections = [
        Section(VERDICT, compared.verdict, steps, figure, run_comparison_alt(compared)),
        Section(
            WHERE,
            "Each run's critical path per rank, kind and op, in ms per step; the changes add up "
            f"to the change in the mean step ({compared.steps.loc['change', 'mean_ms']:+.1f} "
            "ms). The largest first.",
            compared.held.head(ROWS).round(2),
        ),
        Section(
            OPS,
            "Each op's and kernel's calls and time per step (nested ones included) on each rank, "
            "where they differ; the largest changes first.",
            compared.ops[compared.ops["status"] != "same"].head(ROWS).round(2),
        ),
    ]
    sections += _memory_sections((before, after), runs)
    left_out = [f"{path} was left out: {why}" for path, why in skipped]
    if compared.cautions or left_out:
        said = "\n".join(f"- {c}" for c in [*compared.cautions, *left_out])
        sections.append(Section(NOT_SHARED, said))
    glance = {
        "before": show_path(Path(before)),
        "after": show_path(Path(after)),
        "ranks": f"{runs[0]['rank'].nunique()} before, {runs[1]['rank'].nunique()} after",
        "steps": f"{int(steps.loc['before', 'steps'])} before, {int(steps.loc['after', 'steps'])} after",  # fmt: skip
    }
    ranks = sorted(set(runs[0]["rank"]) | set(runs[1]["rank"]))
    source = f"{show_path(Path(before))} against {show_path(Path(after))}"
    return Report(source, glance, sections, skipped, "whole", [int(r) for r in ranks])


def _memory_sections(folders: tuple, runs: list) -> list[Section]:
    """The section on each rank's memory peak and growth, where both runs hold memory events."""
    memory = memory_of_runs(folders, runs)
    if memory is None:
        return []
    return [Section(MEMORY, memory_verdict(memory), memory.set_index(["rank", "device"]).round(2))]
