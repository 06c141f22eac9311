"""The GPU running behind the CPU: each step's CPU time above the GPU work it launched."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..traces.kinds import GPU_WORK_CATEGORIES

__all__ = ["plot_launch_lag"]

#: One shade per step, in turn: dark, light, middle (grey: the steps are told apart, not kinds).
STEP_SHADES = ["#444444", "#bbbbbb", "#808080"]


def plot_launch_lag(events: pd.DataFrame, title: str | None = None) -> Figure:
    """One rank's profiler steps on the CPU (top row) and the GPU work each launched (bottom
    row, all streams together), in the same shade per step, in ms since the first step began.

    A kernel belongs to the step whose CPU code launched it (``load_trace``'s ``step`` column),
    so where the GPU runs behind, a step's kernels sit under the next step's CPU time. GPU
    work launched before the trace's first step is not in the trace: the stretch of the GPU
    row before its first recorded event is hatched and labelled, not left blank."""
    if events["rank"].nunique() != 1:
        raise ValueError("plot_launch_lag draws one rank: pass events[events['rank'] == N]")
    steps = events[(events["kind"] == "step").to_numpy()].sort_values("start_us")
    work = events[events["cat"].astype(str).isin(GPU_WORK_CATEGORIES).to_numpy()].dropna(
        subset=["step"]
    )
    if steps.empty or work.empty:
        raise ValueError("plot_launch_lag needs profiler steps and GPU work launched in them")
    t0 = steps["start_us"].min()
    shade = {int(s): STEP_SHADES[i % len(STEP_SHADES)] for i, s in enumerate(steps["step"])}
    fig, ax = plt.subplots(figsize=(9, 2.4))
    for _, span in steps.iterrows():
        step, start, width = int(span["step"]), (span["start_us"] - t0) / 1e3, span["dur_us"] / 1e3
        ax.broken_barh([(start, width)], (1.1, 0.8), color=shade[step])
        dark = shade[step] == STEP_SHADES[0]
        ax.text(start + width / 2, 1.5, f"ProfilerStep#{step}", ha="center", va="center",
                fontsize=8, color="white" if dark else "black")  # fmt: skip
    for step, launched in work.groupby("step"):
        bars = list(zip((launched["start_us"] - t0) / 1e3, launched["dur_us"] / 1e3))
        ax.broken_barh(bars, (0.1, 0.8), color=shade.get(int(step), "#777777"))
    first_gpu_ms = (work["start_us"].min() - t0) / 1e3
    if first_gpu_ms > 0:
        ax.broken_barh([(0, first_gpu_ms)], (0.1, 0.8), facecolor="none", edgecolor="#999999",
                       hatch="//", linewidth=0)  # fmt: skip
        ax.text(first_gpu_ms / 2, 0.5, "work of earlier steps:\nnot in this trace",
                ha="center", va="center", fontsize=7, backgroundcolor="white")  # fmt: skip
    ax.set_xlim(0, (work["end_us"].max() - t0) / 1e3)
    ax.set_yticks([0.5, 1.5], ["GPU (all streams)", "CPU (main thread)"])
    ax.set_xlabel(f"time since ProfilerStep#{int(steps['step'].iloc[0])} began (ms)")
    legend = [
        Patch(color=c, label=f"step {s} and the GPU work it launched") for s, c in shade.items()
    ]
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1, 1), fontsize=8, frameon=False)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig
