"""The checks of lesson 11's exercises (``notebooks/11_what_held_each_step.ipynb``; worked in
``solutions/11_solutions.ipynb``): the rank and the part of its step that a hidden slowdown
slowed (:func:`helpers.launch_with_a_hidden_slowdown`), read from the critical path; and a
what-if of overlapped work at factors the check draws, on a run whose late batch it draws and
does not say, where moving the step by the change in the work is wrong, given before the check
runs the job with that work and compares the runs."""

from __future__ import annotations

import random
from typing import Any

import pandas as pd

from ..analysis import compare_runs, step_times, within_noise
from ..jobs import launch
from ..traces import load_run
from .common import (
    NOT_ANSWERED,
    TRAIN_DDP_SCRIPT,
    Check,
    arguments,
    is_run,
    number,
    one_hint,
    predictions,
    still_unanswered,
    whole,
    within,
)
from .hidden import DELAY_TOLERANCE, HIDDEN_SLOWDOWN_EXPERIMENT, SLOWED_PARTS

__all__ = ["CHECKS", "SCRIPTS", "FLAGS", "PARTS_BY_KIND", "OVERLAP_SCRIPT", "DRAWS"]

#: Section 5's job: rank 0 works while it waits in an all-reduce for rank 1's late batch.
OVERLAP_SCRIPT = "overlap_job.py"
SCRIPTS = (TRAIN_DDP_SCRIPT, OVERLAP_SCRIPT)
FLAGS = ("--slow-rank", "--delay-ms", "--slow-part", "--overlap-ms", "--late-ms")
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


#: What exercise 11.2's check draws (one row): how late rank 1's batch comes (ms; never the
#: lesson's 60, and not said to the learner), and two factors of rank 0's 40 ms of overlapped
#: work, one whose work still ends before that batch comes (the step does not move) and one past
#: it by 45 ms or more (the work holds the step). No straight line in the factor, no one number
#: and no formula fitted to the lesson's 60 ms run is within the noise of both runs of a row.
#: Rows tried and dropped: 45 ms late (a 46 ms step, 2.3 ms of allowance: the what-if missed in
#: two of four live runs beside other work); 105 ms late with 130 ms of work (the ranks fall into
#: line within about late / (work - late) steps, and the last four, which the check compares,
#: had not).
DRAWS = ((75, (1.25, 3.0)), (90, (0.75, 3.5)), (105, (0.5, 3.75)))


def _in_ms(said: Any, factor: float) -> tuple[float | None, str]:
    """A prediction of 11.2 as a number of ms, or None and why not."""
    ms = number(said)
    return ms, "" if ms is not None else f"predict(events, {factor:g}) gave no number of ms"


def _median_step(events: pd.DataFrame) -> float:
    """A run's median step (ms): the median over its steps of the median over its ranks."""
    return float(step_times(events).median(axis=1).median())


def _settled(events: pd.DataFrame) -> pd.DataFrame:
    """A run's last four steps: where rank 0's work outlasts rank 1's wait, the ranks take a
    step or two to fall into line (rank 1 runs ahead, then waits for rank 0 in every step), and
    predictions are read after that too."""
    return events[events["step"] >= events["step"].max() - 3]


def _overlap_run(job: Any, late_ms: float, work_ms: float) -> Any:
    """A fresh run of the overlap job ``job`` ran, with rank 1's batch ``late_ms`` late and
    rank 0's work at ``work_ms``."""
    args = ["--late-ms", f"{late_ms:g}", "--overlap-ms", f"{work_ms:g}"]
    experiment = f"late-{late_ms:g}-overlap-{work_ms:g}"
    return launch(job.script, nproc=job.nproc, experiment=experiment, cpu=True, echo=False, args=args)  # fmt: skip


def _predicted_before_the_run(
    answer: Any, slow: Any = None, seed: Any = None
) -> tuple[bool | None, str]:
    """11.2: ``predict(events, factor)``, a function giving the median step (ms) of a run of
    section 5's overlap job (``slow`` is the lesson's, ``overlap_job.py --overlap-ms 40``)
    with rank 0's overlapped work at ``factor`` times its time. The check draws a row of
    :data:`DRAWS`: it runs the job with rank 1's batch late by the row's ms (not said), hands
    ``predict`` that run's events with each of the row's two factors, then runs the job with
    that much work (the runs come after the predictions, so no measurement can be copied into
    them), and compares each run with the first (:func:`helpers.compare_runs`): right when each
    prediction is within the noise of its run. Moving the step by the change in the work is
    wrong here, and is said so; so is a straight line in the factor, which the row's factor
    below the wait refutes, and a formula fitted to the lesson's run, which the hidden lateness
    refutes. ``seed``: the tests' choice of row."""
    if not is_run(slow) or slow.script != OVERLAP_SCRIPT or number(arguments(slow).get("--overlap-ms")) != 40:  # fmt: skip
        return False, 'hand the check the lesson\'s overlap run: check("11.2", predict, slow=runs[40])'  # fmt: skip
    if not callable(answer):
        return False, "answer with a function: predict(events, factor) gives the median step in ms"
    late, factors = random.Random(seed).choice(DRAWS)
    if still_unanswered(answer, None, factors[0]):  # before the first run, not after it
        return None, NOT_ANSWERED
    base = load_run(_overlap_run(slow, late, 40)).events
    # a copy each time: a function that changes its events in place changes only its own
    predicted, instead = predictions(lambda f: answer(base.copy(), f), factors, _in_ms)
    if instead:
        return instead
    step = _median_step(base)
    said, right = [], True
    for factor, guess in predicted.items():
        work = 40 * factor
        run = _overlap_run(slow, late, work)
        row = compare_runs(_settled(base), _settled(load_run(run).events), prediction=pd.Series([guess] * 4)).prediction.iloc[0]  # fmt: skip
        right &= within_noise(row)
        said.append((factor, guess, row, step + work - 40))  # moved by the change
    if not right:
        if all(abs(guess - moved) < 5 for _, guess, _, moved in said):
            return False, (
                "that moves the step by the change in the work: rank 0's 40 ms of work ended "
                "before rank 1's late batch came, so less work buys nothing and the first ms of "
                "more only fill that wait; what_if replays the run with the work at factor= "
                "times its time"
            )
        if len({round(guess) for _, guess, _, _ in said}) == 1:
            return False, "your prediction does not change with the work: past rank 1's late batch, rank 0's work is on the path"  # fmt: skip
        # neither the measured steps nor which prediction missed are said: a prediction could
        # be fitted to them
        return False, (
            "not within the noise of the runs with that work: is it what_if's replay of the "
            "events the check hands you (not runs[40]'s: its batch comes late by another "
            "amount) with rank 0's overlapped work at factor= times its time, read as the "
            "median of the steps after the replay settled (the last four)?"
        )
    return True, f"rank 1's batch came {late:g} ms late; " + "; ".join(
        f"{factor:g}x the work: you predicted {guess:.0f} ms, the run measured "
        f"{row['measured_ms']:.0f} ms (its last four steps {row['steps_low_ms']:.0f} to "
        f"{row['steps_high_ms']:.0f} ms, ±{row['noise_ms']:.0f} ms of noise); moving the "
        f"step by the change in the work said {moved:.0f} ms ({moved - row['measured_ms']:+.0f} "
        "ms: rank 0's work filled a wait for rank 1's late batch)"
        for factor, guess, row, moved in said
    )


#: Lesson 11's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "11.1": _the_slowed_part,
    "11.2": _predicted_before_the_run,
}
