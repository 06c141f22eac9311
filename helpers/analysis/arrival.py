"""When each rank arrived at a collective: when its data was ready, which is not always when it
called the collective (:func:`data_ready`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..traces.kinds import name_matches

__all__ = ["GPU_SYNCS", "data_ready"]


#: CUDA calls that block their thread until the GPU work before them has run.
GPU_SYNCS = r"^cuda(?:Stream|Device|Event)Synchronize$"


def data_ready(events: pd.DataFrame, collectives: pd.DataFrame) -> np.ndarray:
    """When each of ``collectives`` (rows of ``events``) had its rank's data ready: its start,
    or, where it opens by waiting for its own rank's GPU (gloo on CUDA tensors: its thread
    copies the tensors to the host and calls ``cudaStreamSynchronize`` inside the collective's
    span), the end of the last such CUDA synchronisation on its thread within the span. What
    comes before is the rank waiting for its own GPU, not for the others."""
    ready = collectives["start_us"].to_numpy(dtype=float).copy()
    syncs = events[name_matches(events, GPU_SYNCS)]
    if syncs.empty or collectives.empty:
        return ready
    ends = collectives["end_us"].to_numpy(dtype=float)
    lanes = collectives["lane"].astype(str).to_numpy()
    for (rank, lane), mine in syncs.groupby(["rank", "lane"], observed=True):
        mine = mine.sort_values("start_us")
        starts, done = mine["start_us"].to_numpy(), mine["end_us"].to_numpy()
        here = np.flatnonzero((collectives["rank"].to_numpy() == rank) & (lanes == str(lane)))
        lo = np.searchsorted(starts, ready[here], side="left")
        hi = np.searchsorted(starts, ends[here], side="left")
        for at, a, b in zip(here, lo, hi):
            if b > a:
                ready[at] = min(float(done[a:b].max()), ends[at])
    return ready
