"""Questions only a GPU trace answers: how long each stream of each rank sat idle in a step.

(The collectives' GPU side, NCCL kernels, overlap and bandwidth, is in :mod:`.collectives`.)
"""

from __future__ import annotations

import pandas as pd

from ..traces.kinds import GPU_WORK_CATEGORIES
from .intervals import busy_ms_per_group

__all__ = ["gpu_idle_time"]


def gpu_idle_time(events: pd.DataFrame) -> pd.DataFrame:
    """How long each GPU stream sat idle in each step, per rank.

    A step's GPU window on a rank runs from the first to the last moment any of its streams
    worked on that step's kernels, memcpys and memsets (those its CPU code launched). A
    stream is idle in the window when none of its work of that step runs.

    Returns one row per rank, step and stream: ``rank, step, stream, window_ms, busy_ms,
    idle_ms, idle_fraction``; empty for a trace without GPU events.
    """
    work = events[events["cat"].astype(str).isin(GPU_WORK_CATEGORIES).to_numpy()].dropna(
        subset=["step"]
    )
    windows = work.groupby(["rank", "step"], observed=True)
    window_ms = (windows["end_us"].max() - windows["start_us"].min()) / 1e3
    busy = busy_ms_per_group(work, ["rank", "step", "stream"]).rename("busy_ms").reset_index()
    table = busy.join(window_ms.rename("window_ms"), on=["rank", "step"])
    table = table[["rank", "step", "stream", "window_ms", "busy_ms"]]
    table["idle_ms"] = table["window_ms"] - table["busy_ms"]
    table["idle_fraction"] = table["idle_ms"] / table["window_ms"]
    return table.astype({"rank": int, "step": int, "stream": int})
