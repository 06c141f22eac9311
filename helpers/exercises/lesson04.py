"""The checks of lesson 4's exercises (``notebooks/04_reading_ddp_traces.ipynb``; worked in
``solutions/04_solutions.ipynb``): where the fast rank waits in the straggler run, and a
straggler chosen at random (:func:`helpers.launch_with_a_hidden_straggler`) and its delay, found
from the traces of that run alone."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..analysis import busy_ms_per_group, collective_waits
from ..traces import load_run
from .common import (
    TRAIN_DDP_SCRIPT,
    Check,
    arguments,
    close,
    is_run,
    number,
    whole,
)
from .hidden import judge_hidden_straggler

__all__ = ["CHECKS", "SCRIPTS", "FLAGS", "TRAIN_DDP_SCRIPT", "STRAGGLER_FLAGS"]

#: The flags of train_ddp.py that make a straggler: which rank, and its delay per batch.
STRAGGLER_FLAGS = ("--slow-rank", "--delay-ms")
#: The scripts these checks rely on, and the flags of theirs they pass or read.
SCRIPTS = (TRAIN_DDP_SCRIPT,)
FLAGS = STRAGGLER_FLAGS


def _broadcast_ms_per_rank(events: pd.DataFrame) -> pd.Series:
    """Median over steps of the wall time each rank spends in broadcasts (two broadcasts at
    once on two threads count once), in ms: a Series indexed by rank."""
    waits = collective_waits(events)
    broadcasts = waits[waits["name"].str.contains("broadcast", case=False)].dropna(subset=["step"])
    broadcasts = broadcasts.assign(end_us=broadcasts["start_us"] + broadcasts["dur_us"])
    per_step = busy_ms_per_group(broadcasts, ["rank", "step"])
    if per_step.empty:
        return pd.Series(dtype=float)
    return per_step.groupby(level="rank").median()


def _where_the_fast_rank_waits(
    prediction: Any, run: Any = None, events: Any = None
) -> tuple[bool, str]:
    """4.1: the rank that waits in broadcasts, and how long per step, in the straggler
    run. ``events`` is accepted only to say that the check needs the run itself."""
    if not is_run(run):
        return False, 'hand the check the straggler run itself: check("04.1", prediction, run=slow)'
    given = arguments(run)
    slow_rank = whole(given.get("--slow-rank", -1))
    delay_ms = number(given.get("--delay-ms", 0))
    if run.script != TRAIN_DDP_SCRIPT or slow_rank is None or slow_rank < 0 or not delay_ms:
        return False, (
            f"this is not a straggler run: use the lesson's run of {TRAIN_DDP_SCRIPT} with "
            "--slow-rank and --delay-ms (slow)"
        )
    per_rank = _broadcast_ms_per_rank(load_run(run).events)
    if per_rank.empty:
        return False, "this run's traces have no broadcasts inside profiler steps"
    if not isinstance(prediction, dict) or {"rank", "ms"} - set(prediction):
        return False, 'predict a dict {"rank": ..., "ms": ...}'
    rank, ms = whole(prediction["rank"]), number(prediction["ms"])
    if rank not in per_rank.index or ms is None:
        return False, f"the rank is one of {sorted(int(r) for r in per_rank.index)}, ms a number"
    longest = float(per_rank.max())
    if rank == slow_rank or not close(float(per_rank[rank]), longest, 0.3, 10):
        return False, (
            "the rank that waits is the one that is early: the slow rank joins the "
            "broadcast last and hardly waits in it"
        )
    measured = float(per_rank[rank])
    if not close(ms, measured, 0.3, 10):
        return False, (
            f"rank {rank} is right; the time is off by more than 30 %: the wait is about "
            f"the delay the other rank adds to its batches, counted once per step"
        )
    return True, (
        f"rank {rank} spends {measured:.0f} ms per step in broadcasts, waiting for the slow rank"
    )


def _the_hidden_straggler(answer: Any, run: Any) -> tuple[bool, str]:
    """4.2: the rank that launch_with_a_hidden_straggler slowed, and its delay per step, from
    the traces of that run alone (the run's manifest keeps what was chosen)."""
    return judge_hidden_straggler(
        answer, run, TRAIN_DDP_SCRIPT, "launch_with_a_hidden_straggler(NPROC, common)"
    )


#: Lesson 4's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "04.1": _where_the_fast_rank_waits,
    "04.2": _the_hidden_straggler,
}
