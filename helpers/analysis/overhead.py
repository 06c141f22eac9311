"""What profiling costs: the same training steps timed without the profiler and with it.

Lesson 2 measures it with :func:`profiling_cost`. The profiler adds work to every op it
records, so the cost depends less on how long a step is than on how many ops it runs; a
slowdown is measured against a baseline taken moments before, and the median over a few
rounds keeps other work on the machine (and the CPU's changing clock speed) from deciding it.
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

    setting: ``None`` to run without the profiler; otherwise the keyword arguments of a
    ``torch.profiler.profile`` (``{}``, ``{"record_shapes": True}``, ...) recording
    ``activities`` around the steps. Only the steps are timed, not the profiler's stop. On
    ``device="cuda"`` the GPU is waited for before the clock starts and before it stops.
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
    with recording:
        start = time.perf_counter()
        for _ in range(steps):
            step_fn()
        if device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start  # the steps only, not the profiler's stop
    return steps / elapsed


def profiling_cost(
    workloads: dict[str, tuple[Callable[[], object], int]],
    settings: dict[str, dict | None],
    activities: Sequence[ProfilerActivity],
    device: str,
    rounds: int = 7,
) -> pd.DataFrame:
    """How many times slower each workload's steps run under each profiler setting.

    workloads: ``{name: (step_fn, steps)}``: a training step and how many to time at once.
    settings: ``{name: profile keyword arguments}``, ``None`` for no profiler (slowdown 1.0).

    In each of ``rounds`` rounds, every workload is timed without the profiler and then under
    each setting (:func:`steps_per_second`), and each setting's slowdown is the baseline's
    steps per second over its own. Returns one row per workload and setting: ``workload,
    setting, slowdown`` (the median over the rounds), in the order of the arguments.
    """
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
    return pd.DataFrame(
        [
            {"workload": w, "setting": s, "slowdown": statistics.median(v)}
            for (w, s), v in slowdowns.items()
        ]
    )
