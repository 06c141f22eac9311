"""The GPU work of a run as the builders of GPU waits read it (:mod:`.gpu_waits`): each work's
launch, stream and times per rank (:class:`GpuWork`), the CUDA runtime calls and the sync records
by their call, the edges found and how (:class:`FoundEdges`), and the op that launched each GPU
event (:func:`launching_ops`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...traces.kinds import GPU_CATEGORIES, NOT_WORK_KINDS, name_matches
from ..intervals import last_open
from .graph import EXACT, FROM_CALLS, FROM_TIMING, Edges
from .interval_arrays import IntervalArrays, last_rows
from .wakers import launch_calls, launched_on_a_gpu

__all__ = [
    "GpuWork",
    "FoundEdges",
    "runtime_calls",
    "records_by_call",
    "launching_ops",
]

_GPU = list(GPU_CATEGORIES)


@dataclass
class GpuWork:
    """A run's GPU work launched from the CPU, per rank: each work's interval ``row`` (its last),
    ``stream``, ``launch`` (when its launch call began), ``issued`` (when it returned; NaN where
    the call is not in the trace), ``start``, ``end``, and ``lane`` (the lane of its launch call;
    -1 where the call is not in the trace), sorted by launch."""

    row: np.ndarray
    stream: np.ndarray
    launch: np.ndarray
    issued: np.ndarray
    start: np.ndarray
    end: np.ndarray
    lane: np.ndarray

    @classmethod
    def of(cls, ev: pd.DataFrame, arrays: IntervalArrays, rank: int, calls: pd.DataFrame) -> GpuWork:  # fmt: skip
        """The GPU work of ``rank`` among ``ev``, whose launch calls are among ``calls``
        (the runtime calls of the rank, with ``lane_id``)."""
        work = launched_on_a_gpu(ev)
        work = work[(work["rank"] == rank).to_numpy()].sort_values("launch_us", kind="stable")
        rows = last_rows(arrays, work.index.to_numpy(np.int64))
        found = calls[["lane_id", "end_us"]].reindex(launch_calls(work, calls))
        lanes = found["lane_id"].fillna(-1).to_numpy(dtype=np.int64)
        issued = found["end_us"].to_numpy(dtype=float)
        kept = rows >= 0
        return cls(
            rows[kept],
            work["stream"].to_numpy(dtype=float)[kept],
            work["launch_us"].to_numpy(dtype=float)[kept],
            issued[kept],
            work["start_us"].to_numpy(dtype=float)[kept],
            arrays.end[rows[kept]],
            lanes[kept],
        )

    def last_before(self, t: float, stream: float | None = None, lane: int | None = None) -> int:
        """The position of the last work launched before ``t`` (on ``stream``, from ``lane``,
        where given); -1 for none."""
        mine = np.flatnonzero(self.launch < t)
        if stream is not None:
            mine = mine[self.stream[mine] == stream]
        if lane is not None:
            mine = mine[self.lane[mine] == lane]
        return int(mine[-1]) if len(mine) else -1

    def first_after(self, t: float, lane: int) -> int:
        """The position of the first work launched from ``lane`` after ``t``; -1 for none."""
        mine = np.flatnonzero((self.launch > t) & (self.lane == lane))
        return int(mine[0]) if len(mine) else -1


def runtime_calls(run, pattern: str | None = None) -> pd.DataFrame:
    """The run's CUDA runtime calls (matching ``pattern``) with their lane and last interval."""
    ev = run.ev
    calls = ev[(ev["kind"] == "cuda runtime").to_numpy()]
    if pattern is not None:
        calls = calls[name_matches(calls, pattern)]
    rows = last_rows(run.arrays, calls.index.to_numpy(np.int64))
    calls = calls[rows >= 0].assign(row=rows[rows >= 0])
    return calls.assign(lane_id=run.arrays.lane[calls["row"].to_numpy()])


