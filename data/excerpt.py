"""What the ``make_excerpt.py`` scripts of ``data/`` share: a window of profiler steps cut out of
real GPU traces, every event that starts within it and the GPU work launched within it kept
unchanged but for the args the analysis does not read, and the excerpt written as gzip JSON that
is the same bytes each time it is made.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

HEADER = ("schemaVersion", "distributedInfo", "baseTimeNanoseconds", "deviceProperties")


def step_window(docs: list[dict], steps: set[int]) -> tuple[float, float]:
    """From the earliest start of ``steps`` (``ProfilerStep#N`` on the CPU) in any of ``docs``
    to their latest end."""
    spans = [(e["ts"], e["ts"] + e["dur"]) for doc in docs for e in doc["traceEvents"]
             if e.get("name", "").startswith("ProfilerStep#") and e.get("cat") == "user_annotation"
             and int(e["name"].split("#")[1]) in steps]  # fmt: skip
    return min(s for s, _ in spans), max(e for _, e in spans)


def excerpt(doc: dict, lo: float, hi: float, args_kept: set[str], steps: set[int]) -> dict:
    """``doc`` with its header, the complete events that start in ``[lo, hi)`` or are GPU work
    launched by a CUDA call that does (but the profiler steps not in ``steps``), each with only
    ``args_kept`` of its args, and its metadata events."""
    events = doc["traceEvents"]
    calls = {e["args"]["correlation"] for e in events
             if e.get("cat") == "cuda_runtime" and lo <= e["ts"] < hi}  # fmt: skip
    names = {f"ProfilerStep#{s}" for s in steps}
    kept = []
    for e in events:
        if e.get("ph") != "X":
            continue
        args = e.get("args", {})
        launched = args.get("correlation") in calls and e.get("cat") != "cuda_runtime"
        another_step = e.get("name", "").startswith("ProfilerStep#") and e["name"] not in names
        if (lo <= e["ts"] < hi or launched) and not another_step:
            kept.append(dict(e, args={k: v for k, v in args.items() if k in args_kept}))
    out = {k: doc[k] for k in HEADER if k in doc}
    out["traceEvents"] = kept + [e for e in events if e.get("ph") == "M"]
    return out


def write_excerpt(out: dict, target: Path) -> None:
    """``out`` as gzip JSON at ``target`` (no time in the gzip header), and a line saying so."""
    target.write_bytes(gzip.compress(json.dumps(out, separators=(",", ":")).encode(), mtime=0))
    print(f"{target.parent.name}/{target.name}: {len(out['traceEvents'])} events, {target.stat().st_size / 1e3:.0f} kB")  # fmt: skip
