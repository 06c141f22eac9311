"""Summaries of a run's events that the lessons reuse.

All take the ``events`` DataFrame of ``load_run(...)`` and return small DataFrames
in milliseconds. Time "per kind" is wall time: where events of one kind overlap
(nested ops, collectives on several threads at once) the overlap counts once
(:mod:`helpers.intervals`).

Here: step times, time per kind, the heaviest ops, time per source line, the GPU's idle
time, parallel lanes, shifting ranks' clocks and RPC nodes. The collectives (waiting, the
straggler, overlap, bandwidth, clock offsets) live in :mod:`helpers.collectives`; their names
are importable from here too.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from .collectives import (
    COLLECTIVE_NAMES,
    NCCL_KERNELS,
    bus_factor,
    clock_offsets,
    collective_bandwidth,
    collective_source,
    collective_waits,
    communication_overlap,
    find_straggler,
    waiting_per_step,
)
from .intervals import busy_ms, busy_ms_per_group, merge_intervals
from .kinds import KIND_NAMES, event_names

__all__ = [
    "merge_intervals",
    "busy_ms",
    "step_times",
    "time_per_kind",
    "top_ops",
    "time_by_source_line",
    "COLLECTIVE_NAMES",
    "NCCL_KERNELS",
    "collective_source",
    "collective_waits",
    "waiting_per_step",
    "communication_overlap",
    "collective_bandwidth",
    "bus_factor",
    "gpu_idle_time",
    "find_straggler",
    "max_parallel_lanes",
    "clock_offsets",
    "shift_ranks",
    "by_rpc_node",
]


def step_times(events: pd.DataFrame) -> pd.DataFrame:
    """Duration in ms of each ``ProfilerStep#N`` (rows: step, columns: rank)."""
    steps = events[events["kind"] == "step"]
    if steps.empty:
        raise ValueError(
            "no ProfilerStep#N events: step times need a profiler schedule "
            "(torch.profiler.schedule) and prof.step() after each step"
        )
    table = steps.assign(step_ms=steps["dur_us"] / 1e3).pivot_table(
        index="step", columns="rank", values="step_ms", aggfunc="sum", observed=True
    )
    table.columns.name = "rank"
    return table


def time_per_kind(events: pd.DataFrame, kinds: list[str] | None = None) -> pd.DataFrame:
    """Wall time in ms per kind of event per rank (rows: rank, columns: kind).

    Steps and ``other`` are left out unless named in ``kinds``.
    """
    ev = (
        events[events["kind"].isin(kinds)]
        if kinds
        else events[~events["kind"].isin(["step", "other"])]
    )
    table = busy_ms_per_group(ev, ["rank", "kind"]).unstack("kind", fill_value=0.0)
    table.columns = table.columns.astype(str)
    order = [k for k in KIND_NAMES if k in table.columns]
    return table[order].rename_axis(index="rank", columns=None)


def top_ops(events: pd.DataFrame, n: int = 10, kind: str | None = "compute") -> pd.DataFrame:
    """The ``n`` events with the most total time on each rank (inclusive of nested ones).

    Columns: rank, name, calls, total_ms, mean_ms; one block of ``n`` rows per rank.
    """
    ev = events if kind is None else events[events["kind"] == kind]
    table = (
        ev.groupby(["rank", "name"], observed=True)["dur_us"]
        .agg(calls="count", total_us="sum")
        .reset_index()
    )
    table["total_ms"] = table.pop("total_us") / 1e3
    table["mean_ms"] = table["total_ms"] / table["calls"]
    table["name"] = event_names(table)
    return (
        table.sort_values(["rank", "total_ms"], ascending=[True, False])
        .groupby("rank")
        .head(n)
        .reset_index(drop=True)
    )


