"""Derive the excerpts of the series' own H200 job that lesson 11 reads (its section on a GPU).

    python data/h200-job/make_excerpt.py ../shared/real-traces/h200

The sources were recorded for this series on one NVIDIA H200 (driver 580.159.04, torch
2.11.0+cu130, CUDA 13.0) by ``gpu_job.py`` (``../shared/real-traces/h200/``): a DDP job of 2 ranks
sharing the GPU over gloo with CUDA tensors, ``--case base`` and ``--case gpuslow``. What is kept
of each rank's trace: its header, the three profiler steps ``STEPS`` and every event that starts
within them (CPU ops, annotations, CUDA runtime calls, GPU kernels and copies and Kineto's GPU
copies of the annotations), with their names, times, threads, streams and the args the analysis
reads, unchanged; everything else is left out.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS = {5, 6, 7}
ARGS = {"correlation", "External id", "stream", "device", "context", "cuda_sync_kind",
        "wait_on_stream", "wait_on_cuda_event_record_corr_id", "wait_on_cuda_event_id",
        "Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size",
        "Process Group Name", "Process Group Ranks", "Seq"}  # fmt: skip
HEADER = ("schemaVersion", "distributedInfo", "baseTimeNanoseconds", "deviceProperties")


def excerpt(source: Path, target: Path) -> None:
    doc = json.loads(gzip.decompress(source.read_bytes()))
    events = doc["traceEvents"]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("name", "").startswith("ProfilerStep#") and e.get("cat") == "user_annotation"
             and int(e["name"].split("#")[1]) in STEPS]  # fmt: skip
    lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
    calls = {e["args"]["correlation"] for e in events
             if e.get("cat") == "cuda_runtime" and lo <= e["ts"] < hi}  # fmt: skip
    kept = []
    for e in events:
        if e.get("ph") != "X":
            continue
        args = e.get("args", {})
        launched = args.get("correlation") in calls and e.get("cat") != "cuda_runtime"
        if lo <= e["ts"] < hi or launched:
            kept.append(dict(e, args={k: v for k, v in args.items() if k in ARGS}))
    meta = [e for e in events if e.get("ph") == "M"]
    out = {k: doc[k] for k in HEADER if k in doc}
    out["traceEvents"] = kept + meta
    target.write_bytes(gzip.compress(json.dumps(out, separators=(",", ":")).encode(), mtime=0))
    print(f"{target.parent.name}/{target.name}: {len(kept)} events, {target.stat().st_size / 1e3:.0f} kB")  # fmt: skip


def main(source: Path) -> None:
    for run in ("base-1", "gpuslow-1"):
        (HERE / run).mkdir(exist_ok=True)
        for rank in (0, 1):
            excerpt(source / run / f"rank{rank}.json.gz", HERE / run / f"rank{rank}.json.gz")
        walls = (source / run / "step_walls.csv").read_text()
        (HERE / run / "step_walls.csv").write_text(walls)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
