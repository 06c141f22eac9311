"""Benchmark: the report command on a lesson's recorded run and on a run of many generated ranks.

The big run is rank_by_rank.py's (``--ranks`` traces of ``--mb-per-rank`` MB in ``--folder``,
generated once and reused): too large to load whole, so the report reads it one rank at a time.
Each report is built in a fresh process; the figures are its wall time, its own peak resident
memory (VmHWM) and the largest peak of the worker processes it started, measured in this run,
for the big run with and without the critical path (``--no-path``), and their ratio.

    python benchmarks/report_big_run.py --ranks 256 --mb-per-rank 32
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from rank_by_rank import generated  # noqa: E402

CHILD = r"""
import json, re, resource, sys, time
from helpers.report.__main__ import main
t0 = time.perf_counter()
status = main(sys.argv[1:])
print(json.dumps({"status": status, "seconds": time.perf_counter() - t0,
                  "self_kb": int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read())[1]),
                  "child_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def measure(traces: list[str], out: Path) -> dict:
    """The report of ``traces`` built in a fresh process: its figures."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *traces, "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, check=True,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--mb-per-rank", type=int, default=32)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/pdp-rank-by-rank"))
    args = parser.parse_args()
    lesson_run = next((REPO / "recordings").glob("ddp-straggler-*/files"))
    files = generated(args.folder, args.ranks, args.mb_per_rank)
    gb = sum(f.stat().st_size for f in files) / 1e9
    with tempfile.TemporaryDirectory() as tmp:
        small = measure([str(lesson_run)], Path(tmp) / "small.html")
        bare = measure([str(args.folder), "--no-path"], Path(tmp) / "bare.html")
        big = measure([str(args.folder)], Path(tmp) / "big.html")
    print(f"lesson 4's straggler run (2 ranks): {small['seconds']:.1f} s, "
          f"peak {small['self_kb'] / 1024:.0f} MiB")  # fmt: skip
    for label, r in (("without the path (--no-path)", bare), ("with the path", big)):
        print(f"{args.ranks} generated ranks ({gb:.1f} GB of JSON), read rank by rank, {label}: "
              f"{r['seconds']:.1f} s, {gb * 1e3 / r['seconds']:.0f} MB/s; peak memory "
              f"{r['self_kb'] / 1024:.0f} MiB in the report's process, {r['child_kb'] / 1024:.0f} "
              f"MiB in its largest worker (target: within 2 GB, as rank by rank)")  # fmt: skip
    print(
        f"the report with the path / without it: {big['seconds'] / bare['seconds']:.2f} "
        "(target: at most 2)"
    )


if __name__ == "__main__":
    main()
