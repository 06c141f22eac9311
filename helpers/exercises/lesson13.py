"""The checks of lesson 13's exercises (``notebooks/13_many_process_groups.ipynb``; worked in
``solutions/13_solutions.ipynb``): in a job of a 2x2 mesh of tensor parallel (tp) and data
parallel (dp) groups, the group, collective and rank where a hidden stall began, read from the
Flight Recorder dumps; and each group's straggler and the delay when one rank is slowed at
random, read from the traces."""

from __future__ import annotations

from typing import Any

from ..hangs import FlightRecorderError, group_descriptions, group_members, load_flight_records
from .common import Check, arguments, is_run, number, one_hint, whole, within, wrong_run
from .hidden import (
    DELAY_TOLERANCE,
    HIDDEN_STALL_EXPERIMENT,
    HIDDEN_STRAGGLER_EXPERIMENT,
    MESH_SCRIPT,
)

__all__ = ["CHECKS", "SCRIPTS", "FLAGS"]

SCRIPTS = (MESH_SCRIPT,)
FLAGS = ("--bug", "--bug-rank", "--bug-step", "--slow-rank", "--delay-ms", "--profile", "--steps")
_LAUNCH_13_1 = "launch_with_a_hidden_stall()"
_LAUNCH_13_2 = (
    'launch_with_a_hidden_straggler(4, args=["--profile", "--steps", "6"], script="mesh_job.py")'
)


def _groups_of(run: Any) -> tuple[dict[str, list[int]], dict[str, str]] | str:
    """The run's groups ``{name: ranks}`` and ``{name: description}`` from its dumps, or a hint."""
    try:
        records = load_flight_records(run.run_dir, expect_ranks=range(4))
    except FlightRecorderError as err:
        return f"no usable Flight Recorder dumps in this run ({err}): launch it again"
    return group_members(records), group_descriptions(records)


def _where_the_others_wait(
    stalled: int, tp: str, members: dict[str, list[int]], descs: dict[str, str]
) -> dict[int, str]:
    """Where each rank but the stalled one waits: its tp partner in their tp group; the other
    tp pair, which finished that all-reduce, each in its dp group (with a rank of the first)."""
    partner = next(r for r in members[tp] if r != stalled)
    dp = {r: g for g, ranks in members.items() if descs.get(g) == "dp" for r in ranks}
    return {r: (tp if r == partner else dp[r]) for r in range(4) if r != stalled}


def _where_the_stall_began(answer: Any, run: Any) -> tuple[bool, str]:
    """13.1: ``{"group": name, "seq": n, "rank": r, "waiting": {rank: group}}`` of a hidden
    stall: the tp group of the stalled rank, the group's own number of the collective it never
    called, the rank, and the group where each other rank waits. Every wrong answer gets one
    hint: a blind guess of the rank and the step passes one run in 24."""
    given = arguments(run) if is_run(run) else {}
    stalled, step = whole(given.get("--bug-rank", -1)), whole(given.get("--bug-step", -1))
    if not is_run(run) or run.experiment != HIDDEN_STALL_EXPERIMENT or stalled is None:
        return False, f"launch the run with {_LAUNCH_13_1} and hand the check that run"
    found = _groups_of(run)
    if isinstance(found, str):
        return False, found
    members, descs = found
    tp = next(g for g, ranks in members.items() if stalled in ranks and descs.get(g) == "tp")
    if not isinstance(answer, dict) or {"group", "seq", "rank", "waiting"} - set(answer):
        return False, 'answer with a dict {"group": ..., "seq": ..., "rank": ..., "waiting": ...}'
    rank, seq, group = whole(answer["rank"]), whole(answer["seq"]), str(answer["group"])
    waiting = answer["waiting"]
    if not isinstance(waiting, dict):
        return False, '"waiting": a dict {rank: group} of where each of the other three ranks waits'
    said = {whole(r): str(g) for r, g in waiting.items()}
    expected = _where_the_others_wait(stalled, tp, members, descs)
    hint = one_hint([rank == stalled, group == tp, seq == step, said == expected], None, (
        "not yet: the hang began in the group whose missing rank waits in no other group "
        "(section 2): that rank stopped, where a rank missing from a group because it waits "
        "in another is a victim (group_states(records) says where each missing rank waits). "
        "The collective is that group's own sequence number where its ranks part: each group "
        "numbers its own, from 1, not across a rank's groups. Each other rank waits in the "
        "collective of its last entry in the dumps"
    ))  # fmt: skip
    if hint:
        return False, hint
    where = ", ".join(f"rank {r} in group {g}" for r, g in sorted(expected.items()))
    return True, f"rank {stalled} stopped before collective {step} of its tp group {tp}; {where}"


def _stragglers_per_group(answer: Any, run: Any) -> tuple[bool, str]:
    """13.2: ``{"stragglers": {group name: straggler rank or None}, "delay_ms": ms}`` for a run
    of mesh_job.py with one rank slowed at random before its tp all-reduce: each group's
    straggler, and how late the slow rank is per step (to within :data:`DELAY_TOLERANCE`). A
    blind guess of the stragglers passes one run in four, with the delay one in 28; every wrong
    answer gets one hint."""
    wrong = wrong_run(run, MESH_SCRIPT, {"--profile": None}, nproc=4)
    given = arguments(run) if is_run(run) else {}
    slow, delay = whole(given.get("--slow-rank", -1)), number(given.get("--delay-ms"))
    if wrong or run.experiment != HIDDEN_STRAGGLER_EXPERIMENT or slow is None or slow < 0:
        return False, f"launch the run with {_LAUNCH_13_2} and hand the check that run"
    found = _groups_of(run)
    if isinstance(found, str):
        return False, found
    members, descs = found
    shape = f'{{"stragglers": {{one entry per group, {sorted(members)}}}, "delay_ms": ...}}'
    if not isinstance(answer, dict) or set(answer) != {"stragglers", "delay_ms"}:
        return False, f"answer with a dict {shape}"
    said_groups = answer["stragglers"]
    if not isinstance(said_groups, dict) or set(map(str, said_groups)) != set(members):
        return False, f"answer with a dict {shape}"
    partner = next(r for g, ranks in members.items() if slow in ranks and descs[g] == "tp"
                   for r in ranks if r != slow)  # fmt: skip
    expected = {
        g: slow if slow in ranks else (partner if descs[g] == "dp" else None)
        for g, ranks in members.items()
    }
    said = {str(g): (None if r is None else whole(r)) for g, r in said_groups.items()}
    ms = number(answer["delay_ms"])
    hint = one_hint([said == expected, within(ms, delay, DELAY_TOLERANCE)], ms, (
        "not yet: in each group the straggler is the rank the others wait for "
        "(waiting_per_group's straggler, where others_wait_ms is a delay; None where it is a "
        "fraction of a millisecond beside the other groups'), and a rank that waited in one "
        "group arrives late at the next. The delay: how long the slow rank's tp partner waits "
        "for it per step (others_wait_ms in its tp group), in ms"
    ))  # fmt: skip
    if hint:
        return False, hint
    return True, (
        f"rank {slow} is {delay:g} ms late in its tp group; then it and rank {partner} are both "
        "late to their dp groups, and the other tp group waits for nobody"
    )


#: Lesson 13's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "13.1": _where_the_stall_began,
    "13.2": _stragglers_per_group,
}
