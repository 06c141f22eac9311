"""A hang followed across process groups: each rank stuck in its last collective, waiting for
the members of that group that never called it, each of those stuck elsewhere or nowhere
(:func:`wait_chains`, lesson 13)."""

from __future__ import annotations

import re

import pandas as pd

from .groups import (
    group_descriptions,
    group_members,
    group_states,
    job_ranks,
    members_unknown_warning,
)
from .positions import (
    Positions,
    collective_calls,
    failed_inside,
    place_name,
    positions,
    ranks_said,
    stopped_first,
    without_dumps,
)

__all__ = ["wait_chains"]


def _where_rank_is(rank: int, place: tuple, at: Positions, waits: dict, gone: tuple, desc: dict) -> str:  # fmt: skip
    """Where a rank that others wait for at ``place`` (group, sequence number, their call's
    key) is, as the clause after its number (``gone``: the ranks that left no dump, and those
    with no entry)."""
    no_dump, empty = gone
    if rank in no_dump:
        return "which left no dump (killed, or dead before writing one)"
    if rank in empty and at.idle(rank):
        return "whose dump holds no collective under way (every one it issued completed: it stopped outside them)"  # fmt: skip
    if rank in empty:
        return "whose dump is empty (stuck before any collective)"
    group, seq, key = place
    if at.keys.get((rank, group, seq), key) != key:
        return f"which called {at.seen[(rank, group, seq)]} there"
    if rank in waits:
        (group, seq, op), _ = waits[rank]
        return f"which {'stopped' if waits[rank][1] is None else 'waits'} in {place_name(group, seq, op, desc)}"  # fmt: skip
    return "which never joined it"


def _p2p_before(records: pd.DataFrame, at: Positions, rank: int, members: dict) -> str | None:
    """The oldest send or receive of ``rank`` that the dumps say never completed and that it
    issued before the collective where it is, as "its recv from rank 12 in group 43 (pp)"
    (the peer's rank in the job, from the op's ``0<-3`` and the group's members), or None."""
    if not at.tracked or rank not in at.at:
        return None
    mine = records[(records["rank"] == rank) & records["p2p"].astype(bool)]
    before = mine[(mine["state"] != "completed") & (mine["created_ns"] < at.where.set_index("rank").loc[rank, "created_ns"])]  # fmt: skip
    if before.empty:
        return None
    row = before.sort_values("created_ns", kind="stable").iloc[0]
    op = row["op"].split(":")[-1]
    found = re.search(r"(\d+)\s*(<-|->)\s*(\d+)", op)
    peer, in_group = (int(found.group(3)) if found else None), members.get(row["group"], [])
    kind = op.split()[0]
    whom = f" {'from' if kind == 'recv' else 'to'} rank {in_group[peer]}" if peer is not None and peer < len(in_group) else ""  # fmt: skip
    return f"its {kind}{whom} in group {row['group']} ({row['group_desc'] or 'no description'})"


def _joined(at: Positions, member: int, row) -> bool:
    """Whether ``member`` joined the collective of ``row`` (an entry of another rank): it called
    the same there, and not only queued it behind an earlier one that did not complete (NCCL),
    or its entry is gone from the dump though later ones are there (it called it, long ago)."""
    place = (member, row.group, row.seq)
    if place not in at.keys:
        return at.called(*place)
    queued = at.tracked and at.at.get(member) != (row.group, row.seq) and not at.completed_by(*place)  # fmt: skip
    return at.keys[place] == row.key and not queued


def _plural(clause: str, ranks: int) -> str:
    """A clause of :func:`_where_rank_is` said of several ranks."""
    if ranks == 1:
        return clause
    plural = clause.replace("which waits", "which wait").replace("whose dump is", "whose dumps are")
    return plural.replace("which stopped in", "which stopped in, each,")


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
    at = positions(collective_calls(records), records.attrs.get("progress"))
    members_unknown_warning(records, group_states(records, job), ranks)
    inside = failed_inside(at, members)
    waits = {}  # rank -> (where: group, seq, op; the members not in it, None: it stopped there)
    for r in at.where.itertuples():
        missing = [m for m in members.get(r.group, []) if not _joined(at, m, r)]
        if int(r.rank) in inside:
            waits[int(r.rank)] = ((r.group, int(r.seq), r.op), None)
        elif missing or at.unfinished(r):  # gloo's dumps never say a collective completed
            waits[int(r.rank)] = ((r.group, int(r.seq), r.op), missing)
    stuck: dict[tuple, list[int]] = {}
    for rank, (where, missing) in waits.items():
        stuck.setdefault((where, None if missing is None else tuple(missing)), []).append(rank)
    said = []
    for ((group, seq, op), missing), waiting in stuck.items():
        where, who = place_name(group, seq, op, desc), ranks_said(sorted(waiting))
        verb = "waits" if len(waiting) == 1 else "wait"
        if missing is None:  # it stopped where its peers went on
            peers = [m for m in members[group] if m not in waiting]
            said.append((False, f"{who} stopped in {where}, which {ranks_said(peers)} completed: a failure on {who} (a GPU error, a dead link)"))  # fmt: skip
            continue
        if not missing:  # every member called it, and it did not complete
            behind = {r: _p2p_before(records, at, r, members) for r in sorted(waiting)}
            if all(behind.values()):  # each is behind a send or receive (left out above)
                queued = "; ".join(f"rank {r}: {b}" for r, b in behind.items())
                said.append((True, f"{who} {verb} in {where}, which every member called and which never completed, behind a send or receive that never completed ({queued})"))  # fmt: skip
            else:
                said.append((False, f"{who} {verb} in {where}, which every member called and which never completed: a rank failed or hangs inside it (its stack, or the network, says which)"))  # fmt: skip
            continue
        clauses: dict[str, list[int]] = {}
        for rank in missing:
            clause = _where_rank_is(rank, (group, seq, at.keys[(waiting[0], group, seq)]), at, waits, gone, desc)  # fmt: skip
            clauses.setdefault(clause, []).append(rank)
        whom = "; and ".join(f"{ranks_said(rs)}, {_plural(clause, len(rs))}" for clause, rs in clauses.items())  # fmt: skip
        ends = any(not clause.startswith("which waits") for clause in clauses)
        said.append((not ends, f"{who} {verb} in {where} for {whom}"))
    if said and all(goes_on for goes_on, _ in said):  # no chain ends: the waits form a cycle
        said.append((False, stopped_first(sorted(waits), at, desc)[1]))
    # the ends first; each part in the order of its words, not of the dumps' clocks
    return [sentence for _, sentence in sorted(said)]
