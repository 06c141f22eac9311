"""Summaries of a run's events that the lessons reuse.

All take the ``events`` DataFrame of ``load_run(...)`` and return small DataFrames
in milliseconds. Time "per kind" is wall time: where events of one kind overlap
(nested ops, collectives on several threads at once) the overlap counts once.

The same questions get the same answers on both backends: the collective analyses read
what the trace holds (NCCL's kernels on a GPU trace, gloo's CPU spans on a CPU trace), and
every GPU event belongs to the step whose CPU code launched it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import numpy as np
import pandas as pd

from .kinds import KIND_NAMES

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
        .join(_wall_ms(charged, ["rank", "line"]).rename("ms"))
    )
    return (
        table.reset_index()
        .sort_values(["rank", "ms"], ascending=[True, False])
        .reset_index(drop=True)
    )


#: Names of the collectives as the backends record them on the CPU (``gloo:all_reduce``,
#: ``nccl:all_reduce``). With gloo (and MPI) these spans are the collective itself; with
#: NCCL they only queue the work on the GPU, in a few µs.
COLLECTIVE_NAMES = r"^(?:gloo|nccl|mpi):"
#: Names of NCCL's GPU kernels, where an NCCL collective waits for its peers and moves data.
NCCL_KERNELS = r"^nccl(?:Dev)?Kernel"

_MATCHED_BY = {
    "seq": "sequence number",
    "identity": "collective, process group and message size, in order",
    "order": "name and order on each rank",
}


def _name_matches(events: pd.DataFrame, pattern: str) -> np.ndarray:
    """Which events' names match ``pattern`` (each distinct name is tested once)."""
    names = events["name"]
    if isinstance(names.dtype, pd.CategoricalDtype):
        hits = names.cat.categories.str.contains(pattern, regex=True)
        codes = names.cat.codes.to_numpy()
        return np.append(np.asarray(hits, dtype=bool), False)[codes]
    return names.astype(str).str.contains(pattern, regex=True).to_numpy()


def collective_source(events: pd.DataFrame) -> tuple[str, str]:
    """Which events hold a run's collectives, read from the trace itself: ``(pattern, what)``.

    NCCL kernels on the GPU when the trace has them (there an NCCL collective waits and
    moves data); otherwise the CPU spans ``gloo:*`` / ``nccl:*`` / ``mpi:*`` (gloo's are the
    collective itself). A trace with ``nccl:*`` spans but no kernels was profiled without
    CUDA activity: its spans measure only the queueing, and a warning says so."""
    if _name_matches(events, NCCL_KERNELS).any():
        return NCCL_KERNELS, "NCCL kernels on the GPU"
    if _name_matches(events, r"^nccl:").any():
        warnings.warn(
            "this trace has nccl:* spans but no NCCL kernels: the CPU spans only queue the "
            "work, so waiting and transfer cannot be read from them. Profile with "
            "ProfilerActivity.CUDA to record the kernels",
            stacklevel=3,
        )
    return COLLECTIVE_NAMES, "CPU spans (gloo:, nccl:, mpi:)"


def _collectives(events: pd.DataFrame, names: str | None) -> pd.DataFrame:
    """The collectives (``names``, or :func:`collective_source`'s choice), each with a ``key``
    and an ``index`` that are equal for the same collective on every rank, and ``matched_by``.

    A collective is matched by what the trace records about it: its sequence number where
    present; else its collective name, process group and message size (the i-th such on
    each rank); else its event name (the i-th such on each rank)."""
    pattern = collective_source(events)[0] if names is None else names
    ev = events[_name_matches(events, pattern)].sort_values(["rank", "start_us"], kind="stable")
    ev = ev.assign(name=ev["name"].astype(str))
    label = ev["collective"].astype(str).where(ev["collective"].notna(), ev["name"])
    group = ev["process_group"].astype(str).where(ev["process_group"].notna(), "")
    by_seq = ev["seq"].notna().to_numpy()
    by_identity = ~by_seq & (ev["collective"].notna() & ev["msg_bytes"].notna()).to_numpy()
    rules = [by_seq, by_identity]
    how = np.select(rules, ["seq", "identity"], "order")
    key = np.select(
        rules,
        [
            "seq|" + label + "|" + group + "|" + ev["seq"].astype(str),
            "id|" + label + "|" + group + "|" + ev["msg_bytes"].astype(str),
        ],
        "order|" + ev["name"],
    )
    ev["key"] = key
    ev["matched_by"] = pd.Categorical([_MATCHED_BY[h] for h in how])
    ev["index"] = ev.groupby(["rank", "key"]).cumcount()
    return ev


