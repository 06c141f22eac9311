"""Each rank's collectives in the order it called them, side by side: where the sequences of a
hung job part (lesson 8).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from ..traces.kinds import KIND_COLORS

__all__ = ["plot_collective_sequences"]


def _sequence_cell(ax: plt.Axes, x: int, y: int, row) -> None:
    """One rank's collective at one sequence number (``row``), or "(nothing)" for None."""
    box = (x + 0.05, y + 0.1)
    if row is not None:
        colour = KIND_COLORS["communication"]
        ax.add_patch(plt.Rectangle(box, 0.9, 0.8, facecolor=colour, alpha=0.35, edgecolor="none"))
        label, colour = f"{row['collective']} {row['input_sizes']}", "black"
    else:
        ax.add_patch(plt.Rectangle(box, 0.9, 0.8, fill=False, linestyle="--", edgecolor="#777777"))
        label, colour = "(nothing)", "#777777"
    ax.text(x + 0.5, y + 0.5, label, ha="center", va="center", fontsize=8, color=colour)


def plot_collective_sequences(
    records: pd.DataFrame, mismatch=None, last: int = 10, title: str | None = None
) -> Figure:
    """Each rank's collectives in the order it called them, side by side (one column per rank,
    sequence number downwards), as Flight Recorder dumps record them.

    Args:
        records: a DataFrame from :func:`helpers.load_flight_records`.
        mismatch: a :class:`helpers.hangs.Mismatch` to mark (its row gets a frame).
        last: show this many sequence numbers, ending just after the mismatch (or at the end).
        title: the axes' title (default: none).

    Returns:
        The figure.
    """
    ranks = sorted(records["rank"].unique())
    end = (mismatch.seq + 1) if mismatch is not None else int(records["seq"].max())
    seqs = list(range(max(1, end - last + 1), end + 1))
    cells = records.set_index(["seq", "rank"])
    fig, ax = plt.subplots(figsize=(2.2 + 2.6 * len(ranks), 0.9 + 0.42 * len(seqs)))
    for y, seq in enumerate(seqs):
        for x, rank in enumerate(ranks):
            row = cells.loc[(seq, rank)] if (seq, rank) in cells.index else None
            _sequence_cell(ax, x, y, row)
        if mismatch is not None and seq == mismatch.seq:
            ax.add_patch(
                plt.Rectangle(
                    (0, y + 0.02), len(ranks), 0.96, fill=False, edgecolor="black", linewidth=2
                )
            )
            ax.text(
                len(ranks) + 0.05, y + 0.5, f"first mismatch:\n{mismatch.kind}", va="center",
                fontsize=8,
            )  # fmt: skip
    ax.set_xlim(0, len(ranks) + (0.9 if mismatch is not None else 0))
    ax.set_ylim(len(seqs), 0)
    ax.set_xticks([x + 0.5 for x in range(len(ranks))], [f"rank {r}" for r in ranks])
    ax.set_yticks([y + 0.5 for y in range(len(seqs))], [str(s) for s in seqs], fontsize=8)
    ax.set_ylabel("collective (sequence number)")
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig
