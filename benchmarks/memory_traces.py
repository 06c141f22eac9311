"""Peak memory of loading and merging traces, against what a load leaves behind: measured in this run.

    .venv/bin/python benchmarks/memory_traces.py [--mb 100] [--ranks 4]

Issue 19 asks that a load peak within twice the resulting DataFrame plus the largest file
(``peak growth <= 2 * frame + largest file``); each line prints the ratio of the peak growth
to that allowance (target <= 1). Each phase runs in a fresh process on generated traces
(benchmarks/synthetic_trace.py) and reads its peak resident memory (``VmHWM``, reset between
phases through ``/proc/self/clear_refs``), so the figures include everything the loader and
numpy/pandas/msgspec allocate, not only Python objects.

1. ``load_trace`` of one plain ``.json`` file of --mb MB, and of the same file gzip-compressed.
2. ``load_run`` of --ranks files of --mb / --ranks MB each (one core, no cache).
3. ``merge_traces`` of that run into one ``.json.gz`` (the run already loaded: the growth is
   the merge's own).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from synthetic_trace import write_trace  # noqa: E402

CHILD = r"""
import json, sys
from pathlib import Path
from helpers.traces import merge_traces
from helpers.traces import load_run, load_trace

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

phase, files = sys.argv[1], [Path(p) for p in sys.argv[2:]]
if phase == "merge":
    run = load_run(files, workers=1, cache=False, progress=False)
reset_peak()
before = status("VmRSS")
if phase == "trace":
    frame = load_trace(files[0]).events
elif phase == "run":
    frame = load_run(files, workers=1, cache=False, progress=False).events
else:
    merge_traces(run, files[0].parent / "merged.json.gz")
    frame = run.events
print(json.dumps({"growth": status("VmHWM") - before,
                  "frame": int(frame.memory_usage(deep=True).sum())}))
"""


def measure(phase: str, files: list[Path]) -> dict:
    """``{"growth": bytes, "frame": bytes}`` of one phase, in a fresh process."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, phase, *map(str, files)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{phase} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(label: str, result: dict, largest: int) -> float:
    """Print one phase's figures; returns the peak growth over the allowance."""
    allowed = 2 * result["frame"] + largest
    ratio = result["growth"] / allowed
    print(
        f"{label:34s} peak growth {result['growth'] / 1e6:6.0f} MB = "
        f"{result['growth'] / largest:4.1f}x the largest file; DataFrame "
        f"{result['frame'] / 1e6:4.0f} MB; growth / (2 x frame + largest file) = {ratio:.2f}"
        f"  target <= 1"
    )
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="size of one file, and of the run")
    parser.add_argument("--ranks", type=int, default=4)
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="memory-traces-"))
    try:
        one = work / "rank0.json"
        write_trace(one, 0, 1, opts.mb * 1_000_000)
        packed = work / "gz" / "rank0.json.gz"
        packed.parent.mkdir()
        packed.write_bytes(gzip.compress(one.read_bytes(), compresslevel=5))
        run = work / "run"
        run.mkdir()
        files = []
        for rank in range(opts.ranks):
            files.append(run / f"rank{rank}.json")
            write_trace(files[-1], rank, opts.ranks, opts.mb * 1_000_000 // opts.ranks)
        size = one.stat().st_size
        print(
            f"one file {size / 1e6:.0f} MB (gzip {packed.stat().st_size / 1e6:.0f} MB); "
            f"a run of {opts.ranks} x {files[0].stat().st_size / 1e6:.0f} MB"
        )
        report("load_trace, .json", measure("trace", [one]), size)
        report("load_trace, .json.gz", measure("trace", [packed]), size)
        largest = max(f.stat().st_size for f in files)
        report(f"load_run, {opts.ranks} ranks", measure("run", files), largest)
        report("merge_traces (after the load)", measure("merge", files), largest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
