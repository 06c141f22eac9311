"""The clocks of several hosts: how far each node's clock is ahead of the first node's, read
from the collectives alone, and the ranks' events shifted to correct it.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from .collectives import matched_collectives

__all__ = ["clock_offsets", "shift_ranks"]


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
    ends = matched_collectives(events, names).pivot_table(
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
    for column in ("start_us", "end_us", "rel_us", "launch_us", "waits_for_us"):
        if column in out.columns:
            out.loc[mine, column] = out.loc[mine, column] + offset_us
    return out
