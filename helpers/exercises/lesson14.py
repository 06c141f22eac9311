"""The checks of lesson 14's exercises (``notebooks/14_pipelines.ipynb``; worked in
``solutions/14_solutions.ipynb``): the stage of a pipeline slowed at random and its delay per
forward, read from the traces (the delay is in no span of its own); and the bubble and the step
time of a pipeline at numbers of micro-batches the lesson did not run, predicted by a function
the check calls with counts it draws, then compared with runs the check makes after."""

from __future__ import annotations

import random
from typing import Any

from ..analysis import stage_waits, step_times
from ..jobs import launch
from ..traces import load_run
from .common import (
    Check,
    arguments,
    close,
    is_run,
    number,
    one_hint,
    predictions,
    whole,
    within,
)
from .hidden import HIDDEN_STRAGGLER_EXPERIMENT

__all__ = ["CHECKS", "SCRIPTS", "FLAGS", "PIPELINE_SCRIPT", "MICROBATCH_PAIRS"]

#: Lesson 14's pipeline of stages, one per rank.
PIPELINE_SCRIPT = "pipeline_job.py"
SCRIPTS = (PIPELINE_SCRIPT,)
FLAGS = ("--schedule", "--microbatches", "--slow-rank", "--delay-ms", "--work-ms")
_LAUNCH_14_1 = (
    'launch_with_a_hidden_straggler(3, args=["--microbatches", "4"], script="pipeline_job.py")'
)
#: How close 14.1's delay must be: a twentieth of it, or 3 ms. Read as the slow stage's median
#: forward less another stage's, it comes within 1 ms; the slow forward's whole length (the
#: stage's own 10 ms of work on top) is refused.
DELAY_TOLERANCE = (0.05, 3.0)
#: The pairs of micro-batch counts 14.2's check draws (one pair), none the lesson ran (GPipe at 6,
#: 1F1B at 6 and 12; exercise 14.1 runs 4):
#: each has a small count (3 or 5), where the bubble over m slots, (p - 1) / m, is 10 or more
#: points off, and a large one (8 or 10), 3 or more slots apart, so no one guess fits both.
MICROBATCH_PAIRS = ((3, 8), (5, 10), (3, 10), (5, 8))
#: How close 14.2's predictions must come: the bubble in percentage points (the lesson's own
#: tolerance against the textbook), the step time as a share of the measured one.
BUBBLE_POINTS, STEP_SHARE = 6.0, 0.15


def _the_slow_stage(answer: Any, run: Any) -> tuple[bool, str]:
    """14.1: ``{"stage": rank, "delay_ms": ms}`` of a pipeline with one stage's forwards slowed
    at random, the delay in no span of its own. Every wrong answer gets one hint: a blind guess
    passes one run in 21 (one stage of 3, one of 7 delays)."""
    given = arguments(run) if is_run(run) else {}
    slow, delay_ms = whole(given.get("--slow-rank", -1)), number(given.get("--delay-ms", 0))
    hidden = is_run(run) and run.experiment == HIDDEN_STRAGGLER_EXPERIMENT
    if not hidden or run.script != PIPELINE_SCRIPT or slow is None or slow < 0 or not delay_ms:
        return False, f"launch the run with {_LAUNCH_14_1} and hand the check that run"
    if not isinstance(answer, dict) or {"stage", "delay_ms"} - set(answer):
        return False, 'answer with a dict {"stage": ..., "delay_ms": ...}'
    said = number(answer["delay_ms"])
    hint = one_hint([whole(answer["stage"]) == slow, within(said, delay_ms, DELAY_TOLERANCE)], said, (
        "not yet: a stage that waits is not the slow one. Which stage does the critical path "
        "spend its time on? Its delay is per forward and has no span of its own: how much "
        "longer are that stage's forward spans than another stage's?"
    ))  # fmt: skip
    if hint:
        return False, hint
    return True, (
        f"stage {slow}'s forwards were slowed by {delay_ms:g} ms each; you read {said:g} ms "
        "from its traces alone"
    )


def _bubble_and_step(said: Any, m: int) -> tuple[tuple[float, float] | None, str]:
    """A prediction of 14.2 as ``(bubble %, step ms)``, or None and why not."""
    shape = 'predict(m) gives {"bubble_pct": ..., "step_ms": ...}'
    if not isinstance(said, dict) or {"bubble_pct", "step_ms"} - set(said):
        return None, shape
    bubble, step_ms = number(said["bubble_pct"]), number(said["step_ms"])
    if bubble is not None and 0 < bubble < 1:
        return None, "give the bubble in % of the step (25 for a quarter), not as a fraction"
    return ((bubble, step_ms), "") if None not in (bubble, step_ms) else (None, shape)


