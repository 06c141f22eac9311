"""Benchmark: the what-if against runs measured without the cause, where subtracting the cause's
time from the step is wrong (issue 47). Every figure is measured in this one run.

Each case runs a tiny two-rank gloo job (``what_if_job.py``) twice: as it is, and with one
rank's chosen work removed (the fix). From the first run's traces, ``what_if`` predicts the
median step without that work; subtraction predicts the median step less the work's median time
per step. Both are compared with the second run's median step:

- two slowed ranks: removing the slower rank's delay buys only the difference, since the other
  rank's delay then holds the collective;
- work that overlaps a collective the other rank holds up: removing it buys nothing;
- work that overlaps it in part: removing it buys only what it ran past the other rank.

    python benchmarks/what_if_cases.py [--repeats 1]
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from repeated import run_cases  # noqa: E402

from helpers import load_run, step_times, what_if  # noqa: E402
from helpers.jobs import launch  # noqa: E402

JOB = REPO / "benchmarks" / "what_if_job.py"
H200 = REPO / "data" / "h200-job"
#: Per case: the job's arguments as it is, the rank and work removed, and the arguments without it.
CASES = {
    "two slowed ranks (120 and 60 ms): remove rank 0's delay": (
        ["--delay-ms", "120,60"], (0, "^load_batch$"), ["--delay-ms", "0,60"]),
    "rank 0 works 40 ms while rank 1 holds the collective 60 ms: remove that work": (
        ["--delay-ms", "0,60", "--overlap-ms", "40,0"], (0, "^overlapped$"), ["--delay-ms", "0,60"]),
    "rank 0 works 100 ms while rank 1 holds it 60 ms: remove that work": (
        ["--delay-ms", "0,60", "--overlap-ms", "100,0"], (0, "^overlapped$"), ["--delay-ms", "0,60"]),
}  # fmt: skip


def median_step(folder: Path) -> tuple[pd.DataFrame, float]:
    """The run's events and its median step (ms; the median over ranks of each step)."""
    events = load_run(folder, cache=False).events
    return events, float(step_times(events).median(axis=1).median())


def measure(name: str, before: list[str], removed: tuple[int, str], after: list[str], root: Path) -> dict:  # fmt: skip
    """One case: the step as it is, the what-if's and subtraction's predictions without the
    work, and the step measured without it."""
    rank, pattern = removed
    runs = [launch(JOB, 2, experiment=f"case{i}", args=a, echo=False, traces_root=root) for i, a in enumerate((before, after))]  # fmt: skip
    events, step = median_step(runs[0].run_dir)
    _, fixed = median_step(runs[1].run_dir)
    predicted = float(what_if(events, rank=rank, name=pattern).median())
    work = events[(events["rank"] == rank) & events["name"].astype(str).str.contains(pattern)]
    per_step = work.groupby("step")["dur_us"].sum() / 1e3
    subtracted = step - float(per_step.median())
    return {
        "case": name,
        "step ms": round(step, 1),
        "measured without ms": round(fixed, 1),
        "what-if ms": round(predicted, 1),
        "subtraction ms": round(subtracted, 1),
        "what-if error %": round(100 * abs(predicted - fixed) / fixed, 1),
        "subtraction error %": round(100 * abs(subtracted - fixed) / fixed, 1),
    }


def recorded_gpu_case() -> dict:
    """The series' H200 job (data/h200-job, recorded): rank 1's slow op taken out of the slowed
    run, against the run recorded without it."""
    slow, step = median_step(H200 / "gpuslow-1")
    _, fixed = median_step(H200 / "base-1")
    predicted = float(what_if(slow, rank=1, name="^slow_op$").median())
    return {
        "case": "H200, DDP over gloo: remove rank 1's slow op (its GPU matmuls)",
        "step ms": round(step, 1),
        "measured without ms": round(fixed, 1),
        "what-if ms": round(predicted, 1),
        "subtraction ms": float("nan"),
        "what-if error %": round(100 * abs(predicted - fixed) / fixed, 1),
        "subtraction error %": float("nan"),
    }


def main() -> None:
    rows, repeats = run_cases(__doc__.splitlines()[0], CASES, measure, "pdp-what-if-")
    table = pd.DataFrame([*rows, recorded_gpu_case()]).groupby("case", sort=False).median()
    with pd.option_context("display.width", 200, "display.max_colwidth", 80):
        print(table.to_string())
    print(
        f"what-if error, median over the cases: {table['what-if error %'].median():.1f} % "
        f"(target: within 15 %); subtraction: {table['subtraction error %'].median():.1f} %; "
        f"cases where subtraction is 30 % or more off: {(table['subtraction error %'] >= 30).sum()} of {len(table)}"  # fmt: skip
    )


if __name__ == "__main__":
    main()
