"""The report's sections: each a title, sentences a learner can act on, a table and a figure.

Each section is made from a run's events (or from what a rank-by-rank read keeps of them) by
one function here; :func:`section_html` is a section as HTML, which a notebook shows.
"""

from __future__ import annotations

import base64
import html
import io
import re
from dataclasses import dataclass

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from ..analysis import (
    collective_bandwidth,
    communication_overlap,
    gpu_idle_time,
    sends_and_receives,
    stage_waits,
    straggler_of,
    waiting_per_step,
)
from ..drawing import plot_fsdp_phases
from ..traces.kinds import GPU_WORK_KINDS, KIND_COLORS
from .cautions import listed, waiting_points_outside

__all__ = ["Section", "section_html"]

#: A figure draws at most this many ranks (the tables hold them all).
RANKS_DRAWN = 64
#: A straggler is named only when the others wait this share of a step more than it does.
CLEAR_SHARE = 0.05
#: A step-time figure turns to a log scale when its longest step is this many times a median.
LOG_SCALE_FROM = 10
#: The kinds that are work themselves (not spans around other work).
WORK_KINDS = ("compute", "communication", "gpu kernel", "gpu memory", "cuda runtime", "python")


@dataclass
class Section:
    """One part of the report: a title, sentences, and a table and a figure (PNG) if any."""

    title: str
    text: str
    table: pd.DataFrame | None = None
    figure: bytes | None = None
    alt: str = ""

    def _repr_html_(self) -> str:  # a section shows itself in a notebook
        return section_html(self)

    def __repr__(self) -> str:
        table = "" if self.table is None else f", a table of {len(self.table)} rows"
        figure = "" if self.figure is None else ", a figure"
        return f"Section({self.title!r}: {len(self.text)} characters of text{table}{figure})"


def _prose(text: str) -> str:
    """Escaped text with `code` spans, and "- " lines as a list."""
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
    lines = escaped.split("\n")
    if all(line.startswith("- ") for line in lines if line):
        return "<ul>" + "".join(f"<li>{line[2:]}</li>" for line in lines if line) + "</ul>"
    return "".join(f"<p>{line}</p>" for line in lines if line)


def section_html(section: Section) -> str:
    """One section: its title, sentences, table and figure (with its alternative text)."""
    parts = [f"<h2>{html.escape(section.title)}</h2>", _prose(section.text)]
    if section.table is not None:
        parts.append(section.table.to_html(border=0, na_rep="", float_format=lambda x: f"{x:g}"))
    if section.figure is not None:
        data = base64.b64encode(section.figure).decode("ascii")
        parts.append(f'<img src="data:image/png;base64,{data}" alt="{html.escape(section.alt)}">')
    return "\n".join(parts)


def median_step(times: pd.DataFrame | None) -> float | None:
    """The median over ranks of each rank's median step (ms), from :func:`step_times`'s table;
    None without steps."""
    return float(times.median().median()) if times is not None else None


def median_waiting(
    events: pd.DataFrame, has_steps: bool, names: str | None = None
) -> pd.Series | None:
    """Median ms per step each rank waited in collectives (``names``, default
    :func:`helpers.collective_source`'s choice); None when that cannot be read."""
    if not has_steps or events["rank"].nunique() < 2:
        return None
    try:
        waiting = waiting_per_step(events, names)
    except ValueError:
        return None
    return waiting.median() if not waiting.empty else None


def figure_png(fig: Figure) -> bytes:
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)  # a figure of pyplot's (plot_fsdp_phases) is let go too
    return out.getvalue()


