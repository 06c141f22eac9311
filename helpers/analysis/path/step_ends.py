"""A step's end as a node of the graph (:mod:`.graph`), like a collective's.

Each rank ends a step on its main lane (the lane of its steps, which :func:`.lanes.lane_intervals`
cuts at their bounds): at the end of the interval there that ends where the rank's step ends.
The step ends when the last of them did: an edge from each rank's end into a node of the step's
own (a *hub*, numbered past the collectives'), whose binding edge (:func:`.graph.binding_edges`,
the last arrival; of equal ends, the lowest rank) comes from the rank that ended the step last.
That is where the step's path begins, in the whole run's walk (:mod:`.walk`) and in the path
strung rank by rank (:mod:`.from_rank_parts`) alike: both ask :func:`last_to_end`. No moment
waits for a step's end, so the replay's times of every interval are the same with it as
without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from .dependencies import STEP_END
from .graph import Edges, Graph

__all__ = ["step_end_rows", "step_end_edges", "last_to_end"]


def step_end_rows(intervals: pd.DataFrame, steps: pd.DataFrame, main: Mapping[int, int]) -> dict[int, list[int]]:  # fmt: skip
    """Per step, the interval of each rank's main lane that ends where the rank ended the step
    (of several, the last), in the order of the ranks (a rank without one left out).

    Args:
        intervals: the run's intervals (:attr:`.lanes.Lanes.intervals`, sorted by lane then time).
        steps: each rank's steps (``rank, step, end_us``; of a step listed twice, its last end).
        main: each rank's main lane (rank -> lane_id).
    """
    lane = intervals["lane_id"].to_numpy()
    end = intervals["end_us"].to_numpy(float)
    rows: dict[int, list[int]] = {}
    for rank, ends in steps.groupby("rank", observed=True):  # rank after rank
        if int(rank) not in main:
            continue
        lo, hi = np.searchsorted(lane, main[int(rank)]), np.searchsorted(lane, main[int(rank)], side="right")  # fmt: skip
        at_end = ends.groupby("step", observed=True)["end_us"].max()
        found = lo + np.searchsorted(end[lo:hi], at_end.to_numpy(float), side="right") - 1
        for step, row, t in zip(at_end.index.tolist(), found.tolist(), at_end.tolist()):
            if row >= lo and end[row] == t:
                rows.setdefault(int(step), []).append(int(row))
    return dict(sorted(rows.items()))


def step_end_edges(run) -> list[Edges]:
    """``step end``: through a hub of its own per step (``run.new_hub()``: one for each step of
    :attr:`.lanes.Lanes.step_ends`, in its order), an edge from each rank's end of the step (in
    the order of the ranks) into it, with no delay. ``run``: the builders'
    :class:`.builders.LanesAndEvents`."""
    source, target = [], []
    for rows in run.lanes.step_ends.values():
        hub = run.new_hub()
        source += [2 * row + 1 for row in rows]
        target += [hub] * len(rows)
    return [Edges.of(source, target, STEP_END, 0.0)]


def last_to_end(graph: Graph, step_ends: Mapping[int, list[int]], steps: Iterable[int]) -> dict[int, int]:  # fmt: skip
    """Per step of ``steps``, the rank that ended it last: the rank of the node whose edge binds
    the step's hub in ``graph`` (of equal ends, the lowest rank). Where the step's path begins.

    Args:
        graph: the graph (its hubs of steps made by :func:`step_end_edges`, in the order of
            ``step_ends``; a rank may end two steps at one moment, with one interval).
        step_ends: step -> each rank's interval that ended it (:attr:`.lanes.Lanes.step_ends`).
        steps: the steps asked for.

    Raises:
        ValueError: the graph has not one hub for each step of ``step_ends`` (made without
            :func:`step_end_edges`), or a step asked for has no node of its end.
    """
    made = [step for step, rows in step_ends.items() if rows]
    hubs = np.unique(graph.target[graph.dependency == STEP_END.code])  # numbered as made
    if len(hubs) != len(made):
        raise ValueError(
            f"the graph has {len(hubs)} nodes of a step's end for {len(made)} steps: it was "
            "made without step_end_edges, or from other lanes"
        )
    missing = [step for step in steps if step not in made]
    if missing:
        raise ValueError(
            f"step(s) {missing[:5]}: no end of theirs is a node of the graph (no rank's main lane "
            "has an interval that ends where its step ends): please report it with the traces' "
            "first lines"
        )
    return dict(zip(made, graph.rank[graph.behind(hubs)].astype(int).tolist()))