def _gpipe_run(base: Any, m: int) -> Any:
    """A fresh GPipe run of ``m`` micro-batches, of ``base``'s script and stages, with the
    default work and nothing else (the lesson's run also recorded memory: it adds no time a
    slot, 36 ms a slot either way in the recordings)."""
    return launch(base.script, nproc=base.nproc, experiment=f"pipeline-gpipe-{m}", cpu=True, echo=False, args=["--schedule", "gpipe", "--microbatches", str(m)])  # fmt: skip


def _median_step(run: Any) -> float:
    """A run's median step (ms): the median over its steps of the ranks' median."""
    return float(step_times(load_run(run).events).median(axis=1).median())


def _slower_now(base: Any) -> float:
    """How many times as long the machine takes for ``base``'s steps now as when it ran them
    (1.1: 10 % slower now): ``base`` run again as it was, its median step over ``base``'s. A
    machine can run one job 10 % faster or slower one hour than another."""
    again = launch(base.script, nproc=base.nproc, experiment=base.experiment, cpu=True, echo=False, args=list(base.args))  # fmt: skip
    return _median_step(again) / _median_step(base)


def _measured(base: Any, m: int) -> tuple[float, float]:
    """The bubble (%) and the median step (ms) of a GPipe run of ``m`` micro-batches, run now
    (:func:`_gpipe_run`)."""
    run = _gpipe_run(base, m)
    bubble = 100 * float(stage_waits(load_run(run).events).groupby("rank")["share"].median().median())  # fmt: skip
    return bubble, _median_step(run)


def _the_bubble_predicted(answer: Any, base: Any = None, seed: Any = None) -> tuple[bool | None, str]:  # fmt: skip
    """14.2: ``predict(m)``, a function giving ``{"bubble_pct": %, "step_ms": ms}`` of a GPipe
    run of ``m`` micro-batches, 3 stages, from the lesson's runs (``base``: its GPipe
    run). The check draws two counts the lesson did not run (:data:`MICROBATCH_PAIRS`, a small
    one among them, where the bubble over m slots is far off), asks for both predictions, then
    runs ``base`` again (its steps now over then scale the predicted steps: the machine's speed
    drifts between the lesson and the check) and the job with each count, and compares.
    ``seed``: the tests' choice of pair."""
    given = arguments(base) if is_run(base) else {}
    if not is_run(base) or base.script != PIPELINE_SCRIPT or given.get("--schedule") != "gpipe" or base.nproc != 3:  # fmt: skip
        return False, 'hand the check the lesson\'s GPipe run: check("14.2", predict, base=runs["gpipe"])'  # fmt: skip
    if not callable(answer):
        return False, 'answer with a function: predict(m) gives {"bubble_pct": ..., "step_ms": ...}'  # fmt: skip
    pair = random.Random(seed).choice(MICROBATCH_PAIRS)
    said, instead = predictions(answer, pair, _bubble_and_step)
    if instead:
        return instead
    slower = _slower_now(base)  # only now: after both predictions
    measured = {m: _measured(base, m) for m in pair}
    for m in pair:
        if abs(said[m][0] - measured[m][0]) > BUBBLE_POINTS:
            return False, (
                f"the bubble is off for {m} micro-batches: you said {said[m][0]:.1f} %, the "
                f"run waited {measured[m][0]:.1f} % (more than {BUBBLE_POINTS:g} points "
                "apart): count, in the lesson's drawing of the schedules, the slots a stage is "
                "idle and the slots the step lasts"
            )
    for m in pair:
        if not close(said[m][1] * slower, measured[m][1], STEP_SHARE, 0.0):
            return False, (
                f"the bubble is right; the step time is off for {m} micro-batches: you said "
                f"{said[m][1]:.0f} ms ({said[m][1] * slower:.0f} at the machine's speed now), "
                f"the run's steps took {measured[m][1]:.0f} (more than {STEP_SHARE:.0%} "
                "apart): a step lasts as many slots as the drawing "
                "shows, each slot one forward and one backward with their transfers; time a "
                "slot from the lesson's runs"
            )
    return True, "; ".join(
        f"{m} micro-batches: a bubble of {measured[m][0]:.1f} % (you said {said[m][0]:.1f}) and "
        f"steps of {measured[m][1]:.0f} ms (you said {said[m][1]:.0f})"
        for m in pair
    ) + f"; the lesson's run took {slower:.2f} times as long now, and your steps were scaled by it"


#: Lesson 14's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "14.1": _the_slow_stage,
    "14.2": _the_bubble_predicted,
}
