"""Per-rank timelines of trace events with matplotlib.

:func:`plot_rank_timeline` draws one row per rank (optionally one lane per thread or GPU
stream inside each rank, and ranks grouped by node), bars coloured by kind (the colours of
:mod:`helpers.traces.kinds`), on a shared time axis in milliseconds. Bars are drawn as one
collection per kind, and bars closer than a pixel are joined, so a million events draw
in about a second.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..analysis.intervals import merge_intervals
from ..traces.kinds import KIND_COLORS, KIND_NAMES, KINDS

__all__ = ["plot_rank_timeline", "plot_timelines", "step_window"]

#: Bars closer than this fraction of the time axis are drawn as one (below a pixel).
MERGE_FRACTION = 1 / 4000
#: In a row that is not split into lanes, communication fills the lower part of the row
#: (this fraction), so the compute it overlaps on other threads stays visible above it.
COLLAPSED_COMMUNICATION = 0.4
#: Annotations (record_function regions, DistributedDataParallel.forward) enclose other work:
#: they fill only the upper part of the row (this fraction), behind the work they enclose, so a
#: thread that waits inside one shows the annotation alone, not a full bar.
ANNOTATION_HEIGHT = 0.45
STEP_TICK = "#333333"  # marks where each profiler step begins
_LAYER = {k.name: k.layer for k in KINDS}


def step_window(events: pd.DataFrame, step: int) -> tuple[float, float]:
    """``(start_ms, end_ms)`` on the run's axis covering ``ProfilerStep#<step>`` on every rank
    (the CPU's: a copy of the step on a GPU stream is an annotation)."""
    named = events["name"] == f"ProfilerStep#{step}"  # a categorical compares as text
    rows = events[named & (events["kind"] == "step")]
    if rows.empty:
        steps = sorted(events["step"].dropna().unique().tolist()) if "step" in events else []
        raise ValueError(
            f"step={step}: no ProfilerStep#{step} in these events; steps present: "
            f"{steps or 'none (was the profiler run with a schedule?)'}"
        )
    return rows["rel_us"].min() / 1e3, (rows["rel_us"] + rows["dur_us"]).max() / 1e3


def timeline_rows(
    events: pd.DataFrame,
    drawable: pd.DataFrame,
    lanes: bool,
    nodes: dict[int, list[int]] | None,
    row_label: str,
):
    """Where each row of a timeline goes.

    Args:
        events: the run's events (every rank gets a row, even one with nothing to draw).
        drawable: the events to be drawn (their lanes get rows).
        lanes: one row per lane of each rank, or one row per rank.
        nodes: ``{node: [ranks]}``: rows grouped by node (None: one group).
        row_label: what a row is called (``rank``, ``worker``...).

    Returns:
        The y position of each ``(rank, lane)`` row, the ticks and their labels, the total
        height, and where one node's rows end and the next begin.
    """
    node_of = {r: n for n, ranks in (nodes or {}).items() for r in ranks}
    ranks = sorted(events["rank"].unique(), key=lambda r: (node_of.get(r, 0), r))
    rows: dict[tuple, float] = {}
    ticks, labels, node_breaks, y = [], [], [], 0.0
    for i, rank in enumerate(ranks):
        if i and nodes and node_of.get(rank) != node_of.get(ranks[i - 1]):
            node_breaks.append(y - 0.15)
            y += 0.4  # a wider gap between nodes
        prefix = f"node {node_of[rank]} · " if rank in node_of else ""
        rank_lanes = (
            sorted(drawable.loc[drawable["rank"] == rank, "lane"].astype(str).unique())
            if lanes
            else [None]
        )
        for lane in rank_lanes or [None]:
            rows[(rank, lane)] = y
            ticks.append(y + 0.4)
            labels.append(f"{prefix}{row_label} {rank}" + (f" · {lane}" if lane else ""))
            y += 1.0
        y += 0.3  # gap between ranks
    return rows, ticks, labels, y, node_breaks


def _merged_bars(x0: np.ndarray, x1: np.ndarray, group: np.ndarray, gap: float):
    """Join the bars of each group that overlap or lie less than ``gap`` apart (all groups
    at once: each group is moved far along the axis from the others, merged, moved back)."""
    span = float(x1.max() - x0.min()) + 2 * abs(gap) + 1.0
    shift = group * span
    s0, s1 = merge_intervals(x0 + shift, x1 + shift, gap)
    g = np.floor((s0 - x0.min() + abs(gap)) / span).astype(np.int64)
    return s0 - g * span, s1 - g * span, g


def _row_index(ev: pd.DataFrame, rows: dict, lanes: bool) -> np.ndarray:
    """The position in ``rows`` of each event's (rank, lane) row."""
    if not lanes:
        return pd.Index([rank for rank, _ in rows]).get_indexer(ev["rank"].to_numpy())
    lane = (
        pd.Categorical(ev["lane"].astype(str))
        if ev["lane"].dtype != "category"
        else ev["lane"].array
    )
    lane_code = {name: i for i, name in enumerate(lane.categories.astype(str))}
    width = len(lane_code) + 1
    keys = pd.Index([int(rank) * width + lane_code.get(name, width - 1) for rank, name in rows])
    codes = ev["rank"].to_numpy().astype(np.int64) * width + lane.codes
    return keys.get_indexer(codes)


def _draw(
    ax,
    ev: pd.DataFrame,
    rows: dict,
    lanes: bool,
    shown: list[str],
    span: float,
    min_width_ms: float | None = None,
) -> None:
    """One PolyCollection per kind, in drawing order (back to front); bars narrower than
    ``min_width_ms`` are widened to it (to the right), so that short events stay visible."""
    row = _row_index(ev, rows, lanes)
    row_y = np.array(list(rows.values()))
    x0 = ev["rel_us"].to_numpy() / 1e3
    x1 = x0 + ev["dur_us"].to_numpy() / 1e3
    kind = pd.Categorical(ev["kind"], categories=KIND_NAMES).codes
    for k in sorted(shown, key=_LAYER.get):
        mine = kind == KIND_NAMES.index(k)
        if not mine.any():
            continue
        # steps stay separate even where they touch; other bars merge below a pixel
        s0, s1, r = _merged_bars(
            x0[mine], x1[mine], row[mine], -1e-9 if k == "step" else span * MERGE_FRACTION
        )
        if min_width_ms:
            s1 = np.maximum(s1, s0 + min_width_ms)
        base = row_y[r]
        if k == "step":  # a thin band at the top of the row, a tick where each step begins
            b0, b1 = base - 0.16, base - 0.03
        elif k == "communication" and not lanes:
            b0, b1 = base + 0.8 * (1 - COLLAPSED_COMMUNICATION), base + 0.8
        elif k == "annotation":
            b0, b1 = base, base + 0.8 * ANNOTATION_HEIGHT
        else:
            b0, b1 = base, base + 0.8
        verts = np.empty((len(s0), 4, 2))
        verts[:, 0, 0] = verts[:, 1, 0] = s0
        verts[:, 2, 0] = verts[:, 3, 0] = s1
        verts[:, 0, 1] = verts[:, 3, 1] = b0
        verts[:, 1, 1] = verts[:, 2, 1] = b1
        edge = "white" if k == "step" else "none"
        ax.add_collection(
            PolyCollection(
                verts,
                facecolors=KIND_COLORS[k],
                edgecolors=edge,
                linewidths=0.8 if k == "step" else 0,
                label=k,
            )
        )
        if k == "step":  # a dark tick where each step begins: visible at any zoom
            ax.add_collection(
                LineCollection(
                    np.stack([np.c_[s0, b0 - 0.06], np.c_[s0, b1 + 0.06]], axis=1),
                    colors=STEP_TICK,
                    linewidths=1.2,
                )
            )


def _time_axis(ax, ev: pd.DataFrame, window, min_width_ms: float | None) -> None:
    """The x axis: the window, or else the events' extent (a widened last bar included), and
    a label that says when short bars are drawn wider than they are."""
    if window is not None:
        ax.set_xlim(*window)
    elif len(ev):
        ends = (ev["rel_us"] + ev["dur_us"]) / 1e3
        if min_width_ms:  # a widened bar at the end stays inside the axis
            ends = np.maximum(ends, ev["rel_us"] / 1e3 + min_width_ms)
        ax.set_xlim(float(ev["rel_us"].min()) / 1e3, float(ends.max()))
    label = "time since the run's first event (ms)"
    if min_width_ms:
        label += f"; bars shorter than {min_width_ms:g} ms are drawn {min_width_ms:g} ms wide"
    ax.set_xlabel(label)


def plot_rank_timeline(
    events: pd.DataFrame,
    *,
    window: tuple[float, float] | None = None,
    step: int | None = None,
    lanes: bool = False,
    kinds: list[str] | None = None,
    nodes: dict[int, list[int]] | None = None,
    ax: plt.Axes | None = None,
    title: str | None = None,
    row_label: str = "rank",
    min_width_ms: float | None = None,
) -> Figure:
    """Draw the events of every rank on one time axis and return the figure.

    Args:
        events: a DataFrame from ``load_run(...).events`` (needs rank, lane, kind, rel_us, dur_us).
        window: ``(start_ms, end_ms)`` on the run's axis to zoom into.
        step: zoom to ``ProfilerStep#<step>`` (across all ranks) instead.
        lanes: one lane per thread / GPU stream inside each rank's row. Without lanes, a rank's
            threads share one row and communication fills its lower part, so the compute that
            runs at the same time on another thread stays visible.
        kinds: only these kinds (default: all but ``other``). Steps are a thin grey band at the
            top of each row, with a dark tick where each step begins; annotations fill the upper
            part of a row, behind the work they enclose.
        nodes: ``{node: [ranks]}`` (``RunRecord.nodes``): rows grouped and labelled by node.
        row_label: what a row is called on the y axis (``rank``, ``worker``, ``process``).
        min_width_ms: draw every bar at least this wide (ms), so that events far shorter than a
            pixel stay visible; the x axis's label says so. Default: true widths.
        title: the axes' title (default: none).
        ax: the axes to draw into (default: a new figure).
    """
    if step is not None:
        window = step_window(events, step)
    shown = list(kinds) if kinds else [k for k in KIND_NAMES if k != "other"]
    ev = drawable = events[events["kind"].isin(shown)]
    if window is not None:
        lo, hi = window[0] * 1e3, window[1] * 1e3
        ev = ev[(ev["rel_us"] + ev["dur_us"] >= lo) & (ev["rel_us"] <= hi)]
    rows, ticks, labels, height, breaks = timeline_rows(events, drawable, lanes, nodes, row_label)
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 0.9 + 0.42 * height))
    if len(ev):
        span = (
            (window[1] - window[0])
            if window is not None
            else float((ev["rel_us"] + ev["dur_us"]).max() - ev["rel_us"].min()) / 1e3
        )
        _draw(ax, ev, rows, lanes, shown, span, min_width_ms)
    _frame_rows(ax, ev, breaks)
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.set_ylim(height, -0.3)
    _time_axis(ax, ev, window, min_width_ms)
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title)
    ax.figure.tight_layout()
    return ax.figure