def records_by_call(syncs: pd.DataFrame, kind: str) -> dict[tuple[int, float], tuple]:
    """The sync records of one ``kind`` (``Stream Sync``, ...) by their call's ``(rank,
    start)``: ``(stream, wait_stream, waits_for_us)`` (NaN where unknown)."""
    mine = syncs[(syncs["name"] == kind).to_numpy() & syncs["launch_us"].notna().to_numpy()]
    keys = zip(mine["rank"].tolist(), mine["launch_us"].tolist())
    values = zip(*(mine[c].to_numpy(dtype=float) for c in ("stream", "wait_stream", "waits_for_us")))  # fmt: skip
    return dict(zip(keys, values))


class FoundEdges:
    """Edges found of one dependency, by how each was found (:data:`.graph.EXACT`, ...)."""

    def __init__(self):
        self.found: dict[int, tuple[list, list]] = {how: ([], []) for how in (EXACT, FROM_CALLS, FROM_TIMING)}  # fmt: skip

    def add(self, source: int, target: int, how: int) -> None:
        sources, targets = self.found[how]
        sources.append(source)
        targets.append(target)

    def edges(self, dependency, lag=None) -> list[Edges]:
        return [Edges.of(*st, dependency, lag, inferred=how) for how, st in self.found.items()]


def launching_ops(ev: pd.DataFrame) -> pd.DataFrame:
    """Per GPU event of ``ev`` whose launch is in the trace (indexed by its label), what launched
    it, each looked up from its launch call once: ``launched_by``, the innermost event on the
    call's thread that encloses the call and is no CUDA runtime call (an ``aten::`` op, a
    ``record_function`` annotation), and ``launched_within``, the innermost ``record_function``
    annotation (``slow_op``; not a step, a collective, the optimizer's); ``""`` where none
    does."""
    columns = ["launched_by", "launched_within"]
    work = launched_on_a_gpu(ev)
    if work.empty:
        return pd.DataFrame(columns=columns, dtype=object)
    runtime = (ev["kind"] == "cuda runtime").to_numpy()
    ops = ~runtime & ~ev["kind"].isin(NOT_WORK_KINDS).to_numpy() & ~ev["cat"].isin(_GPU).to_numpy()  # fmt: skip
    labels = launch_calls(work, ev)
    known = labels >= 0
    call = ev.loc[labels[known]]
    queries = pd.DataFrame(
        {
            "label": work.index.to_numpy()[known],
            "rank": work["rank"].to_numpy()[known],
            "lane": call["lane"].astype(str).to_numpy(),
            "end": call["end_us"].to_numpy(dtype=float),
            "start": work["launch_us"].to_numpy(dtype=float)[known],
        }
    )
    annotation = (ev["kind"] == "annotation").to_numpy()
    found = {c: _innermost(ev[keep], queries) for c, keep in zip(columns, (ops, ops & annotation))}
    return pd.DataFrame(found, index=work.index[known]).fillna("")


def _innermost(ops: pd.DataFrame, queries: pd.DataFrame) -> pd.Series:
    """Per launch of ``queries`` (``label, rank, lane, start, end`` of its call), the name of
    the innermost of ``ops`` on the call's thread that encloses the call, by label; missing
    where none does."""
    found = []
    for (rank, lane), asked in queries.groupby(["rank", "lane"]):
        mine = ops[(ops["rank"] == rank).to_numpy() & (ops["lane"].astype(str) == lane).to_numpy()]
        if mine.empty:
            continue
        order = np.lexsort((-mine["end_us"].to_numpy(), mine["start_us"].to_numpy()))
        starts, ends = mine["start_us"].to_numpy()[order], mine["end_us"].to_numpy()[order]
        names = mine["name"].astype(str).to_numpy()[order]
        parent = last_open(np.arange(len(starts)) - 1, ends, starts)
        at = np.searchsorted(starts, asked["start"].to_numpy(), side="right") - 1
        # open until the call's end: ended before it, not at it
        at = last_open(at, ends, np.nextafter(asked["end"].to_numpy(), -np.inf), parent)
        held = at >= 0
        found += list(zip(asked["label"].to_numpy()[held], names[at[held]]))
    return pd.Series(dict(found), dtype=object)
