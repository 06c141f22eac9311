"""Questions of an RPC job: which node ran each event of a legacy-profiler trace, the calls
and the remote work they caused, whether each call encloses its work, and how many of a
server's threads (lanes) were busy at once.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..traces.kinds import event_names
from .intervals import merge_intervals

__all__ = ["RPC_CALL", "by_rpc_node", "rpc_calls", "enclosure", "max_parallel_lanes"]


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


def by_rpc_node(events: pd.DataFrame) -> pd.DataFrame:
    """The events of a legacy-profiler RPC trace with ``rank`` set to the node that ran each
    one: the caller's own events are node 0's, and the remote events it received sit on
    lanes named ``node_id:N, thread_id:T``. Draw the result with ``row_label="node"``."""
    lane = events["lane"].astype(str)
    node = pd.to_numeric(lane.str.extract(r"node_id:(\d+)")[0]).fillna(0).astype(np.int32)
    thread = lane.str.extract(r"thread_id:(\d+)")[0]
    named = lane.where(thread.isna(), "thread " + thread.fillna(""))  # "thread 4", not the raw tid
    return events.assign(rank=node.to_numpy(), lane=pd.Categorical(named))


#: The events that mark an RPC call on its caller (``rpc_async#aten::add(worker0 -> worker1)``,
#: ``rpc_remote#...``, ``rpc_sync#...``), the function it called in the group.
RPC_CALL = r"^rpc_(?:async|sync|remote)#(.*?)\("


def rpc_calls(events: pd.DataFrame) -> pd.DataFrame:
    """``events`` with the RPC calls told apart, for a legacy-profiler trace (after
    :func:`by_rpc_node`) or a caller's Kineto trace whose calls are marked the same way:
    ``call`` is the function a call's event called (``rpc_async#aten::add(worker0 -> worker1)``
    calls ``aten::add``), ``remote_op`` what a legacy trace's remote event ran (``<NA>`` for
    every other event). Each call, not its remote events, gets a lane of its own on its rank,
    ``call <function>``, numbered in the order they started when a function was called more
    than once; every other event keeps its lane."""
    name = event_names(events)
    called = name.str.extract(RPC_CALL)[0]
    remote = name.str.partition("#remote_op: ")[2].where(called.notna()).replace("", pd.NA)
    out = events.assign(call=called, remote_op=remote)
    calls = out[called.notna() & remote.isna()].sort_values("start_us", kind="stable")
    nth = calls.groupby(["rank", "call"]).cumcount() + 1
    times = calls.groupby(["rank", "call"])["call"].transform("size")
    label = ("call " + calls["call"]).where(
        times == 1, "call " + calls["call"] + " (" + nth.astype(str) + ")"
    )
    lane = out["lane"].astype(str)
    lane.loc[label.index] = label
    return out.assign(lane=pd.Categorical(lane))


def enclosure(calls: pd.DataFrame, work: pd.DataFrame, on: str) -> pd.DataFrame:
    """Each call beside the work it caused elsewhere: the rows of ``calls`` and ``work`` with
    the same value in column ``on`` (values found once on each side), times in ms on the run's
    axis (``rel_us``): ``on, call_start_ms, work_start_ms, work_end_ms, call_end_ms`` and
    ``inside``, true when the work began after its call and ended before it."""

    def span(frame: pd.DataFrame, prefix: str) -> pd.DataFrame:
        once = frame[~frame[on].duplicated(keep=False)]
        return pd.DataFrame(
            {
                on: once[on].to_numpy(),
                f"{prefix}_start_ms": once["rel_us"].to_numpy() / 1e3,
                f"{prefix}_end_ms": (once["rel_us"] + once["dur_us"]).to_numpy() / 1e3,
            }
        )

    table = span(calls, "call").merge(span(work, "work"), on=on).sort_values(on)
    table = table[[on, "call_start_ms", "work_start_ms", "work_end_ms", "call_end_ms"]]
    inside = (table["call_start_ms"] <= table["work_start_ms"]) & (
        table["work_end_ms"] <= table["call_end_ms"]
    )
    return table.assign(inside=inside).reset_index(drop=True)
