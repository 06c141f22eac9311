"""What fixing it would buy: the run re-timed with some work made shorter, from the dependencies
that :mod:`.lanes` reads in the traces.

Every interval of every lane keeps what it measured, and its place among the others:

- work (an op's own time, untraced time) lasts as long as it did, after the interval before it;
- a wait ends as long after its waker's end as it did (a thread resumes µs after what it
  waited for), and an issued event starts as long after its issuer's end as it did;
- a collective ends on every rank when its last rank has arrived, plus its transfer: its
  shortest duration across ranks.

:func:`replay_step_times` re-times the run as it was: the difference from the measured step
times (:func:`replay_error`) is what this model of the run misses; the per-rank jitter of a
collective's end is the main part of it. :func:`what_if` re-times it with one rank's chosen work
taking a fraction of its time (none, by default), and predicts the step times as measured less
what the change saves in the replay.

What the replay cannot know: work that would run faster or slower once the rest changes (two
ranks sharing a core free it for each other; a GPU kernel that no longer overlaps runs faster),
and work the traces do not hold. Lumos (MLSys 2025) replays a dependency graph built from traces
the same way, with GPU-specific rules, and reports 3.3 % replay error on average.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pandas as pd

from ..traces.kinds import name_matches
from .lanes import Lanes, lane_intervals

__all__ = ["replay_step_times", "replay_error", "what_if", "retime"]


def retime(lanes: Lanes, shrink: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """New ``(starts, ends)`` of every interval of ``lanes`` (:func:`.lanes.lane_intervals`):
    the run re-timed with each interval's own time multiplied by ``shrink`` (one factor per
    interval; 1 keeps it, 0 removes it: a removed wait ends as it begins)."""
    iv = lanes.intervals
    n = len(iv)
    s0, e0 = iv["start_us"].to_numpy(), iv["end_us"].to_numpy()
    shrink = np.ones(n) if shrink is None else shrink
    lane = iv["lane_id"].to_numpy()
    rule, after = iv["rule"].to_numpy(), iv["after"].to_numpy()
    first_of_lane = np.r_[True, lane[1:] != lane[:-1]]
    # node 2i: start of interval i, node 2i+1: its end
    preds: list[list[int]] = [[] for _ in range(2 * n)]
    for i in range(n):
        if not first_of_lane[i]:
            preds[2 * i].append(2 * (i - 1) + 1)
        preds[2 * i + 1].append(2 * i)
        if rule[i] in ("wait", "issued") and after[i] >= 0:
            preds[2 * i + 1].append(2 * after[i] + 1)
    instance_of = lanes.instance
    for rows in lanes.arrivals.values():
        for i in rows:
            preds[2 * i + 1] += [2 * j for j in rows if j != i]
    order = _topological(preds)
    start, end = s0.copy(), e0.copy()
    value = np.ravel(np.column_stack([s0, e0]))  # measured, for nodes left in a cycle
    for node in order:
        i, is_end = divmod(node, 2)
        if not is_end:
            value[node] = s0[i] if first_of_lane[i] else value[2 * (i - 1) + 1]
            start[i] = value[node]
            continue
        begin = value[2 * i]
        if shrink[i] == 0.0:
            value[node] = begin
        elif i in instance_of:
            rows = lanes.arrivals[instance_of[i]]
            last = max(value[2 * j] for j in rows)
            value[node] = max(begin, last + lanes.transfer_us[instance_of[i]])
        elif rule[i] in ("wait", "issued") and after[i] >= 0:
            value[node] = max(begin, value[2 * after[i] + 1] + (e0[i] - e0[after[i]]))
        else:
            value[node] = begin + shrink[i] * (e0[i] - s0[i])
        end[i] = value[node]
    return start, end


def _topological(preds: list[list[int]]) -> list[int]:
    """The nodes in an order where each comes after its predecessors (Kahn's algorithm); nodes
    left in a cycle (measured times that contradict each other by the wake-up tolerance) come
    last, in their own order."""
    n = len(preds)
    waiting = np.array([len(p) for p in preds])
    followers: list[list[int]] = [[] for _ in range(n)]
    for node, ps in enumerate(preds):
        for p in ps:
            followers[p].append(node)
    ready = deque(np.flatnonzero(waiting == 0).tolist())
    order: list[int] = []
    while ready:
        node = ready.popleft()
        order.append(node)
        for f in followers[node]:
            waiting[f] -= 1
            if waiting[f] == 0:
                ready.append(f)
    if len(order) < n:
        order += sorted(set(range(n)) - set(order))
    return order


def _step_durations(lanes: Lanes, start: np.ndarray, end: np.ndarray) -> pd.DataFrame:
    """Each rank's step durations (ms; rows: step, columns: rank) from re-timed intervals: a
    step begins where the interval that began it measured begins now, and ends likewise."""
    iv = lanes.intervals
    main = lanes.lanes.index[lanes.lanes["main"]]
    rows = []
    for rank_lane in main:
        mine = iv[iv["lane_id"] == rank_lane]
        rank = lanes.lanes.at[rank_lane, "rank"]
        steps = lanes.steps[lanes.steps["rank"] == rank]
        at_start = dict(zip(mine["start_us"], mine.index))
        at_end = dict(zip(mine["end_us"], mine.index))
        for step, s, e in zip(steps["step"], steps["start_us"], steps["end_us"]):
            if s in at_start and e in at_end:
                rows.append((int(step), rank, (end[at_end[e]] - start[at_start[s]]) / 1e3))
    table = pd.DataFrame(rows, columns=["step", "rank", "ms"])
    return table.pivot(index="step", columns="rank", values="ms").rename_axis(columns="rank")


def replay_step_times(events: pd.DataFrame, lanes: Lanes | None = None) -> pd.DataFrame:
    """The step times (ms; rows: step, columns: rank, as :func:`helpers.step_times`) of the run
    re-timed with everything as measured: how well the model reproduces the run."""
    lanes = lane_intervals(events) if lanes is None else lanes
    return _step_durations(lanes, *retime(lanes))


def replay_error(events: pd.DataFrame, lanes: Lanes | None = None) -> pd.Series:
    """Per step, how far the replayed step time is from the measured one, as a fraction of the
    measured (both the median over ranks): 0.01 is 1 %."""
    lanes = lane_intervals(events) if lanes is None else lanes
    return _error(replay_step_times(events, lanes), _measured_per_rank(lanes))


def _error(replayed: pd.DataFrame, measured: pd.DataFrame) -> pd.Series:
    replayed, measured = replayed.median(axis=1), measured.median(axis=1)
    return ((replayed - measured).abs() / measured).rename("replay error")


def _measured_per_rank(lanes: Lanes) -> pd.DataFrame:
    """The measured step times (ms; rows: step, columns: rank)."""
    steps = lanes.steps.assign(ms=(lanes.steps["end_us"] - lanes.steps["start_us"]) / 1e3)
    return steps.pivot_table(index="step", columns="rank", values="ms", aggfunc="sum")


def what_if(
    events: pd.DataFrame,
    rank: int,
    name: str,
    factor: float = 0.0,
    lanes: Lanes | None = None,
) -> pd.Series:
    """The step times predicted if some of one rank's events took a share of their time.

    Each rank's prediction is its measured step time less what the change saves in the replay
    (the replay with the change against the replay without it), so that what the model misses
    (:func:`replay_error`) is not counted as a saving. What the changed events enclosed goes
    with them.

    Args:
        events: a run's events (``load_run(...).events``).
        rank: the rank whose events change.
        name: a regular expression on event names (as ``re.search``; ``"^aten::mm$"`` for one
            op): the events of ``rank`` that change.
        factor: the share of their time they take: 0, by default, is no time.
        lanes: :func:`helpers.analysis.lanes.lane_intervals` of ``events``, when already made.

    Returns:
        The predicted step times in ms (the median over ranks), a Series indexed by step; its
        ``attrs`` hold the measured step times (``"measured"``) and the replay error per step
        (``"replay_error"``).

    Raises:
        ValueError: no event of ``rank`` matches ``name`` within its profiler steps.
    """
    lanes = lane_intervals(events) if lanes is None else lanes
    mine = events[(events["rank"] == rank).to_numpy() & name_matches(events, name)]
    iv = lanes.intervals
    shrink = np.ones(len(iv))
    lane_ids = dict(zip(zip(lanes.lanes["rank"], lanes.lanes["lane"]), lanes.lanes.index))
    hit = 0
    for lane, s, e in zip(mine["lane"], mine["start_us"], mine["end_us"]):
        lane_id = lane_ids.get((rank, lane))
        if lane_id is None:
            continue
        inside = (iv["lane_id"].to_numpy() == lane_id) & (iv["start_us"].to_numpy() >= s) & (iv["end_us"].to_numpy() <= e)  # fmt: skip
        shrink[inside] = factor
        hit += int(inside.any())
    if not hit:
        raise ValueError(
            f"no event of rank {rank} matches {name!r} within its profiler steps: name an event "
            "of that rank (a regular expression on event names, e.g. 'DataLoader' or "
            "'^aten::convolution_backward$')"
        )
    replayed = _step_durations(lanes, *retime(lanes))
    changed = _step_durations(lanes, *retime(lanes, shrink))
    measured = _measured_per_rank(lanes)
    predicted = (measured + changed - replayed).median(axis=1).rename("predicted step (ms)")
    predicted.attrs["measured"] = measured.median(axis=1)
    predicted.attrs["replay_error"] = _error(replayed, measured)
    return predicted
