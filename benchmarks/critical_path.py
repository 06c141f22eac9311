"""Benchmark: the critical path and its replay on every recording of the series and on the real
traces that have steps (issue 35's figures). Every figure is measured in this one run.

For each run with profiler steps: its ranks and steps, how much of each step's wall time the path
covers (1.000: end to end, no gap, no overlap), the replay error (how far the dependency graph,
re-timed with the measured durations, is from the measured step times: median and largest over
the steps; target: within 3 %), and the seconds the path and the replay took. Then, for the runs
with more than one rank, how far the path strung together rank by rank (``summarise_run``) is
from the whole run's: the largest gap of any (rank, kind, op), in ms over the run.

    python benchmarks/critical_path.py
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from helpers import critical_path, load_run, path_summary, replay_error  # noqa: E402
from helpers.analysis.path.lanes import lane_intervals  # noqa: E402
from helpers.analysis.path.walk import step_windows  # noqa: E402
from helpers.analysis.rank_by_rank import summarise_run  # noqa: E402
from helpers.jobs.recorded import RECORDINGS_ROOT  # noqa: E402
from helpers.traces import TraceError  # noqa: E402

REAL = REPO.parent / "shared" / "real-traces" / "hta"
REAL_RUNS = {
    "real: ns_resolution_trace (1 GPU)": [REAL / "ns_resolution_trace"],
    "real: nccl_parser_config (1 GPU, NCCL)": [REAL / "nccl_parser_config"],
    "real: trace_filter (2 of 128 GPUs)": sorted((REAL / "trace_filter").glob("*.json.gz")),
}


def runs() -> dict[str, list[Path]]:
    """Every recording's folder, by experiment, and the real traces that are present."""
    found = {}
    for manifest in sorted(RECORDINGS_ROOT.glob("*/recording.json")):
        found[json.loads(manifest.read_text())["key"]["experiment"]] = [manifest.parent]
    found.update({name: files for name, files in REAL_RUNS.items() if all(f.exists() for f in files) and files})  # fmt: skip
    return found


def coverage(path: pd.DataFrame, events: pd.DataFrame) -> pd.Series:
    """Per step, the path's time over the step's wall time."""
    steps = events[(events["kind"] == "step").to_numpy()].dropna(subset=["step"])
    walls = {
        s: hi - lo for s, lo, hi in step_windows(steps[["rank", "step", "start_us", "end_us"]])
    }
    return path.groupby("step")["dur_us"].sum() / pd.Series(walls)


def by_op(table: pd.DataFrame) -> pd.Series:
    return table.set_index(["rank", "kind", "name"])["ms"]


def measure(name: str, source: list[Path]) -> dict | None:
    """The figures of one run; None when it has no steps to follow."""
    try:
        events = load_run(source if len(source) > 1 else source[0], cache=False, progress=False).events  # fmt: skip
    except TraceError:
        return None
    if not (events["kind"] == "step").any():
        return None
    t0 = time.perf_counter()
    lanes = lane_intervals(events)
    path = critical_path(events)
    t1 = time.perf_counter()
    error = replay_error(events, lanes)
    t2 = time.perf_counter()
    covered = coverage(path, events)
    row = {
        "run": name,
        "ranks": int(events["rank"].nunique()),
        "steps": len(covered),
        "coverage min": round(float(covered.min()), 4),
        "coverage max": round(float(covered.max()), 4),
        "replay error median %": round(100 * float(error.median()), 2),
        "replay error max %": round(100 * float(error.max()), 2),
        "path s": round(t1 - t0, 2),
        "replay s": round(t2 - t1, 2),
    }
    if row["ranks"] > 1:
        whole = by_op(path_summary(path, ["kind", "name"]))
        strung = by_op(summarise_run(source if len(source) > 1 else source[0], workers=1, cache=False, progress=False).path_summary())  # fmt: skip
        gap = (whole.reindex(whole.index.union(strung.index), fill_value=0.0)
               - strung.reindex(whole.index.union(strung.index), fill_value=0.0)).abs()  # fmt: skip
        row["rank by rank, largest gap ms"] = round(float(gap.max()), 2)
    return row


def main() -> None:
    rows = []
    with warnings.catch_warnings():  # the loader's notes on each recording are not the figures
        warnings.simplefilter("ignore")
        for name, source in runs().items():
            row = measure(name, source)
            if row is not None:
                rows.append(row)
    table = pd.DataFrame(rows).set_index("run")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string())
    worst = table["replay error max %"]
    print(
        f"replay error over {len(table)} runs: median of the medians "
        f"{table['replay error median %'].median():.2f} %, largest {worst.max():.2f} % "
        f"({worst.idxmax()}); runs within 3 % in every step: {(worst <= 3).sum()} of {len(table)}"
    )
    print(
        f"path coverage of every step: {table['coverage min'].min():.4f} to "
        f"{table['coverage max'].max():.4f}"
    )


if __name__ == "__main__":
    main()
