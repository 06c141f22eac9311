"""The checks of lesson 11's exercises (``notebooks/11_what_held_each_step.ipynb``; worked in
``solutions/11_solutions.ipynb``): the rank and the part of its step that a hidden slowdown
slowed (:func:`helpers.launch_with_a_hidden_slowdown`), read from the critical path; and a
what-if of a data pipeline twice as fast, checked against a run with half the delay."""

from __future__ import annotations

from typing import Any

from ..analysis import what_if
from ..traces import load_run
from .common import TRAIN_DDP_SCRIPT, Check, arguments, close, is_run, number, whole
from .hidden import HIDDEN_SLOWDOWN_EXPERIMENT, SLOWED_PARTS

__all__ = ["CHECKS", "SCRIPTS", "FLAGS", "PARTS_BY_KIND"]

SCRIPTS = (TRAIN_DDP_SCRIPT,)
FLAGS = ("--slow-rank", "--delay-ms", "--slow-part")
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


def _half_the_delay(answer: Any, slow: Any = None, half: Any = None) -> tuple[bool, str]:
    """11.2: the median step predicted for ``slow`` (a straggler run of train_ddp.py) with its
    batches loading twice as fast (``what_if(..., factor=0.5)``), and ``half``, a run with half
    its delay, to compare the prediction with."""
    if not is_run(slow) or not is_run(half):
        return False, 'hand the check both runs: check("11.2", predicted, slow=slow, half=half)'
    a, b = arguments(slow), arguments(half)
    rank, delay = whole(a.get("--slow-rank", -1)), number(a.get("--delay-ms", 0))
    if slow.script != TRAIN_DDP_SCRIPT or rank is None or rank < 0 or not delay:
        return False, "slow is the lesson's straggler run, with --slow-rank and --delay-ms"
    if whole(b.get("--slow-rank", -1)) != rank or not close(number(b.get("--delay-ms", 0)) or 0, delay / 2, 0.01, 0.5):  # fmt: skip
        return False, f"half is the same job with rank {rank} slowed by {delay / 2:g} ms"
    said = number(answer)
    if said is None:
        return False, "answer with the predicted median step in ms, a number"
    predicted = float(what_if(load_run(slow).events, rank, "DataLoader", factor=0.5).median())
    if close(said, float(what_if(load_run(slow).events, rank, "DataLoader").median()), 0.02, 1):
        return False, "that is the step with no data loading at all: twice as fast is factor=0.5"
    if not close(said, predicted, 0.02, 1):
        return False, (
            f"not what the what-if predicts: rank {rank}'s data loading (its name matches "
            "'DataLoader') at half its time, factor=0.5, the median over the steps"
        )
    steps = load_run(half).events
    measured = float(
        steps[steps["kind"] == "step"].groupby("rank")["dur_us"].median().median() / 1e3
    )
    return True, (
        f"predicted {predicted:.0f} ms, measured {measured:.0f} ms with half the delay: "
        f"{(predicted - measured) / measured:+.0%}, on a machine whose step varies by tens of "
        "percent from run to run"
    )


#: Lesson 11's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "11.1": _the_slowed_part,
    "11.2": _half_the_delay,
}
