"""Benchmark of the trace layer; prints each target as a ratio measured in this one run.

    make benchmark            # or: python benchmarks/bench_traces.py [--mb 250] [--events 1000000]

1. Load time of the same multi-rank traces: helpers.traces.load_run against plain
   json.load and against HolisticTraceAnalysis' TraceAnalysis (HTA, installed for the
   benchmark only), on the small real traces in ../shared/real-traces and on a
   generated trace of about --mb megabytes (2 ranks).
2. Memory on the generated trace: peak RSS growth of load_run against json.load (each
   in a fresh process), and the DataFrame's size against the JSON text.
3. Drawing a timeline of --events events (4 ranks) to a PNG.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from synthetic_trace import write_trace  # noqa: E402

REAL = REPO.parent / "shared" / "real-traces" / "hta" / "trace_filter"


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def json_load_all(files: list[Path]) -> None:
    for f in files:
        with (gzip.open(f) if f.name.endswith(".gz") else open(f, "rb")) as fh:
            json.load(fh)


def hta_available() -> bool:
    try:
        import hta  # noqa: F401
        return True
    except ImportError:
        return False


def hta_load(folder: Path) -> None:
    import logging

    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    TraceAnalysis(trace_dir=str(folder))


CHILD = r"""
import gc, json, gzip, resource, sys, time
from pathlib import Path
files = [Path(p) for p in sys.argv[2:]]
from helpers.traces import load_run
import pandas
gc.collect()
def rss_kb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 // 1024
before = rss_kb()
if sys.argv[1] == "json":
    docs = [json.load(open(f, "rb")) for f in files]
    extra = 0
else:
    run = load_run(files)
    extra = int(run.events.memory_usage(deep=True).sum())
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"before_kb": before, "peak_kb": peak, "frame_bytes": extra}))
"""


def peak_growth(kind: str, files: list[Path]) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, kind, *map(str, files)], cwd=REPO,
                         capture_output=True, text=True, check=True)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    data["growth_mb"] = (data["peak_kb"] - data["before_kb"]) / 1024
    return data


def timeline_seconds(n_events: int, out: Path) -> float:
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np
    import pandas as pd

    from helpers.plotting import plot_rank_timeline
    from helpers.traces import KINDS

    rng = np.random.default_rng(0)
    ranks = 4
    per = n_events // ranks
    rel = np.concatenate([np.sort(rng.uniform(0, 10_000_000, per)) for _ in range(ranks)])
    events = pd.DataFrame({
        "rank": np.repeat(np.arange(ranks, dtype=np.int32), per),
        "lane": pd.Categorical(rng.choice(["main", "gloo 1", "gloo 2"], size=per * ranks)),
        "kind": pd.Categorical(rng.choice(KINDS[1:6], size=per * ranks), categories=KINDS),
        "rel_us": rel, "dur_us": rng.uniform(1, 50, per * ranks),
    })
    t0 = time.perf_counter()
    fig = plot_rank_timeline(events, lanes=True)
    fig.savefig(out, dpi=80)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=250, help="size of the generated trace (MB)")
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the timeline")
    opts = parser.parse_args()
    from helpers.traces import load_run

    have_hta = hta_available()
    if not have_hta:
        print("HTA is not installed (pip install -r benchmarks/requirements.txt): "
              "its ratios are skipped")
    work = Path(tempfile.mkdtemp(prefix="bench-traces-"))
    try:
        sets = []
        if REAL.is_dir():
            small = work / "small"
            small.mkdir()
            for f in sorted(REAL.glob("*.json.gz")):
                shutil.copy(f, small / f.name)
            sets.append(("real GPU traces, 2 ranks", small, 5))
        big = work / "big"
        big.mkdir()
        print(f"writing a generated trace of about {opts.mb} MB (2 ranks) ...", flush=True)
        for rank in range(2):
            write_trace(big / f"rank{rank}.json", rank, 2, opts.mb * 1_000_000 // 2)
        sets.append((f"generated {opts.mb} MB, 2 ranks", big, 1))

        print("\n== load time (s; best of N)")
        for label, folder, repeat in sets:
            files = sorted(folder.iterdir())
            mb = sum(f.stat().st_size for f in files) / 1e6
            t_json = best_of(lambda: json_load_all(files), repeat)
            t_ours = best_of(lambda: load_run(files), repeat)
            line = (f"{label} ({mb:.1f} MB on disk): json.load {t_json:.3f}, load_run {t_ours:.3f}"
                    f" -> load_run / json.load = {t_ours / t_json:.2f} (target <= 1.5)")
            print(line, flush=True)
            if have_hta:
                t_hta = best_of(lambda: hta_load(folder), max(1, repeat // 2))
                print(f"    HTA TraceAnalysis {t_hta:.3f} -> HTA / load_run = "
                      f"{t_hta / t_ours:.1f}x (target >= 5)", flush=True)

        print("\n== memory on the generated trace (fresh process each)")
        files = sorted(big.iterdir())
        text_bytes = sum(f.stat().st_size for f in files)
        mem_json = peak_growth("json", files)
        mem_ours = peak_growth("ours", files)
        print(f"peak RSS growth: json.load {mem_json['growth_mb']:.0f} MB, load_run "
              f"{mem_ours['growth_mb']:.0f} MB -> load_run / json.load = "
              f"{mem_ours['growth_mb'] / mem_json['growth_mb']:.2f} (target <= 2)")
        print(f"DataFrame {mem_ours['frame_bytes'] / 1e6:.0f} MB vs JSON text "
              f"{text_bytes / 1e6:.0f} MB -> {mem_ours['frame_bytes'] / text_bytes:.2f} "
              f"(target <= 0.5)")

        print(f"\n== drawing a timeline of {opts.events:,} events (4 ranks, 3 lanes each)")
        seconds = timeline_seconds(opts.events, work / "timeline.png")
        print(f"plot_rank_timeline + savefig: {seconds:.2f} s (target < 5 s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
