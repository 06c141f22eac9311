"""A small DDP job on gloo whose memory is known by construction.

Each step: a batch, a forward through four linear layers, the loss, the backward and an
Adam step. Traces go to RUN_DIR, one per rank, with profile_memory, record_shapes and
with_stack on.

--keep-rank R    rank R keeps --keep-mib MiB every step and never frees it: a copy of
                 its first layer's output in forward (--keep-in forward), or of the
                 loss's input in loss_of (--keep-in loss)
--fsdp           shard the model with FSDP2 instead of replicating it with DDP
--first-step     trace the first step too (the profiler's warmup comes before any
                 work), where Adam makes its state
--timeline       write the profiler's own memory timeline (export_memory_timeline:
                 each allocation's category) beside the traces, in
                 memory-timeline/rank<N>.raw.json.gz; on torch 2.14 it fails
                 ("version mismatch") under FSDP2 and where the trace holds Adam's
                 first step
"""

import argparse
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

KEPT = []  # what the keeping rank holds on to, step after step


class Model(nn.Module):
    """Four linear layers; ``keep_mib`` > 0 keeps a copy of the first one's output."""

    def __init__(self, width: int, keep_mib: float, keep_in: str):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(4))
        self.keep_mib, self.keep_in = keep_mib, keep_in

    def forward(self, x):
        x = torch.relu(self.layers[0](x))
        if self.keep_mib and self.keep_in == "forward":
            repeats, count = copy_size(x, self.keep_mib)
            KEPT.append(x.detach().flatten().repeat(repeats)[:count].clone())
        for layer in self.layers[1:]:
            x = torch.relu(layer(x))
        return x


def copy_size(x, mib):
    """How many times to repeat ``x``'s values, and how many to keep, for ``mib``."""
    count = int(mib * 2**20) // x.element_size()
    return count // x.numel() + 1, count


def loss_of(output, target, keep_mib):
    """The mean squared error; ``keep_mib`` > 0 keeps a copy of the output first."""
    if keep_mib:
        repeats, count = copy_size(output, keep_mib)
        KEPT.append(output.detach().flatten().repeat(repeats)[:count].clone())
    return F.mse_loss(output, target)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--keep-rank", type=int, default=-1)
    p.add_argument("--keep-mib", type=float, default=1.0)
    p.add_argument("--keep-in", choices=["forward", "loss"], default="forward")
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--timeline", action="store_true")
    p.add_argument("--first-step", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    keep = args.keep_mib if rank == args.keep_rank else 0.0
    keep_in_loss = keep if args.keep_in == "loss" else 0.0
    torch.manual_seed(0)
    device = torch.device("cuda", 0)
    torch.cuda.memory._record_memory_history(max_entries=50_000)
    model = Model(args.width, keep, args.keep_in).to(device)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        wrapped = fully_shard(model)
    else:
        wrapped = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(wrapped.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.width, device=device)
    target = torch.randn(args.batch, args.width, device=device)
    run_dir = os.environ.get("RUN_DIR", ".")

    def write(prof):
        prof.export_chrome_trace(os.path.join(run_dir, f"rank{rank}.json"))
        if args.timeline:
            with warnings.catch_warnings():  # it says it is deprecated, for snapshots
                warnings.simplefilter("ignore")
                folder = os.path.join(run_dir, "memory-timeline")
                os.makedirs(folder, exist_ok=True)
                path = os.path.join(folder, f"rank{rank}.raw.json.gz")
                prof.export_memory_timeline(path, device="cuda:0")

    plan = schedule(wait=0, warmup=1, active=args.steps - 1, repeat=1)
    with profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
        schedule=plan,
        on_trace_ready=write,
        profile_memory=True,
        record_shapes=True,
        with_stack=True,
    ) as prof:
        if args.first_step:  # the warmup step before any work: every step is traced
            prof.step()
        for _ in range(args.steps - (1 if args.first_step else 0)):
            batch = x + 0.0  # the step's input, a tensor of its own
            optimizer.zero_grad(set_to_none=True)
            loss = loss_of(wrapped(batch), target, keep_in_loss)
            loss.backward()
            optimizer.step()
            prof.step()
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(os.path.join(run_dir, f"rank{rank}.snapshot.pickle"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
