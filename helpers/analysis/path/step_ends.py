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

from collections.abc import Mapping

import numpy as np
import pandas as pd

from .dependencies import STEP_END
from .graph import Edges, Graph

__all__ = ["step_end_rows", "step_end_edges", "last_to_end"]


def step_end_rows(intervals: pd.DataFrame, steps: pd.DataFrame, main: Mapping[int, int]) -> dict[int, list[int]]:  # fmt: skip
    """Per step, the interval of each rank's main lane that ends where the rank ended the step,
    in the order of the ranks (a rank without one left out).

    Args:
        intervals: the run's intervals (:attr:`.lanes.Lanes.intervals`, sorted by lane then time).
        steps: each rank's steps (``rank, step, end_us``; of a step listed twice, its last end).
        main: each rank's main lane (rank -> lane_id).
    """
    lane = intervals["lane_id"].to_numpy()
    end = intervals["end_us"].to_numpy(float)
    rows: dict[int, list[int]] = {}
    ends = steps.groupby(["rank", "step"], observed=True)["end_us"].max()  # rank after rank
    for (rank, step), at_end in ends.items():
        if int(rank) not in main:
            continue
        lo, hi = np.searchsorted(lane, main[int(rank)]), np.searchsorted(lane, main[int(rank)], side="right")  # fmt: skip
        row = lo + int(np.searchsorted(end[lo:hi], at_end))
        if row < hi and end[row] == at_end:
            rows.setdefault(int(step), []).append(int(row))
    return dict(sorted(rows.items()))


def step_end_edges(run) -> list[Edges]:
    """``step end``: through a hub of its own per step (``run.new_hub()``), an edge from each
    rank's end of the step (:attr:`.lanes.Lanes.step_ends`, in the order of the ranks) into it,
    with no delay. ``run``: the builders' :class:`.builders.LanesAndEvents`."""
    source, target = [], []
    for rows in run.lanes.step_ends.values():
        hub = run.new_hub()
        source += [2 * row + 1 for row in rows]
        target += [hub] * len(rows)
    return [Edges.of(source, target, STEP_END, 0.0)]


def last_to_end(graph: Graph, step_ends: Mapping[int, list[int]]) -> dict[int, int]:
    """Per step of ``step_ends`` (step -> each rank's interval that ended it), the rank that
    ended it last: the rank of the node whose edge binds the step's hub in ``graph`` (of equal
    ends, the lowest rank). Where the step's path begins; a step without a hub in ``graph``
    (one whose builder was left out) is left out, and has no path."""
    into = graph.dependency == STEP_END.code
    hub_of = dict(zip((graph.source[into] // 2).tolist(), graph.target[into].tolist()))
    steps = [step for step, rows in step_ends.items() if rows and rows[0] in hub_of]
    hubs = np.array([hub_of[step_ends[step][0]] for step in steps], dtype=np.int64)
    return dict(zip(steps, graph.rank[graph.behind(hubs)].astype(int).tolist()))
