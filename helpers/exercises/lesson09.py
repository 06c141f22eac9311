"""The checks of lesson 9's exercises (``notebooks/09_look_inside_a_running_job.ipynb``;
worked in ``solutions/09_solutions.ipynb``): a straggler made mid-run, its rank chosen at random
(:func:`helpers.slow_a_rank`) and found from a live profile, and a hang diagnosed while it
hangs, both read from what the learner's own running job answered (kept in its run folder)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..analysis import waiting_per_step
from ..hangs import FlightRecorderError, first_mismatch, lines_in_script, load_flight_records
from ..jobs import BackgroundRun
from ..live import saved_answers, saved_stacks
from ..traces import RunTraces
from .common import Check, whole, wrong_run
from .hidden import SLOW_DOWN_FILE

__all__ = [
    "CHECKS",
    "SCRIPTS",
    "FLAGS",
    "LIVE_SCRIPT",
    "SLOW_DOWN_FILE",
    "SLOW_DOWN_MS",
    "WAIT_LINE",
]

#: The lesson's script: a DDP loop with a debug server per rank, hung by --hang-at.
LIVE_SCRIPT = "live_train.py"
#: The text of the line where a rank waits for a rank that skipped its step.
WAIT_LINE = "loss.backward()"
#: The scripts these checks rely on, and the flag of live_train.py they pass.
SCRIPTS = (LIVE_SCRIPT,)
FLAGS = ("--hang-at",)


def _wrong_job(job: Any, wanted: dict[str, str]) -> str | None:
    """``None`` when ``job`` is a background run of the lesson's script with ``wanted``."""
    if not isinstance(job, BackgroundRun):
        return (
            "hand the check the handle that launch_in_background(...) returned "
            f"(launch_in_background({LIVE_SCRIPT!r}, nproc=2, ...))"
        )
    return wrong_run(job.record, LIVE_SCRIPT, wanted, finished=False)


#: The slow-down exercise 9.1 asks for, in ms per step (the rank: slow_a_rank's choice).
SLOW_DOWN_MS = 30


def _slowed_rank(job: BackgroundRun) -> int | str:
    """The rank that :func:`helpers.slow_a_rank` slowed by :data:`SLOW_DOWN_MS` in the job
    (its slow-down file says so), or a hint when it did not."""
    try:
        asked = json.loads((job.run_dir / SLOW_DOWN_FILE).read_text())
    except (OSError, ValueError):
        asked = None
    rank = whole(asked.get("rank")) if isinstance(asked, dict) else None
    if rank is None or not 0 <= rank < job.record.world_size or asked.get("ms") != SLOW_DOWN_MS:
        return (
            f"while the job runs, slow one of its ranks, chosen at random: "
            f"slow_a_rank(my_job, ms={SLOW_DOWN_MS})"
        )
    return rank


def _profile_of(job: BackgroundRun, profile: Any) -> str | None:
    """``None`` when ``profile`` was taken from ``job`` (its files in the job's folder)."""
    if not isinstance(profile, RunTraces) or not profile.headers:
        return "hand the check the profile_ranks(my_job, ...) you took after the slow-down"
    folder = job.run_dir.resolve()
    if not all(Path(h.path).resolve().is_relative_to(folder) for h in profile.headers):
        return "this profile was taken from another job: profile_ranks(my_job, ...)"
    return None


def _a_straggler_made_mid_run(
    answer: Any, job: Any = None, profile: Any = None
) -> tuple[bool, str]:
    """9.1: the rank slow_a_rank slowed mid-run, named from the live profile."""
    wrong = _wrong_job(job, {})
    slowed = _slowed_rank(job) if not wrong else None
    wrong = wrong or (slowed if isinstance(slowed, str) else None) or _profile_of(job, profile)
    if wrong:
        return False, wrong
    waits = waiting_per_step(profile.events).median()
    if len(waits) < 2 or slowed not in waits.index or waits.drop(slowed).min() - waits[slowed] < 15:
        return False, (
            "in this profile the other ranks do not wait for the slowed rank: was it taken before "
            "the slow-down, or at the same moment? Slow it, wait a second, profile again"
        )
    if whole(answer) != slowed:
        return False, "which rank waits least in collectives (waiting_per_step, find_straggler)?"
    return True, (
        f"rank {slowed}: the others wait about {waits.drop(slowed).min() - waits[slowed]:.0f} ms "
        f"per step for it, live"
    )


def _a_hang_diagnosed_live(answer: Any, job: Any = None) -> tuple[bool, str]:
    """9.2: the collective rank 1 never called, and rank 0's line, asked while it hung."""
    wrong = _wrong_job(job, {"--hang-at": "15"})
    if wrong:
        return False, wrong
    flights, stacks = saved_answers(job, "flight"), saved_answers(job, "stacks")
    if not flights or not stacks:
        return False, "while it hangs, ask flight_records_now(my_hang) and where_ranks_are(my_hang)"
    try:
        mismatch = first_mismatch(load_flight_records(flights[-1]))
    except FlightRecorderError as err:
        return False, f"its Flight Recorder answer cannot be read ({err}): ask again"
    waiting = lines_in_script(saved_stacks(stacks[-1]), LIVE_SCRIPT)
    if mismatch is None or 0 not in waiting.index or WAIT_LINE not in waiting.at[0, "code"]:
        return (
            False,
            "the job was not hanging yet when you asked: wait for 'skips step', then a second, then ask",
        )
    if not isinstance(answer, dict) or {"seq", "line"} - set(answer):
        return False, 'answer with {"seq": ..., "line": ...}'
    if whole(answer["seq"]) != mismatch.seq:
        return False, "first_mismatch(flight_records_now(my_hang)): its seq"
    if whole(answer["line"]) != waiting.at[0, "line"]:
        return False, "where_ranks_are(my_hang): the line of rank 0, which waits for rank 1"
    return True, f"{mismatch}; rank 0 waits on line {waiting.at[0, 'line']}: {WAIT_LINE}"


#: Lesson 9's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "09.1": _a_straggler_made_mid_run,
    "09.2": _a_hang_diagnosed_live,
}
