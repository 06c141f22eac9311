"""Per-rank timelines of trace events with matplotlib.

:func:`plot_rank_timeline` draws one row per rank (optionally one lane per thread
or GPU stream inside each rank), bars coloured by kind, on a shared time axis in
milliseconds. Bars are drawn as one collection per kind, so a million events
draw in seconds.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .analysis import merge_intervals
from .traces import KINDS

#: Colour of each kind of event.
KIND_COLORS = {
    "step": "#bdbdbd",
    "compute": "#4c72b0",
    "communication": "#dd5555",
    "optimizer": "#55a868",
    "data loading": "#8172b2",
    "annotation": "#ccb974",
    "gpu kernel": "#2a9d8f",
    "gpu memory": "#64b5cd",
    "cuda runtime": "#937860",
    "python": "#da8bc3",
    "other": "#8c8c8c",
}


#: Back to front: containers (steps, annotations) behind, communication always on top.
DRAW_ORDER = ["step", "annotation", "compute", "python", "cuda runtime", "optimizer",
              "data loading", "gpu kernel", "gpu memory", "other", "communication"]
#: Bars closer than this fraction of the time axis are drawn as one (below a pixel).
MERGE_FRACTION = 1 / 4000


def step_window(events: pd.DataFrame, step: int) -> tuple[float, float]:
    """``(start_ms, end_ms)`` on the run's axis covering ``ProfilerStep#<step>`` on every rank."""
    rows = events[events["name"].astype(str) == f"ProfilerStep#{step}"]
    if rows.empty:
        steps = sorted(events["step"].dropna().unique().tolist()) if "step" in events else []
        raise ValueError(f"step={step}: no ProfilerStep#{step} in these events; steps present: "
                         f"{steps or 'none (was the profiler run with a schedule?)'}")
    return rows["rel_us"].min() / 1e3, (rows["rel_us"] + rows["dur_us"]).max() / 1e3


def plot_rank_timeline(
    events: pd.DataFrame,
    *,
    window: tuple[float, float] | None = None,
    step: int | None = None,
    lanes: bool = False,
    kinds: list[str] | None = None,
    ax: plt.Axes | None = None,
    title: str | None = None,
    row_label: str = "rank",
) -> Figure:
    """Draw the events of every rank on one time axis and return the figure.

    events: a DataFrame from ``load_run(...).events`` (needs rank, lane, kind, rel_us, dur_us).
    window: ``(start_ms, end_ms)`` on the run's axis to zoom into.
    step: zoom to ``ProfilerStep#<step>`` (across all ranks) instead.
    lanes: one lane per thread / GPU stream inside each rank's row.
    kinds: only these kinds (default: all but ``other``); ``step`` bars are drawn thin on top.
    row_label: what a row is called on the y axis (``rank``, ``worker``, ``node``).
    """
    if step is not None:
        window = step_window(events, step)
    shown = list(kinds) if kinds else [k for k in KINDS if k != "other"]
    drawable = events[events["kind"].isin(shown)]
    ev = drawable
    if window is not None:
        lo, hi = window[0] * 1e3, window[1] * 1e3
        ev = ev[(ev["rel_us"] + ev["dur_us"] >= lo) & (ev["rel_us"] <= hi)]
    if ax is None:
        ranks_n = max(1, events["rank"].nunique())
        lanes_n = (drawable.groupby("rank", observed=True)["lane"].nunique().sum()
                   if lanes else ranks_n)
        _, ax = plt.subplots(figsize=(11, 1.0 + 0.45 * lanes_n + 0.35 * ranks_n))

    # y positions: one band per rank, split into lanes if asked
    rows: dict[tuple, float] = {}
    ticks, labels, y = [], [], 0.0
    for rank in sorted(events["rank"].unique()):
        rank_lanes = (sorted(drawable.loc[drawable["rank"] == rank, "lane"].astype(str).unique())
                      if lanes else [None])
        top = y
        for lane in rank_lanes:
            rows[(rank, lane)] = y
            if lanes:
                ticks.append(y + 0.4)
                labels.append(f"{row_label} {rank} · {lane}")
            y += 1.0
        if not lanes:
            ticks.append(top + 0.4)
            labels.append(f"{row_label} {rank}")
        y += 0.3  # gap between ranks

    if len(ev):
        keys = list(zip(ev["rank"].to_numpy(), ev["lane"].astype(str).to_numpy())) if lanes \
            else [(r, None) for r in ev["rank"].to_numpy()]
        row_of = {key: i for i, key in enumerate(rows)}
        row = np.fromiter((row_of[k] for k in keys), dtype=np.int64, count=len(keys))
        row_y = np.array(list(rows.values()))
        x0 = ev["rel_us"].to_numpy() / 1e3
        x1 = x0 + ev["dur_us"].to_numpy() / 1e3
        span = (window[1] - window[0]) if window is not None else float(x1.max() - x0.min())
        gap = span * MERGE_FRACTION
        kind = ev["kind"].astype(str).to_numpy()
        for k in DRAW_ORDER:
            if k not in shown:
                continue
            mine = kind == k
            if not mine.any():
                continue
            starts, ends, ys = [], [], []
            for r in np.unique(row[mine]):
                sel = mine & (row == r)
                # steps stay separate even where they touch; other bars merge below a pixel
                s0, s1 = merge_intervals(x0[sel], x1[sel], -1e-9 if k == "step" else gap)
                starts.append(s0)
                ends.append(s1)
                ys.append(np.full(len(s0), row_y[r]))
            s0, s1, base = np.concatenate(starts), np.concatenate(ends), np.concatenate(ys)
            if k == "step":  # a thin band at the top of the row marks each step
                b0, b1 = base - 0.12, base - 0.02
            else:
                b0, b1 = base, base + 0.8
            verts = np.empty((len(s0), 4, 2))
            verts[:, 0, 0] = verts[:, 1, 0] = s0
            verts[:, 2, 0] = verts[:, 3, 0] = s1
            verts[:, 0, 1] = verts[:, 3, 1] = b0
            verts[:, 1, 1] = verts[:, 2, 1] = b1
            ax.add_collection(PolyCollection(verts, facecolors=KIND_COLORS[k],
                                             edgecolors="none", linewidths=0, label=k))
    present = [k for k in KINDS if k in set(ev["kind"].astype(str))]
    ax.legend(handles=[Patch(color=KIND_COLORS[k], label=k) for k in present],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.set_ylim(y, -0.3)
    if window is not None:
        ax.set_xlim(*window)
    elif len(ev):
        ax.set_xlim(float(ev["rel_us"].min()) / 1e3, float((ev["rel_us"] + ev["dur_us"]).max()) / 1e3)
    ax.set_xlabel("time since the run's first event (ms)")
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title)
    ax.figure.tight_layout()
    return ax.figure
