"""The report's first section: what held the steps, what to fix first and what fixing it would
buy, and the steps and collectives that say a job stalled or hung."""

from __future__ import annotations

import re
import warnings

import pandas as pd

from ..analysis import RunSummary, path_summary, unmatched_collectives, what_if, what_if_checks
from ..analysis.path.dependencies import DEPENDENCIES, UNTRACED
from ..analysis.path.findings import findings_said
from ..analysis.path.lanes import Lanes, lane_intervals, lanes_of
from ..analysis.path.walk import kind_said, named_for_fixing, path_of
from ..drawing import plot_critical_path
from .cautions import missing_ranks
from .sections import Section, figure_png

__all__ = ["HELD", "held_section", "held_section_of", "held_section_of_summary", "LONG_STEP"]

HELD = "What held the steps, what to fix first"
#: A step this many times the median step is a stall or a hang, and the report says so.
LONG_STEP = 5.0
#: The most ranks the section's figure draws: those the path visits in its step.
FIGURE_RANKS = 6
#: Kinds on the path that a what-if cannot remove by name: no event, or the collective itself.
_NOT_REMOVABLE = tuple(d.segment_kind for d in DEPENDENCIES if not d.removable and d.segment_kind)


def held_section_of(
    events: pd.DataFrame,
    summary: RunSummary | None,
    times: pd.DataFrame,
    names: str,
    world: int | None = None,
) -> Section | None:
    """The section of a run read whole (``summary`` None: from every event) or rank by rank
    (from what ``summary`` kept of each rank; None where it kept no path).

    Args:
        events: the run's events (read rank by rank: its steps and collectives).
        summary: what :func:`helpers.summarise_run` kept, for a run read rank by rank.
        times: the run's step times (:func:`helpers.step_times`).
        names: the collectives' names (:func:`helpers.collective_source`'s choice).
        world: the job's size, as the traces record it (None: unknown).
    """
    if summary is None:
        return held_section(events, lane_intervals(events, names=names), times, names, world)
    if not summary.pieces:  # read without the path
        return None
    return held_section_of_summary(summary, events, times, names, world)


def held_section(
    events: pd.DataFrame,
    lanes: Lanes,
    times: pd.DataFrame,
    names: str | None = None,
    world: int | None = None,
) -> Section:
    """The section of a run read whole.

    Args:
        events: the run's events.
        lanes: their lanes (:func:`helpers.analysis.path.lanes.lane_intervals`).
        times: their step times (:func:`helpers.step_times`).
        names: the collectives' names (default: :func:`helpers.collective_source`'s choice).
        world: the job's size, as the traces record it (None: unknown).
    """
    path = path_of(lanes_of(events, lanes, lanes.window), events)  # lanes of these events
    clocks = findings_said(lanes, events, "negative lag")
    if clocks:  # the report turns it into a caution
        warnings.warn(clocks, stacklevel=2)
    per_step = times.median(axis=1)
    median_ms = float(per_step.median())
    long = _long(per_step)
    ops = path_summary(named_for_fixing(path[~path["step"].isin(long)]), ["kind", "name"])
    fix = _first_fix(ops)
    text = [_most_of_it(ops.iloc[0], per_step, long) + _fix_first(ops.iloc[0], fix)]
    ranks = sorted(int(r) for r in events["rank"].unique())
    text += _caveats(ops.iloc[0], ranks, world)
    text.append(_what_if(events, lanes, fix, median_ms))
    text += _long_steps(per_step, path)
    text += _unmatched(events, names)
    step = int((per_step - median_ms).abs().idxmin())
    figure, alt = _figure(events, path, step)
    return Section(HELD, "\n".join(t for t in text if t), _table(ops), figure, alt)


def held_section_of_summary(
    summary: RunSummary,
    events: pd.DataFrame,
    times: pd.DataFrame,
    names: str | None = None,
    world: int | None = None,
) -> Section | None:
    """The section of a run read rank by rank: the path strung together from each rank's
    chains, the long steps, the collectives that do not match; without the figure and the
    what-if, which need every event of the ranks at once.

    Args:
        summary: what :func:`helpers.summarise_run` kept.
        events: the steps and collectives it kept.
        times: their step times (:func:`helpers.step_times`).
        names: the collectives' names (default: :func:`helpers.collective_source`'s choice).
        world: the job's size, as the traces record it (None: unknown).

    Returns:
        The section, or None when no path could be strung.
    """
    per_step = times.median(axis=1)
    long = _long(per_step)
    ops = summary.path_summary(leave_out=long)
    if ops.empty:
        return None
    text = [
        _most_of_it(ops.iloc[0], per_step, long)
        + _fix_first(ops.iloc[0], _first_fix(ops))
        + " It was strung together from each rank's part of the path, the run being too large "
        "to load whole: for the figure and the what-if, run the report on the files of the ranks "
        "the table names."
    ]
    text += _caveats(ops.iloc[0], list(summary.ranks), world)
    text += _long_steps(per_step, None)
    text += _unmatched(events, names)
    return Section(HELD, "\n".join(text), _table(ops))


