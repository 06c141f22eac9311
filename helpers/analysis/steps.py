"""Where a run's time goes, per rank: the length of each step, wall time per kind of event,
the heaviest ops, and time per line of the script that made them.

All take the ``events`` DataFrame of ``load_run(...)`` and return small DataFrames in
milliseconds. Time "per kind" is wall time: where events of one kind overlap (nested ops,
collectives on several threads at once) the overlap counts once (:mod:`.intervals`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..traces.kinds import KIND_NAMES, NOT_WORK_KINDS, event_names
from .intervals import busy_ms_per_group

__all__ = ["step_times", "time_per_kind", "top_ops", "time_by_source_line"]


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
        else events[~events["kind"].isin(NOT_WORK_KINDS)]
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
    if python["call_from"].isna().all():
        raise ValueError(
            "the python_function events of these traces do not say where each call was made "
            "(args 'CallFrom': torch 2.14.1 records it, torch 2.11 did not): record them with "
            "the torch the series pins (make install)"
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
