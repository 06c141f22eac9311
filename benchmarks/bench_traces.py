"""Benchmark of the trace layer: every figure is measured in this one run and printed with its target.

    make benchmark     # or: python benchmarks/bench_traces.py [--ranks 64] [--mb-per-rank 8]

This machine's speed drifts from minute to minute, so the loader's rates are printed next to two
references measured in the same run: plain ``json.load`` and "the limit", msgspec decoding the same
bytes into records of just ``ph``, ``ts`` and ``dur`` on one core (no columns, no checks).

1. A generated run of --ranks ranks of --mb-per-rank MB each (benchmarks/synthetic_trace.py).
2. Loading it: one core, all cores (worker processes), a window of steps, a second load (cache).
3. Peak memory of a load against the final DataFrame (target: at most 1.2 times it).
4. One file on its own (load_trace) against json.load.
5. HolisticTraceAnalysis (HTA), with its default parser and its fastest documented one
   (IJSON_BATCH_AND_COMPRESS), on the real 2-rank GPU traces and on 8 of the generated ranks.
6. A timeline of --events events drawn to a PNG.
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

import msgspec

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


def megabytes(files) -> float:
    return sum(f.stat().st_size for f in files) / 1e6


def json_load_all(files) -> None:
    for f in files:
        with gzip.open(f) if f.name.endswith(".gz") else open(f, "rb") as fh:
            json.load(fh)


class _Event(msgspec.Struct, gc=False):
    """The least a loader must read of an event: the limit's records."""

    ph: str = ""
    ts: float = 0.0
    dur: float = 0.0


class _Doc(msgspec.Struct, gc=False):
    traceEvents: list[_Event]


def decode_limit(files) -> None:
    decoder = msgspec.json.Decoder(_Doc)
    for f in files:
        decoder.decode(f.read_bytes())


MEMORY_CHILD = r"""
import json, re, sys
from pathlib import Path
from helpers.traces import load_run
def rss_kb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 // 1024
files = [Path(p) for p in sys.argv[1:]]
before = rss_kb()
run = load_run(files, workers=1, cache=False, progress=False)
# this process's own peak (VmHWM): ru_maxrss would count the RSS of the benchmark that started it
peak = int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1))
print(json.dumps({"before_kb": before, "peak_kb": peak,
                  "frame_bytes": int(run.events.memory_usage(deep=True).sum())}))
"""


def peak_memory(files) -> dict:
    """Peak RSS growth of a one-core load in a fresh process (the frame is built there)."""
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, *map(str, files)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    data["growth_mb"] = (data["peak_kb"] - data["before_kb"]) * 1024 / 1e6
    return data


def hta_seconds(folder: Path, backend: str | None) -> float | None:
    """Time of HTA's TraceAnalysis on a folder (a fresh process: HTA keeps state), or None."""
    child = (
        "import logging, sys, time\nlogging.disable(logging.WARNING)\n"
        "from hta.common.trace_parser import set_default_trace_parsing_backend\n"
        "from hta.configs.parser_config import ParserBackend\n"
        "from hta.trace_analysis import TraceAnalysis\n"
        + (f"set_default_trace_parsing_backend(ParserBackend.{backend})\n" if backend else "")
        + "t0 = time.perf_counter()\nTraceAnalysis(trace_dir=sys.argv[1])\n"
        "print(time.perf_counter() - t0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", child, str(folder)], capture_output=True, text=True
    )
    if done.returncode != 0:
        print(f"    HTA ({backend or 'default'}) failed: {done.stderr.strip().splitlines()[-1:]}")
        return None
    return float(done.stdout.strip().splitlines()[-1])


def timeline_seconds(n_events: int, out: Path) -> float:
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np
    import pandas as pd

    from helpers.drawing import plot_rank_timeline
    from helpers.traces.kinds import KIND_NAMES

    rng = np.random.default_rng(0)
    ranks, per = 4, n_events // 4
    rel = np.concatenate([np.sort(rng.uniform(0, 10_000_000, per)) for _ in range(ranks)])
    events = pd.DataFrame(
        {
            "rank": np.repeat(np.arange(ranks, dtype=np.int32), per),
            "lane": pd.Categorical(rng.choice(["main", "gloo 1", "gloo 2"], size=per * ranks)),
            "kind": pd.Categorical(
                rng.choice(KIND_NAMES[1:6], size=per * ranks), categories=KIND_NAMES
            ),
            "rel_us": rel,
            "dur_us": rng.uniform(1, 50, per * ranks),
        }
    )
    t0 = time.perf_counter()
    fig = plot_rank_timeline(events, lanes=True)
    fig.savefig(out, dpi=80)
    return time.perf_counter() - t0


