"""A pipeline-parallel job on gloo, written out: one stage per rank, launched by torchrun.

Each step pushes ``--microbatches`` micro-batches through the stages: a stage receives its input
from the stage before (``dist.recv``), runs its layers, and sends the output on (``dist.isend``);
backward sends each input's gradient back the same way. ``--schedule gpipe`` runs every forward
then every backward; ``1f1b`` runs a stage's warm-up forwards, then alternates one forward and one
backward. One stage can be slowed: a sleep inside ``record_function("slow_layer")`` in each of its
forwards (``--slow-stage``, ``--slow-ms``). ``--work-ms`` gives every stage work that leaves the
CPU free (a sleep in each forward, twice as long in each backward), so that stages of equal
work follow the textbook on a machine with fewer cores than ranks. Traces (with ``record_shapes=True``, which records each
send's peer and tag) go to ``RUN_DIR``, one per rank.

(Why not ``torch.distributed.pipelining``: with torch 2.14.1 on gloo, its GPipe and 1F1B schedules
hung here on three stages once gradients were sent back. Its ``stage.py`` describes a deadlock of
sends and receives that share one communicator, and the fix it offers, a communicator per
direction (``TORCH_DISTRIBUTED_PIPELINE_PER_DIRECTION_P2P=1``), failed here in ``split_group``
on gloo.)
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile, schedule

ACTIVATION, GRADIENT = 0, 1  # the tags of the two directions
WIDTH, ROWS = 256, 16  # a micro-batch: ROWS rows of WIDTH features


def order_of(schedule_name: str, stage: int, stages: int, microbatches: int) -> list[tuple]:
    """The stage's work in a step, in order: ``("f", k)`` forward and ``("b", k)`` backward of
    micro-batch k."""
    if schedule_name == "gpipe":
        return [("f", k) for k in range(microbatches)] + [("b", k) for k in range(microbatches)]
    warm = min(stages - stage - 1, microbatches)
    order = [("f", k) for k in range(warm)]
    for k in range(microbatches - warm):
        order += [("f", warm + k), ("b", k)]
    return order + [("b", k) for k in range(microbatches - warm, microbatches)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    p.add_argument("--microbatches", type=int, default=6)
    p.add_argument("--slow-stage", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--work-ms", type=float, default=0.0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == world - 1
    torch.manual_seed(rank)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(4)])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    slow = args.slow_ms / 1000 if rank == args.slow_stage else 0.0
    work = args.work_ms / 1000  # a stage's own work, that leaves the CPU free
    inputs, outputs, sends = {}, {}, []

    def forward(k):
        x = torch.randn(ROWS, WIDTH)
        if not first:
            dist.recv(x, rank - 1, tag=ACTIVATION)
            x.requires_grad_()
        with record_function(f"forward {k}"):
            time.sleep(work)
            if slow:
                with record_function("slow_layer"):
                    time.sleep(slow)
            inputs[k], outputs[k] = x, model(x)
        if not last:
            sends.append(dist.isend(outputs[k].detach(), rank + 1, tag=ACTIVATION))

    def backward(k):
        y, grad = outputs.pop(k), None
        if last:
            y = y.pow(2).mean()
        else:
            grad = torch.empty(ROWS, WIDTH)
            dist.recv(grad, rank + 1, tag=GRADIENT)
        with record_function(f"backward {k}"):
            time.sleep(2 * work)
            y.backward(grad)
        x = inputs.pop(k)
        if not first:
            sends.append(dist.isend(x.grad, rank - 1, tag=GRADIENT))

    def write(prof):
        prof.export_chrome_trace(os.path.join(os.environ.get("RUN_DIR", "."), f"rank{rank}.json"))

    plan = schedule(wait=1, warmup=1, active=args.steps - 2)
    order = order_of(args.schedule, rank, world, args.microbatches)
    with profile(
        activities=[ProfilerActivity.CPU], schedule=plan, on_trace_ready=write, record_shapes=True
    ) as prof:
        for _ in range(args.steps):
            for what, k in order:
                (forward if what == "f" else backward)(k)
            while sends:
                sends.pop().wait()
            optimizer.step()
            optimizer.zero_grad()
            prof.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
