"""The checks of lesson 15's exercises (``notebooks/15_where_the_memory_went.ipynb``; worked in
``solutions/15_solutions.ipynb``): a leak placed at random (:func:`helpers.launch_with_a_hidden_leak`)
found from the traces alone, its rank, MiB a step and line; and the optimizer state each rank of
a sharded run of a wider model holds at its peak, predicted and then read from the run."""

from __future__ import annotations

import re
from typing import Any

from ..analysis import alive_at_peak, allocation_lives, memory_growth
from ..traces import TraceError, load_memory, load_run
from .common import Check, arguments, close, is_run, number, one_hint, whole, within
from .hidden import HIDDEN_LEAK_EXPERIMENT, MEMORY_SCRIPT

__all__ = ["CHECKS", "SCRIPTS", "FLAGS"]

SCRIPTS = (MEMORY_SCRIPT,)
FLAGS = ("--keep-rank", "--keep-mib", "--keep-in", "--fsdp", "--width", "--first-step")
#: How close a MiB figure must be: 5 % (the job keeps exact sizes; the traces say them to the byte).
MIB_TOLERANCE = 0.05
_LEAK = "launch_with_a_hidden_leak(NPROC, common)"
_WIDE = 'launch("memory_job.py", nproc=NPROC, cpu=True, args=short + ["--fsdp", "--width", "1024"])'  # fmt: skip


def _lives(run: Any) -> tuple[Any, Any]:
    """A run's memory events and each allocation's life."""
    memory = load_memory(run)
    return memory, allocation_lives(memory, load_run(run).events)


def _line_number(value: Any) -> int | None:
    """A line given as 12, "12" or "memory_job.py:12"."""
    if isinstance(value, str):
        found = re.fullmatch(r"\s*(?:memory_job\.py:)?(\d+)\s*", value)
        return int(found.group(1)) if found else None
    return whole(value)


def _a_leak_found_from_the_traces(answer: Any, run: Any) -> tuple[bool, str]:
    """15.1: ``{"rank": R, "mib_per_step": M, "line": N}``: the rank that keeps memory, its MiB a
    step within :data:`MIB_TOLERANCE` (the run's own ``--keep-mib``) and the line of
    ``memory_job.py`` that allocates it (what the run's traces say keeps it). One hint for any
    wrong answer, which says where to look, never which part was right: a blind guess passes
    one run in 32 (:data:`helpers.exercises.hidden.LEAK_MIB`)."""
    given = arguments(run) if is_run(run) else {}
    if not is_run(run) or run.experiment != HIDDEN_LEAK_EXPERIMENT or "--keep-rank" not in given:
        return False, f"launch the job with {_LEAK} and hand the check that run"
    shape = 'answer with a dict {"rank": ..., "mib_per_step": ..., "line": ...}'
    if not isinstance(answer, dict) or set(answer) != {"rank", "mib_per_step", "line"}:
        return False, shape
    rank, mib = whole(answer["rank"]), number(answer["mib_per_step"])
    line = _line_number(answer["line"])
    if rank is None or mib is None or line is None:
        return False, shape + ": a rank, a number of MiB and a line number"
    try:
        growth = memory_growth(_lives(run)[1])
    except TraceError as err:
        return False, f"this run's traces cannot be read: {err}"
    if growth.empty:
        return False, "this run's traces show no growth: was it launched with common?"
    kept = _line_number(str(growth.iloc[0]["line"]))
    truth = (whole(given["--keep-rank"]), number(given.get("--keep-mib", 1.0)))
    hint = one_hint([rank == truth[0], within(mib, truth[1], (MIB_TOLERANCE, 0.0)), line == kept], None, (
        "not yet: pair each allocation with its free, then look for what one rank allocates in "
        "every step and never frees: its size a step, and the line of your code around it "
        "(sections 3 and 4)"
    ))  # fmt: skip
    if hint:
        return False, hint
    return True, f"rank {rank} keeps {truth[1]:g} MiB a step, allocated at memory_job.py:{kept}"


def _optimizer_state_of_a_wider_sharded_model(predicted: Any, run: Any) -> tuple[bool, str]:
    """15.2: the MiB of optimizer state each rank of a sharded run with ``--width 1024`` holds at
    its peak, predicted, and then read from the run (every rank's within :data:`MIB_TOLERANCE`)."""
    given = arguments(run) if is_run(run) else {}
    if not is_run(run) or run.script != MEMORY_SCRIPT or number(given.get("--width")) != 1024:
        return False, f"predict first, then launch the run: {_WIDE}"
    if "--fsdp" not in given or "--first-step" not in given:
        return False, "launch it sharded (--fsdp) and with short, which traces Adam's first step"
    if number(predicted) is None:
        return False, "predict a number: the MiB of optimizer state on each rank"
    try:
        memory, lives = _lives(run)
    except TraceError as err:
        return False, f"this run's traces cannot be read: {err}"
    alive = alive_at_peak(lives, memory)
    state = alive[alive["category"] == "optimizer state"]["mib"]
    if state.empty:
        return False, "this run's peaks hold no optimizer state: was it launched with short?"
    said = float(number(predicted))
    if all(close(said, float(mib), MIB_TOLERANCE, 0.0) for mib in state):
        return True, f"each rank holds {state.mean():.2f} MiB: Adam's two copies of its shard"
    truth = float(state.mean())
    if close(said, 2 * truth, MIB_TOLERANCE, 0.0):
        return False, "that is what a replica holds: an FSDP2 rank updates only its shard"
    if close(said, truth / 2, MIB_TOLERANCE, 0.0):
        return False, "Adam keeps two tensors for each parameter it updates"
    return False, (
        "count the parameters of four layers of 1024 by 1024 (weights and biases, 4 bytes "
        "each), then what Adam keeps of them, then what one rank of two updates"
    )


#: Lesson 15's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "15.1": _a_leak_found_from_the_traces,
    "15.2": _optimizer_state_of_a_wider_sharded_model,
}
