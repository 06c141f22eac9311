"""The checks of lesson 9's exercises (``notebooks/09_look_inside_a_running_job.ipynb``;
worked in ``solutions/09_solutions.ipynb``): a straggler made mid-run and found from a live
profile, and a hang diagnosed while it hangs, both read from what the learner's own running
job answered (kept in its run folder)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..analysis import find_straggler, waiting_per_step
from ..hangs import FlightRecorderError, first_mismatch, lines_in_script, load_flight_records
from ..jobs import BackgroundRun
from ..live import saved_answers, saved_stacks
from ..traces import RunTraces
from .common import Check, whole, wrong_run

__all__ = ["CHECKS", "SCRIPTS", "FLAGS", "LIVE_SCRIPT", "SLOW_DOWN_FILE", "WAIT_LINE"]

#: The lesson's script: a DDP loop with a debug server per rank, hung by --hang-at.
LIVE_SCRIPT = "live_train.py"
#: The file in the run folder that slows a rank down: {"rank": R, "ms": D}.
SLOW_DOWN_FILE = "slow_down.json"
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


def _slowed_rank(job: BackgroundRun, rank: int, ms: float) -> str | None:
    """``None`` when the job's slow-down file asks ``rank`` for ``ms`` ms, else a hint."""
    try:
        asked = json.loads((job.run_dir / SLOW_DOWN_FILE).read_text())
    except (OSError, ValueError):
        asked = None
    if not isinstance(asked, dict) or whole(asked.get("rank")) != rank or asked.get("ms") != ms:
        return (
            f"slow rank {rank} by {ms:g} ms: write "
            f'json.dumps({{"rank": {rank}, "ms": {ms:g}}}) to my_job.run_dir / "{SLOW_DOWN_FILE}" '
            f"while the job runs"
        )
    return None


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
    """9.1: rank 0 slowed by 30 ms, and named as the straggler from the live profile."""
    wrong = _wrong_job(job, {}) or _slowed_rank(job, 0, 30) or _profile_of(job, profile)
    if wrong:
        return False, wrong
    waits = waiting_per_step(profile.events).median()
    if len(waits) < 2 or waits.drop(0).min() - waits[0] < 15:
        return False, (
            "in this profile the other ranks do not wait for rank 0: was it taken before the "
            "slow-down, or at the same moment? Write the file, wait a second, profile again"
        )
    if whole(answer) != find_straggler(profile.events):
        return False, "which rank waits least in collectives (waiting_per_step, find_straggler)?"
    return True, (
        f"rank {whole(answer)}: the others wait about {waits.drop(0).min() - waits[0]:.0f} ms "
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
