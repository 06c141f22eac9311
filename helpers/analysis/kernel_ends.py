"""NCCL kernels matched across ranks by their order, checked against their times.

On a GPU trace without sequence numbers (PyTorch before about 2.4), the i-th NCCL kernel of a
name on one rank is not always the i-th on another: ranks begin profiling at different moments,
so one rank's window may open a collective or two after another's (TorchRec's ranks differ by 1
to 4 kernels). What the trace does give is time: a collective's kernels run at once on every
rank it joins. Each kernel starts when its rank arrives and spins until the last one has, then
all move the data, so every rank's kernel is still under way at the last arrival. Their ends
often agree within about 0.1 ms on one host, but not always: in the shared TorchRec runs, an
all-to-all's kernels ended up to 4 ms apart, the ranks that had less to receive first.

So each rank's kernels of one name (or of one collective, process group and size) are lined up
against a reference rank's by the shift under which the most pairs overlap in time, and a kernel
that was not under way at its instance's last arrival (its end before another's start) is
matched to none. Where no shift makes most pairs overlap (ranks on several hosts, whose clocks
differ by more than a kernel lasts), the kernels stay matched by order alone, as
:func:`helpers.matched_collectives` says.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["CHECKED_BY_TIME", "SLACK_US", "align_by_time"]

#: How ``matched_by`` says a kernel was matched by order checked against the kernels' times.
CHECKED_BY_TIME = "order, checked against the kernels' times"
#: The largest shift tried beyond the difference in counts (kernels missing inside a window
#: are not expected: windows differ at their edges).
_SLACK = 4
#: How long before another rank's kernel of its instance began a kernel may have ended (µs): a
#: small send or receive of an all-to-all ends once its own data has moved, and in the shared
#: TorchRec runs such kernels ended up to 40 µs before the last rank's began.
SLACK_US = 100.0
#: Where the indices of kernels matched to none begin (below every shifted index).
_ALONE = -(10**9)


def align_by_time(matched: pd.DataFrame, gpu: np.ndarray, point_to_point: np.ndarray) -> pd.DataFrame:  # fmt: skip
    """``matched`` (:func:`helpers.matched_collectives`' rows, with ``key`` and ``index``) with
    the GPU kernels among them (``gpu``, a mask) that carry no sequence number re-numbered: for
    each key, each rank's kernels shifted against the rank with the most (see the module), and
    ``matched_by`` set to :data:`CHECKED_BY_TIME`; a kernel that ended before another of its
    instance began gets an index of its own (matched to none). Keys under which no shift makes
    most pairs overlap are left as they were, and so are the kernels of sends and receives
    (``point_to_point``, a mask) unless every rank of the job is here: an all-to-all's
    ``SendRecv`` kernels run at once on every rank, but two ranks of many may each be sending
    to a third at the same moment."""
    everyone = matched["rank"].nunique() >= matched.attrs.get("world_size", np.inf)
    by_order = gpu & (matched["matched_by"].astype(str) != "sequence number").to_numpy()
    by_order &= everyone | ~point_to_point
    if not by_order.any() or matched["rank"].nunique() < 2:
        return matched
    matched = matched.copy()
    index = matched["index"].to_numpy().copy()
    checked = np.zeros(len(matched), dtype=bool)
    starts = matched["start_us"].to_numpy(dtype=float)
    ends = matched["end_us"].to_numpy(dtype=float)
    rows = np.flatnonzero(by_order)
    keys, ranks = matched["key"].to_numpy()[rows], matched["rank"].to_numpy()[rows]
    for key in pd.unique(keys):
        mine = rows[keys == key]  # in the order of matched: by rank, then start
        per_rank = {r: mine[ranks[keys == key] == r] for r in pd.unique(ranks[keys == key])}
        shifts = _shifts(per_rank, starts, ends)
        if shifts is None:
            continue
        for rank, at in per_rank.items():
            index[at] = np.arange(len(at)) - shifts[rank]
        for members in pd.Series(mine).groupby(index[mine]).agg(list):
            alone = _not_under_way(np.asarray(members), starts, ends)
            index[alone] = _ALONE - alone  # an instance of its own each
        checked[mine] = True
    matched["index"] = index
    said = matched["matched_by"].astype(str).where(~checked, CHECKED_BY_TIME)
    matched["matched_by"] = pd.Categorical(said)
    return matched


def _shifts(per_rank: dict, starts: np.ndarray, ends: np.ndarray) -> dict | None:
    """Per rank, the shift of its kernels against the reference rank's (the rank with the most,
    the lowest of equals; shift d: its kernel j is the reference's j - d) under which the most
    pairs overlap in time, the smallest of equals; None where some rank's best shift leaves
    fewer than half of the pairs it makes overlapping."""
    reference = max(per_rank, key=lambda r: (len(per_rank[r]), -r))
    ref = per_rank[reference]
    shifts = {reference: 0}
    for rank, at in per_rank.items():
        if rank == reference:
            continue
        reach = abs(len(ref) - len(at)) + _SLACK
        best, best_score, pairs = 0, -1, 0
        for d in sorted(range(-reach, reach + 1), key=abs):
            lo, hi = max(0, d), min(len(at), len(ref) + d)
            if hi <= lo:
                continue
            a, b = at[lo:hi], ref[lo - d : hi - d]
            overlap = np.minimum(ends[a], ends[b]) - np.maximum(starts[a], starts[b])
            if (overlap > -SLACK_US).sum() > best_score:
                best, best_score, pairs = d, int((overlap > -SLACK_US).sum()), hi - lo
        if 2 * best_score < pairs or best_score <= 0:
            return None
        shifts[rank] = best
    return shifts


def _not_under_way(members: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The members of one instance (rows) to match to none so that every other one was under
    way at the last arrival (the latest start before the earliest end): while some ended
    before another began, the one farthest from the others' middle goes."""
    left = list(members)
    while len(left) > 1 and max(starts[left]) > min(ends[left]) + SLACK_US:
        middle = np.median((starts[left] + ends[left]) / 2)
        far = max(left, key=lambda r: max(starts[r] - middle, middle - ends[r]))
        left.remove(far)
    return np.setdiff1d(members, left) if len(left) > 1 else members[1:]
