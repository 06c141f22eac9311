"""A job of three overlapping process groups that one rank hangs on purpose, on gloo and the CPU
(issue 49's reproductions; ``hang_cases.py`` runs it). Every rank that can leaves its Flight
Recorder dump in RUN_DIR/fr_<rank> (JSON).

4 or 8 ranks. Tensor-parallel pairs (tp: [0, 1], [2, 3], ...), data-parallel groups across them
(dp: the even ranks and the odd ones), and expert-parallel groups across both (ep: [0, 3] and
[1, 2] on 4 ranks; [0, 1, 4, 5] and [2, 3, 6, 7] on 8). Each step: an all_reduce in tp, an
all_to_all in ep, an all_reduce in dp.

--fault stall  rank --fault-rank stops before its --fault-at collective of step --fault-step
               (it sleeps, as if gone elsewhere), then dumps when it is stopped
--fault kill   it dies there instead (SIGKILL): it leaves no dump at all
--profile      each rank writes its trace of step 1 to RUN_DIR/rank<rank>_trace.json
"""

import argparse
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

GROUPS = {
    4: {"tp": [[0, 1], [2, 3]], "dp": [[0, 2], [1, 3]], "ep": [[0, 3], [1, 2]]},
    8: {
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "dp": [[0, 2, 4, 6], [1, 3, 5, 7]],
        "ep": [[0, 1, 4, 5], [2, 3, 6, 7]],
    },
}
ORDER = ("tp", "ep", "dp")  # the collectives of a step, in the order every rank calls them

parser = argparse.ArgumentParser()
parser.add_argument("--fault", choices=["stall", "kill"], required=True)
parser.add_argument("--fault-rank", type=int, required=True)
parser.add_argument("--fault-step", type=int, required=True)
parser.add_argument("--fault-at", choices=ORDER, required=True)
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--timeout-s", type=float, default=5)
parser.add_argument("--profile", action="store_true")
args = parser.parse_args()
RUN_DIR = os.environ.get("RUN_DIR", ".")

timeout = datetime.timedelta(seconds=args.timeout_s)
dist.init_process_group("gloo", timeout=timeout)
rank, world = dist.get_rank(), dist.get_world_size()
if world not in GROUPS:
    sys.exit(f"hang_job.py runs on 4 or 8 ranks, not {world}")
groups = {}
for desc in ORDER:  # every rank makes every group, in the same order (new_group's rule)
    for ranks in GROUPS[world][desc]:
        group = dist.new_group(ranks, timeout=timeout, group_desc=desc)
        if rank in ranks:
            groups[desc] = (group, len(ranks))


def dump_flight_recorder():
    """Write this rank's Flight Recorder buffer to RUN_DIR/fr_<rank> (JSON), whole or not at all."""
    partial = os.path.join(RUN_DIR, f".fr_{rank}.partial")
    with open(partial, "wb") as f:
        f.write(torch._C._distributed_c10d._dump_fr_trace_json())
    os.replace(partial, os.path.join(RUN_DIR, f"fr_{rank}"))


def stopped(signum, frame):
    """torchrun stops the other ranks with SIGTERM when one fails: dump on the way out."""
    dump_flight_recorder()
    sys.exit(1)


def collective(desc):
    group, size = groups[desc]
    if desc == "ep":
        dist.all_to_all_single(torch.empty(4 * size), torch.ones(4 * size), group=group)
    else:
        dist.all_reduce(torch.ones(16), group=group)


signal.signal(signal.SIGTERM, stopped)
profiler = profile(
    activities=[ProfilerActivity.CPU],
    schedule=schedule(wait=0, warmup=0, active=1, repeat=1),
    on_trace_ready=lambda p: p.export_chrome_trace(f"{RUN_DIR}/rank{rank}_trace.json"),
)
if args.profile:
    profiler.start()
try:
    for step in range(1, args.steps + 1):
        if args.profile and step == 2:
            profiler.step()  # step 1's trace is written
            profiler.stop()
        for desc in ORDER:
            if (rank, step, desc) == (args.fault_rank, args.fault_step, args.fault_at):
                if args.fault == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(6 * args.timeout_s)  # gone elsewhere while the others wait
                dump_flight_recorder()
                sys.exit(1)
            collective(desc)
except RuntimeError as err:  # a collective timed out, or a peer's connection closed
    dump_flight_recorder()
    sys.exit(f"rank {rank}: {str(err).splitlines()[0][-90:]}")
dump_flight_recorder()
dist.destroy_process_group()
