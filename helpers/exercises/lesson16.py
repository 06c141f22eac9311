"""The checks of lesson 16's exercises (``notebooks/16_your_own_job.ipynb``; worked in
``solutions/16_solutions.ipynb``): a job of 3 ranks profiled on 2, one rank slowed at random
(:func:`helpers.launch_with_a_hidden_straggler`), diagnosed from its report alone: the slowed
rank, or ``"not profiled"`` when the report shows that the ranks profiled all wait for another,
and its delay;
and the ranks to profile of a job of 4 machines of 8 GPUs, 6 at most, worked out from what its
last two runs' reports said (:func:`past_reports`)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from .common import (
    TRAIN_DDP_SCRIPT,
    Check,
    arguments,
    is_run,
    number,
    one_hint,
    whole,
    whole_numbers,
    within,
)
from .hidden import DELAY_TOLERANCE, HIDDEN_STRAGGLER_EXPERIMENT

__all__ = ["CHECKS", "SCRIPTS", "FLAGS", "NOT_PROFILED", "past_reports"]

SCRIPTS = (TRAIN_DDP_SCRIPT,)
FLAGS = ("--profile-ranks", "--slow-rank", "--delay-ms")
#: The answer when the straggler is one of the ranks that left no trace.
NOT_PROFILED = "not profiled"
_LAUNCH = 'launch_with_a_hidden_straggler(3, common + ["--profile-ranks", "0,1"], delays_ms=FEW_RANKS_DELAYS_MS)'  # fmt: skip


def _profiled(run: Any) -> list[int] | None:
    """The ranks a run of train_ddp.py profiled, when it profiled only some of them."""
    chosen = str(arguments(run).get("--profile-ranks", "all"))
    if chosen == "all":
        return None
    ranks = [whole(r) for r in chosen.split(",")]
    return sorted(r for r in ranks if r is not None)


def _the_straggler_from_a_report(answer: Any, run: Any) -> tuple[bool, str]:
    """16.1: ``{"straggler": rank or "not profiled", "delay_ms": ms}``: the slowed rank of a job
    profiled on some of its ranks (or "not profiled" when it left no trace), and its delay per
    step to within :data:`DELAY_TOLERANCE`. A blind guess passes one run in 21 (one of 3 ranks,
    one of the 7 :data:`FEW_RANKS_DELAYS_MS`), and every wrong answer gets one hint."""
    hidden = is_run(run) and run.experiment == HIDDEN_STRAGGLER_EXPERIMENT
    profiled = _profiled(run) if is_run(run) else None
    given = arguments(run) if is_run(run) else {}
    slowed, delay = whole(given.get("--slow-rank", -1)), number(given.get("--delay-ms"))
    if not hidden or run.script != TRAIN_DDP_SCRIPT or profiled is None or slowed is None:
        return False, f"launch the job with {_LAUNCH} and hand the check that run"
    unprofiled = sorted(set(range(run.world_size)) - set(profiled))
    shape = f'answer with a dict {{"straggler": a rank or "{NOT_PROFILED}", "delay_ms": ...}}'
    if not isinstance(answer, dict) or set(answer) != {"straggler", "delay_ms"}:
        return False, shape
    straggler = answer["straggler"]
    said = straggler.strip().lower() if isinstance(straggler, str) else whole(straggler)
    if said is None or (isinstance(said, str) and said != NOT_PROFILED):
        return False, shape
    ms = number(answer["delay_ms"])
    if slowed in profiled:
        named = said == slowed
    else:  # the rank not profiled, by its number too where it is the only one
        named = said == NOT_PROFILED or said == slowed == unprofiled[0]
    hint = one_hint([named, within(ms, delay, DELAY_TOLERANCE)], ms, (
        "not yet: where one rank profiled takes far longer to load its batches than the other "
        "(time per kind), it is the straggler; where every rank profiled waits and none loads "
        "its batches slowly, none of them is the one they wait for: read the report's section "
        "'What the traces cannot tell', after what held the steps. The delay per step: a "
        "profiled straggler's data loading (time per kind, over the steps profiled), else the "
        "waiting of the rank profiled that waits least (the others also wait for each other "
        "on shared cores)"
    ))  # fmt: skip
    if hint:
        return False, hint
    if slowed in profiled:
        return True, f"rank {slowed}: profiled, and its batches are {delay:g} ms slow"
    return True, (
        f"rank {slowed} was slowed by {delay:g} ms and left no trace: the ranks profiled "
        f"({profiled}) all wait for it, which is how a report of a few ranks points outside them"
    )


#: Exercise 16.2's job: machines, ranks per machine, how many ranks may be profiled this time.
MACHINES, PER_MACHINE, BUDGET = 4, 8, 6
#: What the reports of the job's last two runs said, each profiled on a few ranks: per run, its
#: median step (ms) and each profiled rank's median waiting per step (ms). On Monday every rank
#: profiled waited two fifths of a step and none stood out: the rank they waited for left no
#: trace. On Tuesday rank 20 waited least by far: the straggler, or its machine (16-23), where
#: Monday profiled no rank.
_REPORTS = {
    "monday": (482.0, {0: 205.1, 1: 201.7, 8: 198.4, 24: 202.9}),
    "tuesday": (476.0, {0: 201.3, 12: 207.2, 20: 8.6, 28: 199.0}),
}
#: The rank Tuesday's report named as the straggler.
_SUSPECT = 20
#: The run the next one compares with, rank by rank: the last.
_LAST_RUN = "tuesday"


def past_reports() -> pd.DataFrame:
    """Exercise 16.2's history: what the reports of a job's last two runs said, one row per run
    and rank profiled: ``run, rank, machine, median step (ms), median waiting per step (ms)``.
    The job runs on 4 machines of 8 ranks each (ranks 0-7 on machine 0, 8-15 on machine 1...)."""
    rows = [
        {
            "run": run,
            "rank": rank,
            "machine": rank // PER_MACHINE,
            "median step (ms)": step,
            "median waiting per step (ms)": waiting,
        }  # fmt: skip
        for run, (step, waits) in _REPORTS.items()
        for rank, waiting in waits.items()
    ]
    return pd.DataFrame(rows)


def _ranks_to_profile(answer: Any) -> tuple[bool, str]:
    """16.2: at most BUDGET ranks of MACHINES x PER_MACHINE, planned from past_reports(): a rank
    on every machine, rank 0, the rank Tuesday named and a neighbour of it on its machine, and
    the ranks Tuesday profiled (they fit the budget), so that the two runs compare."""
    world = MACHINES * PER_MACHINE
    ranks = whole_numbers(answer)
    if ranks is None or not ranks:
        return False, "answer with a list of ranks, e.g. [0, 5, 9]"
    if len(set(ranks)) != len(ranks) or not all(0 <= r < world for r in ranks):
        return False, f"ranks are 0 to {world - 1}, each once"
    if len(ranks) > BUDGET:
        return False, f"at most {BUDGET} ranks: every trace costs the job time and someone reading"
    if _SUSPECT not in ranks:
        return False, (
            "past_reports() points at one rank: in one run a rank waits far less than every "
            "other rank profiled, so the others wait for it. Profile it again"
        )
    machine = _SUSPECT // PER_MACHINE
    if not any(r // PER_MACHINE == machine and r != _SUSPECT for r in ranks):
        first = machine * PER_MACHINE
        return False, (
            f"is it rank {_SUSPECT}, or its whole machine (ranks {first}-{first + PER_MACHINE - 1})? "
            "No run has profiled another rank of that machine: add a neighbour, and the next "
            "report tells"
        )
    bare = [m for m in range(MACHINES) if not any(r // PER_MACHINE == m for r in ranks)]
    if bare:
        first = bare[0] * PER_MACHINE
        return False, (
            f"machine {bare[0]} (ranks {first}-{first + PER_MACHINE - 1}) has no rank profiled: "
            "a slow machine slows all its ranks alike, and only a rank of it can show it"
        )
    if 0 not in ranks:
        return False, "rank 0 often does extra work (logging, checkpoints): profile it"
    if not set(_REPORTS[_LAST_RUN][1]) <= set(ranks):
        return False, (
            "two runs compare only on the ranks both profiled: keep the last run's ranks "
            "(past_reports()), the budget has room for them"
        )
    return True, (
        f"{sorted(ranks)}: rank {_SUSPECT}, which Tuesday's report named, a neighbour on its "
        "machine to tell a slow rank from a slow machine, every machine, rank 0, and "
        "Tuesday's ranks, so that the runs compare"
    )


#: Lesson 16's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "16.1": _the_straggler_from_a_report,
    "16.2": _ranks_to_profile,
}
