"""Memory in use over time, one line per rank (and device), with the moments that explain it;
and what was alive at each rank's peak, by category, one bar per rank."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

__all__ = ["plot_memory", "plot_alive_at_peak", "CATEGORY_COLOURS"]

#: Line colours for several ranks (Okabe-Ito, as the kinds' colours); one rank is drawn black.
RANK_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]
#: Shaded bands, one colour each (Okabe-Ito).
SPAN_COLOURS = ["#E69F00", "#56B4E9", "#009E73", "#CC79A7"]
#: One colour per category of memory (Okabe-Ito), the same in every figure; none is grey.
CATEGORY_COLOURS = {
    "parameter": "#0072B2", "gradient": "#56B4E9", "optimizer state": "#009E73",
    "activation": "#D55E00", "input": "#F0E442", "temporary": "#E69F00",
    "autograd detail": "#CC79A7", "(none)": "#999999",
}  # fmt: skip


def plot_memory(
    memory: pd.DataFrame,
    marks: dict[str, float] | None = None,
    spans: dict[str, tuple[float, float]] | None = None,
    ax: plt.Axes | None = None,
    title: str | None = None,
    ylabel: str = "in use, from the\nstarting point (MiB)",
) -> Figure:
    """Draw memory in use over time as steps (memory holds its value until the next allocation
    or free); marks and bands are named in the legend, beside the axes, so that no label lies
    over the curve.

    Args:
        memory: :func:`helpers.memory_over_time`'s frame (``mib`` against ``ms``): one line per
            rank and device, or per value of a ``label`` column, which then names the lines
            (two runs side by side).
        marks: ``{label: ms}``: a dashed line at each.
        spans: ``{label: (start_ms, end_ms)}``: a shaded band over each, in a colour of its own.
        ax: the axes to draw on (default: a new figure).
        title: the axes' title.
        ylabel: the y axis's label.

    Returns:
        The figure.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 2.8))
    by = ["label"] if "label" in memory.columns else ["rank", "device"]
    lines = list(memory.groupby(by, sort=False, observed=True))
    for i, (key, line) in enumerate(lines):
        colour = "black" if len(lines) == 1 else RANK_COLOURS[i % len(RANK_COLOURS)]
        if by == ["label"]:
            label = str(key[0])
        else:
            rank, device = key
            label = f"rank {rank}" + (f" ({device})" if memory["device"].nunique() > 1 else "")
        label = label if len(lines) > 1 else f"_{label}"  # one line needs no legend entry
        ax.step(line["ms"], line["mib"], where="post", color=colour, linewidth=1, label=label)
    styles = ["--", ":", "-."]
    for i, (label, ms) in enumerate((marks or {}).items()):
        ax.axvline(ms, color="#555555", linestyle=styles[i % len(styles)], linewidth=1, label=label)
    for i, (label, (start, end)) in enumerate((spans or {}).items()):
        colour = SPAN_COLOURS[i % len(SPAN_COLOURS)]
        ax.axvspan(start, end, color=colour, alpha=0.25, linewidth=0, label=label)
    if len(lines) > 1 or marks or spans:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.figure.tight_layout()
    return ax.figure


def plot_alive_at_peak(
    alive: pd.DataFrame, ax: plt.Axes | None = None, title: str | None = None
) -> Figure:
    """Draw what was alive at each rank's peak, by category: one bar per rank (and run), its
    parts the categories, in :data:`CATEGORY_COLOURS`.

    Args:
        alive: :func:`helpers.alive_at_peak`'s frame by category (``rank``, ``category``,
            ``mib``), or several with a ``run`` column that names each bar's run.
        ax: the axes to draw on (default: a new figure).
        title: the axes' title.

    Returns:
        The figure.
    """
    keys = ["run", "rank"] if "run" in alive.columns else ["rank"]
    table = alive.pivot_table(
        index=keys, columns="category", values="mib", aggfunc="sum", sort=False
    )
    table = table[[c for c in CATEGORY_COLOURS if c in table.columns]].fillna(0.0)
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.6 + 0.4 * len(table)))
    frame = table.index.to_frame(index=False)
    names = "rank " + frame["rank"].astype(str)
    if "run" in frame.columns:
        names = frame["run"].astype(str) + ", " + names
    left = np.zeros(len(table))
    for category in table.columns:
        colour = CATEGORY_COLOURS[category]
        ax.barh(names, table[category], left=left, color=colour, label=category)
        left += table[category].to_numpy()
    ax.invert_yaxis()  # the first bar on top
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_xlabel("alive at the peak (MiB)")
    if title:
        ax.set_title(title)
    ax.figure.tight_layout()
    return ax.figure
