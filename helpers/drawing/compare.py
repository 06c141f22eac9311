"""Two runs compared in one picture: what moved on the critical path, per rank and kind."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from ..analysis.compare import RunComparison
from ..traces.kinds import KIND_COLORS
from .critical_path import FONT, WIDTH_INCHES

__all__ = ["plot_run_comparison", "run_comparison_alt"]

#: The colour of the path's own kinds of waiting (wake-up, launch, sync, untraced, ...).
WAITING_COLOUR = "#999999"


def moved_on_the_path(compared: RunComparison, rows: int = 8) -> pd.DataFrame:
    """The change in each rank's time per kind on the critical path (ms per step), the
    ``rows`` that moved most, largest first: ``rank, kind, before_ms, after_ms, change_ms``."""
    by_kind = compared.held.groupby(["rank", "kind"], observed=True)[["before_ms", "after_ms", "change_ms"]].sum()  # fmt: skip
    order = by_kind["change_ms"].abs().sort_values(ascending=False).index[:rows]
    return by_kind.loc[order].reset_index()


def plot_run_comparison(compared: RunComparison, rows: int = 8, title: str | None = None) -> Figure:  # fmt: skip
    """Horizontal bars, one per (rank, kind) of the critical path that moved most from the first
    run to the second (ms per step: left, less time held; right, more), coloured by kind, with
    the step's shift and its interval above them. Returns the figure."""
    moved = moved_on_the_path(compared, rows)
    change = compared.steps.loc["change"]
    fig, ax = plt.subplots(figsize=(WIDTH_INCHES, 1.4 + 0.4 * len(moved)))
    labels = [f"rank {r} · {k}" for r, k in zip(moved["rank"], moved["kind"])]
    colours = [KIND_COLORS.get(k, WAITING_COLOUR) for k in moved["kind"]]
    y = range(len(moved))[::-1]
    ax.barh(list(y), moved["change_ms"], color=colours, height=0.6)
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(list(y), labels, fontsize=FONT)
    for i, value in zip(y, moved["change_ms"]):
        ax.annotate(f"{value:+.1f}", (value, i), xytext=(4 if value >= 0 else -4, 0),
                    textcoords="offset points", va="center", ha="left" if value >= 0 else "right",
                    fontsize=FONT - 1)  # fmt: skip
    ax.margins(x=0.15)
    ax.set_xlabel("change in time held on the critical path (ms per step, after - before)", fontsize=FONT)  # fmt: skip
    before, after = compared.steps.loc["before", "median_ms"], compared.steps.loc["after", "median_ms"]  # fmt: skip
    ax.set_title(
        (title + "\n" if title else "")
        + f"median step {before:.1f} → {after:.1f} ms; shift {change['shift_ms']:+.1f} ms "
        f"(interval {change['low_ms']:+.1f} to {change['high_ms']:+.1f}, "
        f"±{change['noise_ms']:.1f} between runs)",
        fontsize=FONT + 1,
    )
    ax.tick_params(axis="x", labelsize=FONT - 1)
    fig.tight_layout()
    return fig


def run_comparison_alt(compared: RunComparison, rows: int = 8) -> str:
    """The alternative text of :func:`plot_run_comparison`'s figure: what its bars say."""
    moved = moved_on_the_path(compared, rows)
    change = compared.steps.loc["change"]
    parts = [f"rank {r}'s {k} {c:+.1f} ms" for r, k, c in zip(moved["rank"], moved["kind"], moved["change_ms"])]  # fmt: skip
    return (
        f"Bars of the change in time held on the critical path per rank and kind, ms per step: "
        f"{'; '.join(parts[:4])}. The step's shift is {change['shift_ms']:+.1f} ms, interval "
        f"{change['low_ms']:+.1f} to {change['high_ms']:+.1f} ms from the steps, "
        f"±{change['noise_ms']:.1f} ms between runs."
    )
