"""How far one sample of values moved from another, with an interval: the Hodges-Lehmann
shift of two runs' steps (their times, their memory peaks), used by :mod:`.compare` and
:mod:`.memory`."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

__all__ = ["step_shift", "ALPHA"]

#: The share of runs in which a run's interval may miss the true shift: 0.05 is a 95 % interval.
ALPHA = 0.05


def step_shift(
    before: np.ndarray, after: np.ndarray, alpha: float = ALPHA
) -> tuple[float, float, float]:
    """How far ``after``'s values moved from ``before``'s: ``(shift, low, high)``.

    ``shift`` is the median of the differences of every value of ``after`` against every value
    of ``before`` (the Hodges-Lehmann estimate); ``low`` and ``high`` are the k-th smallest and
    largest of those differences, with k the largest count that the Mann-Whitney statistic of
    two samples from one distribution stays below with probability at most ``alpha / 2``: an
    interval that holds the true shift in at least ``1 - alpha`` of runs whose values vary
    independently around their run's level. Raises ValueError with fewer than 2 values in
    either, or when no interval of that confidence exists for so few (at 95 %: 4 and 4 at
    least, or 3 and 5, or 2 and 8)."""
    before = np.asarray(before, dtype=float)
    after = np.asarray(after, dtype=float)
    n, m = len(before), len(after)
    if n < 2 or m < 2:
        raise ValueError(
            f"a shift needs at least 2 steps in each run ({n} before, {m} after): profile more "
            "steps (the profiler's schedule: active=...)"
        )
    differences = np.sort(np.subtract.outer(after, before).ravel())
    k = _mann_whitney_k(n, m, alpha)
    if k < 1:
        raise ValueError(
            f"{n} and {m} steps are too few for a {1 - alpha:.0%} interval: profile more steps"
        )
    return float(np.median(differences)), float(differences[k - 1]), float(differences[-k])


def _mann_whitney_k(n: int, m: int, alpha: float) -> int:
    """The largest k with P(U < k) <= alpha / 2, U the Mann-Whitney count of two samples of
    sizes ``n`` and ``m`` from one continuous distribution (exact up to 2,500 pairs, else the
    normal approximation)."""
    if n * m > 2500:
        z = NormalDist().inv_cdf(1 - alpha / 2)
        return max(0, math.floor(n * m / 2 - z * math.sqrt(n * m * (n + m + 1) / 12)))
    below = np.cumsum(_mann_whitney_distribution(n, m))  # P(U <= u)
    return int(np.searchsorted(below, alpha / 2 + 1e-12, side="right"))


def _mann_whitney_distribution(n: int, m: int) -> np.ndarray:
    """P(U = u) for u = 0..n*m: the recurrence p(i, j, u) = i/(i+j) p(i-1, j, u-j) +
    j/(i+j) p(i, j-1, u) (the last of the i+j values is one of the first sample's, above the j
    of the second, or one of the second's)."""
    rows = [np.ones(1) for _ in range(m + 1)]  # p(0, j, .): U = 0
    for i in range(1, n + 1):
        current = [np.zeros(1)] * (m + 1)
        current[0] = np.ones(1)  # p(i, 0, .): U = 0
        for j in range(1, m + 1):
            p = np.zeros(i * j + 1)
            p[j : j + len(rows[j])] += i / (i + j) * rows[j]
            p[: len(current[j - 1])] += j / (i + j) * current[j - 1]
            current[j] = p
        rows = current
    return rows[m]
