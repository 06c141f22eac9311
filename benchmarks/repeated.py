"""The case benchmark's runs (``pipeline_cases.py``): each case run
``--repeats`` times, in a temporary folder, one row of figures per run."""

from __future__ import annotations

import argparse
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path


def run_cases(description: str, cases: dict[str, tuple], measure: Callable[..., dict], prefix: str) -> tuple[list[dict], int, bool]:  # fmt: skip
    """``measure(name, *case, folder)`` for every case of ``cases``, ``--repeats`` times (read
    from the command line, whose help says ``description``), the runs under a temporary folder
    named ``prefix``...; returns the rows and the number of repeats. (The what-if's record of
    checks, :func:`helpers.what_if_checks`, is ``what_if_pairs.py``'s.)"""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each case")
    opts = parser.parse_args()
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        rows = [measure(name, *case, Path(tmp)) for _ in range(opts.repeats) for name, case in cases.items()]  # fmt: skip
    return rows, opts.repeats
