"""A hang followed across process groups: each rank stuck in its last collective, waiting for
the members of that group that never called it, each of those stuck elsewhere or nowhere
(:func:`wait_chains`, lesson 12)."""

from __future__ import annotations

import pandas as pd

from .groups import (
    collective_calls,
    group_descriptions,
    group_members,
    group_states,
    job_ranks,
    members_unknown_warning,
)
from .positions import Positions, positions, without_dumps

__all__ = ["wait_chains"]


def _ranks(ranks: list[int]) -> str:
    """``[0, 1, 5]`` as "ranks 0, 1 and 5"; ``[4]`` as "rank 4"."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"


def _where_rank_is(rank: int, place: tuple, seen: dict, waits: dict, gone: tuple, desc: dict) -> str:  # fmt: skip
    """Where a rank that others wait for at ``place`` (group, sequence number, their call) is,
    as the clause after its number (``seen``: what each rank called where; ``gone``: the ranks
    that left no dump, and those with no entry)."""
    no_dump, empty = gone
    if rank in no_dump:
        return "which left no dump (killed, or dead before writing one)"
    if rank in empty:
        return "whose dump is empty (stuck before any collective)"
    group, seq, call = place
    if seen.get((rank, group, seq), call) != call:
        return f"which called {seen[(rank, group, seq)]} there"
    if waits.get(rank):
        group, seq, op = waits[rank][0]
        return f"which waits in group {group} ({desc.get(group) or 'no description'})'s {op} #{seq}"
    return "which never joined it"


def _joined(at: Positions, member: int, row) -> bool:
    """Whether ``member`` joined the collective of ``row`` (an entry of another rank): it called
    the same there, and not only queued it behind an earlier one that did not complete (NCCL)."""
    place = (member, row.group, row.seq)
    queued = at.tracked and at.at.get(member) != (row.group, row.seq) and place not in at.done
    return at.seen.get(place) == row.call and not queued


def _plural(clause: str, ranks: int) -> str:
    """A clause of :func:`_where_rank_is` said of several ranks."""
    if ranks == 1:
        return clause
    return clause.replace("which waits", "which wait").replace("whose dump is", "whose dumps are")


def wait_chains(records: pd.DataFrame, ranks: list[int] | None = None) -> list[str]:
    """The hang followed across groups, one sentence per collective that ranks wait in.

    Each rank is taken to wait where it is (:func:`.groups.where_ranks_are`: its last collective,
    or with NCCL's states its first that did not complete; sends and receives left out), for the
    members of that collective's group that never issued it (or called another collective
    there); where the dumps say when collectives completed (NCCL's), a rank also waits in a
    collective that every member called and that did not complete, and the chain ends there (a
    rank failed or hangs inside it). A
    rank waited for may itself wait in another group's collective: the sentence says which, and
    the chain goes on there; it ends at ranks that are in no collective ("which never joined
    it"), that left no dump, or an empty one (``ranks``: the job's ranks, default: every rank with
    a dump). The collectives where it ends come first: "ranks 0, 1 and 5 wait in group 5 (ep)'s
    all_to_all #2 for rank 4, which never joined it"; then "ranks 3 and 7 wait in group 8 (dp)'s
    all_reduce #2 for ranks 1 and 5, which wait in group 5 (ep)'s all_to_all #2". Several
    independent roots each have their sentence. An empty list: nobody waits for anybody, as far as
    the dumps show (without ``ranks``, a rank that left no dump is unseen: a warning says so)."""
    job = job_ranks(records, ranks)
    gone = without_dumps(records, job)
    members, desc = group_members(records, job), group_descriptions(records)
    at = positions(collective_calls(records))
    members_unknown_warning(records, group_states(records, job), ranks)
    waits = {}  # rank -> (where it waits: group, seq, op; the members that have not joined it)
    for r in at.where.itertuples():
        missing = [m for m in members.get(r.group, []) if not _joined(at, m, r)]
        if missing or at.unfinished(r):  # gloo's dumps never say a collective completed
            waits[int(r.rank)] = ((r.group, int(r.seq), r.op.split(":")[-1]), missing)
    stuck: dict[tuple, list[int]] = {}
    for rank, (where, missing) in waits.items():
        stuck.setdefault((where, tuple(missing)), []).append(rank)
    said = []
    for ((group, seq, op), missing), waiting in stuck.items():
        clauses: dict[str, list[int]] = {}
        for rank in missing:
            clause = _where_rank_is(rank, (group, seq, at.seen[(waiting[0], group, seq)]), at.seen, waits, gone, desc)  # fmt: skip
            clauses.setdefault(clause, []).append(rank)
        whom = "; and ".join(f"{_ranks(rs)}, {_plural(clause, len(rs))}" for clause, rs in clauses.items())  # fmt: skip
        verb = "waits" if len(waiting) == 1 else "wait"
        where = f"group {group} ({desc.get(group) or 'no description'})'s {op} #{seq}"
        sentence = f"{_ranks(sorted(waiting))} {verb} in {where} for {whom}"
        if not missing:  # every member called it, and it did not complete
            sentence = f"{_ranks(sorted(waiting))} {verb} in {where}, which every member called and which never completed: a rank failed or hangs inside it (its stack, or the network, says which)"  # fmt: skip
        ends = not missing or any(not clause.startswith("which waits") for clause in clauses)
        said.append((not ends, sentence))
    # the ends first; each part in the order of its words, not of the dumps' clocks
    return [sentence for _, sentence in sorted(said)]