def step_section(times: pd.DataFrame | None) -> Section:
    """Step time per rank, from :func:`step_times`'s table (None: the traces have no steps)."""
    title = "Step time per rank"
    if times is None:
        return Section(title, "No `ProfilerStep#N` in the traces: nothing to say per step.")
    table = times.agg(["median", "min", "max"]).T.rename_axis("rank").round(1)
    table.columns = ["median (ms)", "shortest (ms)", "longest (ms)"]
    slow, fast = table["median (ms)"].idxmax(), table["median (ms)"].idxmin()
    spread = table["median (ms)"].max() / table["median (ms)"].min() - 1
    if len(table) == 1:
        text = (
            f"One rank: its median step takes {table['median (ms)'].iloc[0]:.1f} ms "
            f"({table['shortest (ms)'].iloc[0]:.1f} to {table['longest (ms)'].iloc[0]:.1f}). "
            "With one rank there is nothing to compare it with."
        )
    else:
        text = (
            f"The median step takes {table['median (ms)'].median():.1f} ms. Rank {slow}'s are "
            f"the longest ({table.loc[slow, 'median (ms)']:.1f} ms), rank {fast}'s the shortest "
            f"({table.loc[fast, 'median (ms)']:.1f} ms): {spread:.1%} apart. Ranks that meet in "
            "collectives end their steps together, so equal steps do not mean equal work: the "
            "waiting below says who waits for whom."
        )
    shown = table.head(RANKS_DRAWN)
    fig = Figure(figsize=(8, 2.6))  # drawn into the report, never on a screen
    ax = fig.subplots()
    ax.bar(shown.index.astype(str), shown["median (ms)"], color="#0072B2")
    ax.errorbar(shown.index.astype(str), shown["median (ms)"], fmt="none", ecolor="black",
                yerr=[shown["median (ms)"] - shown["shortest (ms)"], shown["longest (ms)"] - shown["median (ms)"]])  # fmt: skip
    ax.set_xlabel("rank")
    far = float(shown["longest (ms)"].max()) > LOG_SCALE_FROM * float(shown["median (ms)"].min())
    if far:  # one step far longer than the rest: on a linear axis the medians would vanish
        ax.set_yscale("log")
    ax.set_ylabel("step (ms, log scale)" if far else "step (ms)")
    ax.set_title("Median step time per rank (bars: shortest to longest)")
    alt = (
        f"A bar per rank of its median step time, the medians within {spread:.1%} of each other"
        + (
            f"; the longest step, {shown['longest (ms)'].max():.0f} ms, is drawn on a log scale."
            if far
            else "."
        )
    )
    return Section(title, text, table, figure_png(fig), alt)


def waiting_section(waiting: pd.Series | None, step_ms: float | None, missing: int = 0) -> Section:  # fmt: skip
    """Who waits for whom, from each rank's median ms of waiting per step (None: nothing to
    compare); ``missing``: how many of the job's ranks left no trace."""
    title = "Waiting and the straggler"
    if waiting is None:
        return Section(title, "Nothing to compare: waiting compares two or more ranks that meet in collectives within whole steps.")  # fmt: skip
    straggler = straggler_of(waiting)
    others = waiting.drop(straggler)
    among = " of the ranks profiled" if missing else ""
    table = waiting.rename("median waiting per step (ms)").rename_axis("rank").round(1).to_frame()
    text = (
        f"Rank {straggler} waits least{among} in collectives: {waiting[straggler]:.1f} ms per step "
        f"(median), against {others.median():.1f} ms for the median of the others. Everyone "
        f"else is already there when it arrives: rank {straggler} is the straggler. What held "
        "it, and what fixing that would buy, is in the first section (waiting is not the "
        "cost: the others' extra waiting leaves out what the straggler's delay also holds up)."
    )
    if missing and waiting_points_outside(waiting, step_ms):
        text = (
            f"Every rank profiled waits a large part of each step in collectives, rank "
            f"{straggler} least: {waiting[straggler]:.1f} ms per step (median), "
            f"{waiting[straggler] / step_ms:.0%} of a step. The rank they wait for is probably "
            f"among the {missing} that left no trace, unless the ranks profiled are slow "
            "themselves: their time per kind below says."
        )
    elif step_ms and others.median() - waiting[straggler] < CLEAR_SHARE * step_ms:
        text = (
            f"No rank stands out: rank {straggler} waits least in collectives "
            f"({waiting[straggler]:.1f} ms per step, median), but the others wait only "
            f"{others.median() - waiting[straggler]:.1f} ms more, under {CLEAR_SHARE:.0%} of a "
            f"{step_ms:.0f} ms step (median). Waiting this even says the ranks "
            f"{'profiled ' if missing else ''}arrive together at the collectives that match "
            "across them (the first section lists those that do not)."
        )
    return Section(title, text, table)


