"""Execute lessons and solutions again and again under nbval and count the runs each one passed:
a claim a notebook asserts must hold in every run, not in most.

    python tools/repeat_notebooks.py --times 5 notebooks/*.ipynb solutions/*.ipynb
    python tools/repeat_notebooks.py --times 2 --busy 2 notebooks/04_reading_ddp_traces.ipynb

``--busy N`` keeps N processes spinning on the CPU while the notebooks run (a busy machine: the
runs that find the races). Each run's result is appended to ``build/repeat/results.jsonl``
(notebook, round, busy, passed, seconds, the first failure's last lines), so that rounds run at
different times add up; the table at the end counts every run recorded there.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "build" / "repeat" / "results.jsonl"
NBVAL = [
    "-m", "pytest", "-p", "no:cacheprovider", "-q", "-x", "--nbval", "--nbval-current-env",
    "--nbval-sanitize-with", "tests/nbval_sanitize.cfg", "--nbval-cell-timeout=600",
]  # fmt: skip


def _spin() -> None:
    while True:
        pass


def run_once(notebook: Path, busy: int, recorded: bool) -> dict:
    """One nbval run of ``notebook``: whether it passed, how long it took, how it failed."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(busy)]
    for spinner in spinners:
        spinner.start()
    env = dict(os.environ, PDP_CHECKS_MUST_PASS="1", PDP_NO_PROGRESS="1")
    if recorded:
        env["PDP_RECORDED"] = "1"
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, *NBVAL, str(notebook)], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        passed, out = done.returncode == 0, done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        passed, out = False, "timed out after 1800 s"
    finally:
        for spinner in spinners:
            spinner.terminate()
    failure = "" if passed else "\n".join(out.strip().splitlines()[-25:])
    return {"passed": passed, "seconds": round(time.monotonic() - started, 1), "failure": failure}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--times", type=int, default=5, help="runs of each notebook")
    parser.add_argument("--busy", type=int, default=0, help="processes spinning meanwhile")
    parser.add_argument("--recorded", action="store_true", help="in recorded mode")
    args = parser.parse_args(argv)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    for round_ in range(args.times):
        for notebook in args.notebooks:
            result = run_once(notebook, args.busy, args.recorded)
            row = {"notebook": str(notebook), "round": round_, "busy": args.busy,
                   "recorded": args.recorded, **result}  # fmt: skip
            with RESULTS.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{notebook}: {'passed' if result['passed'] else 'FAILED'} "
                  f"({result['seconds']} s, busy {args.busy})", flush=True)  # fmt: skip
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for line in RESULTS.read_text().splitlines():
        row = json.loads(line)
        counts[row["notebook"]][0] += row["passed"]
        counts[row["notebook"]][1] += 1
        counts[row["notebook"]][2] += row["busy"] > 0
    print("\nnotebook: passed/runs (of them on a busy machine)")
    for name, (passed, runs, busy) in sorted(counts.items()):
        print(f"{name}: {passed}/{runs} ({busy} busy)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
