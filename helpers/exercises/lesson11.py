"""The checks of lesson 11's exercises (``notebooks/11_what_held_each_step.ipynb``; worked in
``solutions/11_solutions.ipynb``): the rank and the part of its step that a hidden slowdown
slowed (:func:`helpers.launch_with_a_hidden_slowdown`), read from the critical path; and a
what-if of overlapped work at a factor the check draws, where adding the work is wrong, given
before the check runs the job with that work and compares the runs."""

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
    close,
    is_run,
    number,
    predictions,
    whole,
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
    in 30 on 2 ranks (2 ranks, 3 parts, 5 delays)."""
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
    if whole(answer["rank"]) != slowed or answer["part"] != part:
        # one hint for any wrong answer: it says where to look, never which half was right
        return False, (
            "not that work: the path spends each step's extra time on the slowed rank's work, "
            "so path_summary(path, ['rank', 'kind']) puts it first among the rows that are "
            "work (not a transfer or a wake-up); data loading is the batch, compute the "
            "backward (a hook's sleep shows as BackwardHookFunctionBackward), optimizer the "
            "optimizer step"
        )
    said = number(answer["delay_ms"])
    if said is None or not close(said, delay, *DELAY_TOLERANCE):
        return False, (
            "the rank and the part are right; the delay is off: that op's time per step on the "
            "slowed rank, less the same op's on the other rank (its normal time)"
        )
    return True, f"rank {slowed}'s {part} was slowed by {delay:g} ms a step, and the path says so"


#: The pairs of factors exercise 11.2's check draws (one pair): rank 0's overlapped work at that
#: many times its 40 ms, past rank 1's 60 ms late batch, 40 ms apart so that no one number is
#: within the noise of both runs.
WORK_FACTORS = ((2.5, 3.5), (2.75, 3.75), (3.0, 4.0))


def _in_ms(said: Any, factor: float) -> tuple[float | None, str]:
    """A prediction of 11.2 as a number of ms, or None and why not."""
    ms = number(said)
    return ms, "" if ms is not None else f"predict({factor:g}) gave no number of ms"


def _predicted_before_the_run(
    answer: Any, slow: Any = None, seed: Any = None
) -> tuple[bool | None, str]:
    """11.2: ``predict(factor)``, a function giving the median step (ms) of section 5's overlap
    job (``slow``, ``overlap_job.py --overlap-ms 40``) with rank 0's overlapped work at
    ``factor`` times its time. The check draws two factors (:data:`WORK_FACTORS`), asks for
    both predictions, then runs the job with that much work (the runs come after the
    predictions, so no measurement can be copied into them) and compares each run with
    ``slow`` (:func:`helpers.compare_runs`): right when each prediction is within the noise of
    its run. Adding the extra work to the step is wrong here, and is said so. ``seed``: the
    tests' choice of pair."""
    if not is_run(slow) or slow.script != OVERLAP_SCRIPT or number(arguments(slow).get("--overlap-ms")) != 40:  # fmt: skip
        return False, 'hand the check the lesson\'s overlap run: check("11.2", predict, slow=runs[40])'  # fmt: skip
    if not callable(answer):
        return False, "answer with a function: predict(factor) gives the median step in ms"
    predicted, instead = predictions(answer, random.Random(seed).choice(WORK_FACTORS), _in_ms)
    if instead:
        return instead
    before = load_run(slow).events
    step = float(step_times(before).median(axis=1).median())
    said, right = [], True
    for factor, guess in predicted.items():
        work = 40 * factor
        run = launch(slow.script, nproc=slow.nproc, experiment=f"overlap-{work:g}", cpu=True, echo=False, args=["--overlap-ms", f"{work:g}"])  # fmt: skip
        row = compare_runs(before, load_run(run).events, prediction=pd.Series([guess] * 7)).prediction.iloc[0]  # fmt: skip
        right &= within_noise(row)
        said.append((factor, guess, row, step + work - 40))
    if not right:
        if all(abs(guess - added) < 5 for _, guess, _, added in said):
            return False, (
                "that adds the extra work to the step: rank 0's 40 ms of work ended about 20 ms "
                "before rank 1's late batch came, so the first 20 ms of the extra work only fill "
                "that wait; what_if replays the run with the work at factor= times its time"
            )
        if len({round(guess) for _, guess, _, _ in said}) == 1:
            return False, "your prediction does not change with the work: past rank 1's 60 ms, rank 0's work is on the path"  # fmt: skip
        return (
            False,
            "not within the noise of the runs (is it the median of the steps after the replay settled, the last four?): "
            + "; ".join(
                f"{factor:g}x: predicted {guess:.0f} ms, measured {row['measured_ms']:.0f} ms"
                for factor, guess, row, _ in said  # fmt: skip
            ),
        )
    return True, "; ".join(
        f"{factor:g}x the work: you predicted {guess:.0f} ms, the run measured "
        f"{row['measured_ms']:.0f} ms (within ±{row['noise_ms']:.0f} ms of noise); adding the "
        f"extra work to the step said {added:.0f} ms ({added - row['measured_ms']:+.0f} ms: "
        "its first part only filled rank 0's wait for rank 1's late batch)"
        for factor, guess, row, added in said
    )


#: Lesson 11's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "11.1": _the_slowed_part,
    "11.2": _predicted_before_the_run,
}
