"""Summaries of a run's events that the lessons reuse.

All take the ``events`` DataFrame of ``load_run(...)`` and return small DataFrames
in milliseconds. Time "per kind" is wall time: where events of one kind overlap
(nested ops, collectives on several threads at once) the overlap counts once.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from .kinds import KIND_NAMES

__all__ = [
    "merge_intervals",
    "busy_ms",
    "step_times",
    "time_per_kind",
    "top_ops",
    "COLLECTIVE_NAMES",
    "NCCL_KERNELS",
    "collective_waits",
    "waiting_per_step",
    "find_straggler",
    "max_parallel_lanes",
    "clock_offsets",
    "shift_ranks",
    "by_rpc_node",
]


def merge_intervals(starts, ends, gap: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Join intervals that overlap or lie less than ``gap`` apart; returns sorted (starts, ends)."""
    starts = np.asarray(starts, dtype=float)
    ends = np.asarray(ends, dtype=float)
    if starts.size == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    # a new block starts where an interval begins after everything before it has ended
    new_block = np.empty(starts.size, dtype=bool)
    new_block[0] = True
    new_block[1:] = starts[1:] > reach[:-1] + gap
    first = np.flatnonzero(new_block)
    return starts[first], np.maximum.reduceat(ends, first)


def busy_ms(starts_us, ends_us) -> float:
    """Wall time covered by a set of intervals (µs in), overlaps counted once, in ms."""
    block_starts, block_ends = merge_intervals(starts_us, ends_us)
    return float((block_ends - block_starts).sum() / 1e3)


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


def _wall_ms(frame: pd.DataFrame, by: list[str], end_column: str = "end_us") -> pd.Series:
    """Wall time in ms per group of ``frame`` (from ``start_us`` to ``end_column``), overlaps
    within a group counted once."""
    if frame.empty:
        return pd.Series([], dtype=float, index=pd.MultiIndex.from_arrays([[]] * len(by), names=by))
    return frame.groupby(by, observed=True)[["start_us", end_column]].apply(
        lambda g: busy_ms(g["start_us"], g[end_column])
    )


def time_per_kind(events: pd.DataFrame, kinds: list[str] | None = None) -> pd.DataFrame:
    """Wall time in ms per kind of event per rank (rows: rank, columns: kind).

    Steps and ``other`` are left out unless named in ``kinds``.
    """
    ev = (
        events[events["kind"].isin(kinds)]
        if kinds
        else events[~events["kind"].isin(["step", "other"])]
    )
    table = _wall_ms(ev, ["rank", "kind"]).unstack("kind", fill_value=0.0)
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
    table["name"] = table["name"].astype(str)
    return (
        table.sort_values(["rank", "total_ms"], ascending=[True, False])
        .groupby("rank")
        .head(n)
        .reset_index(drop=True)
    )


#: Names of the collectives as the backends record them on the CPU (``gloo:all_reduce``,
#: ``nccl:all_reduce``). With NCCL the transfer runs in GPU kernels: pass
#: ``names=NCCL_KERNELS`` to analyse those instead.
COLLECTIVE_NAMES = r"^(?:gloo|nccl|mpi):"
NCCL_KERNELS = r"^nccl(?:Dev)?Kernel"


def _numbered_collectives(events: pd.DataFrame, names: str) -> pd.DataFrame:
    """The collectives whose name matches ``names``, each numbered (``index``) in the order
    it started on its rank, so that the i-th one can be matched across ranks."""
    ev = events[events["name"].astype(str).str.contains(names, regex=True)]
    ev = ev.sort_values(["rank", "start_us"]).copy()
    ev["name"] = ev["name"].astype(str)
    ev["index"] = ev.groupby(["rank", "name"]).cumcount()
    return ev


