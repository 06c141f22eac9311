"""The process group of each gloo collective in a trace, from the same ranks' Flight Recorders.

A gloo trace does not say which process group ran a collective: ``gloo:all_reduce`` and
``c10d::allreduce_`` carry no group (torch 2.14; NCCL's ``record_param_comms`` does), so in a
job of many groups the i-th all-reduce of one rank and of another may be different groups'
collectives. The Flight Recorder names the group and its sequence number, and stamps each entry
with the time it was created, on the same clock as the profiler's events. Each collective in the
trace is the rank's latest Flight Recorder entry of the same operation created before it started
(the next one is created only once it returns, for collectives called without ``async_op``).
"""

from __future__ import annotations

import warnings

import pandas as pd

from .groups import group_members

__all__ = ["with_groups_from_flight_records"]


def with_groups_from_flight_records(events: pd.DataFrame, records: pd.DataFrame) -> pd.DataFrame:
    """``events`` (a run's, as ``load_run`` gives them) with ``process_group``, ``seq`` and
    ``group_size`` filled in for each gloo collective from ``records`` (the same run's Flight
    Recorder dumps, as :func:`load_flight_records` gives them): then ``collective_waits``,
    ``waiting_per_step``, ``find_straggler`` and ``waiting_per_group`` match each collective
    within its own group, by its sequence number.

    A collective with no entry created before it, or one whose entry is also claimed by an
    earlier collective (calls with ``async_op=True`` can start out of order), keeps no group; a
    warning says how many.
    """
    collectives = events["name"].astype(str).str.startswith("gloo:") & events["seq"].isna()
    entries = records[~records["p2p"].astype(bool)]
    entries = entries.assign(entry_us=entries["created_ns"] / 1e3, entry=range(len(entries)))
    found = pd.merge_asof(
        events.loc[collectives, ["rank", "name", "start_us"]]
        .astype({"name": str, "rank": "int64"})
        .reset_index()
        .sort_values("start_us"),
        entries[["rank", "op", "group", "seq", "entry_us", "entry"]]
        .astype({"rank": "int64"})
        .sort_values("entry_us"),
        left_on="start_us",
        right_on="entry_us",
        left_by=["rank", "name"],
        right_by=["rank", "op"],
        direction="backward",
    )
    claimed = found["entry"].notna() & ~found["entry"].duplicated(keep="first")
    unlabelled = int(len(found) - claimed.sum())
    if unlabelled:
        warnings.warn(
            f"{unlabelled} of {len(found)} gloo collectives have no Flight Recorder entry of "
            "their own (created before they started): they keep no process group",
            stacklevel=2,
        )
    found = found[claimed].set_index("index")
    sizes = {group: len(ranks) for group, ranks in group_members(records).items()}
    out = events.copy()
    groups = out["process_group"].astype("string")
    groups.loc[found.index] = found["group"].astype("string")
    out["process_group"] = groups.astype("category")
    out.loc[found.index, "seq"] = found["seq"].astype("Int64")
    out.loc[found.index, "group_size"] = found["group"].map(sizes).astype("Int64")
    return out