def loading(files, mb: float, limit_mbs: float, json_mbs: float) -> None:
    from helpers.jobs.runs import usable_cores
    from helpers.traces import load_run

    cores = usable_cores()
    one = best_of(lambda: load_run(files, workers=1, cache=False, progress=False), 2)
    all_cores = best_of(lambda: load_run(files, workers=cores, cache=False, progress=False), 2)
    print(
        f"load_run, one core:    {one:6.2f} s = {mb / one:4.0f} MB/s "
        f"({mb / one / limit_mbs:.2f} of the limit, {mb / one / json_mbs:.1f}x json.load) "
        f"target >= 250 MB/s"
    )
    print(
        f"load_run, {cores} workers:   {all_cores:6.2f} s = {mb / all_cores:4.0f} MB/s "
        f"({mb / all_cores / limit_mbs:.2f} of the one-core limit)  target >= 400 MB/s"
    )
    steps = load_run(files[:1], cache=False).events["step"].dropna()
    middle = int(steps.median())
    window = best_of(
        lambda: load_run(files, workers=1, cache=False, progress=False, steps=(middle, middle + 2)),
        1,
    )
    print(
        f"load_run, steps {middle}..{middle + 2} only: {window:6.2f} s "
        f"({(1 - window / one) * 100:.0f} % less time than the whole run)"
    )


def caching(folder: Path) -> None:
    from helpers.jobs.runs import CACHE_DIR
    from helpers.traces import load_run

    shutil.rmtree(folder / CACHE_DIR, ignore_errors=True)
    first = best_of(lambda: load_run(folder, workers=1, progress=False), 1)
    second = best_of(lambda: load_run(folder, workers=1, progress=False), 3)
    print(
        f"a second load of the unchanged run: {second:.2f} s after {first:.2f} s "
        f"(first load with writing the cache) -> {second / first:.3f}  target <= 0.10"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--mb-per-rank", type=int, default=8)
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the timeline")
    opts = parser.parse_args()
    from helpers.traces import load_trace

    work = Path(tempfile.mkdtemp(prefix="bench-traces-"))
    try:
        run = work / "run"
        run.mkdir()
        print(f"writing {opts.ranks} ranks of {opts.mb_per_rank} MB ...", flush=True)
        for rank in range(opts.ranks):
            write_trace(run / f"rank{rank}.json", rank, opts.ranks, opts.mb_per_rank * 1_000_000)
        files = sorted(run.glob("rank*.json"), key=lambda p: int(p.stem[4:]))
        mb = megabytes(files)

        print(f"\n== loading {len(files)} ranks, {mb:.0f} MB")
        limit = best_of(lambda: decode_limit(files), 2)
        subset = files[:16]
        json_s = best_of(lambda: json_load_all(subset), 1)
        limit_mbs, json_mbs = mb / limit, megabytes(subset) / json_s
        print(f"the limit (msgspec, ph/ts/dur only, one core): {limit_mbs:4.0f} MB/s")
        print(f"json.load (16 of the ranks):                   {json_mbs:4.0f} MB/s")
        loading(files, mb, limit_mbs, json_mbs)
        caching(run)

        print("\n== memory (a one-core load in a fresh process)")
        mem = peak_memory(files)
        frame_mb = mem["frame_bytes"] / 1e6
        print(
            f"peak growth {mem['growth_mb']:.0f} MB for a DataFrame of {frame_mb:.0f} MB -> "
            f"{mem['growth_mb'] / frame_mb:.2f}x the DataFrame  target <= 1.2x"
        )

        print("\n== one file on its own")
        one = files[0]
        t_json = best_of(lambda: json_load_all([one]), 5)
        t_ours = best_of(lambda: load_trace(one), 5)
        print(
            f"load_trace {t_ours * 1e3:.0f} ms, json.load {t_json * 1e3:.0f} ms -> "
            f"{t_ours / t_json:.2f} of json.load's time"
        )

        print("\n== HolisticTraceAnalysis (each in a fresh process)")
        from helpers.traces import load_run

        sets = [("generated, 8 ranks", files[:8])]
        if REAL.is_dir():
            sets.insert(0, ("real GPU traces, 2 ranks", sorted(REAL.glob("*.json.gz"))))
        for number, (label, chosen) in enumerate(sets):
            target = work / f"hta{number}"
            target.mkdir()
            for f in chosen:
                shutil.copy(f, target / f.name)
            copies = sorted(target.iterdir())
            ours = best_of(lambda copies=copies: load_run(copies, cache=False, progress=False), 2)
            print(f"{label} ({megabytes(copies):.0f} MB): load_run {ours:.2f} s")
            for backend in (None, "IJSON_BATCH_AND_COMPRESS"):
                seconds = hta_seconds(target, backend)
                if seconds is not None:
                    print(
                        f"    HTA, {backend or 'default parser (JSON)':28s} {seconds:6.2f} s -> "
                        f"{seconds / ours:.1f}x load_run's time"
                    )

        print(f"\n== drawing a timeline of {opts.events:,} events (4 ranks, 3 lanes each)")
        seconds = timeline_seconds(opts.events, work / "timeline.png")
        print(f"plot_rank_timeline + savefig: {seconds:.2f} s  target < 2 s")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