def _frame_rows(ax: plt.Axes, ev: pd.DataFrame, node_breaks: list[float]) -> None:
    """Lines between nodes, and a legend of the kinds drawn."""
    if node_breaks:
        ax.add_collection(
            LineCollection(
                [[(-1e12, b), (1e12, b)] for b in node_breaks], colors="black", linewidths=0.8
            )
        )
    drawn = set(ev["kind"].unique().astype(str))
    present = [k for k in KIND_NAMES if k in drawn]
    ax.legend(
        handles=[Patch(color=KIND_COLORS[k], label=k) for k in present],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        frameon=False,
    )


def plot_timelines(
    panels: dict[str, pd.DataFrame],
    *,
    window: tuple[float, float] | None = None,
    pad_ms: float = 5.0,
    **options,
) -> Figure:
    """Several timelines one above the other, so that equal widths are equal times.

    Args:
        panels: the events of each timeline, under its title, top to bottom.
        window: the span of the run's axis (ms) every panel shows; without it, each panel
            shows its own events from ``pad_ms`` before the first, every panel as long.
        pad_ms: the margin before each panel's first event, without ``window``.
        **options: for :func:`plot_rank_timeline` (``lanes``, ``kinds``, ``nodes``,
            ``row_label``...).

    Returns:
        The figure.
    """
    starts = {t: float(e["rel_us"].min()) / 1e3 - pad_ms for t, e in panels.items()}
    ends = {t: float((e["rel_us"] + e["dur_us"]).max()) / 1e3 for t, e in panels.items()}
    span = max(ends[t] - starts[t] for t in panels) + 2 * pad_ms
    rows = [
        e.groupby(["rank", "lane"], observed=True).ngroups
        if options.get("lanes")
        else e["rank"].nunique()
        for e in panels.values()
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 0.9 * len(panels) + 0.42 * sum(rows)),
                             sharex=window is not None, squeeze=False)  # fmt: skip
    for ax, (title, events) in zip(axes[:, 0], panels.items()):
        shown = window or (starts[title], starts[title] + span)
        plot_rank_timeline(events, window=shown, ax=ax, title=title, **options)
    if window is not None:
        for ax in axes[:-1, 0]:
            ax.set_xlabel("")
    fig.tight_layout()
    return fig