def kinds_section(kinds: pd.DataFrame) -> Section:
    """Wall time per kind of event and rank, from :func:`time_per_kind`'s table: the table, a
    figure with a dot per kind on each rank's row, and which kind of work takes the most."""
    title = "Time per kind"
    kinds = kinds.loc[:, (kinds > 0).any()].round(1)
    if kinds.empty:
        return Section(title, "No event with a duration of a known kind in the traces.")
    work = [k for k in kinds.columns if k in WORK_KINDS]
    top = kinds[work or list(kinds.columns)].sum().idxmax()
    kinds.columns = [f"{k} (ms)" for k in kinds.columns]
    text = (
        f"Wall time per kind of event over the traces, per rank; of the kinds that are work "
        f"themselves, `{top}` takes the most (annotations, the optimizer's and the data "
        "loader's spans mark what runs inside them, on the CPU). Kinds overlap (a collective "
        "runs while an op computes), so a row does not add up to the time covered."
    )
    shown = kinds.head(RANKS_DRAWN)
    fig = Figure(figsize=(8, 0.9 + 0.25 * len(shown)))
    ax = fig.subplots()
    rows = range(len(shown))
    # a dot per kind, not stacked bars: kinds overlap in time; a dot at 0 drawn whole
    for column in shown.columns:
        kind = column[: -len(" (ms)")]
        ax.plot(shown[column], rows, "o", label=kind, color=KIND_COLORS.get(kind), alpha=0.85, clip_on=False)  # fmt: skip
    ax.set_yticks(list(rows), [str(r) for r in shown.index])
    ax.set_ylim(len(shown) - 0.5, -0.5)
    ax.grid(axis="y", color="#eeeeee")
    ax.set_xlim(0, None)
    ax.set_xlabel("wall time (ms); kinds overlap, so a row's dots do not add up")
    ax.set_ylabel("rank")
    ax.set_title("Wall time per kind of event, per rank")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    longest = shown.idxmax(axis=1).str[: -len(" (ms)")]
    said = "; ".join(
        f"{kind} on rank{'s' if len(ranks) > 1 else ''} {listed(ranks)}"
        for kind, ranks in longest.groupby(longest).groups.items()
    )
    alt = f"A row per rank with a dot per kind of event at its wall time. The longest: {said}."
    return Section(title, text, kinds.rename_axis("rank"), figure_png(fig), alt)


def gpu_section(events: pd.DataFrame, names: str | None = None) -> Section:
    """The GPU per rank, from a run's events: launch-to-start lag, the share of the collectives'
    time hidden under other work (``names``, default :func:`helpers.collective_source`'s
    choice: on a GPU trace, the NCCL kernels, under other kernels), the busiest stream's idle
    share (medians over the steps), and the best median bus bandwidth where message sizes were
    recorded. A table, no figure."""
    title = "The GPU"
    work = events[events["kind"].isin(GPU_WORK_KINDS) & events["launch_us"].notna()]
    lag = ((work["start_us"] - work["launch_us"]) / 1e3).groupby(work["rank"]).median()
    table = pd.DataFrame({"launch to start (ms, median)": lag})
    overlap = communication_overlap(events, names)
    if not overlap.empty:
        table["communication hidden (share)"] = overlap.groupby("rank")["overlap"].median()
    idle = gpu_idle_time(events)
    if not idle.empty:
        busiest = idle.groupby(["rank", "step"])["idle_fraction"].min()
        table["busiest stream idle (share)"] = busiest.groupby("rank").median()
    bandwidth = collective_bandwidth(events, names)
    text = (
        "Per rank: how long GPU work waited after its launch (long: work queues up behind "
        "earlier work, the CPU runs ahead; near zero: the GPU waits for the CPU's launches), how much of "
        "the NCCL kernels' time ran under other kernels, and the share of a step's GPU window "
        "in which even its busiest stream sat idle (medians over the steps)."
    )
    if not bandwidth.empty:
        busbw = bandwidth.groupby("name")["busbw_gbps"].median()
        best = busbw.idxmax()
        text += (
            f" Bus bandwidth, median per collective: {busbw[best]:.1f} GB/s for `{best}` at best."
        )
    return Section(title, text, table.rename_axis("rank").round(3))


