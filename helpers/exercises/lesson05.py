"""The checks of lesson 5's exercises (``notebooks/05_rpc_profiling.ipynb``; worked in
``solutions/05_solutions.ipynb``): how long a profiled RPC call lasts, and how many of six
concurrent calls each way of profiling records."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from ..traces import load_run, name_matches
from .common import Check, close, number, whole, wrong_run

__all__ = [
    "CHECKS",
    "SCRIPTS",
    "FLAGS",
    "RPC_SCRIPT",
    "WORKER_TRACES",
    "LEGACY_SUMMARY",
    "CALL_MARK",
    "SERVED_CALL",
]

#: The lesson's script: a caller (worker0) and a server (worker1), profiled in --part ways.
RPC_SCRIPT = "rpc_profiling.py"
#: The scripts these checks rely on, and the flags of rpc_profiling.py they pass or read.
SCRIPTS = (RPC_SCRIPT,)
FLAGS = ("--part", "--sleep-ms", "--concurrent", "--num-worker-threads")
#: The traces --part per-worker writes, the caller's and the server's, by rank.
WORKER_TRACES = {0: "worker0_trace.json", 1: "worker1_trace.json"}
#: What --part legacy writes: udf_calls_recorded, the calls the legacy profiler kept.
LEGACY_SUMMARY = "legacy_summary.json"
#: The caller's mark of every call of udf_with_ops (rpc_async#udf_with_ops...).
CALL_MARK = "#udf_with_ops"
#: The server's record_function around each call it serves (a regular expression).
SERVED_CALL = r"server: udf call \d+"


def _per_worker_events(run: Any) -> pd.DataFrame:
    """The events of both workers' traces of a --part per-worker run, in one frame."""
    return load_run(
        {r: run.run_dir / name for r, name in WORKER_TRACES.items()}, cache=False
    ).events


def _per_worker_files(run: Any) -> str | None:
    """A hint when the run lacks the two per-worker traces, else ``None``."""
    missing = [n for n in WORKER_TRACES.values() if not (run.run_dir / n).is_file()]
    return f"this run has no {missing[0]}: launch it again" if missing else None


def _how_long_a_profiled_call_lasts(prediction_ms: Any, run: Any) -> tuple[bool, str]:
    """5.1: the shortest marked call of 3 concurrent 50 ms calls, in ms."""
    asked = {"--part": "per-worker", "--sleep-ms": "50", "--concurrent": "3"}
    wrong = wrong_run(
        run, RPC_SCRIPT, asked, defaults={"--num-worker-threads": "4"}, nproc=2
    ) or _per_worker_files(run)
    if wrong:
        return False, wrong
    events = _per_worker_events(run)
    marks = events[(events["rank"] == 0).to_numpy() & name_matches(events, CALL_MARK)]
    if marks.empty:
        return False, "the caller's trace has no rpc_async#udf_with_ops marks: launch it again"
    shortest = float(marks["dur_us"].min()) / 1e3
    prediction = number(prediction_ms)
    if prediction is None:
        return False, "predict a number of milliseconds"
    if prediction <= 50:
        return False, (
            "the caller's mark lasts from sending the request until the reply arrives: "
            "longer than the server's 50 ms sleep alone"
        )
    if not close(prediction, shortest, 0.2, 5):
        return False, (
            "the mark runs from sending the request until the reply arrives: the "
            "server's work plus the time the messages take, and waiting for a free thread "
            "(the server has 4)"
        )
    return True, f"the shortest call lasted {shortest:.1f} ms: the 50 ms sleep plus a little"


def _six_concurrent_calls(counts: Any, legacy_run: Any, per_worker_run: Any) -> tuple[bool, str]:
    """5.2: how many of 6 concurrent calls each way of profiling recorded."""
    wrong = wrong_run(
        legacy_run, RPC_SCRIPT, {"--part": "legacy", "--concurrent": "6"}
    ) or wrong_run(per_worker_run, RPC_SCRIPT, {"--part": "per-worker", "--concurrent": "6"})
    if wrong:
        return False, wrong
    summary_path = legacy_run.run_dir / LEGACY_SUMMARY
    wrong = _per_worker_files(per_worker_run)
    if wrong or not summary_path.is_file():
        return False, wrong or f"the legacy run has no {LEGACY_SUMMARY}: launch it again"
    summary = json.loads(summary_path.read_text())
    events = _per_worker_events(per_worker_run)
    served = events[
        (events["rank"] == 1).to_numpy() & name_matches(events, rf"^(?:{SERVED_CALL})$")
    ]
    truth = {"legacy": summary["udf_calls_recorded"], "per_worker": len(served)}
    if not isinstance(counts, dict) or set(counts) != set(truth):
        return False, 'answer with {"legacy": ..., "per_worker": ...}'
    if whole(counts["legacy"]) != truth["legacy"]:
        return False, "count the legacy run's rpc_async#udf_with_ops events (udf_calls_recorded)"
    if whole(counts["per_worker"]) != truth["per_worker"]:
        return False, "count the 'server: udf call N' events in the server's trace (worker1)"
    return True, (
        f"the legacy profiler recorded {truth['legacy']} of 6 calls, every worker "
        f"profiling itself {truth['per_worker']} of 6"
    )


#: Lesson 5's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "05.1": _how_long_a_profiled_call_lasts,
    "05.2": _six_concurrent_calls,
}
