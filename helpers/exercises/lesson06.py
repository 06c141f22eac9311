"""The checks of lesson 6's exercises (``notebooks/06_rpc_num_worker_threads.ipynb``; worked
in ``solutions/06_solutions.ipynb``): the latency of 8 waiting calls on 4 threads, and the
smallest pool past which more threads add nothing, both against the learner's sweep."""

from __future__ import annotations

import json
from typing import Any

from .common import Check, arguments, close, number, spelled, whole, wrong_run

__all__ = ["CHECKS", "SCRIPTS", "FLAGS", "THREADS_SCRIPT", "LATENCY_FILE", "POOLS_6"]

#: The lesson's script: a sweep of RPC servers' pool sizes (--threads), calls in flight.
THREADS_SCRIPT = "rpc_threads.py"
#: The scripts these checks rely on, and the flags of rpc_threads.py they pass or read.
SCRIPTS = (THREADS_SCRIPT,)
FLAGS = ("--threads", "--calls", "--wait-ms")
#: What rpc_threads.py writes: the median latency per pool size (by_threads).
LATENCY_FILE = "latency.json"
#: The pool sizes exercise 6.1 sweeps (its statement).
POOLS_6 = {1, 2, 4, 8, 16}


def _sweep_of_eight_calls(run: Any) -> tuple[dict[int, float] | None, str]:
    """The median latency of 8 waiting calls per pool size of exercise 6.1's sweep, or
    ``(None, hint)`` when ``run`` is not that sweep."""
    asked = {"--threads": ",".join(map(str, sorted(POOLS_6))), "--calls": "8"}
    wrong = wrong_run(run, THREADS_SCRIPT, {"--calls": "8"}, defaults={"--wait-ms": "50"})
    pools = {whole(t) for t in (arguments(run).get("--threads") or "").split(",")}
    if wrong or not POOLS_6 <= pools:
        return None, wrong or (
            f"this sweep does not have every pool size the exercise asks for: launch "
            f"{THREADS_SCRIPT} with {spelled(asked)}"
        )
    path = run.run_dir / LATENCY_FILE
    if not path.is_file():
        return None, f"this run has no {LATENCY_FILE}: launch it again"
    data = json.loads(path.read_text())
    return {int(t): r["wait"]["median_ms"] for t, r in data["by_threads"].items()}, ""


def _eight_calls_on_four_threads(prediction_ms: Any, run: Any) -> tuple[bool, str]:
    """6.1: the latency of 8 waiting calls on 4 threads, against the sweep."""
    latency, wrong = _sweep_of_eight_calls(run)
    if latency is None:
        return False, wrong
    measured = latency[4]
    prediction = number(prediction_ms)
    if prediction is None or not close(prediction, measured, 0.2, 15):
        return False, (
            "4 threads run 4 of the calls at a time; each call sleeps 50 ms: how many "
            "rounds do 8 calls need?"
        )
    return True, f"measured {measured:.0f} ms: two rounds of 4 calls, 50 ms each"


def _enough_threads_for_eight_calls(threads: Any, run: Any) -> tuple[bool, str]:
    """6.2: the smallest pool within 10 % of the sweep's best latency."""
    latency, wrong = _sweep_of_eight_calls(run)
    if latency is None:
        return False, wrong
    best = min(latency.values())
    enough = min(t for t, ms in latency.items() if ms <= 1.1 * best)
    pool = whole(threads)
    if pool == enough:
        return True, (
            f"from {enough} threads on, 8 waiting calls take about {best:.0f} ms: one "
            f"call's time. More threads than calls in flight add nothing"
        )
    if pool not in latency:
        return False, f"answer with one of the sweep's pool sizes: {sorted(latency)}"
    if latency[pool] > 1.1 * best:
        return False, (
            f"at {pool} threads the batch still takes {latency[pool]:.0f} ms, more than "
            f"10 % above the best"
        )
    return False, (
        "a smaller pool already comes within 10 % of the best latency: compare the run's latencies"
    )


#: Lesson 6's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "06.1": _eight_calls_on_four_threads,
    "06.2": _enough_threads_for_eight_calls,
}
