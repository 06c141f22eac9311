"""How much of each rank's communication ran hidden behind its computation
(:func:`communication_overlap`, HTA's comm/comp overlap), on a GPU trace (NCCL kernels under
other kernels) and on a CPU trace (gloo's spans under the ops of the other threads)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..traces.kinds import NOT_WORK_KINDS, name_matches
from .collectives import NCCL_KERNELS, collective_source
from .intervals import covered_us, merge_intervals

__all__ = ["communication_overlap"]


def _compute_events(events: pd.DataFrame, comm: pd.DataFrame, gpu: bool) -> pd.DataFrame:
    """Computation: GPU kernels other than NCCL's on a GPU trace. On a CPU trace, CPU ops on the
    threads that run no collective (``comm``: on gloo's own threads the ops are the collective's
    copies and reduction), less the ops that enclose an event of another kind: autograd's
    ``evaluate_function`` around a hook that all-gathers, say, which encloses its waiting too."""
    if gpu:
        return events[
            (events["kind"] == "gpu kernel").to_numpy() & ~name_matches(events, NCCL_KERNELS)
        ]
    busy = pd.MultiIndex.from_frame(comm[["rank", "lane"]].drop_duplicates())
    kept = events[~pd.MultiIndex.from_frame(events[["rank", "lane"]]).isin(busy)]
    compute = kept[(kept["kind"] == "compute").to_numpy()]
    marks = kept[~kept["kind"].isin(["compute", *NOT_WORK_KINDS]).to_numpy()]
    encloses = np.zeros(len(compute), dtype=bool)
    for (rank, lane), ops in compute.groupby(["rank", "lane"], observed=True):
        inside = np.sort(
            marks.loc[(marks["rank"] == rank) & (marks["lane"] == lane), "start_us"].to_numpy()
        )
        # events of one thread nest, so a mark that starts inside an op lies inside it
        first = np.searchsorted(inside, ops["start_us"].to_numpy(), side="right")
        after = np.searchsorted(inside, ops["end_us"].to_numpy(), side="left")
        encloses[compute.index.get_indexer(ops.index)] = after > first
    return compute[~encloses]


def communication_overlap(events: pd.DataFrame, names: str | None = None) -> pd.DataFrame:
    """How much of each rank's communication ran while computation ran too, per step.

    Communication: the collectives (:func:`collective_source`: NCCL kernels on a GPU trace);
    computation: the other GPU kernels on a GPU trace (any stream); on a CPU trace, the CPU ops
    on the threads that run no collective (gloo's threads run each collective's own copies and
    reduction: part of the communication), less those that enclose an annotation or a
    collective call (they enclose their waiting too).
    Both are wall time (overlaps within each counted once) of the events of that step (for
    kernels, the step that launched them). ``overlap`` is ``overlapped_ms / comm_ms``: 1.0 when
    every moment of communication was hidden behind computation (HTA's comm/comp overlap).

    Returns one row per rank and step: ``rank, step, comm_ms, overlapped_ms, overlap``.
    """
    pattern = collective_source(events).pattern if names is None else names
    comm = events[name_matches(events, pattern)].dropna(subset=["step"])
    compute = _compute_events(events, comm, gpu=pattern == NCCL_KERNELS).dropna(subset=["step"])
    rows = []
    for (rank, step), group in comm.groupby(["rank", "step"], observed=True):
        c_starts, c_ends = merge_intervals(group["start_us"], group["end_us"])
        work = compute[(compute["rank"] == rank) & (compute["step"] == step)]
        w_starts, w_ends = merge_intervals(work["start_us"], work["end_us"])
        comm_us = float((c_ends - c_starts).sum())
        overlapped_us = covered_us(c_starts, c_ends, w_starts, w_ends)
        rows.append((rank, step, comm_us / 1e3, overlapped_us / 1e3))
    table = pd.DataFrame(rows, columns=["rank", "step", "comm_ms", "overlapped_ms"])
    table["overlap"] = table["overlapped_ms"] / table["comm_ms"]
    return table.astype({"rank": int, "step": int})
