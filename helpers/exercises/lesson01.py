"""The checks of lesson 1's exercises (``notebooks/01_setup_and_ranks.ipynb``; worked in
``solutions/01_solutions.ipynb``): what 6 processes on 2 nodes see, and a rank that stops
with an exit code of its own."""

from __future__ import annotations

import json
from typing import Any

from ..jobs import RankFailed
from .common import Check, whole, whole_numbers, wrong_run

__all__ = [
    "CHECKS",
    "SCRIPTS",
    "FLAGS",
    "RANKS_SCRIPT",
    "FAILS_SCRIPT",
    "FAILS_EXIT_SCRIPT",
    "RANK_FILES",
]

#: The lesson's script: every process writes what it sees to rank<N>.json.
RANKS_SCRIPT = "ranks.py"
#: The lesson's script whose rank 1 raises (exercise 1.2's failure must not be its).
FAILS_SCRIPT = "fails.py"
#: The script exercise 1.2 has the learner write: rank 1 stops with sys.exit(3).
FAILS_EXIT_SCRIPT = "fails_exit.py"
#: The files ranks.py writes into the run folder, rank<N>.json, one per process.
RANK_FILES = "rank*.json"
#: The scripts these checks rely on, and the flags of theirs they pass or read (none).
SCRIPTS = (RANKS_SCRIPT, FAILS_SCRIPT, FAILS_EXIT_SCRIPT)
FLAGS: tuple[str, ...] = ()


def _rank_files(run: Any) -> list[dict]:
    """What every process of a run of ranks.py saw, one dict each, from its rank<N>.json."""
    return [json.loads(p.read_text()) for p in run.paths(RANK_FILES) if p.name[4:-5].isdigit()]


def _six_processes_on_two_nodes(prediction: Any, run: Any) -> tuple[bool, str]:
    """1.1: what 6 processes on 2 nodes see, against the rank files of the learner's run."""
    wrong = wrong_run(run, RANKS_SCRIPT, {}, nproc=3, nnodes=2)
    if wrong:
        return False, wrong
    seen = _rank_files(run)
    if len(seen) != run.world_size:
        return False, f"{len(seen)} rank files for {run.world_size} processes: launch it again"
    truth = {
        "WORLD_SIZE": {int(r["WORLD_SIZE"]) for r in seen},
        "LOCAL_RANKS": {int(r["LOCAL_RANK"]) for r in seen},
        "MASTER_PORTS": len({r["MASTER_PORT"] for r in seen}),
    }
    if not isinstance(prediction, dict) or set(prediction) != set(truth):
        return False, 'predict a dict with keys "WORLD_SIZE", "LOCAL_RANKS" and "MASTER_PORTS"'
    if {whole(prediction["WORLD_SIZE"])} != truth["WORLD_SIZE"]:
        return False, "WORLD_SIZE counts every process of the job, on all nodes together"
    local_ranks = whole_numbers(prediction["LOCAL_RANKS"])
    if local_ranks is None:
        return False, "LOCAL_RANKS is the set of values LOCAL_RANK takes, such as {0, 1}"
    if set(local_ranks) != truth["LOCAL_RANKS"]:
        return False, "LOCAL_RANK numbers the processes of one node; it starts again on each node"
    if whole(prediction["MASTER_PORTS"]) != truth["MASTER_PORTS"]:
        return False, "how many meeting points does one job need, however many nodes it has?"
    return True, (
        f"{len(seen)} processes saw WORLD_SIZE {run.world_size}, LOCAL_RANK "
        f"{sorted(truth['LOCAL_RANKS'])} on each node, and one meeting point"
    )


def _a_rank_that_exits_with_a_code(failure: Any) -> tuple[bool, str]:
    """1.2: rank 1 of the learner's fails_exit.py stops with exit code 3."""
    if failure is None:
        return False, (
            "no RankFailed was caught: the run finished without a failing rank. Launch "
            f"your {FAILS_EXIT_SCRIPT}, in which rank 1 stops with an exit code"
        )
    if not isinstance(failure, RankFailed):
        return False, "hand the check the RankFailed you caught (except RankFailed as err: ...)"
    if getattr(failure.record, "script", None) == FAILS_SCRIPT:
        return False, (
            f"that is the failure of the lesson's {FAILS_SCRIPT}: write {FAILS_EXIT_SCRIPT}, "
            f"launch it and hand the check its RankFailed"
        )
    if failure.exit_code == 1:
        return False, (
            f"rank {failure.rank} exited with 1, which is what an uncaught exception "
            f"gives; stop rank 1 with sys.exit(3) instead"
        )
    if failure.rank != 1:
        return False, f"rank {failure.rank} failed; make rank 1 the one that exits"
    if failure.exit_code != 3:
        return False, f"rank 1 exited with {failure.exit_code}; use sys.exit(3)"
    return True, (
        "rank 1 exited with code 3 and the launcher named it; an uncaught exception "
        "gives exit code 1"
    )


#: Lesson 1's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "01.1": _six_processes_on_two_nodes,
    "01.2": _a_rank_that_exits_with_a_code,
}
