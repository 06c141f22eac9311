"""Memory in use over time, per rank and device, from the frame of :func:`helpers.load_memory`.

A trace's running total counts only what the profiler saw: on the CPU, memory allocated before
profiling began is not in it, nor are its frees (the profiler warns that it leaves them out);
a GPU's caching allocator counts everything. So the series reads memory *from a starting
point*: what was in use just before the first recorded event is zero, and the curve shows what
the step added or freed.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

from ..traces import TraceError, load_memory
from .allocations import allocation_lives, step_at
from .shift import step_shift

__all__ = [
    "memory_over_time", "memory_peaks", "peak_moments", "alive_at_peak", "memory_growth",
    "step_peaks", "compare_memory", "MEMORY_NOISE", "memory_of_runs", "memory_verdict",
    "snapshot_summary", "peak_difference",
]  # fmt: skip

MIB = 2**20
#: What two runs of one unchanged job differ by in a rank's peak, as a share of it. On
#: lesson 15's memory_job.py (2 ranks, CPU) ten runs, idle and beside two busy processes, had the
#: same peaks to the byte; beside the test suite's other workers a few bytes of small
#: allocations of another thread sometimes fell at the peak, under 0.05 MiB of 11 MiB. 1 % is
#: well above that and well below any change worth a verdict.
MEMORY_NOISE = 0.01


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


def peak_moments(lives: pd.DataFrame, memory: pd.DataFrame) -> pd.DataFrame:
    """Each rank's and device's peak, from :func:`helpers.allocation_lives`'s frame and
    ``memory`` (the rows it came from): ``rank, device, peak_mib`` (counted from the trace's
    start, as :func:`memory_peaks`), ``at_us`` (on ``memory``'s clock), and the ``step`` and
    ``phase`` of the last allocation made by then."""
    over = memory_over_time(memory)
    peaks = memory_peaks(over)
    start = over.groupby(["rank", "device"], observed=True)["time_us"].min()
    at_us = start.reindex(pd.MultiIndex.from_frame(peaks[["rank", "device"]])).to_numpy()
    peaks = peaks.assign(at_us=at_us + peaks["at_ms"].to_numpy() * 1e3)
    made = lives.sort_values("alloc_us", kind="stable")
    last = pd.merge_asof(
        peaks.sort_values("at_us")[["rank", "device", "at_us"]],
        made[["rank", "device", "alloc_us", "step", "phase"]].rename(columns={"alloc_us": "at_us"}),
        on="at_us", by=["rank", "device"], direction="backward",
    )  # fmt: skip
    peaks = peaks.merge(
        last[["rank", "device", "step", "phase"]], on=["rank", "device"], how="left"
    )
    return peaks[["rank", "device", "peak_mib", "at_us", "step", "phase"]]


def allocations_at_peak(lives: pd.DataFrame, memory: pd.DataFrame) -> pd.DataFrame:
    """The allocations of ``lives`` (:func:`helpers.allocation_lives`'s frame) alive at their
    rank's and device's peak (:func:`peak_moments`): made by it and not freed before it, one
    row each, with the peak's ``at_us``."""
    peaks = peak_moments(lives, memory)[["rank", "device", "at_us"]]
    mine = lives.merge(peaks, on=["rank", "device"])
    return mine[(mine["alloc_us"] <= mine["at_us"]) & ~(mine["free_us"] <= mine["at_us"])]


def alive_at_peak(lives: pd.DataFrame, memory: pd.DataFrame, by: str = "category") -> pd.DataFrame:
    """What was alive at each rank's and device's peak (:func:`peak_moments`), by ``by``
    (``category``, ``op`` or ``line``): the allocations of the trace made by the peak and not
    freed before it. Returns ``rank, device, <by>`` (``"(none)"`` where an allocation has
    none), ``mib`` and ``allocations``, the most first within each rank and device."""
    alive = allocations_at_peak(lives, memory)
    keys = alive[by].astype(object).where(alive[by].notna(), "(none)")
    table = alive.assign(**{by: keys}).groupby(["rank", "device", by], sort=True)["bytes"]
    table = table.agg(mib="sum", allocations="size").reset_index()
    table["mib"] = table["mib"] / MIB
    table = table.sort_values(["rank", "device", "mib"], ascending=[True, True, False])
    return table.reset_index(drop=True)


def peak_difference(lives: pd.DataFrame, memory: pd.DataFrame, by: str = "category") -> pd.DataFrame:  # fmt: skip
    """Why one rank peaked above another: what was alive at the highest peak against what was
    alive at the lowest (of one kind of device), by ``by`` (``category``, ``op`` or ``line``).

    Returns ``<by>``, ``highest_mib``, ``lowest_mib`` and ``more_mib`` (the difference), the
    most more first; its ``attrs`` name the two (``"highest"``, ``"lowest"``: ``(rank,
    device)``). Empty with a single rank and device."""
    peaks = peak_moments(lives, memory)
    kind = peaks["device"].str.split(":").str[0]  # compare GPUs where there are any, else CPUs
    peaks = peaks[(kind == ("cuda" if (kind == "cuda").any() else "cpu")).to_numpy()]
    columns = [by, "highest_mib", "lowest_mib", "more_mib"]
    if len(peaks) < 2:
        return pd.DataFrame(columns=columns)
    ordered = peaks.sort_values("peak_mib", ascending=False, kind="stable")
    ends = [tuple(ordered.iloc[i][["rank", "device"]]) for i in (0, -1)]
    alive = alive_at_peak(lives, memory, by)
    sides = [
        alive[(alive["rank"] == rank) & (alive["device"] == device)].set_index(by)["mib"]
        for rank, device in ends
    ]
    table = pd.concat(sides, axis=1, keys=columns[1:3]).fillna(0.0)
    table["more_mib"] = table["highest_mib"] - table["lowest_mib"]
    table = table.sort_values("more_mib", ascending=False, kind="stable").reset_index(names=by)
    table.attrs.update(highest=ends[0], lowest=ends[1])
    return table[columns]


def memory_growth(lives: pd.DataFrame, min_mib: float = 0.01) -> pd.DataFrame:
    """Memory allocated step after step and never freed, per rank, device and line.

    From :func:`helpers.allocation_lives`'s frame: the allocations made inside a step, but not
    in the last (whose memory may still be freed after the trace), that the trace never saw
    freed. A line is growing when it kept memory in every one of those steps but at most one,
    and in two at least; an allocation made once (a buffer, the optimizer's state) is not.

    Returns one row per growing rank, device and line, the most first: ``mib_per_step`` (the
    median of what it kept in each step), ``steps`` (the steps it kept memory in), ``of_steps``
    (the steps looked at), ``kept_mib`` (in all) and ``op`` (the op that allocated most of it).
    """
    columns = ["rank", "device", "line", "mib_per_step", "steps", "of_steps", "kept_mib", "op"]
    rows = []
    for (rank, device), mine in lives[lives["step"].notna()].groupby(["rank", "device"]):
        steps = np.sort(mine["step"].unique())[:-1]
        kept = mine[mine["free_us"].isna() & mine["step"].isin(steps)]
        kept = kept.assign(line=kept["line"].astype(object).where(kept["line"].notna(), "(none)"))
        for line, of_line in kept.groupby("line"):
            per_step = of_line.groupby("step")["bytes"].sum().reindex(steps, fill_value=0)
            held = int((per_step > 0).sum())
            if held < max(2, len(steps) - 1) or per_step.median() < min_mib * MIB:
                continue
            op = of_line.groupby("op")["bytes"].sum().idxmax() if of_line["op"].notna().any() else None  # fmt: skip
            rows.append((rank, device, line, per_step.median() / MIB, held, len(steps),
                         of_line["bytes"].sum() / MIB, op))  # fmt: skip
    table = pd.DataFrame(rows, columns=columns)
    return table.sort_values("kept_mib", ascending=False, kind="stable").reset_index(drop=True)


def step_peaks(memory: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """The most in use in each profiler step, per rank and device (counted from the trace's
    start, as :func:`memory_over_time`): ``rank, device, step, peak_mib``."""
    over = memory_over_time(memory)
    parts = []
    for rank, mine in over.groupby("rank", sort=True):
        step = step_at(events[(events["rank"] == rank).to_numpy()], mine["time_us"].to_numpy())
        parts.append(mine.assign(step=step)[~np.isnan(step)])
    within = pd.concat(parts) if parts else over.assign(step=np.nan)
    table = within.groupby(["rank", "device", "step"])["mib"].max().rename("peak_mib")
    return table.reset_index()


def compare_memory(
    before: tuple[pd.DataFrame, pd.DataFrame], after: tuple[pd.DataFrame, pd.DataFrame]
) -> pd.DataFrame:
    """Two runs' memory side by side, per rank and device: did a change lower the peak, or stop
    memory growing. ``before`` and ``after``: each run's ``(memory, events)``.

    Returns ``peak_before, peak_after`` (MiB, the most in use in the run), ``shift_mib``,
    ``low_mib``, ``high_mib`` (how far the steps' own peaks moved, with the interval of
    :func:`helpers.step_shift`; NaN with too few steps), ``grows_before, grows_after`` (MiB a
    step, :func:`memory_growth`) and ``verdict``: ``lower``, ``higher`` (beyond the steps'
    noise, widened by :data:`MEMORY_NOISE` of the first run's peak on each side) or ``same``.
    """
    sides = []
    for memory, events in (before, after):
        growth = memory_growth(allocation_lives(memory, events))
        grows = growth.groupby(["rank", "device"])["mib_per_step"].sum()
        sides.append((step_peaks(memory, events), grows))
    rows = []
    keys = sorted(set(map(tuple, sides[0][0][["rank", "device"]].to_numpy())) & set(map(tuple, sides[1][0][["rank", "device"]].to_numpy())))  # fmt: skip
    for rank, device in keys:
        peaks = [p[(p["rank"] == rank) & (p["device"] == device)]["peak_mib"].to_numpy() for p, _ in sides]  # fmt: skip
        try:
            shift, low, high = step_shift(peaks[0], peaks[1])
        except ValueError:
            shift, low, high = float(np.median(peaks[1]) - np.median(peaks[0])), np.nan, np.nan
        noise = MEMORY_NOISE * float(peaks[0].max())
        verdict = "lower" if high + noise < 0 else "higher" if low - noise > 0 else "same"
        grows = [float(g.get((rank, device), 0.0)) for _, g in sides]
        rows.append((rank, device, peaks[0].max(), peaks[1].max(), shift, low, high, *grows, verdict))  # fmt: skip
    columns = ["rank", "device", "peak_before", "peak_after", "shift_mib", "low_mib", "high_mib", "grows_before", "grows_after", "verdict"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def memory_of_runs(sources: tuple, events: list[pd.DataFrame]) -> pd.DataFrame | None:
    """:func:`compare_memory` of two runs given as ``sources`` (their folders, or RunRecords)
    and their ``events``; None where either is given as events alone or holds no memory
    events."""
    if not all(isinstance(s, (str, os.PathLike)) or hasattr(s, "run_dir") for s in sources):
        return None
    try:
        memory = [load_memory(source) for source in sources]
    except TraceError:  # no [memory] events: nothing to say of memory
        return None
    return compare_memory((memory[0], events[0]), (memory[1], events[1]))


def memory_verdict(table: pd.DataFrame) -> str:
    """One sentence per rank of :func:`compare_memory`'s table that changed: the peak lowered or
    raised beyond the steps' noise, growth stopped or started; or that none changed."""
    said = []
    for r in table.itertuples():
        parts = []
        if r.verdict != "same":
            parts.append(
                f"its peak went from {r.peak_before:.1f} to {r.peak_after:.1f} MiB, "
                f"{'lower' if r.verdict == 'lower' else 'higher'} beyond the steps' noise "
                f"(their peaks moved {r.shift_mib:+.1f} MiB, {r.low_mib:+.1f} to {r.high_mib:+.1f})"
            )
        if r.grows_before > 0 and r.grows_after == 0:
            parts.append(f"its growth stopped ({r.grows_before:.2f} MiB a step before, none after)")
        elif r.grows_after > 0:
            parts.append(f"it grows {r.grows_after:.2f} MiB a step after ({r.grows_before:.2f} before)")  # fmt: skip
        if parts:
            said.append(f"Rank {r.rank}{'' if r.device == 'cpu' else ' on ' + r.device}: " + "; ".join(parts) + ".")  # fmt: skip
    return " ".join(said) or "Memory: no rank's peak moved beyond its steps' noise, and none grows."


def snapshot_summary(blocks: pd.DataFrame) -> pd.DataFrame:
    """Per device of :func:`helpers.load_memory_snapshot`'s blocks, where its reserved memory
    went: ``reserved_mib`` (all segments), ``allocated_mib`` (blocks in use by tensors),
    ``rounding_mib`` (of those, beyond what the tensors asked for), ``awaiting_mib`` (freed,
    waiting for another stream), ``cached_free_mib`` (free in the cache: reserved but unused),
    ``largest_free_mib`` (the largest free block: an allocation larger than it needs a new
    segment even when ``cached_free_mib`` would hold it, which is fragmentation), ``segments``.
    """
    rows = []
    for device, mine in blocks.groupby("device", sort=True):
        state, size = mine["state"], mine["bytes"]
        used = state == "active_allocated"
        free = size[state == "inactive"]
        rows.append((
            device,
            mine.drop_duplicates("segment")["segment_bytes"].sum() / MIB,
            size[used].sum() / MIB,
            (size[used] - mine["requested"][used]).sum() / MIB,
            size[state == "active_awaiting_free"].sum() / MIB,
            free.sum() / MIB,
            (free.max() if len(free) else 0) / MIB,
            mine["segment"].nunique(),
        ))  # fmt: skip
    columns = ["device", "reserved_mib", "allocated_mib", "rounding_mib", "awaiting_mib", "cached_free_mib", "largest_free_mib", "segments"]  # fmt: skip
    return pd.DataFrame(rows, columns=columns)
