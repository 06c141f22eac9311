"""The bandwidth a collective achieved, as nccl-tests defines it (algorithm and bus bandwidth),
from its transfer time across the ranks (:func:`.collectives.collective_waits`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .collectives import collectives_with_waits

__all__ = ["bus_factor", "collective_bandwidth"]


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
    waits = collectives_with_waits(events, names)
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
