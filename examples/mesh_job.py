"""A job of two dimensions that goes wrong on purpose: 4 ranks on a 2x2 mesh, tensor parallel
(tp) by data parallel (dp), on gloo and the CPU. Every rank leaves its Flight Recorder dump in
RUN_DIR/fr_<rank> (JSON) and, with --profile, its trace in RUN_DIR/rank<rank>_trace.json.

    OMP_NUM_THREADS=1 RUN_DIR=out torchrun --standalone --nproc-per-node 4 mesh_job.py --bug stall

The groups: tp [0, 1] and [2, 3], dp [0, 2] and [1, 3], as ``init_device_mesh("cpu", (2, 2),
mesh_dim_names=("dp", "tp"))`` makes them. They are made here with ``new_group`` so that each gets
the 3 s timeout: ``init_device_mesh`` makes its groups with the backend's default timeout (30
minutes on gloo in torch 2.14), not the one given to ``init_process_group``.

Each step: an all_reduce in the rank's tp group, then one in its dp group. --bug chooses what
goes wrong at step --bug-step:

--bug stall      rank 3 stops before its tp all_reduce (it sleeps, then leaves)
--bug different  rank 2 calls broadcast in its tp group where rank 3 calls all_reduce
--bug empty      rank 3 stops before its first collective: its dump holds no entry
--bug none       nothing goes wrong (--slow-rank R --delay-ms D: rank R is late by D ms
                 before its tp all_reduce in every step, a straggler)
--profile        profile steps 2 to --steps (a step: a small matmul, then the two all_reduces)
"""

import argparse
import contextlib
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

parser = argparse.ArgumentParser()
parser.add_argument("--bug", choices=["stall", "different", "empty", "none"], default="none")
parser.add_argument("--bug-step", type=int, default=3)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--timeout-s", type=float, default=3)
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--delay-ms", type=float, default=0)
parser.add_argument("--profile", action="store_true")
args = parser.parse_args()
run_dir = os.environ.get("RUN_DIR", ".")

timeout = datetime.timedelta(seconds=args.timeout_s)
dist.init_process_group("gloo", timeout=timeout)
rank = dist.get_rank()
if dist.get_world_size() != 4:
    raise SystemExit("mesh_job.py runs on 4 ranks: torchrun --nproc-per-node 4")
groups = {}
for desc, members in (("tp", [[0, 1], [2, 3]]), ("dp", [[0, 2], [1, 3]])):
    for ranks in members:  # every rank makes every group, in the same order
        group = dist.new_group(ranks, timeout=timeout, group_desc=desc)
        if rank in ranks:
            groups[desc] = group


def goes_wrong(bug, on_rank, step):
    return args.bug == bug and rank == on_rank and step == args.bug_step


def one_step(step):
    weights = torch.randn(64, 64)
    activations = weights @ torch.randn(64, 8)
    if rank == args.slow_rank:
        time.sleep(args.delay_ms / 1e3)
    if goes_wrong("different", 2, step):
        dist.broadcast(activations, src=2, group=groups["tp"])
    else:
        dist.all_reduce(activations, group=groups["tp"])
    gradients = torch.ones(16)
    dist.all_reduce(gradients, group=groups["dp"])


profiler = profile(
    activities=[ProfilerActivity.CPU],
    schedule=schedule(wait=0, warmup=1, active=args.steps - 1),
    on_trace_ready=lambda p: p.export_chrome_trace(f"{run_dir}/rank{rank}_trace.json"),
)
try:
    with profiler if args.profile else contextlib.nullcontext():
        for step in range(1, args.steps + 1):
            if goes_wrong("stall", 3, step) or (args.bug == "empty" and rank == 3):
                time.sleep(2 * args.timeout_s)  # gone elsewhere while the others wait
                break
            one_step(step)
            if args.profile:
                profiler.step()
except RuntimeError as err:
    print(f"rank {rank}: {str(err).splitlines()[0][-80:]}", flush=True)
finally:
    dump = torch._C._distributed_c10d._dump_fr_trace_json()  # bytes of JSON
    partial = os.path.join(run_dir, f".fr_{rank}.partial")
    with open(partial, "wb") as f:
        f.write(dump)
    os.replace(partial, os.path.join(run_dir, f"fr_{rank}"))
