"""The checks of lesson 11's exercises (``notebooks/11_your_own_job.ipynb``; worked in
``solutions/11_solutions.ipynb``): a job of 3 ranks profiled on 2, one rank slowed at random
(:func:`helpers.launch_with_a_hidden_straggler`), diagnosed from its report alone: the slowed
rank, or ``"not profiled"`` when the report shows that the ranks profiled all wait for another;
and the ranks to profile of a job of 4 machines of 8 GPUs, 6 at most."""

from __future__ import annotations

from typing import Any

from .common import TRAIN_DDP_SCRIPT, Check, arguments, is_run, whole, whole_numbers
from .hidden import HIDDEN_STRAGGLER_EXPERIMENT

__all__ = ["CHECKS", "SCRIPTS", "FLAGS", "NOT_PROFILED"]

SCRIPTS = (TRAIN_DDP_SCRIPT,)
FLAGS = ("--profile-ranks", "--slow-rank")
#: The answer when the straggler is one of the ranks that left no trace.
NOT_PROFILED = "not profiled"
_LAUNCH = 'launch_with_a_hidden_straggler(3, common + ["--profile-ranks", "0,1"], delays_ms=(300, 400, 500))'  # fmt: skip


def _profiled(run: Any) -> list[int] | None:
    """The ranks a run of train_ddp.py profiled, when it profiled only some of them."""
    chosen = str(arguments(run).get("--profile-ranks", "all"))
    if chosen == "all":
        return None
    ranks = [whole(r) for r in chosen.split(",")]
    return sorted(r for r in ranks if r is not None)


def _the_straggler_from_a_report(answer: Any, run: Any) -> tuple[bool, str]:
    """11.1: the slowed rank of a job profiled on some of its ranks, or "not profiled"."""
    hidden = is_run(run) and run.experiment == HIDDEN_STRAGGLER_EXPERIMENT
    profiled = _profiled(run) if is_run(run) else None
    slowed = whole(arguments(run).get("--slow-rank", -1)) if is_run(run) else None
    if not hidden or run.script != TRAIN_DDP_SCRIPT or profiled is None or slowed is None:
        return False, f"launch the job with {_LAUNCH} and hand the check that run"
    unprofiled = sorted(set(range(run.world_size)) - set(profiled))
    said = answer.strip().lower() if isinstance(answer, str) else whole(answer)
    if said is None or (isinstance(said, str) and said != NOT_PROFILED):
        return False, f'answer with a rank, or "{NOT_PROFILED}" if the straggler left no trace'
    if slowed in profiled:
        if said == NOT_PROFILED:
            return False, (
                "one rank profiled takes far longer to load its batches than the other (time per "
                "kind): the straggler is among the ranks profiled"
            )
        if said != slowed:
            return False, "not that rank: whose data loading stands out in the time per kind?"
        return True, f"rank {slowed}: profiled, and its batches are the slow ones"
    right = said == NOT_PROFILED or (said == slowed and unprofiled == [slowed])
    if not right:
        return False, (
            "every rank profiled waits and none loads its batches slowly: none of them is the one "
            "they wait for. Read the report's first section: what the traces cannot tell"
        )
    return True, (
        f"rank {slowed} was slowed and left no trace: the ranks profiled ({profiled}) all wait "
        "for it, which is how a report of a few ranks points outside them"
    )


#: Exercise 11.2's job: machines, ranks per machine, how many ranks may be profiled, and the
#: rank its last run's report named.
MACHINES, PER_MACHINE, BUDGET, NAMED = 4, 8, 6, 13


def _ranks_to_profile(answer: Any) -> tuple[bool, str]:
    """11.2: at most BUDGET ranks of MACHINES x PER_MACHINE: a rank on every machine, rank 0
    and the rank the last run named."""
    world = MACHINES * PER_MACHINE
    ranks = whole_numbers(answer)
    if ranks is None or not ranks:
        return False, "answer with a list of ranks, e.g. [0, 5, 9]"
    if len(set(ranks)) != len(ranks) or not all(0 <= r < world for r in ranks):
        return False, f"ranks are 0 to {world - 1}, each once"
    if len(ranks) > BUDGET:
        return False, f"at most {BUDGET} ranks: every trace costs the job time and someone reading"
    bare = [m for m in range(MACHINES) if not any(r // PER_MACHINE == m for r in ranks)]
    if bare:
        first = bare[0] * PER_MACHINE
        return False, (
            f"machine {bare[0]} (ranks {first}-{first + PER_MACHINE - 1}) has no rank profiled: "
            "a slow machine slows all its ranks alike, and only a rank of it can show it"
        )
    if 0 not in ranks:
        return False, "rank 0 often does extra work (logging, checkpoints): profile it"
    if NAMED not in ranks:
        return False, f"the last run named rank {NAMED}: look at it again, in the same way"
    return True, (
        f"{sorted(ranks)}: every machine, rank 0 and rank {NAMED}"
        + (f", and {BUDGET - len(ranks)} left for a suspect" if len(ranks) < BUDGET else "")
    )


#: Lesson 11's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "11.1": _the_straggler_from_a_report,
    "11.2": _ranks_to_profile,
}
