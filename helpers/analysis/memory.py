"""Memory in use over time, per rank and device, from the frame of :func:`helpers.load_memory`.

A trace's running total counts only what the profiler saw: on the CPU, memory allocated before
profiling began is not in it (its frees are, as negative bytes); a GPU's caching allocator
counts everything. So the series reads memory *from a starting point*: what was in use just
before the first recorded event is zero, and the curve shows what the step added or freed.
"""

from __future__ import annotations

import pandas as pd

__all__ = ["memory_over_time", "memory_peaks"]

MIB = 2**20


def memory_over_time(memory: pd.DataFrame, origin_us: float | None = None) -> pd.DataFrame:
    """``memory`` with ``ms`` (since ``origin_us``; by default since each rank's first event)
    and ``mib``: the device's memory in use after each event, in MiB, counted from what was in
    use just before its first event (its total then, less its own bytes)."""
    groups = memory.groupby(["rank", "device"], sort=False, observed=True)
    first = groups["allocated"].transform("first") - groups["bytes"].transform("first")
    start = groups["time_us"].transform("min") if origin_us is None else origin_us
    return memory.assign(
        ms=(memory["time_us"] - start) / 1e3, mib=(memory["allocated"] - first) / MIB
    )


def memory_peaks(memory: pd.DataFrame) -> pd.DataFrame:
    """Per rank and device, from :func:`memory_over_time`'s frame: ``peak_mib`` (the most in
    use), ``at_ms`` (when it was reached first), ``end_mib`` (in use after the last event), all
    counted from the starting point."""
    over = memory if "mib" in memory.columns else memory_over_time(memory)
    at_peak = over.loc[over.groupby(["rank", "device"], observed=True)["mib"].idxmax()]
    last = over.groupby(["rank", "device"], observed=True)["mib"].last()
    table = at_peak.set_index(["rank", "device"])[["mib", "ms"]]
    table.columns = ["peak_mib", "at_ms"]
    return table.assign(end_mib=last).reset_index()
