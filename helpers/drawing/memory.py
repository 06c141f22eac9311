"""Memory in use over time, one line per rank (and device), with the moments that explain it."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

__all__ = ["plot_memory"]

#: Line colours for several ranks (Okabe-Ito, as the kinds' colours); one rank is drawn black.
RANK_COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]


def plot_memory(
    memory: pd.DataFrame,
    marks: dict[str, float] | None = None,
    spans: dict[str, tuple[float, float]] | None = None,
    ax: plt.Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Draw :func:`helpers.memory_over_time`'s ``mib`` against ``ms`` as steps (memory holds
    its value until the next allocation or free), one line per rank and device, and a dashed
    line at each of ``marks`` (``{label: ms}``) and a shaded band over each of ``spans``
    (``{label: (start_ms, end_ms)}``); their labels alternate between two heights so that
    neighbours do not overwrite each other. Returns the figure."""
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 2.8))
    lines = list(memory.groupby(["rank", "device"], sort=True, observed=True))
    for i, ((rank, device), line) in enumerate(lines):
        colour = "black" if len(lines) == 1 else RANK_COLOURS[i % len(RANK_COLOURS)]
        label = f"rank {rank}" + (f" ({device})" if memory["device"].nunique() > 1 else "")
        ax.step(line["ms"], line["mib"], where="post", color=colour, linewidth=1, label=label)
    bottom, top = ax.get_ylim()
    heights = [top - (top - bottom) * f for f in (0.08, 0.2)]
    for i, (label, ms) in enumerate((marks or {}).items()):
        ax.axvline(ms, color="#777777", linestyle="--", linewidth=1)
        ax.text(ms, heights[i % 2], f" {label}", fontsize=8)
    for i, (label, (start, end)) in enumerate((spans or {}).items()):
        ax.axvspan(start, end, color="#D55E00", alpha=0.15, linewidth=0)
        ax.text(start, heights[i % 2], f" {label}", fontsize=8)
    if len(lines) > 1:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("in use, from the\nstarting point (MiB)")
    if title:
        ax.set_title(title)
    ax.figure.tight_layout()
    return ax.figure
