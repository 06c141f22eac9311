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
    ax: plt.Axes | None = None,
    title: str | None = None,
) -> Figure:
    """Draw :func:`helpers.memory_over_time`'s ``mib`` against ``ms`` as steps (memory holds
    its value until the next allocation or free), one line per rank and device, and a dashed
    line at each of ``marks`` (``{label: ms}``). Returns the figure."""
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 2.8))
    lines = list(memory.groupby(["rank", "device"], sort=True, observed=True))
    for i, ((rank, device), line) in enumerate(lines):
        colour = "black" if len(lines) == 1 else RANK_COLOURS[i % len(RANK_COLOURS)]
        label = f"rank {rank}" + (f" ({device})" if memory["device"].nunique() > 1 else "")
        ax.step(line["ms"], line["mib"], where="post", color=colour, linewidth=1, label=label)
    for label, ms in (marks or {}).items():
        ax.axvline(ms, color="#777777", linestyle="--", linewidth=1)
        ax.text(ms, ax.get_ylim()[1] * 0.9, f" {label}", fontsize=8)
    if len(lines) > 1:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("in use, from the\nstarting point (MiB)")
    if title:
        ax.set_title(title)
    ax.figure.tight_layout()
    return ax.figure