def _long(per_step: pd.Series) -> list[int]:
    """The steps far longer than the median (a stall or a hang), which the table leaves out
    (never most of the steps: each is over the median)."""
    return [int(s) for s in per_step[per_step > LONG_STEP * per_step.median()].index]


def _most_of_it(top: pd.Series, per_step: pd.Series, long: list[int]) -> str:
    """The sentence that names the heaviest op on the path (``top``, a row of path_summary)."""
    usual = len(per_step) - len(long)
    steps = "the one step" if usual == 1 else f"the {usual} steps"
    over = steps + (" of usual length (the long ones are below)" if usual < len(per_step) else "")  # fmt: skip
    return (
        f"Each step's critical path is the chain of work, across the ranks, that decided when "
        f"the step ended (lesson 11). Over {over}, most of it is rank "
        f"{int(top['rank'])}'s `{_short(top['name'])}` ({kind_said(top['kind'])}): {top['ms']:.1f} ms in "
        f"all, {top['ms_per_step']:.1f} ms per step (median), {top['share']:.0%} of the path."
    )


def _caveats(top: pd.Series, ranks: list[int], world: int | None) -> list[str]:
    """What the first row cannot say: an annotation's time with nothing recorded under it, a
    path through a few of the job's ranks (``ranks``, those traced)."""
    said = []
    if top["kind"] == "annotation":
        said.append(
            f"`{_short(top['name'])}` is an annotation, and nothing the profiler recorded ran "
            "under it in that time (Python, or a wait it cannot see): profile with "
            "`with_stack=True`, or mark the parts inside it with `record_function`, to see what "
            "it holds."
        )
    if missing_ranks(ranks, world):
        said.append(
            f"The path runs through the {len(ranks)} ranks traced of the job's {world}: a rank that "
            "was not profiled may be what held them (see what the traces cannot tell)."
        )
    return said


def _table(ops: pd.DataFrame) -> pd.DataFrame:
    table = ops.head(10).assign(
        ms=lambda t: t["ms"].round(1),
        ms_per_step=lambda t: t["ms_per_step"].round(1),
        share=lambda t: (100 * t["share"]).round(1),
    )[["rank", "kind", "name", "ms", "ms_per_step", "share"]]
    table.columns = ["rank", "kind", "op", "on the path (ms)", "per step, median (ms)", "share (%)"]
    return table


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def _first_fix(ops: pd.DataFrame) -> pd.Series:
    """The heaviest row of the path's table (``ops``, :func:`helpers.path_summary`) that is
    work a rank did itself, which a what-if can remove by name; the heaviest row where none
    is."""
    work = ops[~ops["kind"].isin(_NOT_REMOVABLE)]
    return work.iloc[0] if len(work) else ops.iloc[0]


def _fix_first(top: pd.Series, fix: pd.Series) -> str:
    """What to fix first: the heaviest op on the path (``top``), or, where that is no work of a
    rank's own (a collective's transfer, a wait), the heaviest that is (``fix``)."""
    if fix.equals(top):
        return " Fix that first; the table has the next."
    why = _not_removable(str(top["kind"]))
    return (
        f" That is no work a rank did itself ({why}). Of the work on the path, the heaviest is "
        f"rank {int(fix['rank'])}'s `{_short(fix['name'])}` ({kind_said(fix['kind'])}): "
        f"{fix['ms_per_step']:.1f} ms per step (median), {fix['share']:.0%} of the path. Fix "
        "that first; the table has the next."
    )


def _not_removable(kind: str) -> str:
    """Why a what-if cannot remove a segment of ``kind`` by name."""
    if kind == UNTRACED.segment_kind:
        return "untraced: no event recorded it; with_stack=True shows the Python that ran there"
    return f"{kind}: a collective's own time or a wait, set by what comes before it"