def phases_section(phases: pd.DataFrame) -> Section:
    """A sharded job's phases, from :func:`fsdp_phases`' table: ms per step and rank for each
    unit and phase, and a figure of the last step of the first two ranks."""
    title = "A sharded job's phases"
    per_unit = phases.pivot_table(index="unit", columns="phase", values="ms", aggfunc="sum")
    per_unit = (per_unit / phases.groupby(["rank", "step"]).ngroups).fillna(0.0).round(1)
    last = int(phases["step"].max())
    drawn = phases[phases["rank"].isin(sorted(phases["rank"].unique())[:2])]
    text = (
        "FSDP's annotations per unit, in ms per step and rank (a unit's all-gather adds its "
        "gathers of both passes). The figure is one step of two ranks, a row per unit."
    )
    figure = figure_png(plot_fsdp_phases(drawn, last, title=f"ProfilerStep#{last} by phase"))
    alt = "FSDP's phases of one step, a row per unit of each of two ranks."
    return Section(title, text, per_unit, figure, alt)


def groups_section(per_group: pd.DataFrame) -> Section:
    """Waiting per process group, from :func:`waiting_per_group`'s table: each group's members,
    the member the others wait for, and how long they wait; a group whose others wait less
    than a tenth of the longest such wait is said to have no straggler."""
    longest = float(per_group["others_wait_ms"].max())
    table = per_group.set_index("process_group")[["ranks", "straggler", "others_wait_ms"]]
    waited = table["others_wait_ms"] >= 0.1 * longest
    table["straggler"] = table["straggler"].astype(object).where(waited, None)
    table = table.rename(columns={"others_wait_ms": "the others wait (ms per step, median)"})
    named = "; ".join(f"group {g}: rank {r}" for g, r in table["straggler"].dropna().items())
    text = (
        "Each collective matched within its own process group (the traces, or the Flight "
        "Recorder dumps beside them, name its group). Per group, the member the others wait "
        f"for: {named or 'none'}. A rank that waited in one group arrives late at the next, so "
        "a slow rank makes its partners stragglers of the groups they meet next: the rank to "
        "look at is the one that is the straggler of its groups and waits in none (the "
        "waiting section's)."
    )
    return Section("Waiting per process group", text, table.round(1))


PIPELINE_TITLE = "A pipeline's stages"


def pipeline_section(events: pd.DataFrame) -> Section | None:
    """A pipeline's stages, from :func:`helpers.stage_waits`: per rank, the median step, the
    time it waited for the other stages and its sends and receives per step; the rank that
    waits least named where it waits less than half as long as the median rank (the others
    wait for it). None for a run whose sends are not paired with receives, or whose trace does
    not record their waits (gloo's ``gloo:send`` and ``gloo:recv`` do)."""
    pairs = len(sends_and_receives(events))
    waits = stage_waits(events) if pairs else None
    if waits is None or waits.empty:
        return None
    columns = ["step_ms", "waiting_ms", "share", "sends", "receives"]
    table = waits.groupby("rank")[columns].median()
    table["share"] = 100 * table["share"]
    least = int(table["share"].idxmin())
    if table["share"].min() < 0.5 * table["share"].median():
        verdict = (
            f"Rank {least} waits least ({table.at[least, 'waiting_ms']:.1f} ms a step, "
            f"{table.at[least, 'share']:.0f} %): the other stages wait for it."
        )
    else:
        verdict = (
            f"The stages wait alike ({table['share'].min():.0f} to {table['share'].max():.0f} % "
            "of a step): the bubble of a balanced pipeline, (p - 1) / (m + p - 1) of a step "
            "for p stages and m micro-batches in GPipe and 1F1B, plus the transfers."
        )
    text = (
        f"The ranks send to and receive from each other ({pairs} sends paired with their "
        "receives by ranks, tag and order): the stages of a pipeline. Each stage waits for the "
        "others at the end of its receives (its input or its gradient not there yet) and of "
        f"its sends: the bubble, and the transfers. {verdict}"
    )
    table = table.rename(columns={
        "step_ms": "step (ms)", "waiting_ms": "waiting for the others (ms per step)",
        "share": "share of the step (%)", "sends": "sends per step", "receives": "receives per step",
    })  # fmt: skip
    return Section(PIPELINE_TITLE, text, table.round(1))
