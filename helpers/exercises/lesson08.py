"""The checks of lesson 8's exercises (``notebooks/08_when_a_job_hangs.ipynb``; worked in
``solutions/08_solutions.ipynb``): where a mismatched collective lands, and the first
collective a rank skipped, both read from the Flight Recorder dumps of the learner's hung
run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..hangs import (
    FlightRecorderError,
    Mismatch,
    first_mismatch,
    load_flight_records,
)
from ..jobs import LaunchError
from .common import Check, whole, wrong_run

__all__ = ["CHECKS", "SCRIPTS", "FLAGS", "HANG_SCRIPT"]

#: The lesson's script: a job whose ranks disagree (--bug) at a step (--bug-step), and hang.
HANG_SCRIPT = "hang.py"
#: The scripts these checks rely on, and the flags of hang.py they pass.
SCRIPTS = (HANG_SCRIPT,)
FLAGS = ("--bug", "--bug-step")


def _mismatch_of(
    error: Any, asked: Mapping[str, str], defaults: Mapping[str, str]
) -> tuple[Mismatch | None, str]:
    """The first mismatch in the Flight Recorder dumps of the failed run of ``hang.py`` that
    ``error`` carries, or ``(None, hint)`` when it is not that run or it has no dumps."""
    if error is None:
        return None, (
            f"no error was caught: the run finished. {HANG_SCRIPT} with a --bug never finishes: "
            "launch it inside try: ... except RankFailed as err: ... and hand the check err"
        )
    if not isinstance(error, LaunchError):
        return None, "hand the check the RankFailed you caught (except RankFailed as err: ...)"
    wrong = wrong_run(error.record, HANG_SCRIPT, asked, defaults=defaults, finished=False)
    if wrong:
        return None, wrong
    try:
        mismatch = first_mismatch(load_flight_records(error.record.run_dir))
    except FlightRecorderError as err:
        return None, f"no usable Flight Recorder dumps in this run ({err}): launch it again"
    if mismatch is None:
        return None, "the ranks' dumps agree everywhere: launch it again"
    return mismatch, ""


def _where_the_mismatch_lands(predicted_seq: Any, error: Any) -> tuple[bool, str]:
    """8.1: the sequence number where rank 1's broadcast meets rank 0's all_reduce."""
    mismatch, wrong = _mismatch_of(error, {"--bug": "different", "--bug-step": "3"}, {})
    if mismatch is None:
        return False, wrong
    if whole(predicted_seq) != mismatch.seq:
        return False, (
            "every step makes two collectives (an all_reduce, then a broadcast), and "
            "the sequence numbers count from 1: where does step 3's all_reduce fall?"
        )
    return True, str(mismatch)


def _a_skipped_collective(answer: Any, error: Any) -> tuple[bool, str]:
    """8.2: the first collective that rank 1 skipped, and the rank that skipped it."""
    mismatch, wrong = _mismatch_of(error, {"--bug": "skip"}, {"--bug-step": "4"})
    if mismatch is None:
        return False, wrong
    if not isinstance(answer, dict) or {"seq", "rank"} - set(answer):
        return False, 'answer with {"seq": ..., "rank": ...}'
    if whole(answer["seq"]) != mismatch.seq:
        return False, (
            "load_flight_records(...) and first_mismatch(...): the first sequence "
            "number that not every rank reached (two collectives per step, counted from 1)"
        )
    if whole(answer["rank"]) not in mismatch.culprits:
        return False, "which rank has nothing at that sequence number?"
    return True, f"{mismatch}; PyTorch's analyser reports it as 'Not all ranks joining collective'"


#: Lesson 8's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "08.1": _where_the_mismatch_lands,
    "08.2": _a_skipped_collective,
}
