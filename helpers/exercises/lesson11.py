"""The checks of lesson 11's exercises (``notebooks/11_what_held_each_step.ipynb``; worked in
``solutions/11_solutions.ipynb``): the rank and the part of its step that a hidden slowdown
slowed (:func:`helpers.launch_with_a_hidden_slowdown`), read from the critical path; and a
what-if of overlapped work at half its time, where subtraction is wrong, checked against a run
with half the work."""

from __future__ import annotations

from typing import Any

from ..analysis import step_times, what_if
from ..traces import load_run
from .common import TRAIN_DDP_SCRIPT, Check, arguments, close, is_run, number, whole
from .hidden import HIDDEN_SLOWDOWN_EXPERIMENT, SLOWED_PARTS

__all__ = ["CHECKS", "SCRIPTS", "FLAGS", "PARTS_BY_KIND", "OVERLAP_SCRIPT"]

#: Section 6's job: rank 0 works while it waits in an all-reduce for rank 1's late batch.
OVERLAP_SCRIPT = "overlap_job.py"
SCRIPTS = (TRAIN_DDP_SCRIPT, OVERLAP_SCRIPT)
FLAGS = ("--slow-rank", "--delay-ms", "--slow-part", "--overlap-ms")
#: The kind of work on the critical path that each slowed part shows as.
PARTS_BY_KIND = {"data loading": "data", "compute": "backward", "optimizer": "optimizer"}
_LAUNCH_11_1 = "launch_with_a_hidden_slowdown(NPROC, common)"


def _the_slowed_part(answer: Any, run: Any) -> tuple[bool, str]:
    """11.1: ``{"rank": r, "part": "data" | "backward" | "optimizer"}`` of a hidden slowdown."""
    given = arguments(run) if is_run(run) else {}
    slowed, part = whole(given.get("--slow-rank", -1)), given.get("--slow-part")
    if (
        not is_run(run)
        or run.experiment != HIDDEN_SLOWDOWN_EXPERIMENT
        or slowed is None
        or part is None
    ):
        return False, f"launch the run with {_LAUNCH_11_1} and hand the check that run"  # fmt: skip
    if not isinstance(answer, dict) or {"rank", "part"} - set(answer):
        return False, 'answer with a dict {"rank": ..., "part": ...}'
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
    return True, f"rank {slowed}'s {part} was slowed, and the path says so"


def _half_the_work(answer: Any, slow: Any = None, half: Any = None) -> tuple[bool, str]:
    """11.2: the median step (ms) that ``what_if`` predicts for the lesson's overlap job
    (``slow``, ``overlap_job.py --overlap-ms 40``) with rank 0's overlapped work at half its
    time (``factor=0.5``), and ``half``, the job run with half the work, to compare it with.
    Subtracting the time saved is wrong there (the work overlaps a wait), and is said so."""
    if not is_run(slow) or not is_run(half):
        return False, 'hand the check both runs: check("11.2", predicted_ms, slow=runs[40], half=half)'  # fmt: skip
    work = number(arguments(slow).get("--overlap-ms"))
    if slow.script != OVERLAP_SCRIPT or not work:
        return False, "slow is the lesson's overlap run, runs[40] (overlap_job.py --overlap-ms 40)"
    if half.script != OVERLAP_SCRIPT or not close(number(arguments(half).get("--overlap-ms")) or 0, work / 2, 0.01, 0.5):  # fmt: skip
        return False, f"half is the same job with --overlap-ms {work / 2:g}"
    said = number(answer)
    if said is None:
        return False, "answer with the predicted median step in ms, a number"
    events = load_run(slow).events
    predicted = float(what_if(events, 0, "^overlapped$", factor=0.5).median())
    subtracted = float(step_times(events).median(axis=1).median()) - work / 2
    if not close(said, predicted, 0.02, 1):
        if close(said, subtracted, 0.02, 1) and not close(subtracted, predicted, 0.02, 1):
            return False, (
                "that subtracts the time saved from the step: rank 0's work runs while it "
                "waits for rank 1's late batch, so the step may not shrink by it; what_if "
                "replays the run's dependencies with the work shortened"
            )
        return False, (
            "not what the what-if predicts: rank 0's 'overlapped' at half its time, "
            "factor=0.5, the median over the steps"
        )
    measured = float(step_times(load_run(half).events).median(axis=1).median())
    off = {name: f"{round(100 * (ms - measured) / measured):+d}%" for name, ms in (("what-if", predicted), ("subtraction", subtracted))}  # fmt: skip
    return True, (
        f"predicted {predicted:.0f} ms, measured {measured:.0f} ms with half the work: "
        f"{off['what-if']}; subtracting the {work / 2:g} ms saved said {subtracted:.0f} ms "
        f"({off['subtraction']})"
    )


#: Lesson 11's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "11.1": _the_slowed_part,
    "11.2": _half_the_work,
}
