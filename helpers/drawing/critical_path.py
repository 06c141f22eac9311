"""One step's per-rank timelines with its critical path drawn across the ranks: what the
timelines mean, in one picture."""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib import patheffects
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.transforms import offset_copy

from ..analysis.path.dependencies import dependency_names
from ..traces.kinds import KIND_NAMES
from .timeline import plot_rank_timeline, timeline_rows

__all__ = ["plot_critical_path"]

PATH_COLOUR = "#000000"
#: Segments that are the path's own time on a lane (work, transfer) are solid; those where a
#: lane waits to be started or woken (launch, queue, wake-up, untraced) are dotted when they
#: last at least this share of the step (shorter ones are drawn as part of the line).
_DOTTED = dependency_names(lambda d: d.dotted)
DOTTED_FROM = 0.01
#: The figure is read at the width of a page (the site's column, the report's): drawn that wide,
#: so that nothing is scaled down, with letters of this size (points).
WIDTH_INCHES = 8.0
FONT = 10


def _strokes(x0: np.ndarray, x1: np.ndarray, y: np.ndarray, dotted: np.ndarray) -> list[tuple]:
    """The segments joined into strokes: consecutive segments on one lane in one style become
    one line ``(start, end, y, style)``, so that gaps of a few µs between ops do not break it."""
    strokes: list[list] = []
    for a, b, height, dots in zip(x0, x1, y, dotted):
        style = ":" if dots else "-"
        if strokes and strokes[-1][2] == height and strokes[-1][3] == style and strokes[-1][1] >= a:
            strokes[-1][1] = b
        else:
            strokes.append([a, b, height, style])
    return [tuple(s) for s in strokes]


def plot_critical_path(
    events: pd.DataFrame,
    path: pd.DataFrame,
    step: int,
    *,
    title: str | None = None,
    ax: plt.Axes | None = None,
) -> Figure:
    """``ProfilerStep#step`` of every rank, a lane per thread or GPU stream
    (:func:`plot_rank_timeline`), with the step's critical path drawn over it: a thick black
    line under each lane while the path is on it (dotted where the lane waited to be started or
    woken, or had no event, for a hundredth of the step or more), joined where it moves between
    lanes, and a white-edged diamond where it moves to another rank; the legend names only the
    marks drawn.

    Args:
        events: the run's events (``load_run(...).events``).
        path: the run's critical path (:func:`helpers.critical_path`).
        step: the step to draw (a ValueError if the path has no segment in it).
        title: the axes' title (default: none).
        ax: the axes to draw into (default: a new figure).

    Returns:
        The figure.
    """
    mine = path[path["step"] == step].sort_values("start_us")
    if mine.empty:
        raise ValueError(f"step={step}: the path has no segment in that step; its steps: {sorted(path['step'].unique())}")  # fmt: skip
    events = _lanes_busy_in(events, float(mine["start_us"].min()), float(mine["end_us"].max()))
    drawable = events[events["kind"].isin([k for k in KIND_NAMES if k != "other"])]
    rows, _, _, lanes_tall, _ = timeline_rows(events, drawable, True, None, "rank")
    if ax is None:
        _, ax = plt.subplots(figsize=(WIDTH_INCHES, 1.6 + 0.45 * lanes_tall))
    fig = plot_rank_timeline(events, step=step, lanes=True, ax=ax, title=title)
    origin = float((events["start_us"] - events["rel_us"]).iloc[0])
    x0 = (mine["start_us"].to_numpy() - origin) / 1e3
    x1 = (mine["end_us"].to_numpy() - origin) / 1e3
    y = np.array([rows.get((r, lane), np.nan) for r, lane in zip(mine["rank"], mine["lane"])])
    y = y + 0.92  # just under the lane's bars, in the gap before the next lane
    outline = [patheffects.withStroke(linewidth=6.5, foreground="white")]
    visible = DOTTED_FROM * (x1.max() - x0.min())
    dotted = mine["reason"].isin(_DOTTED).to_numpy() & (x1 - x0 > visible)
    for a, b, height, style in _strokes(x0, x1, y, dotted):
        ax.plot([a, b], [height, height], style, color=PATH_COLOUR, linewidth=4,
                path_effects=outline, solid_capstyle="butt", zorder=5)  # fmt: skip
    ranks = mine["rank"].to_numpy()
    for i in range(1, len(mine)):
        if y[i] != y[i - 1] and not np.isnan(y[i] + y[i - 1]):
            ax.plot([x1[i - 1], x0[i]], [y[i - 1], y[i]], color=PATH_COLOUR, linewidth=1.6,
                    path_effects=outline, zorder=5)  # fmt: skip
        if ranks[i] != ranks[i - 1]:
            ax.plot([x0[i]], [y[i]], marker="D", markersize=8, color=PATH_COLOUR,
                    markeredgecolor="white", zorder=6)  # fmt: skip
    _legend_with_path(ax, dotted.any(), bool((ranks[1:] != ranks[:-1]).any()))
    _legible(ax)
    return fig


def _lanes_busy_in(events: pd.DataFrame, lo: float, hi: float) -> pd.DataFrame:
    """``events`` of the lanes that hold some event in ``(lo, hi)``, or the steps (a GPU job's
    many streams, most of them idle in a given step, are left out)."""
    within = (events["start_us"] < hi).to_numpy() & (events["end_us"] > lo).to_numpy()
    busy = events[within | (events["kind"] == "step").to_numpy()]
    keep = pd.MultiIndex.from_frame(busy[["rank", "lane"]].astype(str)).unique()
    lanes = pd.MultiIndex.from_frame(events[["rank", "lane"]].astype(str))
    return events[lanes.isin(keep)]


def _legible(ax: plt.Axes) -> None:
    """Letters of :data:`FONT` points, lanes named short (``python 21823``, ``gloo 21829``
    for ``thread 21823 (python)``, ``thread 21829 (pt_gloo_runloop)``)."""
    short = [re.sub(r"thread (\d+) \((?:pt_)?(\w+?)(?:_runloop)?\)", r"\2 \1", t.get_text())
             for t in ax.get_yticklabels()]  # fmt: skip
    ax.set_yticks(ax.get_yticks(), short, fontsize=FONT - 1)
    ax.tick_params(axis="x", labelsize=FONT - 1)
    ax.xaxis.label.set_fontsize(FONT)
    ax.title.set_fontsize(FONT + 1)
    ax.figure.tight_layout()


def _legend_with_path(ax: plt.Axes, dotted: bool, changes_rank: bool) -> None:
    """The timeline's legend of kinds, then the path's marks that were drawn."""
    legend = ax.get_legend()
    kinds = [(h, t.get_text()) for h, t in zip(legend.legend_handles, legend.get_texts())]
    extra = [(Line2D([], [], color=PATH_COLOUR, linewidth=2.2), "critical path")]
    if dotted:
        extra.append((Line2D([], [], color=PATH_COLOUR, linewidth=2.2, linestyle=":"), "path: waiting to start"))  # fmt: skip
    if changes_rank:
        extra.append((Line2D([], [], color=PATH_COLOUR, marker="D", linestyle="", markeredgecolor="white"), "path changes rank"))  # fmt: skip
    items = kinds + extra
    # under the x axis's numbers and label
    below = offset_copy(ax.transAxes, fig=ax.figure, y=-3.6 * FONT, units="points")
    ax.legend([h for h, _ in items], [t for _, t in items], loc="upper center",
              bbox_to_anchor=(0.5, 0.0), bbox_transform=below, ncol=5, fontsize=FONT - 1,
              frameon=False)  # fmt: skip
