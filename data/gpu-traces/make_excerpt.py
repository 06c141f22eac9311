"""Derive the small GPU trace excerpts that lesson 4 reads from real traces of other people's jobs.

    python data/gpu-traces/make_excerpt.py ../shared/real-traces/hta

The sources are HolisticTraceAnalysis's test traces (MIT licence, see LICENSE beside this file).
What is kept of each: the ``ProfilerStep#N`` spans, every GPU event (kernels, memcpy, memset, GPU
annotations) launched in the steps kept, the CUDA runtime calls that launched them, the collectives'
CPU side (``record_param_comms``, ``nccl:*``) and the DDP annotations; event names, times, streams
and the args the analysis reads are copied unchanged, everything else is left out.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GPU = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
ARGS = {"correlation", "External id", "stream", "device", "Collective name", "In msg nelems",
        "Out msg nelems", "dtype", "Group size", "Process Group Name", "Process Group Ranks", "Seq"}  # fmt: skip
CPU_NAMES = ("ProfilerStep#", "record_param_comms", "nccl:", "DistributedDataParallel.forward",
             "## backward ##", "Optimizer.step")  # fmt: skip


def excerpt(source: Path, target: Path, steps: set[int], header_keys: tuple[str, ...]) -> None:
    doc = json.loads(gzip.decompress(source.read_bytes()))
    events = doc["traceEvents"]
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("name", "").startswith("ProfilerStep#")
             and int(e["name"].split("#")[1]) in steps]  # fmt: skip
    lo, hi = min(s for s, _ in spans), max(e for _, e in spans)

    def in_window(e) -> bool:
        return lo <= e["ts"] < hi

    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") == "cuda_runtime" and in_window(e)}  # fmt: skip
    annotations = {e["args"].get("External id") for e in events
                   if e.get("cat") == "user_annotation" and in_window(e)}  # fmt: skip
    kept = []
    for e in events:
        if e.get("ph") != "X":
            continue
        cat, args = e.get("cat"), e.get("args", {})
        if cat in GPU:
            keep = args.get("correlation") in launches or (
                cat == "gpu_user_annotation" and args.get("External id") in annotations
            )
        elif cat == "cuda_runtime":
            keep = in_window(e)  # only launches of kept GPU events stay (below)
        else:
            keep = in_window(e) and e.get("name", "").startswith(CPU_NAMES)
        if keep:
            kept.append(dict(e, args={k: v for k, v in args.items() if k in ARGS}))
    wanted = {e["args"].get("correlation") for e in kept if e.get("cat") in GPU}
    kept = [e for e in kept if e.get("cat") != "cuda_runtime" or e["args"]["correlation"] in wanted]
    meta = [e for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"]
    out = {k: doc[k] for k in header_keys if k in doc}
    out["traceEvents"] = kept + meta
    target.write_bytes(gzip.compress(json.dumps(out, separators=(",", ":")).encode(), mtime=0))
    print(f"{target.name}: {len(kept)} events, {target.stat().st_size / 1e3:.0f} kB")


def main(hta: Path) -> None:
    keys = ("schemaVersion", "distributedInfo", "baseTimeNanoseconds", "deviceProperties")
    excerpt(hta / "nccl_parser_config/nccl_data.json.gz", HERE / "nccl-2gpu-rank0.json.gz",
            {5, 6}, keys)  # fmt: skip
    excerpt(hta / "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
            HERE / "nccl-1gpu-rank0.json.gz", {103, 104}, keys)  # fmt: skip
    for rank in (0, 1):
        excerpt(hta / f"trace_filter/sampled_rank-{rank}.json.gz",
                HERE / f"nccl-128gpu-rank{rank}.json.gz", {551, 552}, keys)  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]))
