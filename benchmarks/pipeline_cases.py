"""Benchmark: the critical path and the what-if through a pipeline's sends and receives (issue 48).
Every figure is measured in this one run.

Each case runs a three-stage pipeline on gloo (lesson 14's ``pipeline_job.py``, six micro-batches,
the stages' own work none) twice: with one stage slowed by a sleep in every forward (in a
``record_function`` of its own, ``slow_layer``), and without the delay. From the
first run's traces: the share of the slowed op's time that the critical path puts on that stage
(target: at least 80 %), and ``what_if`` without ``slow_layer`` against the second run's median
step (target: within 15 %). Then the bubble of three stages of equal work, measured
(:func:`helpers.stage_waits`) against the textbook's, for 2, 4 and 8 micro-batches.

    OMP_NUM_THREADS=1 python benchmarks/pipeline_cases.py [--repeats 1]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from repeated import run_cases  # noqa: E402

from helpers import critical_path, load_run, stage_waits, step_times, what_if  # noqa: E402
from helpers.jobs import launch, script_from_lesson  # noqa: E402

SCRIPT, LESSON = "pipeline_job.py", "14_pipelines.ipynb"
#: Per case: the schedule, the slowed stage and its delay (ms per micro-batch's forward).
CASES = {
    "1F1B, stage 1 slowed 20 ms": ("1f1b", 1, 20),
    "GPipe, stage 2 slowed 15 ms": ("gpipe", 2, 15),
}


def job(root: Path) -> Path:
    """The lesson's pipeline script in ``root``, written from the lesson the first time."""
    if not (root / SCRIPT).exists():
        script_from_lesson(SCRIPT, LESSON, dest=root)
    return root / SCRIPT


def measure(name: str, schedule: str, stage: int, delay_ms: float, root: Path) -> dict:
    """One case: the path's share of the delay on the slowed stage, the what-if without it and
    the run measured without it."""
    args = ["--schedule", schedule, "--slow-rank", str(stage), "--delay-name", "slow_layer", "--work-ms", "0"]  # fmt: skip
    slowed, fixed = (
        launch(
            job(root),
            3,
            experiment=f"{schedule}{i}",
            args=[*args, "--delay-ms", str(ms)],
            echo=False,
            traces_root=root,
        )  # fmt: skip
        for i, ms in enumerate((delay_ms, 0))
    )
    events = load_run(slowed.run_dir, cache=False).events
    without = float(step_times(load_run(fixed.run_dir, cache=False).events).median(axis=1).median())  # fmt: skip
    path = critical_path(events)
    slow = events[(events["rank"] == stage).to_numpy() & (events["name"] == "slow_layer").to_numpy()]  # fmt: skip
    on_path = path[(path["rank"] == stage).to_numpy() & (path["name"] == "slow_layer").to_numpy()]
    predicted = float(what_if(events, rank=stage, name="^slow_layer$").median())
    return {
        "case": name,
        "step ms": round(float(step_times(events).median(axis=1).median()), 1),
        "delay on the path %": round(100 * on_path["dur_us"].sum() / slow["dur_us"].sum(), 1),
        "what-if ms": round(predicted, 1),
        "measured without ms": round(without, 1),
        "what-if error %": round(100 * abs(predicted - without) / without, 1),
    }


def bubbles(microbatches: list[int], root: Path, schedule: str = "gpipe") -> pd.DataFrame:
    """The bubble measured against the textbook's (p - 1) / (m + p - 1): three stages of equal
    work (10 ms a forward, 20 a backward, sleeps that leave the CPU free), ``m`` micro-batches
    each; the measured share of a step each stage waits for the others (its median over the
    steps, then over the stages)."""
    rows = []
    for m in microbatches:
        args = ["--schedule", schedule, "--microbatches", str(m), "--work-ms", "10"]
        run = launch(job(root), 3, experiment=f"bubble{m}", args=args, echo=False, traces_root=root)  # fmt: skip
        waits = stage_waits(load_run(run.run_dir, cache=False).events)
        share = float(waits.groupby("rank")["share"].median().median())
        rows.append({"schedule": schedule, "micro-batches": m, "textbook %": round(100 * 2 / (m + 2), 1),
                     "measured %": round(100 * share, 1)})  # fmt: skip
    return pd.DataFrame(rows)


def main() -> None:
    rows, repeats = run_cases(__doc__.splitlines()[0], CASES, measure, "pdp-pipeline-")
    table = pd.DataFrame(rows)
    medians = table.groupby("case", sort=False).median(numeric_only=True)
    medians["error of the medians %"] = (
        100 * (medians["what-if ms"] - medians["measured without ms"]).abs() / medians["measured without ms"]
    ).round(1)  # fmt: skip
    with pd.option_context("display.width", 200):
        print(table.to_string(index=False))
        print(medians.to_string())
    print(
        f"delay on the slowed stage's path, lowest: {table['delay on the path %'].min():.1f} % "
        f"(target: at least 80 %); what-if against the run without the delay (medians over "
        f"{repeats} runs of each; the runs without it vary too): "
        + ", ".join(f"{c} {e:.1f} %" for c, e in medians["error of the medians %"].items())
        + " (target: within 15 %)"
    )
    with tempfile.TemporaryDirectory(prefix="pdp-bubble-") as tmp:
        table = pd.concat([bubbles([2, 4, 8], Path(tmp), s) for s in ("gpipe", "1f1b")])
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
