"""The checks of lesson 12's exercises (``notebooks/12_gpus_and_two_runs.ipynb``; worked in
``solutions/12_solutions.ipynb``): the time the critical path spends on each rank's GPU streams,
as a function the check runs on steps it draws from the shipped GPU jobs; and a hidden slowdown
(:func:`helpers.launch_with_a_hidden_slowdown`) read from two runs compared."""

from __future__ import annotations

import random
import warnings
from functools import cache
from typing import Any

import pandas as pd

from ..analysis import compare_runs, critical_path
from ..jobs.runs import REPO_ROOT
from ..traces import load_run
from .common import (
    NOT_ANSWERED,
    TRAIN_DDP_SCRIPT,
    Check,
    arguments,
    is_run,
    number,
    one_hint,
    still_unanswered,
    whole,
    within,
)
from .hidden import DELAY_TOLERANCE, HIDDEN_SLOWDOWN_EXPERIMENT

__all__ = ["CHECKS", "SCRIPTS", "FLAGS", "GPU_RUNS", "KINDS_BY_PART"]

SCRIPTS = (TRAIN_DDP_SCRIPT,)
FLAGS = ("--slow-rank", "--delay-ms", "--slow-part")
#: The GPU jobs the lesson reads, shipped with the series: 12.1's check draws a step of each.
GPU_RUNS = ("data/h200-job/base-1", "data/h200-job/gpuslow-1", "data/nccl-job")
#: The kind of work on the critical path that each part a hidden slowdown slows shows as.
KINDS_BY_PART = {"data": "data loading", "backward": "compute", "optimizer": "optimizer"}
_LAUNCH_12_2 = "launch_with_a_hidden_slowdown(NPROC, common)"
#: How close 12.1's answer must be to the path's, in ms (a rounding, not a different sum).
_GPU_MS_TOLERANCE = (0.01, 0.05)


