"""``python -m helpers.report TRACES... [--out report.html] [--skip-bad] [--merged FILE]``; two
runs compared: ``python -m helpers.report BEFORE/ AFTER/``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from ..jobs.runs import show_path
from ..traces import TraceError
from .build import ReportError, build_report
from .compare import are_two_runs, build_comparison
from .html import write_report


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m helpers.report",
        description="One HTML report of a run's per-rank profiler traces (CPU or GPU); given two "
        "folders that each hold a run (both have rank 0's file, say), the two runs compared.",
    )
    p.add_argument("traces", nargs="+", help="a folder of per-rank traces (searched below too), or the files")  # fmt: skip
    p.add_argument("--out", default="report.html", help="the HTML file to write (default: report.html)")  # fmt: skip
    p.add_argument("--skip-bad", action="store_true", help="leave out files that cannot be read, and list them")  # fmt: skip
    p.add_argument("--merged", metavar="FILE", help="also write every rank into one trace for Perfetto")  # fmt: skip
    p.add_argument("--no-path", action="store_true", help="leave out what held the steps (the critical path): faster on hundreds of ranks")  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit status: 0 when the report is written (a section that
    failed is left out, said in the report and printed), 2 for input it cannot use."""
    args = parser().parse_args(argv)
    started = time.perf_counter()
    try:
        if are_two_runs(args.traces):
            report = build_comparison(*args.traces)
        else:
            report = build_report(
                args.traces, skip_bad=args.skip_bad, merged=args.merged, critical=not args.no_path
            )
        out = write_report(report, args.out)
        if report.merged is not None:
            print(f"merged trace for https://ui.perfetto.dev: {show_path(report.merged)}")
    except (ReportError, TraceError) as err:
        print(f"report: {err}", file=sys.stderr)
        return 2
    took = f"{time.perf_counter() - started:.1f} s"
    if report.glance.keys() >= {"before", "after"}:
        print(
            f"report written to {show_path(out)}: two runs compared, "
            f"{len(report.skipped)} files skipped, {took}"
        )
        return 0
    print(
        f"report written to {show_path(out)}: {len(report.ranks)} rank(s), read {report.read}, "
        f"{len(report.skipped)} files skipped, {took}"
    )
    for title, why in report.failed:
        print(f"report: the section “{title}” could not be written ({why}); the report says so")
    return 0


if __name__ == "__main__":
    sys.exit(main())
