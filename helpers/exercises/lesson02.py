"""The checks of lesson 2's exercises (``notebooks/02_profiler_primer.ipynb``; worked in
``solutions/02_solutions.ipynb``): what a two-cycle schedule records, and the slowest
backward convolution by its input shapes. The lesson profiles in the notebook itself: no
script, no flags."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..traces import TraceError, load_trace
from .common import Check, whole_numbers

__all__ = [
    "CHECKS",
    "SCRIPTS",
    "FLAGS",
    "SCHEDULE_2_1",
    "STEPS_2_1",
    "CONVOLUTION_BACKWARD",
    "recorded_windows",
]

#: The scripts these checks rely on, and the flags of theirs they pass or read: none.
SCRIPTS: tuple[str, ...] = ()
FLAGS: tuple[str, ...] = ()
#: Exercise 2.1's schedule and number of steps (the exercise's statement).
SCHEDULE_2_1 = {"wait": 2, "warmup": 1, "active": 2, "repeat": 2}
STEPS_2_1 = 10
#: The operator whose groups exercise 2.2 compares (the lesson's model's backward pass).
CONVOLUTION_BACKWARD = "aten::convolution_backward"


def recorded_windows(
    steps: int, wait: int, warmup: int, active: int, repeat: int
) -> list[list[int]]:
    """The steps of each trace that ``torch.profiler.schedule`` saves: each cycle waits, warms
    up, then records ``active`` steps and saves them when the last one ends (torch's
    ``schedule_fn``, without ``skip_first``; the tests compare the two).

    Args:
        steps: the steps the loop runs (numbered from 0, as ``prof.step_num`` counts them).
        wait: ``schedule``'s ``wait``.
        warmup: its ``warmup``.
        active: its ``active``.
        repeat: its ``repeat`` (0: cycles until the steps end).

    Returns:
        The steps of each saved window, one list per window, in order.
    """
    cycle = wait + warmup + active
    windows = []
    for start in range(0, steps, cycle):
        if repeat and len(windows) == repeat:
            break
        if start + cycle <= steps:
            windows.append(list(range(start + wait + warmup, start + cycle)))
    return windows


def _what_a_schedule_records(prediction: Any, files: Any) -> tuple[bool, str]:
    """2.1: the files a two-cycle schedule writes, and the steps each holds."""
    if isinstance(files, (str, Path)) or not isinstance(files, Iterable):
        return False, "hand the check the list of paths save_trace wrote (exported)"
    paths = sorted({Path(f) for f in files})
    if not paths:
        return False, "no trace files: run the profiler and collect the files save_trace wrote"
    actual = {}
    for path in paths:
        try:
            steps = load_trace(path).events["step"].dropna().unique()
        except (OSError, TraceError) as err:
            return False, f"{path.name} is not a trace the profiler wrote ({err})"
        actual[path.name] = sorted(int(s) for s in steps)
    cycle = ", ".join(f"{k}={v}" for k, v in SCHEDULE_2_1.items())
    if sorted(actual.values()) != recorded_windows(STEPS_2_1, **SCHEDULE_2_1):
        return False, (
            f"these files are not what schedule({cycle}) records over {STEPS_2_1} steps: start "
            f"from exported = [], profile {STEPS_2_1} steps with that schedule and "
            f"on_trace_ready=save_trace, and hand the check exported"
        )
    if not isinstance(prediction, dict):
        return False, "predict a dict: file name -> list of recorded step numbers"
    if set(prediction) != set(actual):
        return False, (
            "on_trace_ready runs when an active phase ends, and save_trace names the "
            "file after prof.step_num then: how many steps have run at that moment?"
        )
    wrong = [name for name in actual if whole_numbers(prediction[name]) != actual[name]]
    if wrong:
        return False, (
            f"the steps in {wrong[0]} are not those: steps count from 0, and only the "
            f"active phase of each cycle (wait, warmup, active) is kept"
        )
    return True, f"{len(actual)} files, each with its cycle's active steps: {actual}"


def _the_slowest_convolution_by_shape(shapes: Any, prof: Any) -> tuple[bool, str]:
    """2.2: the input shapes of the backward convolution with the most self time."""
    if not hasattr(prof, "key_averages"):
        return False, "hand the check the profile(...) object you profiled the step with"
    groups = [
        e for e in prof.key_averages(group_by_input_shape=True) if e.key == CONVOLUTION_BACKWARD
    ]
    if not groups:
        return False, (
            f"this profile has no {CONVOLUTION_BACKWARD}: profile a whole training "
            "step, backward pass included"
        )
    if not any(e.input_shapes for e in groups):
        return False, (
            f"no input shapes in this profile of {CONVOLUTION_BACKWARD}: profile the "
            "step with record_shapes=True"
        )
    slowest = max(groups, key=lambda e: e.self_cpu_time_total)
    by_total = max(groups, key=lambda e: e.cpu_time_total)
    if shapes == slowest.input_shapes:
        return True, (
            f"{slowest.count} call(s) with these shapes spent "
            f"{slowest.self_cpu_time_total / 1e3:.1f} ms in themselves"
        )
    if shapes == by_total.input_shapes:
        return (
            False,
            "that group has the most total time (with children); the question is self time",
        )
    if not any(shapes == e.input_shapes for e in groups):
        return False, (
            f"these are not the input shapes of any {CONVOLUTION_BACKWARD} group: "
            "take them from key_averages(group_by_input_shape=True)"
        )
    return False, "another shape spends more self CPU time: sort by self_cpu_time_total"


#: Lesson 2's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "02.1": _what_a_schedule_records,
    "02.2": _the_slowest_convolution_by_shape,
}
