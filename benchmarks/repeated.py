"""What the case benchmarks share (``what_if_cases.py``, ``pipeline_cases.py``): each case run
``--repeats`` times, in a temporary folder, one row of figures per run."""

from __future__ import annotations

import argparse
import tempfile
import warnings
from collections.abc import Callable
from datetime import date
from pathlib import Path

import pandas as pd

#: The what-if's predictions checked against runs made without the change, as the benchmarks
#: measured them (``--record``); the report and lesson 11 show them (``helpers.what_if_checks``).
CHECKS = (
    Path(__file__).resolve().parents[1] / "helpers" / "analysis" / "path" / "what_if_checks.csv"
)


def run_cases(description: str, cases: dict[str, tuple], measure: Callable[..., dict], prefix: str) -> tuple[list[dict], int, bool]:  # fmt: skip
    """``measure(name, *case, folder)`` for every case of ``cases``, ``--repeats`` times (read
    from the command line, whose help says ``description``), the runs under a temporary folder
    named ``prefix``...; returns the rows, the number of repeats, and whether to record them
    (``--record``: :func:`record_checks`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each case")
    parser.add_argument("--record", action="store_true", help=f"record the medians in {CHECKS.name}")  # fmt: skip
    opts = parser.parse_args()
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        rows = [measure(name, *case, Path(tmp)) for _ in range(opts.repeats) for name, case in cases.items()]  # fmt: skip
    return rows, opts.repeats, opts.record


def record_checks(medians: pd.DataFrame, benchmark: str, runs: int) -> None:
    """Keep each case's medians (``what-if ms``, ``measured without ms``, indexed by case) in
    :data:`CHECKS`, in place of the rows this benchmark recorded before."""
    rows = pd.DataFrame({
        "case": medians.index, "benchmark": benchmark,
        "what_if_ms": medians["what-if ms"].round(1).to_numpy(),
        "measured_ms": medians["measured without ms"].round(1).to_numpy(),
        "runs": runs, "measured_on": date.today().isoformat(),
    })  # fmt: skip
    rows["error_pct"] = (100 * (rows["what_if_ms"] - rows["measured_ms"]).abs() / rows["measured_ms"]).round(1)  # fmt: skip
    old = pd.read_csv(CHECKS) if CHECKS.exists() else rows.iloc[:0]
    table = pd.concat([old[old["benchmark"] != benchmark], rows], ignore_index=True)
    table.to_csv(CHECKS, index=False)
    print(f"recorded in {CHECKS.relative_to(CHECKS.parents[3])}")
