"""Memory in use over time, one line per rank (and device), with the moments that explain it."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

__all__ = ["plot_memory"]

#: Line colours for several ranks (Okabe-Ito, as the kinds' colours); one rank is drawn black.
RANK_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]
#: Shaded bands, one colour each (Okabe-Ito).
SPAN_COLOURS = ["#E69F00", "#56B4E9", "#009E73", "#CC79A7"]


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
