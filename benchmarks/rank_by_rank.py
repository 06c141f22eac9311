"""Benchmark: a run of many generated ranks summarised one rank at a time (issue 23's targets).

Generates ``--ranks`` traces of ``--mb-per-rank`` MB each (the shape of a CPU DDP trace, see
synthetic_trace.py; kept in ``--folder`` and reused), then, each in a fresh process, measures
``summarise_run`` with one worker and with two (each rank's chains of the critical path
included, and the path strung from them): the MB/s it read, and the peak resident memory
of the process and of its largest worker. For comparison it loads ``--compare-ranks`` of the
ranks whole with ``load_run`` and prints the memory that took, and what the summary took for
the same ranks, and the first pass without the chains (the path's cost, as a ratio of speeds).
Every figure is measured in this one run; ratios are printed beside them.

    python benchmarks/rank_by_rank.py --ranks 256 --mb-per-rank 32
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from synthetic_trace import write_trace  # noqa: E402

CHILD = r"""
import json, re, resource, sys, time
from pathlib import Path
from helpers.analysis.rank_by_rank import summarise_run
from helpers.traces import load_run
how, workers, files = sys.argv[1], int(sys.argv[2]), [Path(p) for p in sys.argv[3:]]
if how.startswith("first"):  # a first pass: no rank's Parquet cache yet
    for cache in {f.parent / ".cache" for f in files}:
        for old in cache.glob("rank-*.parquet"):
            old.unlink()
t0 = time.perf_counter()
if how in ("first", "first without the path", "again"):
    summary = summarise_run(files, workers=workers, progress=False,
                            critical=how != "first without the path")
    kept = int(sum(f.memory_usage(deep=True).sum() for f in (summary.steps, summary.collectives)))
    straggler = summary.find_straggler()
    held = None
    if summary.pieces:  # the critical path, strung from each rank's chains
        top = summary.path_summary().iloc[0]
        held = f"rank {top['rank']}'s {top['kind']}, {top['ms_per_step']:.1f} ms per step"
else:
    kept = int(load_run(files, workers=workers, cache=False, progress=False)
               .events.memory_usage(deep=True).sum())
    straggler = held = None
print(json.dumps({"seconds": time.perf_counter() - t0, "kept_bytes": kept, "held": held,
                  # VmHWM: this process's own peak (ru_maxrss would count the RSS of the
                  # benchmark that started it)
                  "self_kb": int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read())[1]),
                  "child_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
                  "straggler": straggler}))
"""


TEMPLATES = 8  # distinct generated ranks; the others are copies of one with their own rank


def generated(folder: Path, ranks: int, mb: int) -> list[Path]:
    """The run's files, written unless ``folder`` already holds them at that size. Ranks
    0..TEMPLATES-1 are generated (synthetic_trace.py, slow in Python); rank r >= TEMPLATES is
    rank r % TEMPLATES's text with its own rank, pid and thread id."""
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / f"rank{r}_trace.json" for r in range(ranks)]
    t0 = time.perf_counter()
    for rank, path in enumerate(files):
        if path.is_file() and abs(path.stat().st_size - mb * 1e6) < 0.05 * mb * 1e6:
            continue
        if rank < TEMPLATES:
            write_trace(path, rank, ranks, int(mb * 1e6))
            continue
        t = rank % TEMPLATES
        text = files[t].read_text()
        for old, new in [
            (f'"rank": {t},', f'"rank": {rank},'),
            (f'"pid": {10_000 + t},', f'"pid": {10_000 + rank},'),
            (f'"tid": {10_000 + t},', f'"tid": {10_000 + rank},'),
            (f"{20_000 + t}", f"{20_000 + rank}"),
        ]:
            text = text.replace(old, new)
        path.write_text(text)
    print(f"{ranks} ranks x {mb} MB in {folder} (ready in {time.perf_counter() - t0:.0f} s)")
    return files


def measure(how: str, workers: int, files: list[Path]) -> dict:
    """One measurement in a fresh process (``how``: ``first``, a first pass that writes every
    rank's cache; ``first without the path``, the same without the chains of the critical path;
    ``again``, a pass from the caches; ``whole``, load_run)."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, how, str(workers), *map(str, files)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(out.stdout.strip().splitlines()[-1])
    data["mb"] = sum(p.stat().st_size for p in files) / 1e6
    data["mb_s"] = data["mb"] / data["seconds"]
    children = workers * data["child_kb"] if workers > 1 else 0  # as if every worker peaked at once
    data["peak_mb"] = (data["self_kb"] + children) / 1024
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--mb-per-rank", type=int, default=32)
    parser.add_argument("--compare-ranks", type=int, default=16)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/pdp-rank-by-rank"))
    opts = parser.parse_args()
    files = generated(opts.folder, opts.ranks, opts.mb_per_rank)
    passes = {}
    for label, how, workers in [
        ("first pass", "first", 1),
        ("second pass, from the caches", "again", 1),
        ("first pass without the path", "first without the path", 2),
        ("first pass", "first", 2),
        ("second pass, from the caches", "again", 2),
    ]:
        r = passes[how, workers] = measure(how, workers, files)
        print(
            f"summarise_run, {label}, {workers} worker(s): {r['mb']:.0f} MB in "
            f"{r['seconds']:.1f} s = {r['mb_s']:.0f} MB/s; peak memory {r['peak_mb']:.0f} MB "
            f"(process {r['self_kb'] / 1024:.0f} MB, largest worker {r['child_kb'] / 1024:.0f} "
            f"MB); kept {r['kept_bytes'] / 1e6:.0f} MB; straggler {r['straggler']}; most on the "
            f"critical path: {r['held']}"
        )
    for workers in (1, 2):
        ratio = passes["again", workers]["seconds"] / passes["first", workers]["seconds"]
        print(f"second pass / first pass ({workers} worker(s)): {ratio:.3f}")
    speed = passes["first", 2]["mb_s"] / passes["first without the path", 2]["mb_s"]
    print(f"first pass with the path / without it, speed (2 workers): {speed:.2f} (target: >= 0.5)")
    some = files[: opts.compare_ranks]
    whole, summary = measure("whole", 1, some), measure("first", 1, some)
    print(
        f"{len(some)} ranks: load_run peak {whole['self_kb'] / 1024:.0f} MB (its DataFrame "
        f"{whole['kept_bytes'] / 1e6:.0f} MB, {whole['mb_s']:.0f} MB/s); summarise_run peak "
        f"{summary['self_kb'] / 1024:.0f} MB ({summary['mb_s']:.0f} MB/s): "
        f"{whole['self_kb'] / summary['self_kb']:.1f}x less memory"
    )


if __name__ == "__main__":
    main()
