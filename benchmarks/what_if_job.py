"""A tiny job for the what-if benchmark (``what_if_pairs.py``), launched by torchrun on gloo.

Every step: a little compute, then on each rank a delay before its collective
(``--delay-ms``, in ``load_batch``), an all-reduce issued asynchronously, work of its own while
the all-reduce waits for the other ranks (``--overlap-ms``, in ``overlapped``), and the wait for
the all-reduce. Delays are per rank: ``--delay-ms 120,60`` gives rank 0 120 ms and rank 1 60.
Traces go to ``RUN_DIR``, one per rank.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile, schedule


def per_rank(text: str, rank: int) -> float:
    """This rank's value (seconds) of a list of ms such as ``"120,60"``."""
    values = [float(v) for v in text.split(",")] if text else []
    return (values[rank] if rank < len(values) else 0.0) / 1000


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=9)
    p.add_argument("--delay-ms", default="")
    p.add_argument("--overlap-ms", default="")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    delay, overlap = per_rank(args.delay_ms, rank), per_rank(args.overlap_ms, rank)
    x, grads = torch.randn(128, 128), torch.randn(1 << 16)
    run_dir = os.environ.get("RUN_DIR", ".")

    def write(prof):
        prof.export_chrome_trace(os.path.join(run_dir, f"rank{rank}.json"))

    plan = schedule(wait=1, warmup=1, active=args.steps - 2)
    with profile(activities=[ProfilerActivity.CPU], schedule=plan, on_trace_ready=write) as prof:
        for _ in range(args.steps):
            with record_function("compute"):
                for _ in range(4):
                    x = torch.tanh(x @ x)
            with record_function("load_batch"):
                time.sleep(delay)
            work = dist.all_reduce(grads, async_op=True)
            with record_function("overlapped"):
                time.sleep(overlap)
            work.wait()
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