def _on_every_rank(ev: pd.DataFrame) -> pd.DataFrame:
    """The collectives seen on every rank they belong to: all loaded ranks, or, where the
    trace gives the group's size, that many ranks (a collective of a smaller group)."""
    ranks = ev["rank"].nunique()
    seen = ev.groupby(["key", "index"])["rank"].transform("nunique")
    expected = ev["group_size"].astype("Float64").clip(upper=ranks).fillna(ranks).to_numpy()
    return ev[seen.to_numpy() >= expected]


def collective_waits(events: pd.DataFrame, names: str | None = None) -> pd.DataFrame:
    """Split each collective into waiting and moving data, per rank.

    names: a regular expression on event names; by default what the trace holds (NCCL
    kernels on a GPU trace, gloo's CPU spans on a CPU trace: :func:`collective_source`).

    The same collective is found on every rank (by sequence number, or collective, process
    group and size, or name and order: column ``matched_by``). All ranks leave it at about
    the same moment, so the shortest duration among them approximates the transfer itself;
    the rest of each rank's duration is time spent waiting for the others. This needs no
    agreement between the ranks' clocks. With one rank loaded, the transfer is its duration.

    Returns one row per collective and rank: ``name, index, rank, step, start_us, dur_us,
    transfer_us, wait_us, matched_by`` (and ``key``: what identifies the collective);
    collectives missing on some rank are left out. ``step`` is the step that launched a
    GPU kernel.
    """
    columns = ["name", "index", "rank", "step", "start_us", "dur_us", "transfer_us", "wait_us"]
    return _waits(events, names)[columns + ["matched_by", "key"]].reset_index(drop=True)


def _waits(events: pd.DataFrame, names: str | None) -> pd.DataFrame:
    """The matched collectives with every column of ``events``, ``transfer_us`` and ``wait_us``."""
    ev = _on_every_rank(_collectives(events, names))
    ev = ev.assign(transfer_us=ev.groupby(["key", "index"])["dur_us"].transform("min"))
    ev["wait_us"] = ev["dur_us"] - ev["transfer_us"]
    return ev


def waiting_per_step(events: pd.DataFrame, names: str | None = None) -> pd.DataFrame:
    """Time each rank spent waiting in collectives, per step, in ms (rows: step, columns: rank).

    Waiting is the first ``wait_us`` of each collective (see :func:`collective_waits`).
    Collectives run on several threads (or streams) at once, so the waiting intervals of
    one rank and step are joined and counted once: wall time, not a sum of durations.
    """
    waits = collective_waits(events, names).dropna(subset=["step"])
    waits["wait_end_us"] = waits["start_us"] + waits["wait_us"]
    table = _wall_ms(waits, ["step", "rank"], "wait_end_us").unstack("rank", fill_value=0.0)
    return table.rename_axis(index="step", columns="rank")


def find_straggler(events: pd.DataFrame, names: str | None = None) -> int:
    """The rank the others wait for: the one that waits least in collectives (median per step).

    It always names a rank, even in a run without a straggler (two ranks never wait exactly as
    long): compare the others' waiting with a normal run's before calling it a straggler.
    """
    waits = waiting_per_step(events, names)
    if waits.empty:
        raise ValueError(
            "no collectives inside profiler steps: a straggler can only be found in "
            "traces with ProfilerStep#N and collectives (gloo:/nccl: spans or NCCL kernels)"
        )
    return int(waits.median().idxmin())


# ------------------------------------------------------------- what the GPU did


