"""Derive the excerpts of the series' own H200 job that lesson 12 reads (its section on a GPU).

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
sys.path.insert(0, str(HERE.parent))
from excerpt import excerpt, step_window, write_excerpt  # noqa: E402 (data/excerpt.py)

STEPS = {5, 6, 7}
ARGS = {"correlation", "External id", "stream", "device", "context", "cuda_sync_kind",
        "wait_on_stream", "wait_on_cuda_event_record_corr_id", "wait_on_cuda_event_id",
        "Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size",
        "Process Group Name", "Process Group Ranks", "Seq"}  # fmt: skip


def excerpt_of(source: Path, target: Path) -> None:
    doc = json.loads(gzip.decompress(source.read_bytes()))
    lo, hi = step_window([doc], STEPS)
    write_excerpt(excerpt(doc, lo, hi, ARGS, STEPS), target)


def main(source: Path) -> None:
    for run in ("base-1", "gpuslow-1"):
        (HERE / run).mkdir(exist_ok=True)
        for rank in (0, 1):
            excerpt_of(source / run / f"rank{rank}.json.gz", HERE / run / f"rank{rank}.json.gz")
        walls = (source / run / "step_walls.csv").read_text()
        (HERE / run / "step_walls.csv").write_text(walls)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
