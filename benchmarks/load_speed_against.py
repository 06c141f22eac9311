"""Loading speed of this checkout against an earlier commit, measured in one run.

    python benchmarks/load_speed_against.py 972d107 [trace files...]

Checks out ``REV`` into a temporary git worktree, then loads the same files with both versions of
the loader, alternating (each load in a fresh process, CPU time, best of several), and prints the
ratio new/old. Without files it uses the real GPU traces in ../shared/real-traces (the largest
two) and the traces of a recorded lesson run. The machines here are shared and noisy: trust a
ratio, not the seconds.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REAL = REPO.parent / "shared" / "real-traces" / "hta"
DEFAULT_SETS = {
    "real GPU traces": [
        REAL / "ns_resolution_trace" / "rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
        REAL / "nccl_parser_config" / "nccl_data.json.gz",
    ],
    "a lesson's run (ddp-normal)": sorted((REPO / "recordings").glob("ddp-normal-*/files/rank*")),
}

LOAD = r"""
import sys, time, warnings
sys.path.insert(0, sys.argv[1])
warnings.simplefilter("ignore")
from pathlib import Path
try:
    from helpers.traces._file import read_columns
    from helpers.traces._frame import frame as _frame
except ImportError:  # a commit from before helpers/ was laid out by job
    from helpers._tracefile import read_columns
    from helpers.traces import _frame
best = float("inf")
for _ in range(int(sys.argv[2])):
    start = time.process_time()
    for f in sys.argv[3:]:
        _frame([read_columns(Path(f), single=True)])
    best = min(best, time.process_time() - start)
print(best)
"""


def cpu_seconds(checkout: Path, files: list[Path], repeat: int) -> float:
    """The best CPU time of ``repeat`` loads of ``files`` with the loader of ``checkout``."""
    done = subprocess.run(
        [sys.executable, "-c", LOAD, str(checkout), str(repeat), *map(str, files)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the commit to compare with, e.g. 972d107")
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=3, help="alternations of old and new")
    parser.add_argument("--repeat", type=int, default=9, help="loads per process")
    args = parser.parse_args()
    sets = {"your files": args.files} if args.files else DEFAULT_SETS
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "-q", str(old), args.rev],
                       check=True)  # fmt: skip
        try:
            for name, files in sets.items():
                if not files or not all(f.is_file() for f in files):
                    print(f"{name}: files not found, skipped")
                    continue
                times = {"old": [], "new": []}
                for _ in range(args.rounds):
                    times["old"].append(cpu_seconds(old, files, args.repeat))
                    times["new"].append(cpu_seconds(REPO, files, args.repeat))
                o, n = min(times["old"]), min(times["new"])
                print(f"{name}: {args.rev} {o * 1e3:.1f} ms, this checkout {n * 1e3:.1f} ms, "
                      f"new/old {n / o:.3f} (target <= 1.10)")  # fmt: skip
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)],
                           check=False)  # fmt: skip


if __name__ == "__main__":
    main()
