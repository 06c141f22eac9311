"""The checks of lesson 11's exercises (``notebooks/11_what_held_each_step.ipynb``; worked in
``solutions/11_solutions.ipynb``): the rank and the part of its step that a hidden slowdown
slowed (:func:`helpers.launch_with_a_hidden_slowdown`), read from the critical path; and a
what-if of overlapped work at factors the check draws, where moving the step by the change in
the work is wrong, given before the check runs the job with that work and compares the runs."""

from __future__ import annotations

import random
from typing import Any

import pandas as pd

from ..analysis import compare_runs, step_times, within_noise
from ..jobs import launch
from ..traces import load_run
from .common import (
    TRAIN_DDP_SCRIPT,
    Check,
    arguments,
    is_run,
    number,
    one_hint,
    predictions,
    whole,
    within,
)
from .hidden import DELAY_TOLERANCE, HIDDEN_SLOWDOWN_EXPERIMENT, SLOWED_PARTS

__all__ = ["CHECKS", "SCRIPTS", "FLAGS", "PARTS_BY_KIND", "OVERLAP_SCRIPT", "WORK_FACTORS"]

#: Section 5's job: rank 0 works while it waits in an all-reduce for rank 1's late batch.
OVERLAP_SCRIPT = "overlap_job.py"
SCRIPTS = (TRAIN_DDP_SCRIPT, OVERLAP_SCRIPT)
FLAGS = ("--slow-rank", "--delay-ms", "--slow-part", "--overlap-ms")
#: The kind of work on the critical path that each slowed part shows as.
PARTS_BY_KIND = {"data loading": "data", "compute": "backward", "optimizer": "optimizer"}
_LAUNCH_11_1 = "launch_with_a_hidden_slowdown(NPROC, common)"


def _the_slowed_part(answer: Any, run: Any) -> tuple[bool, str]:
    """11.1: ``{"rank": r, "part": "data" | "backward" | "optimizer", "delay_ms": ms}`` of a
    hidden slowdown, the delay to within :data:`DELAY_TOLERANCE`. A blind guess passes one run
    in 30 on 2 ranks (2 ranks, 3 parts, 5 delays), and every wrong answer gets one hint."""
    given = arguments(run) if is_run(run) else {}
    slowed, part = whole(given.get("--slow-rank", -1)), given.get("--slow-part")
    delay = number(given.get("--delay-ms"))
    if (
        not is_run(run)
        or run.experiment != HIDDEN_SLOWDOWN_EXPERIMENT
        or slowed is None
        or part is None
        or delay is None
    ):
        return False, f"launch the run with {_LAUNCH_11_1} and hand the check that run"  # fmt: skip
    if not isinstance(answer, dict) or {"rank", "part", "delay_ms"} - set(answer):
        return False, 'answer with a dict {"rank": ..., "part": ..., "delay_ms": ...}'
    if answer["part"] not in SLOWED_PARTS:
        return False, f"the part is one of {list(SLOWED_PARTS)}"
    said = number(answer["delay_ms"])
    hint = one_hint(
        [
            whole(answer["rank"]) == slowed,
            answer["part"] == part,
            within(said, delay, DELAY_TOLERANCE),
        ],  # fmt: skip
        said,
        "not yet: each part runs as one op, the batch as the DataLoader's __next__, the "
        "backward's sleep inside the hook around layer3 (BackwardHookFunctionBackward), the "
        "optimizer as Optimizer.step. On the path by rank and op (path_summary(path, "
        "['rank', 'name'])), the slowed one holds tens of ms a step and the other two hardly "
        "any: compare those three ops, not kinds (a rank's compute can hold more than the "
        "delay). The delay is that op's time per step in the trace on the slowed rank less "
        "the same op's on the other rank. If none of the three holds tens of ms, a busy "
        "machine slowed the other rank by more than the delay and hid it: launch again",
    )
    if hint:
        return False, hint
    return True, f"rank {slowed}'s {part} was slowed by {delay:g} ms a step, and the path says so"


#: The pairs of factors exercise 11.2's check draws (one pair): rank 0's overlapped work at that
#: many times its 40 ms, one below 1.5 (the work still ends before rank 1's 60 ms late batch:
#: the step does not move) and one past it (the work holds the step): no straight line in the
#: factor, and no one number, is within the noise of both runs.
WORK_FACTORS = ((0.5, 3.5), (0.75, 2.75), (1.25, 3.0))