def _what_if(events: pd.DataFrame, lanes: Lanes, top: pd.Series, median_ms: float) -> str:
    """What removing an op of the path would buy, predicted; or why it cannot be."""
    rank, name = int(top["rank"]), str(top["name"])
    if top["kind"] in _NOT_REMOVABLE:
        return f"A what-if cannot remove it by name ({_not_removable(str(top['kind']))})."
    predicted = what_if(events, rank, f"^{re.escape(name)}$", lanes=lanes)
    fit = float(predicted.attrs["replay_error"].max())
    gpu = predicted.attrs["changed"]["gpu_work"]
    launched = f", with the {gpu} GPU events it launched," if gpu else ""
    low, high = predicted.attrs["range"]
    checks = what_if_checks()
    off = checks["error_pct"].abs()
    return (
        f"If rank {rank}'s `{_short(name)}` took no time{launched} the median step would take "
        f"{predicted.median():.1f} ms ({low:.1f} to {high:.1f} over the steps) instead of "
        f"{median_ms:.1f} ms, predicted by re-timing the run's dependencies. How far to trust "
        f"it: held to runs made without the change, in the series' {len(checks)} pairs of "
        f"runs (`what_if_checks()`), such predictions missed by {off.median():.1f} % in the "
        f"median and {off.max():.1f} % at worst, where two runs of one job differed by up to "
        f"{checks['runs_differ_pct'].max():.0f} %; the re-timing fits this run to within "
        f"{fit:.1%} (its replay error, a check of the model, not of the prediction). It keeps "
        "every op as long as it was, but for ops that shared the machine's cores or a GPU with "
        "what it removes (where the run's manifest says the cores)."
    )


def _long_steps(per_step: pd.Series, path: pd.DataFrame | None) -> list[str]:
    """A sentence per step far longer than the median: a stall or a hang (and, given the
    ``path``, what held it)."""
    median = float(per_step.median())
    said = []
    for step in _long(per_step):
        ms = float(per_step[step])
        sentence = (
            f"Step {step} took {ms:.0f} ms, {ms / median:.0f} times the median step "
            f"({median:.1f} ms): a stall or a hang, not a slow rank."
        )
        if path is not None:
            held = path_summary(
                named_for_fixing(path[path["step"] == step]), ["kind", "name"]
            ).iloc[0]
            sentence += (
                f" Its path is mostly rank {int(held['rank'])}'s `{_short(held['name'])}` "
                f"({kind_said(held['kind'])}, {held['ms']:.0f} ms)."
            )
        said.append(sentence)
    return said


def _unmatched(events: pd.DataFrame, names: str | None) -> list[str]:
    """A sentence on the collectives (``names``) that some rank never joined."""
    lonely = unmatched_collectives(events, names)
    if lonely.empty:
        return []
    calls = "; ".join(
        f"rank {int(r)}'s {name} #{int(i) + 1}" + (f" (step {int(s)})" if pd.notna(s) else "")
        + f" has no partner on rank{'s' if len(m) > 1 else ''} {', '.join(map(str, m))}"
        for name, i, r, s, m in zip(lonely["name"], lonely["index"], lonely["rank"], lonely["step"], lonely["missing"])
    )  # fmt: skip
    return [
        f"Collectives that do not match across the ranks: {calls}. Ranks that call different "
        "collectives, or a different number of them, wait for each other until a timeout: the "
        "mark of a hang (lesson 8; a trace that ended early on one rank looks the same)."
    ]


def _figure(events: pd.DataFrame, path: pd.DataFrame, step: int) -> tuple[bytes, str]:
    """The path of ``step`` over the timelines of the ranks it visits (at most a few)."""
    mine = path[path["step"] == step]
    on_path = mine.groupby("rank")["dur_us"].sum().sort_values(ascending=False).index.tolist()
    others = sorted(set(events["rank"].unique()) - set(on_path))
    ranks = [int(r) for r in (on_path + others)[:FIGURE_RANKS]]
    shown = events[events["rank"].isin(ranks)]
    fig = plot_critical_path(shown, path[path["rank"].isin(ranks)], step,
                             title=f"ProfilerStep#{step}, the step of median length, and its critical path")  # fmt: skip
    moves = int(mine["to_rank"].notna().sum())
    alt = (
        f"One step of ranks {', '.join(map(str, sorted(ranks)))}, a lane per thread: a thick "
        f"black line runs under the lanes where the critical path holds the step, on rank"
        f"{'s' if len(on_path) > 1 else ''} {', '.join(map(str, sorted(on_path)))}, and moves "
        f"between ranks {moves} time{'s' if moves != 1 else ''} at collectives."
    )
    return figure_png(fig), alt
