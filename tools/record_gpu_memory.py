"""Record lesson 15's memory job on a GPU, as test data: run it where there is one.

    python tools/record_gpu_memory.py OUT [CASE ...]

It writes ``memory_job.py`` from lesson 15 with its tensors moved onto GPU 0 (2 ranks sharing
the GPU over gloo, CUDA tensors), the profiler's CUDA activity on, the profiler's memory
timeline of GPU 0, and each rank's CUDA memory snapshot (``torch.cuda.memory._dump_snapshot``)
beside its trace. Then it runs the cases below under torchrun in :data:`JOB_DIR` (the folder
the files then name, as ``data/h200-memory`` holds them), gzips the traces, and packs everything
into ``OUT/gpu-memory.tar.gz``; without a CASE, it runs ``leak``, ``held-out`` and ``fsdp``. It
imports nothing of the series (the GPU machine may lack its dependencies);
``tests/test_gpu_memory.py`` reads what it recorded.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LESSON = REPO / "notebooks" / "15_where_the_memory_went.ipynb"
#: Where the job runs: its traces and snapshots name this folder, none of the machine's own.
JOB_DIR = Path("/srv/job")

#: name: the job's arguments. ``leak``: the lesson's leak (rank 1 keeps 1 MiB a step in its
#: forward); ``held-out``: rank 0 keeps 0.5 MiB a step in its loss; ``fsdp``: no leak, FSDP2
#: (the profiler's timeline fails under FSDP2 on torch 2.14, so none is asked for). ``wide``
#: (another width and batch) and ``keeps-nothing`` were recorded after the category rules were
#: last changed, to hold them to runs they never saw.
CASES = {
    "leak": ["--keep-rank", "1", "--timeline"],
    "held-out": ["--keep-rank", "0", "--keep-mib", "0.5", "--keep-in", "loss", "--timeline"],
    "fsdp": ["--fsdp"],
    "wide": ["--width", "768", "--batch", "128", "--keep-rank", "1", "--timeline"],
    "keeps-nothing": ["--timeline"],
}

#: (what the lesson's script says, what the GPU's says): each must be found exactly once.
ON_THE_GPU = [
    (
        "    model = Model(args.width, keep, args.keep_in)\n",
        '    device = torch.device("cuda", 0)\n'
        "    torch.cuda.memory._record_memory_history(max_entries=50_000)\n"
        "    model = Model(args.width, keep, args.keep_in).to(device)\n",
    ),
    (
        "x = torch.randn(args.batch, args.width)\n",
        "x = torch.randn(args.batch, args.width, device=device)\n",
    ),  # fmt: skip
    (
        "target = torch.randn(args.batch, args.width)\n",
        "target = torch.randn(args.batch, args.width, device=device)\n",
    ),  # fmt: skip
    (
        "activities=[ProfilerActivity.CPU]",
        "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]",
    ),  # fmt: skip
    ('device="cpu")', 'device="cuda:0")'),
    (
        "    dist.destroy_process_group()\n",
        "    torch.cuda.synchronize()\n"
        '    torch.cuda.memory._dump_snapshot(os.path.join(run_dir, f"rank{rank}.snapshot.pickle"))\n'
        "    dist.destroy_process_group()\n",
    ),
]


def lesson_cell(marker: str) -> str:
    """The source of lesson 15's first code cell that holds ``marker``."""
    cells = json.loads(LESSON.read_text())["cells"]
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and marker in source:
            return source
    raise SystemExit(f"{LESSON.name}: no code cell holds {marker!r}")


def gpu_script() -> str:
    """Lesson 15's ``memory_job.py``, on GPU 0."""
    text = lesson_cell("%%writefile memory_job.py").split("\n", 1)[1]
    for old, new in ON_THE_GPU:
        if text.count(old) != 1:
            raise SystemExit(f"memory_job.py: {old!r} found {text.count(old)} times, not once")
        text = text.replace(old, new)
    return text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_case(work: Path, name: str, args: list[str]) -> None:
    """One case under torchrun, its traces gzipped in ``work/name``."""
    run_dir = work / name
    run_dir.mkdir()
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        str(work / "memory_job.py"), *args,
    ]  # fmt: skip
    env = {**os.environ, "RUN_DIR": str(run_dir), "OMP_NUM_THREADS": "1"}
    subprocess.run(command, env=env, check=True, timeout=300)
    for trace in run_dir.glob("rank*.json"):
        with trace.open("rb") as raw, gzip.open(f"{trace}.gz", "wb") as packed:
            shutil.copyfileobj(raw, packed)
        trace.unlink()
    print(name, sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()))


def main() -> None:
    out, work = Path(sys.argv[1]), JOB_DIR
    work.mkdir(parents=True)
    (work / "memory_job.py").write_text(gpu_script() + "\n")
    names = sys.argv[2:] or ["leak", "held-out", "fsdp"]
    if unknown := set(names) - set(CASES):
        raise SystemExit(f"no such case: {sorted(unknown)}; the cases are {list(CASES)}")
    for name in names:
        run_case(work, name, CASES[name])
    import torch

    (work / "versions.txt").write_text(
        f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}\n"
    )
    with tarfile.open(out / "gpu-memory.tar.gz", "w:gz") as tar:
        tar.add(work, arcname="gpu-memory")
    print("packed", (out / "gpu-memory.tar.gz").stat().st_size, "bytes")


if __name__ == "__main__":
    main()