def _in_ms(said: Any, factor: float) -> tuple[float | None, str]:
    """A prediction of 11.2 as a number of ms, or None and why not."""
    ms = number(said)
    return ms, "" if ms is not None else f"predict({factor:g}) gave no number of ms"


def _median_step(events: pd.DataFrame) -> float:
    """A run's median step (ms): the median over its steps of the median over its ranks."""
    return float(step_times(events).median(axis=1).median())


def _overlap_run(slow: Any, work_ms: float) -> Any:
    """A fresh run of the overlap job ``slow`` ran, with rank 0's work at ``work_ms``."""
    args = ["--overlap-ms", f"{work_ms:g}"]
    return launch(slow.script, nproc=slow.nproc, experiment=f"overlap-{work_ms:g}", cpu=True, echo=False, args=args)  # fmt: skip


def _predicted_before_the_run(
    answer: Any, slow: Any = None, seed: Any = None
) -> tuple[bool | None, str]:
    """11.2: ``predict(factor)``, a function giving the median step (ms) of section 5's overlap
    job (``slow``, ``overlap_job.py --overlap-ms 40``) with rank 0's overlapped work at
    ``factor`` times its time. The check draws two factors (:data:`WORK_FACTORS`), asks for
    both predictions, then runs the job as it was and with that much work (the runs come after
    the predictions, so no measurement can be copied into them), moves each prediction by what
    the job as it was gained or lost since ``slow`` (the machine's speed now), and compares
    each run with the one as it was (:func:`helpers.compare_runs`): right when each prediction
    is within the noise of its run. Moving the step by the change in the work is wrong here,
    and is said so; so is a straight line in the factor, which the pair's factor below 1.5
    refutes. ``seed``: the tests' choice of pair."""
    if not is_run(slow) or slow.script != OVERLAP_SCRIPT or number(arguments(slow).get("--overlap-ms")) != 40:  # fmt: skip
        return False, 'hand the check the lesson\'s overlap run: check("11.2", predict, slow=runs[40])'  # fmt: skip
    if not callable(answer):
        return False, "answer with a function: predict(factor) gives the median step in ms"
    predicted, instead = predictions(answer, random.Random(seed).choice(WORK_FACTORS), _in_ms)
    if instead:
        return instead
    step = _median_step(load_run(slow).events)
    # the job as it was, run again now: a machine busier (or calmer) than when ``slow`` ran
    # moves every run of this sitting alike, so each prediction is moved by as much
    now = load_run(_overlap_run(slow, 40)).events
    drift = _median_step(now) - step
    said, right = [], True
    for factor, guess in predicted.items():
        work = 40 * factor
        run = _overlap_run(slow, work)
        row = compare_runs(now, load_run(run).events, prediction=pd.Series([guess + drift] * 7)).prediction.iloc[0]  # fmt: skip
        right &= within_noise(row)
        said.append((factor, guess, row, step + work - 40))  # moved by the change
    if not right:
        if all(abs(guess - moved) < 5 for _, guess, _, moved in said):
            return False, (
                "that moves the step by the change in the work: rank 0's 40 ms of work ended "
                "about 20 ms before rank 1's late batch came, so less work buys nothing and the "
                "first 20 ms of more only fill that wait; what_if replays the run with the work "
                "at factor= times its time"
            )
        if len({round(guess) for _, guess, _, _ in said}) == 1:
            return False, "your prediction does not change with the work: past rank 1's 60 ms, rank 0's work is on the path"  # fmt: skip
        # neither the measured steps nor which prediction missed are said: a prediction could
        # be fitted to them
        return False, (
            "not within the noise of the runs with that work: is it what_if's replay with "
            "rank 0's overlapped work at factor= times its time, read as the median of the "
            "steps after the replay settled (the last four)?"
        )
    return True, "; ".join(
        f"{factor:g}x the work: you predicted {guess:.0f} ms ({guess + drift:.0f} at the "
        f"machine's speed now), the run measured "
        f"{row['measured_ms']:.0f} ms (within ±{row['noise_ms']:.0f} ms of noise); moving the "
        f"step by the change in the work said {moved:.0f} ms ({moved + drift - row['measured_ms']:+.0f} "
        "ms: rank 0's work filled a wait for rank 1's late batch)"
        for factor, guess, row, moved in said
    )


#: Lesson 11's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "11.1": _the_slowed_part,
    "11.2": _predicted_before_the_run,
}