@cache
def _gpu_run(folder: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A shipped GPU job's events and critical path, read once."""
    with warnings.catch_warnings():  # the NCCL excerpt's GPU events launched before it
        warnings.simplefilter("ignore", UserWarning)
        events = load_run(REPO_ROOT / folder).events
    return events, critical_path(events)


def _on_gpu(path: pd.DataFrame, step: int) -> dict[int, float]:
    """The ms the path of ``step`` spends on each rank's GPU streams (ranks with none left out)."""
    mine = path[(path["step"] == step) & path["lane"].astype(str).str.startswith("GPU")]
    return (mine.groupby("rank")["dur_us"].sum() / 1e3).round(3).to_dict()


def _said(answer: Any, events: pd.DataFrame, step: int) -> tuple[dict | None, str]:
    """``answer(events, step)`` as ``{rank: ms}``, or None and why not."""
    try:
        said = answer(events.copy(), step)
    except Exception as err:  # the learner's own code: any error is a hint, not a crash
        return None, f"gpu_on_path(events, {step}) raised {type(err).__name__}: {err}"
    if isinstance(said, pd.Series):
        said = said.to_dict()
    if not isinstance(said, dict) or any(number(v) is None for v in said.values()):
        return None, "gpu_on_path gives a dict {rank: ms}, one number of ms for each rank"
    return {whole(k): number(v) for k, v in said.items()}, ""


def _gpu_time_on_the_path(answer: Any, seed: Any = None) -> tuple[bool | None, str]:
    """12.1: ``gpu_on_path(events, step)``, a function giving the ms that the critical path of
    ``step`` spends on each rank's GPU streams, as ``{rank: ms}`` (a rank it never reaches: 0 or
    left out). The check draws a step of each of :data:`GPU_RUNS` and compares the function's
    answer with the path's, within a rounding. ``seed``: the tests' choice of steps."""
    if not callable(answer):
        return False, "answer with a function: gpu_on_path(events, step) gives {rank: ms}"
    chooser, asked = random.Random(seed), []
    for folder in GPU_RUNS:
        events, path = _gpu_run(folder)
        step = chooser.choice(sorted(int(s) for s in path["step"].unique()))
        if not asked and still_unanswered(answer, events, step):
            return None, NOT_ANSWERED
        said, why = _said(answer, events, step)
        if said is None:
            return False, why
        truth = _on_gpu(path, step)
        ranks = set(truth) | set(said)
        if not all(within(said.get(r, 0.0), truth.get(r, 0.0), _GPU_MS_TOLERANCE) for r in ranks):
            return False, (
                "not yet, in one of the steps drawn: is it the path of that step "
                "(critical_path(events)), all of its time on the lanes named GPU ... (every kind "
                "of segment there, queued and waiting time too), by rank and in ms? The GPU's "
                "work off the path does not count"
            )
        asked.append(f"{folder} step {step}: " + ", ".join(f"rank {r} {ms:.1f} ms" for r, ms in sorted(truth.items())))  # fmt: skip
    return True, "right on every step drawn: " + "; ".join(asked)


def _the_change_between_two_runs(answer: Any, run: Any = None, before: Any = None) -> tuple[bool, str]:  # fmt: skip
    """12.2: ``{"rank": r, "kind": "data loading" | "compute" | "optimizer", "shift_ms": ms}``
    read from ``compare_runs(before, run)``: the rank and the kind of work of a hidden slowdown
    (``run``, from :func:`helpers.launch_with_a_hidden_slowdown`) against the lesson's normal run
    (``before``), and the steps' shift as the comparison measured it, to within
    :data:`DELAY_TOLERANCE`. Every wrong answer gets one hint."""
    given = arguments(run) if is_run(run) else {}
    slowed, part = whole(given.get("--slow-rank", -1)), given.get("--slow-part")
    if not is_run(run) or run.experiment != HIDDEN_SLOWDOWN_EXPERIMENT or slowed is None or part is None:  # fmt: skip
        return False, f"launch the run with {_LAUNCH_12_2} and hand the check that run"
    if not is_run(before) or before.script != TRAIN_DDP_SCRIPT or arguments(before).get("--slow-rank") is not None:  # fmt: skip
        return False, 'hand the check the lesson\'s normal run: check("12.2", answer, run=mystery, before=normal)'  # fmt: skip
    if not isinstance(answer, dict) or {"rank", "kind", "shift_ms"} - set(answer):
        return False, 'answer with a dict {"rank": ..., "kind": ..., "shift_ms": ...}'
    if answer["kind"] not in KINDS_BY_PART.values():
        return False, f"the kind is one of {list(KINDS_BY_PART.values())}"
    compared = compare_runs(load_run(before).events, load_run(run).events)
    shift = float(compared.steps.loc["change", "shift_ms"])
    said = number(answer["shift_ms"])
    hint = one_hint(
        [
            whole(answer["rank"]) == slowed,
            answer["kind"] == KINDS_BY_PART[part],
            within(said, shift, DELAY_TOLERANCE),
        ],  # fmt: skip
        None,  # a shift, not a delay: any number of ms is an answer
        "not yet: compared = compare_runs(before, after) with the normal run first; the steps' "
        "shift is its steps table's change row (shift_ms). Each part runs as one op: the "
        "DataLoader's __next__, the hook around layer3 (BackwardHookFunctionBackward), "
        "Optimizer.step. In compared.held, the slowed one gained tens of ms a step on one rank "
        "and the other two hardly any: its rank and kind are the answer (compare those three "
        "ops: two runs can move a rank's compute by more than the delay)",
    )
    if hint:
        return False, hint
    return True, (
        f"rank {slowed}'s {part} was slowed by {number(given.get('--delay-ms')):g} ms a step; the "
        f"comparison shows it as {KINDS_BY_PART[part]} on rank {slowed}'s path and the steps "
        f"shifted by {shift:+.0f} ms"
    )


#: Lesson 12's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "12.1": _gpu_time_on_the_path,
    "12.2": _the_change_between_two_runs,
}
