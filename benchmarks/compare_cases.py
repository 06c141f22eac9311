"""Benchmark: two runs compared (issue 60). Every figure is measured in this one run.

Lesson 3's DDP job (``train_ddp.py``, 2 ranks on gloo, 6 profiled steps) is run in pairs:

- **unchanged pairs**: the same job twice; ``compare_runs`` should say "no change beyond the
  noise" (the false alarm rate is the share of pairs where it does not), with its allowance for
  what two runs differ by (``RUN_NOISE``), and from the steps' interval alone;
- **slowed pairs**: the job as it is, then with rank 1's batches loaded ``--delay-ms`` late; the
  delay should be inside the interval of the step's shift (with the allowance), and most of the change on rank 1's
  data loading, in the table and the verdict.

Then the H200 pair in ``../shared/real-traces/h200`` (``base-1`` against ``gpuslow-1``, rank 1's
slow op of GPU matmuls).

    python benchmarks/compare_cases.py [--pairs 10] [--slowed 3] [--delay-ms 50]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from helpers import compare_runs, load_run, within_noise  # noqa: E402
from helpers.jobs import launch, script_from_lesson  # noqa: E402

H200 = REPO.parent / "shared" / "real-traces" / "h200"
COMMON = ["--steps", "9", "--wait", "2", "--warmup", "1", "--active", "6"]


def events_of(root: Path, name: str, args: list[str]) -> pd.DataFrame:
    """One run of lesson 3's job under ``root``: its events."""
    run = launch(root / "train_ddp.py", 2, experiment=name, args=COMMON + args, echo=False, traces_root=root)  # fmt: skip
    return load_run(run.run_dir, cache=False).events


def row(case: str, before: pd.DataFrame, after: pd.DataFrame, added_ms: float | None) -> dict:
    """One comparison's figures: the shift, its interval, and where the change is."""
    compared = compare_runs(before, after)
    change = compared.steps.loc["change"]
    top = compared.held.iloc[0]
    loading = compared.held[(compared.held["rank"] == 1) & (compared.held["kind"] == "data loading")]  # fmt: skip
    return {
        "case": case,
        "shift ms": round(change["shift_ms"], 1),
        "interval ms": f"{change['low_ms']:+.1f} to {change['high_ms']:+.1f} ±{change['noise_ms']:.1f}",  # fmt: skip
        "noise, steps alone": bool(change["low_ms"] <= 0 <= change["high_ms"]),
        "noise": within_noise(change),
        "added inside": None
        if added_ms is None
        else bool(
            change["low_ms"] - change["noise_ms"]
            <= added_ms
            <= change["high_ms"] + change["noise_ms"]
        ),  # fmt: skip
        "on rank 1 data loading %": None
        if not added_ms
        else round(100 * loading["change_ms"].sum() / change["mean_ms"]),  # fmt: skip
        "top of the table": f"rank {top['rank']} {top['kind']}",
        "verdict": compared.verdict[:90],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=10, help="unchanged pairs")
    parser.add_argument("--slowed", type=int, default=3, help="slowed pairs")
    parser.add_argument("--delay-ms", type=int, default=50, help="rank 1's delay per step")
    opts = parser.parse_args()
    warnings.simplefilter("ignore")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pdp-compare-") as tmp:
        root = Path(tmp)
        script_from_lesson("train_ddp.py", "03_ddp_under_torchrun.ipynb", dest=root)
        for i in range(opts.pairs):
            runs = [events_of(root, f"same{i}{j}", []) for j in "ab"]
            rows.append(row("the same job twice", *runs, None))
        slow = ["--slow-rank", "1", "--delay-ms", str(opts.delay_ms)]
        for i in range(opts.slowed):
            runs = [events_of(root, f"base{i}", []), events_of(root, f"slow{i}", slow)]
            rows.append(row(f"rank 1's batch {opts.delay_ms} ms late", *runs, opts.delay_ms))
    h200 = [load_run(H200 / name, cache=False).events for name in ("base-1", "gpuslow-1")]
    gpu = compare_runs(*h200)
    table = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_colwidth", 90):
        print(table.drop(columns="verdict").to_string(index=False))
    same = table[table["case"] == "the same job twice"]
    slowed = table[table["case"] != "the same job twice"]
    print(f"\nthe same job twice: 'no change beyond the noise' in {same['noise'].sum()} of {len(same)} pairs (target: at least 9 of 10); from the steps' interval alone, without the allowance between runs: {same['noise, steps alone'].sum()}")  # fmt: skip
    if len(slowed):
        print(f"slowed pairs: the delay inside the interval in {slowed['added inside'].sum()} of {len(slowed)}; on rank 1's data loading {slowed['on rank 1 data loading %'].min()}-{slowed['on rank 1 data loading %'].max()} % of the change (target: at least 80 %)")  # fmt: skip
    change = gpu.steps.loc["change"]
    print(f"H200, base-1 against gpuslow-1: {gpu.verdict}")
    print(f"  shift {change['shift_ms']:+.1f} ms ({change['low_ms']:+.1f} to {change['high_ms']:+.1f})")  # fmt: skip


if __name__ == "__main__":
    main()