def _covered(starts: np.ndarray, ends: np.ndarray, block_starts, block_ends) -> float:
    """µs of the intervals ``starts..ends`` covered by the disjoint, sorted blocks."""
    if not len(block_starts) or not len(starts):
        return 0.0
    cumulative = np.concatenate([[0.0], np.cumsum(block_ends - block_starts)])

    def covered_until(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(block_starts, t, side="right")  # blocks starting at or before t
        last = np.maximum(i - 1, 0)
        partial = np.clip(np.minimum(t, block_ends[last]) - block_starts[last], 0, None)
        return np.where(i > 0, cumulative[last] + partial, 0.0)

    return float((covered_until(ends) - covered_until(starts)).sum())


def _compute_events(events: pd.DataFrame, gpu: bool) -> pd.DataFrame:
    """Computation: GPU kernels other than NCCL's on a GPU trace, CPU ops on a CPU trace."""
    kind = "gpu kernel" if gpu else "compute"
    return events[(events["kind"] == kind).to_numpy() & ~_name_matches(events, NCCL_KERNELS)]


def communication_overlap(events: pd.DataFrame, names: str | None = None) -> pd.DataFrame:
    """How much of each rank's communication ran while computation ran too, per step.

    Communication: the collectives (:func:`collective_source`: NCCL kernels on a GPU trace);
    computation: the other GPU kernels on a GPU trace (any stream), CPU ops on a CPU trace.
    Both are wall time (overlaps within each counted once) of the events of that step (for
    kernels, the step that launched them). ``overlap`` is ``overlapped_ms / comm_ms``: 1.0 when
    every moment of communication was hidden behind computation (HTA's comm/comp overlap).

    Returns one row per rank and step: ``rank, step, comm_ms, overlapped_ms, overlap``.
    """
    pattern = collective_source(events)[0] if names is None else names
    comm = events[_name_matches(events, pattern)].dropna(subset=["step"])
    compute = _compute_events(events, gpu=pattern == NCCL_KERNELS).dropna(subset=["step"])
    rows = []
    for (rank, step), group in comm.groupby(["rank", "step"], observed=True):
        c_starts, c_ends = merge_intervals(group["start_us"], group["end_us"])
        work = compute[(compute["rank"] == rank) & (compute["step"] == step)]
        w_starts, w_ends = merge_intervals(work["start_us"], work["end_us"])
        comm_us = float((c_ends - c_starts).sum())
        overlapped_us = _covered(c_starts, c_ends, w_starts, w_ends)
        rows.append((rank, step, comm_us / 1e3, overlapped_us / 1e3))
    table = pd.DataFrame(rows, columns=["rank", "step", "comm_ms", "overlapped_ms"])
    table["overlap"] = table["overlapped_ms"] / table["comm_ms"]
    return table.astype({"rank": int, "step": int})


def bus_factor(collective: str, group_size: float) -> float:
    """nccl-tests' factor from algorithm to bus bandwidth for a collective of ``group_size``
    ranks: 2(n-1)/n for all-reduce; (n-1)/n for all-gather, reduce-scatter, all-to-all,
    gather and scatter; 1 for broadcast, reduce, send and receive; NaN when unknown."""
    name = collective.lower().replace("_", "")
    n = group_size
    if not n or n != n or "barrier" in name:
        return float("nan")
    if "allreduce" in name:
        return 2 * (n - 1) / n
    if any(k in name for k in ("allgather", "reducescatter", "alltoall", "gather", "scatter")):
        return (n - 1) / n
    if any(k in name for k in ("broadcast", "reduce", "send", "recv")):
        return 1.0
    return float("nan")


def collective_bandwidth(events: pd.DataFrame, names: str | None = None) -> pd.DataFrame:
    """Achieved bandwidth of each collective whose message size the trace records, per rank.

    As nccl-tests defines it: algorithm bandwidth ``algbw = size / time`` and bus bandwidth
    ``busbw = algbw * factor`` (:func:`bus_factor`: 2(n-1)/n for an all-reduce of n ranks), in
    GB/s (10^9 bytes). ``size`` is ``msg_bytes`` (the whole buffer); ``time`` is the
    collective's transfer time from :func:`collective_waits` (its shortest duration across
    the loaded ranks, so waiting for a late rank does not count; with one rank loaded it is
    that rank's duration, waiting included, and the bandwidth a lower bound).

    Returns ``name, collective, rank, step, msg_bytes, group_size, time_us, algbw_gbps,
    busbw_gbps``; empty when no collective records its size.
    """
    waits = _waits(events, names)
    sized = waits[waits["msg_bytes"].notna() & (waits["transfer_us"] > 0)]
    sized = sized[sized["msg_bytes"] > 0].rename(columns={"transfer_us": "time_us"})
    out = sized[["name", "collective", "rank", "step", "msg_bytes", "group_size", "time_us"]]
    out = out.assign(collective=out["collective"].astype(str))
    algbw = out["msg_bytes"].astype(float).to_numpy() / out["time_us"].to_numpy() / 1e3
    factor = [
        bus_factor(c, float(n)) if pd.notna(n) else float("nan")
        for c, n in zip(out["collective"], out["group_size"])
    ]
    return out.assign(algbw_gbps=algbw, busbw_gbps=algbw * np.asarray(factor, float)).reset_index(
        drop=True
    )


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


def clock_offsets(
    events: pd.DataFrame, nodes: dict[int, list[int]], names: str | None = None
) -> dict[int, float]:
    """How far each node's clock is ahead of the first node's, in µs, from the traces alone.

    nodes: the ranks of each node, e.g. ``RunRecord.nodes``; the first node is the reference.

    names: which events are the collectives; by default what the trace holds
    (:func:`collective_source`).

    A collective (matched across ranks as in :func:`collective_waits`) is over
    when its last rank leaves it. On each node the latest end of that collective marks
    that moment (earlier ends are ranks that had their result sooner), so the difference
    between two nodes' latest ends is the difference of their clocks, up to the time a
    message takes between them. The estimate is the median over all collectives.
    """
    ends = _collectives(events, names).pivot_table(
        index=["key", "index"], columns="rank", values="end_us"
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
