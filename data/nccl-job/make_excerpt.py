"""Derive the excerpt of a real NCCL job that lesson 12 reads (its section on a real NCCL job).

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
sys.path.insert(0, str(HERE.parent))
from excerpt import excerpt, step_window, write_excerpt  # noqa: E402 (data/excerpt.py)

STEP = 4
ARGS = {"correlation", "External id", "stream", "device", "context", "Collective name",
        "In msg nelems", "Out msg nelems", "dtype", "Group size", "Process Group Name",
        "Process Group Ranks", "Seq"}  # fmt: skip


def main(source: Path) -> None:
    docs = [json.loads(gzip.decompress(f.read_bytes())) for f in sorted(source.glob("*.json.gz"))]
    lo, hi = step_window(docs, {STEP})
    for doc in docs:
        target = HERE / f"rank{doc['distributedInfo']['rank']}.json.gz"
        write_excerpt(excerpt(doc, lo, hi, ARGS, {STEP}), target)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
