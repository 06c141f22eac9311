"""The checks of lesson 13's exercises (``notebooks/13_pipelines.ipynb``; worked in
``solutions/13_solutions.ipynb``): the stage of a pipeline slowed at random and its delay per
forward, read from the traces (the delay is in no span of its own); and the bubble and the step
time of a pipeline at a number of micro-batches the lesson did not run, predicted, then
compared with the learner's own run."""

from __future__ import annotations

from typing import Any

from ..analysis import stage_waits, step_times
from ..traces import load_run
from .common import Check, arguments, close, is_run, number, whole, wrong_delay, wrong_run
from .hidden import HIDDEN_STRAGGLER_EXPERIMENT

__all__ = ["CHECKS", "SCRIPTS", "FLAGS", "PIPELINE_SCRIPT"]

#: Lesson 13's pipeline of stages, one per rank.
PIPELINE_SCRIPT = "pipeline_job.py"
SCRIPTS = (PIPELINE_SCRIPT,)
FLAGS = ("--schedule", "--microbatches", "--slow-rank", "--delay-ms", "--work-ms")
_LAUNCH_13_1 = (
    'launch_with_a_hidden_straggler(3, args=["--microbatches", "4"], script="pipeline_job.py")'
)
#: How close 13.1's delay must be: a twentieth of it, or 3 ms. Read as the slow stage's median
#: forward less another stage's, it comes within 1 ms; the slow forward's whole length (the
#: stage's own 10 ms of work on top) is refused.
DELAY_TOLERANCE = (0.05, 3.0)
#: The micro-batch counts the lesson ran (13.2 asks for another).
LESSON_MICROBATCHES = (2, 4, 6)
#: How close 13.2's predictions must come: the bubble in percentage points (the lesson's own
#: tolerance against the textbook), the step time as a share of the measured one.
BUBBLE_POINTS, STEP_SHARE = 6.0, 0.15


def _the_slow_stage(answer: Any, run: Any) -> tuple[bool, str]:
    """13.1: ``{"stage": rank, "delay_ms": ms}`` of a pipeline with one stage's forwards slowed
    at random, the delay in no span of its own."""
    given = arguments(run) if is_run(run) else {}
    slow, delay_ms = whole(given.get("--slow-rank", -1)), number(given.get("--delay-ms", 0))
    hidden = is_run(run) and run.experiment == HIDDEN_STRAGGLER_EXPERIMENT
    if not hidden or run.script != PIPELINE_SCRIPT or slow is None or slow < 0 or not delay_ms:
        return False, f"launch the run with {_LAUNCH_13_1} and hand the check that run"
    if not isinstance(answer, dict) or {"stage", "delay_ms"} - set(answer):
        return False, 'answer with a dict {"stage": ..., "delay_ms": ...}'
    if whole(answer["stage"]) != slow:
        return False, (
            "not that stage: a stage that waits is not the slow one. Which stage does the "
            "critical path spend its time on?"
        )
    said = number(answer["delay_ms"])
    hint = wrong_delay(said, delay_ms, DELAY_TOLERANCE, "the stage is right", (
        "it is per forward and has no span of its own. How much longer are that stage's "
        "forward spans than another stage's?"
    ))  # fmt: skip
    if hint:
        return False, hint
    return True, (
        f"stage {slow}'s forwards were slowed by {delay_ms:g} ms each; you read {said:g} ms "
        "from its traces alone"
    )


def _the_bubble_predicted(prediction: Any, run: Any) -> tuple[bool, str]:
    """13.2: ``{"microbatches": m, "bubble_pct": %, "step_ms": ms}`` predicted for a GPipe run
    at a count the lesson did not run, then compared with that run's measures."""
    if not isinstance(prediction, dict) or {"microbatches", "bubble_pct", "step_ms"} - set(
        prediction
    ):
        return False, 'predict {"microbatches": ..., "bubble_pct": ..., "step_ms": ...}'
    m = whole(prediction["microbatches"])
    if m is None or m < 1 or m in LESSON_MICROBATCHES:
        return False, "choose a number of micro-batches the lesson did not run (not 2, 4 or 6)"
    wanted = {"--schedule": "gpipe", "--microbatches": str(m)}
    defaults = {"--work-ms": "10", "--slow-rank": "-1"}
    problem = wrong_run(run, PIPELINE_SCRIPT, wanted, defaults=defaults, nproc=3)
    if problem:
        return False, problem
    events = load_run(run).events
    bubble = 100 * float(stage_waits(events).groupby("rank")["share"].median().median())
    step_ms = float(step_times(events).median(axis=1).median())
    said_bubble, said_step = number(prediction["bubble_pct"]), number(prediction["step_ms"])
    if said_bubble is not None and 0 < said_bubble < 1:
        return False, "give the bubble in % of the step (25 for a quarter), not as a fraction"
    if said_bubble is None or abs(said_bubble - bubble) > BUBBLE_POINTS:
        return False, (
            f"the bubble is off (your run: more than {BUBBLE_POINTS:g} points away): count, in "
            "the lesson's drawing of the schedules, the slots a stage is idle and the slots "
            "the step lasts"
        )
    if said_step is None or not close(said_step, step_ms, STEP_SHARE, 0.0):
        return False, (
            f"the bubble is right; the step time is off (more than {STEP_SHARE:.0%} from your "
            "run's): a step lasts as many slots as the drawing shows, each slot one forward "
            "and one backward with their transfers; time a slot from the lesson's runs"
        )
    return True, (
        f"your run of {m} micro-batches: a bubble of {bubble:.1f} % (you said "
        f"{said_bubble:g}) and steps of {step_ms:.0f} ms (you said {said_step:g})"
    )


#: Lesson 13's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "13.1": _the_slow_stage,
    "13.2": _the_bubble_predicted,
}
