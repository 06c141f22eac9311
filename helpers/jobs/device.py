"""Where a run's ranks run: CPU + gloo, or GPUs + nccl (one rank per GPU), and why."""

from __future__ import annotations

from dataclasses import dataclass

from . import recorded

__all__ = ["Device", "choose_device"]


@dataclass(frozen=True)
class Device:
    """Where the ranks run: ``kind`` ``cpu`` or ``cuda``, ``backend`` ``gloo`` or ``nccl``,
    ``gpus`` visible GPUs, and ``reason``: the choice in one sentence."""

    kind: str
    backend: str
    gpus: int
    reason: str

    def nproc(self, cpu: int = 2) -> int:
        """Ranks per node: one per GPU on a GPU node, ``cpu`` on the CPU."""
        return self.gpus if self.kind == "cuda" else cpu


def _visible_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # no torch, or a broken driver: no GPU
        return 0


def choose_device(cpu: bool = False, min_gpus: int = 2, gpus: int | None = None) -> Device:
    """CPU + gloo, or GPUs + nccl (one rank per GPU), and why.

    GPUs are used when at least ``min_gpus`` are visible (2 for a DDP job: each rank needs
    a GPU of its own, and one rank is not a distributed job); with fewer, the ranks run on
    the CPU with gloo. ``cpu=True`` forces the CPU; in recorded mode the device is the
    recordings' (the CPU). ``gpus`` overrides the count (for tests).
    """
    if recorded.replaying():
        return Device("cpu", "gloo", 0, "recorded mode: the runs are replayed from CPU recordings")
    n = _visible_gpus() if gpus is None else gpus
    if cpu:
        return Device("cpu", "gloo", n, "the CPU was asked for (cpu=True)")
    if n >= min_gpus:
        return Device("cuda", "nccl", n, f"{n} GPUs visible: one rank per GPU, nccl")
    if n == 0:
        return Device("cpu", "gloo", 0, "no GPU visible: ranks on the CPU, gloo")
    return Device(
        "cpu",
        "gloo",
        n,
        f"{n} GPU visible but {min_gpus} needed (a GPU per rank): ranks on the CPU, gloo",
    )
