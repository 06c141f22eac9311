"""A sharded step drawn by phase: one row per unit of each rank, what the unit did when."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

__all__ = ["PHASE_COLORS", "plot_fsdp_phases"]

#: One colour per phase (Okabe-Ito): communication in vermillion and orange, compute in blues.
PHASE_COLORS = {
    "all-gather": "#D55E00",
    "copy-out": "#CC79A7",
    "forward": "#0072B2",
    "backward": "#56B4E9",
    "reshard": "#999999",
    "reduce-scatter": "#E69F00",
}


def plot_fsdp_phases(phases: pd.DataFrame, step: int, title: str | None = None) -> Figure:
    """Draw one step of :func:`helpers.fsdp_phases`: one row per unit of each rank (units in the
    order they first computed, ranks one above the other), a bar per phase in its colour, in ms
    since the step's first phase on any rank. Returns the figure."""
    shown = phases[phases["step"] == step]
    if shown.empty:
        raise ValueError(
            f"no FSDP phases in step {step}: steps here are {sorted(set(phases['step']))}"
        )
    t0 = shown["start_us"].min()
    order = shown.sort_values("start_us").drop_duplicates("unit")["unit"].tolist()
    rows = [(rank, unit) for rank in sorted(shown["rank"].unique()) for unit in order]
    fig, ax = plt.subplots(figsize=(11, 0.9 + 0.32 * len(rows)))
    for y, (rank, unit) in enumerate(rows):
        mine = shown[(shown["rank"] == rank) & (shown["unit"] == unit)]
        for phase, bars in mine.groupby("phase"):
            spans = list(zip((bars["start_us"] - t0) / 1e3, bars["ms"]))
            ax.broken_barh(spans, (y - 0.4, 0.8), color=PHASE_COLORS.get(phase, "#000000"))
    ax.set_yticks(range(len(rows)), [f"rank {r} · {u}" for r, u in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.4, -0.6)
    for boundary in range(len(order), len(rows), len(order)):
        ax.axhline(boundary - 0.5, color="black", linewidth=0.8)
    ax.set_xlabel(f"time since ProfilerStep#{step}'s first FSDP phase (ms)")
    ax.grid(axis="x", alpha=0.3)
    present = [p for p in PHASE_COLORS if p in set(shown["phase"])]
    ax.legend(handles=[Patch(color=PHASE_COLORS[p], label=p) for p in present],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)  # fmt: skip
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig
