"""What profiling costs: the same training steps timed without the profiler and with it.

Lesson 2 measures it with :func:`profiling_cost`. The profiler adds work to every op it
records, so the cost depends less on how long a step is than on how many ops it runs; a
slowdown is measured against a baseline taken moments before, and the median over a few
rounds keeps other work on the machine (and the CPU's changing clock speed) from deciding it.

On the CPU the steps run on one thread and are timed by that thread's CPU time: the work the
step and the profiler do, not the turns other programs take on the cores. Timed by the wall
clock on a machine kept busy by two other programs, the MLP of lesson 2 measured 0.4 to 1.7
times slower with the profiler (round to round; 1.0 the median), and by CPU time on one thread
1.4 to 1.7 times (1.65, as on the idle machine); with two threads, waiting threads spin, and
that spinning is CPU time too.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:  # torch is imported when a step is timed, not with the helpers
    from torch.profiler import ProfilerActivity

__all__ = ["profiling_cost", "steps_per_second"]


def steps_per_second(
    step_fn: Callable[[], object],
    steps: int,
    setting: dict | None,
    activities: Sequence[ProfilerActivity],
    device: str,
) -> float:
    """Steps per second of ``steps`` calls of ``step_fn``, after two warm-up calls.

    Only the steps are timed, not the profiler's stop: on the CPU by the CPU time of the thread
    that runs them (``time.thread_time``), on ``device="cuda"`` by the wall clock, the GPU
    waited for before it starts and before it stops.

    Args:
        step_fn: one step of work.
        steps: how many steps to time.
        setting: ``None`` to run without the profiler; otherwise the keyword arguments of a
            ``torch.profiler.profile`` (``{}``, ``{"record_shapes": True}``, ...).
        activities: what the profiler records around the steps.
        device: ``"cpu"`` or ``"cuda"``.
    """
    import torch
    from torch.profiler import profile

    for _ in range(2):  # warm up after switching workloads
        step_fn()
    if device == "cuda":
        torch.cuda.synchronize()
    recording = (
        nullcontext() if setting is None else profile(activities=list(activities), **setting)
    )
    clock = time.perf_counter if device == "cuda" else time.thread_time
    with recording:
        start = clock()
        for _ in range(steps):
            step_fn()
        if device == "cuda":
            torch.cuda.synchronize()
        elapsed = clock() - start  # the steps only, not the profiler's stop
    return steps / max(elapsed, 1e-9)  # a step that does nothing takes no CPU time


def profiling_cost(
    workloads: dict[str, tuple[Callable[[], object], int]],
    settings: dict[str, dict | None],
    activities: Sequence[ProfilerActivity],
    device: str,
    rounds: int = 7,
) -> pd.DataFrame:
    """How many times slower each workload's steps run under each profiler setting.

    In each round, every workload is timed without the profiler and then under each setting
    (:func:`steps_per_second`), and each setting's slowdown is the baseline's steps per second
    over its own. On the CPU, torch runs on one thread meanwhile (its number of threads is set
    back after).

    Args:
        workloads: ``{name: (step_fn, steps)}``: a training step and how many to time at once.
        settings: ``{name: profile keyword arguments}``, ``None`` for no profiler (slowdown 1.0).
        activities: the profiler's activities (CPU, and CUDA on a GPU).
        device: ``"cpu"`` or ``"cuda"`` (see :func:`steps_per_second` for how each is timed).
        rounds: how many rounds.

    Returns:
        One row per workload and setting: ``workload, setting, slowdown`` (the median over the
        rounds), in the order of the arguments.
    """
    import torch

    threads = torch.get_num_threads()
    if device != "cuda":
        torch.set_num_threads(1)
    try:
        slowdowns = _slowdowns(workloads, settings, activities, device, rounds)
    finally:
        torch.set_num_threads(threads)
    return pd.DataFrame(
        [
            {"workload": w, "setting": s, "slowdown": statistics.median(v)}
            for (w, s), v in slowdowns.items()
        ]
    )


def _slowdowns(
    workloads: dict[str, tuple[Callable[[], object], int]],
    settings: dict[str, dict | None],
    activities: Sequence[ProfilerActivity],
    device: str,
    rounds: int,
) -> dict[tuple[str, str], list[float]]:
    """``{(workload, setting): the slowdown of each round}``, as :func:`profiling_cost` says."""
    slowdowns: dict[tuple[str, str], list[float]] = {
        (w, s): [] for w in workloads for s in settings
    }
    for _ in range(rounds):
        for w, (step_fn, steps) in workloads.items():
            baseline = steps_per_second(step_fn, steps, None, activities, device)
            for s, setting in settings.items():
                slowdowns[(w, s)].append(
                    1.0
                    if setting is None
                    else baseline / steps_per_second(step_fn, steps, setting, activities, device)
                )
    return slowdowns