def collective_waits(events: pd.DataFrame, names: str = COLLECTIVE_NAMES) -> pd.DataFrame:
    """Split each collective into waiting and moving data, per rank.

    The i-th collective of a given name is matched across ranks. All ranks leave it at
    about the same moment, so the shortest duration among them approximates the
    transfer itself; the rest of each rank's duration is time spent waiting for the
    others. This needs no agreement between the ranks' clocks.

    Returns one row per collective and rank: ``name, index, rank, step, start_us,
    dur_us, transfer_us, wait_us``; collectives missing on some rank are left out.
    """
    ev = _numbered_collectives(events, names)
    ranks = ev["rank"].nunique()
    group = ev.groupby(["name", "index"])
    ev = ev[group["rank"].transform("nunique") == ranks]
    ev["transfer_us"] = ev.groupby(["name", "index"])["dur_us"].transform("min")
    ev["wait_us"] = ev["dur_us"] - ev["transfer_us"]
    return ev[
        ["name", "index", "rank", "step", "start_us", "dur_us", "transfer_us", "wait_us"]
    ].reset_index(drop=True)


def waiting_per_step(events: pd.DataFrame, names: str = COLLECTIVE_NAMES) -> pd.DataFrame:
    """Time each rank spent waiting in collectives, per step, in ms (rows: step, columns: rank).

    Waiting is the first ``wait_us`` of each collective (see :func:`collective_waits`).
    Collectives run on several threads at once, so the waiting intervals of one rank
    and step are joined and counted once: wall time, not a sum of durations.
    """
    waits = collective_waits(events, names).dropna(subset=["step"])
    waits["wait_end_us"] = waits["start_us"] + waits["wait_us"]
    table = _wall_ms(waits, ["step", "rank"], "wait_end_us").unstack("rank", fill_value=0.0)
    return table.rename_axis(index="step", columns="rank")


def find_straggler(events: pd.DataFrame, names: str = COLLECTIVE_NAMES) -> int:
    """The rank the others wait for: the one that waits least in collectives (median per step).

    It always names a rank, even in a run without a straggler (two ranks never wait exactly as
    long): compare the others' waiting with a normal run's before calling it a straggler.
    """
    waits = waiting_per_step(events, names)
    if waits.empty:
        raise ValueError(
            "no collectives inside profiler steps: a straggler can only be found in "
            "traces with ProfilerStep#N and gloo:/nccl: collectives"
        )
    return int(waits.median().idxmin())


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


def clock_offsets(
    events: pd.DataFrame, nodes: dict[int, list[int]], names: str = COLLECTIVE_NAMES
) -> dict[int, float]:
    """How far each node's clock is ahead of the first node's, in µs, from the traces alone.

    nodes: the ranks of each node, e.g. ``RunRecord.nodes``; the first node is the reference.

    The *i*-th collective of a name is the same operation on every rank, and it is over
    when its last rank leaves it. On each node the latest end of that collective marks
    that moment (earlier ends are ranks that had their result sooner), so the difference
    between two nodes' latest ends is the difference of their clocks, up to the time a
    message takes between them. The estimate is the median over all collectives.
    """
    ends = _numbered_collectives(events, names).pivot_table(
        index=["name", "index"], columns="rank", values="end_us"
    )
    for node, ranks in nodes.items():
        if not set(ranks) <= set(ends.columns):
            raise ValueError(f"node {node}: no collectives from its ranks {ranks}")
    reference, *_ = nodes
    base = ends[nodes[reference]].max(axis=1)
    return {
        node: float((ends[ranks].max(axis=1) - base).dropna().median())
        for node, ranks in nodes.items()
    }


def shift_ranks(events: pd.DataFrame, ranks: Iterable[int], offset_us: float) -> pd.DataFrame:
    """A copy of ``events`` with the given ranks' times moved by ``offset_us`` (as if their
    host's clock were that far ahead); ``rel_us`` is recomputed for the whole run. Shift by
    minus an estimate of :func:`clock_offsets` to correct a node's clock."""
    out = events.copy()
    mine = out["rank"].isin(list(ranks))
    for column in ("start_us", "end_us"):
        out.loc[mine, column] = out.loc[mine, column] + offset_us
    out["rel_us"] = out["start_us"] - out["start_us"].min()
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
