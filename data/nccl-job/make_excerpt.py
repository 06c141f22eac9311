"""Derive the excerpt of a real NCCL job that lesson 11 reads (its section on a GPU).

    python data/nccl-job/make_excerpt.py ../shared/real-traces/nccl-jobs/torchrec-a2a-optimizer-2a

The source is a TorchRec DLRM run on 4 V100-SXM2 GPUs of one machine, one rank per GPU, NCCL,
PyTorch about 2.2: traces committed to github.com/pytorch/torchrec on a pull request's branch
(pull request 1460, commit a7fe7b8), under TorchRec's BSD-3-Clause licence (``LICENSE`` beside
this file). What is kept of each rank's trace: its header, the one profiler step ``STEP`` and
every event that starts within it on any rank (CPU ops, annotations, CUDA runtime calls, GPU
kernels and copies), the GPU work launched within it, with their names, times, threads, streams
and the args the analysis reads, unchanged; everything else is left out. Each file is named
``rank<N>.json.gz`` after the rank its header gives.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEP = 4
ARGS = {"correlation", "External id", "stream", "device", "context", "Collective name",
        "In msg nelems", "Out msg nelems", "dtype", "Group size", "Process Group Name",
        "Process Group Ranks", "Seq"}  # fmt: skip
HEADER = ("schemaVersion", "distributedInfo", "baseTimeNanoseconds", "deviceProperties")


def window(docs: list[dict]) -> tuple[float, float]:
    """From the first rank's start of the step to the last rank's end of it."""
    spans = [(e["ts"], e["ts"] + e["dur"]) for doc in docs for e in doc["traceEvents"]
             if e.get("name") == f"ProfilerStep#{STEP}" and e.get("cat") == "user_annotation"]  # fmt: skip
    return min(s for s, _ in spans), max(e for _, e in spans)


def excerpt(doc: dict, lo: float, hi: float) -> dict:
    events = doc["traceEvents"]
    calls = {e["args"]["correlation"] for e in events
             if e.get("cat") == "cuda_runtime" and lo <= e["ts"] < hi}  # fmt: skip
    kept = []
    for e in events:
        if e.get("ph") != "X":
            continue
        args = e.get("args", {})
        launched = args.get("correlation") in calls and e.get("cat") != "cuda_runtime"
        another_step = e.get("name", "").startswith("ProfilerStep#") and e["name"] != f"ProfilerStep#{STEP}"  # fmt: skip
        if (lo <= e["ts"] < hi or launched) and not another_step:
            kept.append(dict(e, args={k: v for k, v in args.items() if k in ARGS}))
    out = {k: doc[k] for k in HEADER if k in doc}
    out["traceEvents"] = kept + [e for e in events if e.get("ph") == "M"]
    return out


def main(source: Path) -> None:
    docs = [json.loads(gzip.decompress(f.read_bytes())) for f in sorted(source.glob("*.json.gz"))]
    lo, hi = window(docs)
    for doc in docs:
        target = HERE / f"rank{doc['distributedInfo']['rank']}.json.gz"
        out = excerpt(doc, lo, hi)
        target.write_bytes(gzip.compress(json.dumps(out, separators=(",", ":")).encode(), mtime=0))
        print(f"{target.name}: {len(out['traceEvents'])} events, {target.stat().st_size / 1e3:.0f} kB")  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]))
