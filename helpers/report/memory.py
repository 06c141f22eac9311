"""The report's section on memory: each rank's peak and what was alive at it, memory that grows
step after step and the line that allocates it, from the ``[memory]`` events of the traces."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..analysis.allocations import allocation_lives, freed_before_trace
from ..analysis.memory import (
    MEMORY_NOISE,
    MIB,
    alive_at_peak,
    memory_growth,
    memory_peaks,
    peak_difference,
    peak_moments,
)  # fmt: skip
from ..traces import TraceError, load_memory, load_memory_categories
from .sections import Section

__all__ = ["MEMORY_TITLE", "memory_section"]

MEMORY_TITLE = "Where the memory went"
NO_MEMORY = (
    "The traces hold no `[memory]` events: record them with `profile_memory=True` (and "
    "`with_stack=True` for the lines of your code) to see each rank's peak, what was alive at "
    "it, and memory that grows step after step."
)


def memory_section(files: list[Path], events: pd.DataFrame) -> Section:
    """The section, from the trace ``files`` and their ``events``; a sentence alone when the
    traces hold no memory events."""
    try:
        memory = load_memory(files[0] if len(files) == 1 else files)
    except TraceError as err:
        if "no [memory] events" not in str(err):
            raise
        return Section(MEMORY_TITLE, NO_MEMORY)
    categories = pd.concat(
        [load_memory_categories(folder) for folder in sorted({f.parent for f in files})]
    )
    lives = allocation_lives(memory, events, categories)
    peaks = peak_moments(lives, memory)
    growth = memory_growth(lives)
    lines = alive_at_peak(lives, memory, by="line")
    text = " ".join(
        part
        for part in [
            _peaks_text(peaks, alive_at_peak(lives, memory), lines, lives),
            _why_text(
                peaks, peak_difference(lives, memory), peak_difference(lives, memory, "line")
            ),  # fmt: skip
            _growth_text(growth, sorted(peaks["rank"].unique())),
            _before_text(freed_before_trace(memory)),
            _cache_text(memory, peaks),
        ]
        if part  # a part with nothing to say adds no space
    )
    table = _table(peaks, memory_peaks(memory), growth, lines)
    return Section(MEMORY_TITLE, text, table)


def _peaks_text(peaks: pd.DataFrame, kinds: pd.DataFrame, lines: pd.DataFrame, lives: pd.DataFrame) -> str:  # fmt: skip
    """Which rank peaked highest, when, and what was alive at its peak."""
    top = peaks.sort_values("peak_mib", ascending=False, kind="stable").iloc[0]
    others = [
        f"rank {r.rank}{_on(r.device, peaks)} {r.peak_mib:.1f}"
        for r in peaks.itertuples()
        if (r.rank, r.device) != (top["rank"], top["device"])
    ]
    where = (top["rank"], top["device"])
    mine = kinds[(kinds["rank"] == where[0]) & (kinds["device"] == where[1])].head(3)
    from_profiler = (lives["category_from"] == "profiler").mean() > 0.5
    said = "from the profiler's memory timeline" if from_profiler else "inferred from each allocation's phase and life"  # fmt: skip
    line = lines[(lines["rank"] == where[0]) & (lines["device"] == where[1])].iloc[0]
    step = "" if pd.isna(top["step"]) else f" (step {int(top['step'])}, {top['phase']})"
    text = (
        f"Rank {top['rank']}{_on(top['device'], peaks)} peaked highest: {top['peak_mib']:.1f} MiB "
        f"in use above where its trace began{step}"
    )
    text += f"; {', '.join(others)} MiB." if others else "."
    text += (
        f" Alive at that peak, by category ({said}): "
        + ", ".join(f"{r.category} {r.mib:.1f} MiB" for r in mine.itertuples())
        + f"; the most of it from `{line['line']}` ({line['mib']:.1f} MiB)."
    )
    return text


def _why_text(peaks: pd.DataFrame, kinds: pd.DataFrame, lines: pd.DataFrame) -> str:
    """Why the highest rank peaked above the lowest: the categories and the line it held more
    of; nothing where they peaked within the noise between runs of one job."""
    if kinds.empty:
        return ""
    top, low = (peaks.set_index(["rank", "device"]).loc[kinds.attrs[k]] for k in ("highest", "lowest"))  # fmt: skip
    gap = float(top["peak_mib"] - low["peak_mib"])
    if gap <= MEMORY_NOISE * float(top["peak_mib"]):
        return ""
    (rank, _), (other, _) = kinds.attrs["highest"], kinds.attrs["lowest"]
    more = [r for r in kinds.itertuples() if r.more_mib >= 0.01][:3]
    line = lines.iloc[0]
    if not more or line["more_mib"] < 0.01:
        return f"Rank {rank} peaked {gap:.1f} MiB above rank {other}."
    return (
        f"Rank {rank} peaked {gap:.1f} MiB above rank {other}: at its peak it held more "
        + ", ".join(f"{_named(r.category)} (+{r.more_mib:.1f} MiB)" for r in more)
        + f", the most of it from `{line['line']}` (+{line['more_mib']:.1f} MiB)."
    )


def _named(category: str) -> str:
    return "of no category" if category == "(none)" else category


def _on(device: str, peaks: pd.DataFrame) -> str:
    """`` on cuda:0`` where the traces have memory of more than one device, else nothing."""
    return f" on {device}" if peaks["device"].nunique() > 1 else ""


def _growth_text(growth: pd.DataFrame, ranks: list[int]) -> str:
    """Memory that grows step after step, the rank and the line; or that none does."""
    if growth.empty:
        return (
            "No rank's memory grows step after step: what each step allocated was freed by the "
            "trace's end, or allocated in one step only."
        )
    said = [
        f"rank {r.rank} keeps {r.mib_per_step:.2f} MiB a step{'' if r.device == 'cpu' else ' on ' + r.device} "
        f"allocated at `{r.line}` ({r.op}), never freed, in {r.steps} of {r.of_steps} steps"
        for r in growth.itertuples()
    ]  # fmt: skip
    calm = [r for r in ranks if r not in set(growth["rank"])]
    tail = f" Ranks {', '.join(map(str, calm))}: no growth." if len(calm) > 1 else ""
    tail = f" Rank {calm[0]}: no growth." if len(calm) == 1 else tail
    return "Memory grows step after step: " + "; ".join(said) + "." + tail


def _before_text(freed: pd.DataFrame) -> str:
    """The frees of blocks allocated before the trace began, where there were any."""
    freed = freed[freed["bytes"] > 0]
    if freed.empty:
        return ""
    said = ", ".join(f"rank {r.rank} {r.bytes / MIB:.1f} MiB" for r in freed.itertuples())
    return (
        f"Freed in the traces but allocated before they began (not counted as in use at their "
        f"start): {said}."
    )


def _cache_text(memory: pd.DataFrame, peaks: pd.DataFrame) -> str:
    """On a GPU, what the caching allocator held beyond what was allocated, at each peak."""
    gpu = peaks[peaks["device"].str.startswith("cuda")]
    said = []
    for r in gpu.itertuples():
        mine = memory[(memory["rank"] == r.rank) & (memory["device"] == r.device)]
        at = mine.iloc[(mine["time_us"] - r.at_us).abs().argmin()]
        said.append(f"rank {r.rank} {(at['reserved'] - at['allocated']) / MIB:.1f} MiB")
    if not said:
        return ""
    return (
        "Reserved by the caching allocator but not allocated at each GPU peak (its cache, "
        f"and fragmentation): {', '.join(said)}."
    )


def _table(peaks: pd.DataFrame, ends: pd.DataFrame, growth: pd.DataFrame, lines: pd.DataFrame) -> pd.DataFrame:  # fmt: skip
    """One row per rank and device: its peak, when, its end, its growth, its top line."""
    table = peaks.merge(ends[["rank", "device", "end_mib"]], on=["rank", "device"])
    grows = growth.groupby(["rank", "device"])["mib_per_step"].sum().rename("grows_mib_per_step")
    table = table.merge(grows, on=["rank", "device"], how="left").fillna({"grows_mib_per_step": 0.0})  # fmt: skip
    top = lines.groupby(["rank", "device"]).head(1).rename(columns={"line": "top_line_at_peak"})
    table = table.merge(top[["rank", "device", "top_line_at_peak"]], on=["rank", "device"], how="left")  # fmt: skip
    columns = ["rank", "device", "peak_mib", "step", "phase", "end_mib", "grows_mib_per_step", "top_line_at_peak"]  # fmt: skip
    return table[columns].set_index(["rank", "device"]).round(2)