def time_by_source_line(events: pd.DataFrame, script: str, kind: str = "compute") -> pd.DataFrame:
    """Wall time of ``kind`` events (CPU ops by default) per line of ``script`` they came from.

    Needs a trace recorded with ``with_stack=True``: the profiler then records every Python
    function that ran, as an event enclosing the ops it caused, with ``call_from``, the
    ``file:line`` that called it. An op is charged to the line of ``script`` that made the
    innermost such call around it on its thread: every op of a forward pass to the line
    ``ddp_model(images)``, every op of the backward pass to ``loss.backward()``.

    Returns one row per rank and line, the heaviest first: ``rank, line`` (``script:N``),
    ``ops`` (events charged to it) and ``ms`` (their wall time, nested ops counted once).
    """
    python = events[(events["cat"] == "python_function").to_numpy()]
    if python.empty:
        raise ValueError(
            "no python_function events: record the trace with with_stack=True to see which "
            "lines of your code the ops came from"
        )
    prefix = script.rsplit("/", 1)[-1] + ":"
    calls = python[
        python["call_from"].astype(str).str.rsplit("/", n=1).str[-1].str.startswith(prefix)
    ]
    ops = events[(events["kind"] == kind).to_numpy()]
    charged = []
    for (rank, lane), frames in calls.groupby(["rank", "lane"], observed=True):
        mine = ops[((ops["rank"] == rank) & (ops["lane"] == lane)).to_numpy()]
        starts, ends = mine["start_us"].to_numpy(), mine["end_us"].to_numpy()
        line = np.full(len(mine), None, dtype=object)
        frames = frames.sort_values("dur_us", ascending=False)  # outer calls first, inner win
        for start, end, site in zip(frames["start_us"], frames["end_us"], frames["call_from"]):
            line[(starts >= start) & (ends <= end)] = str(site).rsplit("/", 1)[-1]
        charged.append(mine.assign(line=line).dropna(subset=["line"]))
    if not charged:
        return pd.DataFrame(columns=["rank", "line", "ops", "ms"])
    charged = pd.concat(charged)
    table = (
        charged.groupby(["rank", "line"])
        .agg(ops=("name", "size"))
        .join(busy_ms_per_group(charged, ["rank", "line"]).rename("ms"))
    )
    return (
        table.reset_index()
        .sort_values(["rank", "ms"], ascending=[True, False])
        .reset_index(drop=True)
    )


# -------------------------------------------------------- GPU streams and lanes


GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")


def gpu_idle_time(events: pd.DataFrame) -> pd.DataFrame:
    """How long each GPU stream sat idle in each step, per rank.

    A step's GPU window on a rank runs from the first to the last moment any of its streams
    worked on that step's kernels, memcpys and memsets (those its CPU code launched). A
    stream is idle in the window when none of its work of that step runs.

    Returns one row per rank, step and stream: ``rank, step, stream, window_ms, busy_ms,
    idle_ms, idle_fraction``; empty for a trace without GPU events.
    """
    work = events[events["cat"].astype(str).isin(GPU_WORK).to_numpy()].dropna(subset=["step"])
    rows = []
    for (rank, step), group in work.groupby(["rank", "step"], observed=True):
        window_us = float(group["end_us"].max() - group["start_us"].min())
        for stream, lane in group.groupby("stream", observed=True):
            busy_us = busy_ms(lane["start_us"], lane["end_us"]) * 1e3
            rows.append((rank, step, stream, window_us / 1e3, busy_us / 1e3))
    table = pd.DataFrame(rows, columns=["rank", "step", "stream", "window_ms", "busy_ms"])
    table["idle_ms"] = table["window_ms"] - table["busy_ms"]
    table["idle_fraction"] = table["idle_ms"] / table["window_ms"]
    return table.astype({"rank": int, "step": int, "stream": int})


def max_parallel_lanes(events: pd.DataFrame) -> int:
    """The largest number of lanes (threads, streams) busy at the same moment.

    Within a lane, overlapping events (nested ops) count as one busy stretch.
    """
    starts, ends = [], []
    for _, lane in events.groupby(["rank", "lane"], observed=True):
        s, e = merge_intervals(lane["start_us"], lane["end_us"])
        starts.append(s)
        ends.append(e)
    if not starts:
        return 0
    times = np.concatenate(starts + ends)
    change = np.concatenate([np.ones(sum(map(len, starts))), -np.ones(sum(map(len, ends)))])
    order = np.lexsort((change, times))  # at equal times, an end comes before a start
    return int(np.cumsum(change[order]).max())


# ------------------------------------------------------------- clocks and nodes


def shift_ranks(events: pd.DataFrame, ranks: Iterable[int], offset_us: float) -> pd.DataFrame:
    """A copy of ``events`` with the given ranks' times moved by ``offset_us`` (as if their
    host's clock were that far ahead). ``rel_us`` moves with them and keeps its origin, so
    the shifted frame and the original share one time axis (a shifted event may then have a
    negative ``rel_us``). Shift by minus an estimate of :func:`clock_offsets` to correct a
    node's clock."""
    out = events.copy()
    mine = out["rank"].isin(list(ranks))
    for column in ("start_us", "end_us", "rel_us", "launch_us"):
        if column in out.columns:
            out.loc[mine, column] = out.loc[mine, column] + offset_us
    return out


def by_rpc_node(events: pd.DataFrame) -> pd.DataFrame:
    """The events of a legacy-profiler RPC trace with ``rank`` set to the node that ran each
    one: the caller's own events are node 0's, and the remote events it received sit on
    lanes named ``node_id:N, thread_id:T``. Draw the result with ``row_label="node"``."""
    lane = events["lane"].astype(str)
    node = pd.to_numeric(lane.str.extract(r"node_id:(\d+)")[0]).fillna(0).astype(np.int32)
    thread = lane.str.extract(r"thread_id:(\d+)")[0]
    named = lane.where(thread.isna(), "thread " + thread.fillna(""))  # "thread 4", not the raw tid
    return events.assign(rank=node.to_numpy(), lane=pd.Categorical(named))
