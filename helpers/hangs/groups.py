"""Flight Recorder dumps of a job of many process groups, compared group by group.

A real job has many process groups side by side: tensor, pipeline, expert and data parallel (any
``init_device_mesh`` of two dimensions makes one group per row and per column). Each group numbers
its own collectives: ``collective_seq_id`` counts from 1 in every group, so collective 3 of a
tensor-parallel group and collective 3 of a data-parallel group are unrelated. Here a group's
members are compared only with each other, at the group's own sequence numbers, as PyTorch's
analyser does; point-to-point sends and receives (numbered apart, ``p2p_seq_id``) are left out of
the comparison.

- :func:`group_members`: which ranks belong to which group;
- :func:`group_states`: one row per group: healthy, or where its members first disagree, who
  did not come, and whether those ranks are themselves stuck in another group;
- :func:`first_mismatch`: the disagreement that started it (a :class:`Mismatch`): in a group
  whose missing rank is not waiting anywhere else. Ranks whose dump holds no entry at all (stuck
  before their first collective, or with the Flight Recorder off) are named first;
(:func:`.chains.wait_chains` follows the hang from group to group.)
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from .positions import (
    Positions,
    collective_calls,
    failed_inside,
    never_completed,
    never_started,
    place_name,
    positions,
    stopped_first,
    waited_for_gone,
    without_dumps,
)

__all__ = [
    "group_members",
    "group_descriptions",
    "group_states",
    "Mismatch",
    "first_mismatch",
]

DEFAULT_GROUP = "default_pg"  # the description torch gives the group of init_process_group
# What a rank with no entry under way, that completed collectives, left (NCCL's dumps of the
# active entries only): it stopped outside the collectives.
IDLE = "a dump with no collective under way (every one it issued completed: it stopped outside them, where its stack shows)"  # fmt: skip
# What a member called, said of one whose entry is gone from its dump though it has later ones.
EVICTED = "called it (its entry is gone from the dump)"


def job_ranks(records: pd.DataFrame, ranks: list[int] | None) -> list[int]:
    """The ranks of the job: ``ranks``, else those ``load_flight_records`` found a dump of
    (kept in ``records.attrs``) and those the dumps list in their groups (NCCL's list every
    member, so a rank killed before it wrote a dump is still one of the job), else those with
    entries."""
    found = set(ranks if ranks is not None else records.attrs.get("ranks") or ())
    if ranks is None:
        found |= set().union(*map(set, records.attrs.get("members", {}).values()))
    return sorted(found | set(records["rank"].unique().tolist()))


def group_members(records: pd.DataFrame, ranks: list[int] | None = None) -> dict[str, list[int]]:
    """``{group: [ranks]}`` for every group named in ``records`` (rows of
    :func:`load_flight_records`).

    A rank belongs to a group when it recorded a collective there, or when its dump's
    ``pg_config`` lists it (NCCL dumps do; torch 2.14's gloo dumps list one wrong group, so the
    loader keeps only the groups their entries name). A rank found in no group of a description
    (``tp``) is put in the one group of that description that has fewer members than the others,
    where there is exactly one: it stalled before its first collective there. ``default_pg`` has
    every rank of the job (``ranks``, or every rank with a dump).
    """
    job = job_ranks(records, ranks)
    members: dict[str, set[int]] = {}
    for group, rank in records[["group", "rank"]].drop_duplicates().itertuples(index=False):
        members.setdefault(group, set()).add(int(rank))
    for group, listed in records.attrs.get("members", {}).items():
        members.setdefault(group, set()).update(listed)
    desc = group_descriptions(records)
    for group in members:
        if desc.get(group) == DEFAULT_GROUP:
            members[group].update(job)
    for d in set(desc.values()) - {DEFAULT_GROUP, ""}:
        siblings = [g for g in members if desc.get(g) == d]
        placed = set().union(*(members[g] for g in siblings))
        size = max(len(members[g]) for g in siblings)
        short = [g for g in siblings if len(members[g]) < size]
        unplaced = set(job) - placed
        if len(short) == 1 and 0 < len(unplaced) <= size - len(members[short[0]]):
            members[short[0]].update(unplaced)
    return {g: sorted(m) for g, m in sorted(members.items(), key=lambda kv: _group_order(kv[0]))}


def _group_order(group: str) -> tuple:
    """Groups in the order PyTorch named them (``0, 1, 2, ... 10``), then by name."""
    return (0, int(group), "") if group.isdigit() else (1, 0, group)


def group_descriptions(records: pd.DataFrame) -> dict[str, str]:
    """``{group: description}`` (``"tp"``, ``"default_pg"``) for every group named in ``records``."""
    return dict(records[["group", "group_desc"]].drop_duplicates("group").itertuples(index=False))


def _expected(seen: dict[int, str | None], siblings: Counter) -> str:
    """The call a group's members should all have made: the most common among them; on a tie,
    the one most common in the groups of the same description at that number (they run the
    same code), then the lowest rank's."""
    counts = Counter(v for v in seen.values() if v is not None)
    top = max(counts.values())
    tied = [v for v in dict.fromkeys(seen.values()) if v is not None and counts[v] == top]
    if len(tied) > 1 and siblings:
        tied.sort(key=lambda v: -siblings.get(v, 0))  # stable: the lowest rank's first on a tie
    return tied[0]


def _first_disagreement(calls: pd.DataFrame, group: str, members: list[int], siblings: dict, at: Positions) -> dict | None:  # fmt: skip
    """Where the members of one group first disagree (seq, kind, calls, culprits, callers,
    since_ms), or None. A member with no entry at a number it has passed (``at.called``) called
    it: its entry was evicted; it is neither a culprit nor a vote."""
    keys = calls.pivot_table(index="seq", columns="rank", values="key", aggfunc="first")
    shown = calls.pivot_table(index="seq", columns="rank", values="call", aggfunc="first")
    keys, shown = keys.reindex(columns=members), shown.reindex(columns=members)
    since = calls.groupby("seq")["created_ms"].min()
    for seq, row in keys.iterrows():
        absent = [int(r) for r, v in row.items() if pd.isna(v) and not at.called(int(r), group, seq)]  # fmt: skip
        known = {int(r): v for r, v in row.items() if not pd.isna(v)}
        if not absent and len(set(known.values())) == 1:
            continue
        voters = {**known, **dict.fromkeys(absent)}
        expected = _expected(voters, siblings.get(seq, Counter()))
        if absent:
            kind = "missing"
        else:
            ops = {v.split(" ", 1)[0] for v in known.values()}
            kind = "different collective" if len(ops) > 1 else "different sizes"
        said = {int(r): (None if pd.isna(v) else v) for r, v in shown.loc[seq].items()}
        return {
            "seq": int(seq),
            "kind": kind,
            "calls": {r: EVICTED if v is None and r not in absent else v for r, v in said.items()},
            "culprits": [r for r in said if r in absent or (r in known and known[r] != expected)],
            "callers": [r for r in said if r not in absent],
            "since_ms": float(since[seq]),
        }
    return None


def group_states(records: pd.DataFrame, ranks: list[int] | None = None) -> pd.DataFrame:
    """One row per process group: is it healthy, and if not, where and why its members first
    disagree.

    Columns: ``group, desc, ranks`` (its members), ``agreed`` (how many collectives all its
    members made alike), ``state`` (``"healthy"``; the kind of :class:`Mismatch`; or
    ``"members unknown"``: it agrees, but has fewer known members than the other groups of its
    description, or those groups together miss a rank of the job, so a member that recorded
    nothing there cannot be told apart), ``seq`` (the
    group's number of the first disagreement), ``culprits`` (ranks that did not call what the
    others did), ``waiting`` (the members that called it and wait), ``calls`` (what each member
    called there), ``since_ms`` (when it was first called), ``order`` (where that collective
    comes in the program, as the rank that recorded the most ran it),
    ``culprits_waiting_in`` (``{culprit: group}`` for each culprit stuck in another group; a rank
    inside a failure, :func:`failed_inside`, waits nowhere),
    ``root`` (True where a culprit waits nowhere: the disagreement starts here).
    A member with no entry at a collective, but later ones in the group, called it (its entry
    was evicted from the dump's ring buffer): only a member whose newest is before it is
    missing.
    ranks: the ranks of the job (default: every rank with a dump).
    """
    calls = collective_calls(records)
    desc = group_descriptions(records)
    members = group_members(records, ranks)
    at = positions(calls, records.attrs.get("progress"))
    siblings = {
        d: calls[calls["group_desc"] == d].groupby("seq")["key"].agg(Counter).to_dict()
        for d in set(desc.values()) - {""}
    }
    rows = [
        _group_row(group, desc.get(group, ""), in_group, calls, siblings, at)
        for group, in_group in members.items()
    ]
    states = pd.DataFrame(rows).astype({"seq": "Int64", "since_ms": "float64"})
    program = _program_order(calls)
    states["order"] = [
        program.get((row.desc, row.seq), len(program)) for row in states.itertuples()
    ]
    stuck_in = _where_ranks_wait(at, states, failed_inside(at, members))
    states["culprits_waiting_in"] = [
        {r: stuck_in[r] for r in row.culprits if r in stuck_in and stuck_in[r] != row.group}
        for row in states.itertuples()
    ]
    unsure = _members_unknown(states, job_ranks(records, ranks))
    states.loc[(states["state"] == "healthy") & unsure, "state"] = "members unknown"
    states["root"] = [
        row.state not in ("healthy", "members unknown")
        and len(row.culprits_waiting_in) < len(row.culprits)
        for row in states.itertuples()
    ]
    return states


def _group_row(group: str, desc: str, members: list[int], calls, siblings: dict, at: Positions) -> dict:  # fmt: skip
    """One row of :func:`group_states`, before the columns that need every group."""
    mine = calls[calls["group"] == group]
    found = _first_disagreement(mine, group, members, siblings.get(desc, {}), at) or {}
    return {
        "group": group,
        "desc": desc,
        "ranks": members,
        "agreed": (found["seq"] - 1) if found else int(mine["seq"].max()) if len(mine) else 0,
        "state": found.get("kind", "healthy"),
        "seq": found.get("seq"),
        "culprits": found.get("culprits", []),
        "waiting": found.get("callers", []),
        "calls": found.get("calls", {}),
        "since_ms": found.get("since_ms"),
    }


def _members_unknown(states: pd.DataFrame, job: list[int]) -> pd.Series:
    """True for each group with fewer members than another of its description, or whose
    description's groups together miss a rank of the job."""
    sizes = states.groupby("desc")["ranks"].agg(lambda r: max(map(len, r)))
    covered = states.groupby("desc")["ranks"].agg(lambda r: set().union(*map(set, r)))
    short = states["ranks"].map(len) < states["desc"].map(sizes)
    uncovered = states["desc"].map(lambda d: d != "" and covered[d] != set(job))
    return short | uncovered


def _program_order(calls: pd.DataFrame) -> dict[tuple[str, int], int]:
    """``{(description, seq): position}`` in the sequence of the rank that recorded the most
    collectives: where each group's collective comes in the program every rank runs (groups of
    one description are the same code on other ranks)."""
    if calls.empty:
        return {}
    furthest = calls["rank"].value_counts().idxmax()
    mine = calls[calls["rank"] == furthest].sort_values("created_ns")
    return {(d, int(s)): i for i, (d, s) in enumerate(zip(mine["group_desc"], mine["seq"]))}


def members_unknown_warning(records: pd.DataFrame, states: pd.DataFrame, ranks: Any) -> None:
    """Warn, when the job's ranks were not given, that a group with fewer members than another of
    its description may hide a rank that left no dump (unless empty dumps explain it)."""
    sizes = states["ranks"].map(len)
    short = (sizes < sizes.groupby(states["desc"]).transform("max")).any()
    if ranks is None and short and not without_dumps(records, job_ranks(records, None))[1]:
        warnings.warn(
            "some process groups have fewer members in these dumps than others of their kind: "
            "a rank may have left no dump (killed); give the job's ranks, "
            "ranks=range(world_size), to have it named",
            stacklevel=3,
        )


def _where_ranks_wait(at: Positions, states: pd.DataFrame, failed: dict[int, Any]) -> dict[int, str]:  # fmt: skip
    """``{rank: group}`` for each rank whose collective where it is (``at``) is one its group
    disagrees on, or one the dumps say never completed (so it is still waiting there); a rank
    inside a failure (``failed``) waits for nobody."""
    unresolved = {
        (row.group, row.seq)
        for row in states.itertuples()
        if row.state not in ("healthy", "members unknown")
    }
    return {
        int(r.rank): r.group
        for r in at.where.itertuples()
        if int(r.rank) not in failed
        and (any(g == r.group and r.seq >= seq for g, seq in unresolved) or at.unfinished(r))
    }


@dataclass
class Mismatch:
    """Where the ranks' collectives first disagree.

    ``seq``: the sequence number (in ``group``); ``kind``: ``"different collective"``,
    ``"different sizes"``, ``"missing"`` (some ranks never called it), ``"empty dump"``,
    ``"failed"`` (nobody waits, but a rank stopped in a collective its peers completed), or
    ``"never completed"`` (every member called it, and NCCL's dumps say it had not completed
    when they were written: the rank at fault is inside it; ``culprits`` then names ranks
    without a dump or with an empty one, a member stopped inside a failure, or the members
    whose entry never started where others' did, and none where the dumps cannot say);
    ``calls``: what each member called there (``None`` where it called nothing);
    ``culprits``: the ranks that differ from the others (ranks with an empty dump first);
    ``group``, ``desc``: the process group's name and description (``"0"``, ``"default_pg"``);
    ``empty_dumps``: ranks with no entry at all, whether their dump is empty or missing;
    ``no_dumps``: those of them that left no dump (killed, or dead before writing one);
    ``failed``: ``{rank: where}`` for each rank inside a failure (:func:`failed_inside`: it
    stopped in a collective its peers completed), where it stopped;
    ``why``: how the verdict was chosen where the waits form a cycle ("" otherwise);
    ``idle``: the ranks of ``empty_dumps`` whose dump holds no collective under way though NCCL's
    ``pg_status`` says they completed some (a dump of the active entries only).
    """

    seq: int
    kind: str
    calls: dict[int, str | None]
    culprits: list[int]
    group: str | None = None
    desc: str = ""
    empty_dumps: list[int] = field(default_factory=list)
    no_dumps: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    why: str = ""
    idle: list[int] = field(default_factory=list)

    def __str__(self) -> str:
        said = "; ".join(f"rank {r}: {c or 'nothing'}" for r, c in self.calls.items())
        where = f"collective {self.seq}: {self.kind} ({said})"
        if self.group is not None and self.desc != DEFAULT_GROUP:
            where = f"group {self.group} ({self.desc or 'no description'}), {where}"
        empty = "".join(
            f"rank(s) {ranks} left {what}; "
            for ranks, what in [
                (self.no_dumps, "no dump (killed, or dead before writing one)"),
                ([r for r in self.empty_dumps if r not in self.no_dumps and r not in self.idle], "an empty dump (no collective recorded)"),
                (self.idle, IDLE),
            ]
            if ranks
        )  # fmt: skip
        failed = "; ".join(f"rank {r} stopped in {at}" for r, at in self.failed.items())
        if failed:
            failed = (
                f"; {failed}, which {'its peers' if len(self.failed) == 1 else 'their peers'} "
                f"completed: a failure on {'that rank' if len(self.failed) == 1 else 'those ranks'}"
                " (a GPU error, a dead link)"
            )
        why = f"; {self.why}" if self.why else ""
        if self.group is None:
            return empty.rstrip("; ")
        if self.kind == "never completed":
            return f"{empty}{where}; every member called it: a rank failed or hangs inside it{failed}{why}"  # fmt: skip
        return f"{empty}{where}; differs on rank(s) {self.culprits}{failed}{why}"


def first_mismatch(records: pd.DataFrame, ranks: list[int] | None = None) -> Mismatch | None:
    """The disagreement that started a hang, or None when every group's members agree on
    everything recorded, no dump is empty or missing, and (NCCL's dumps, which say so) every
    collective had completed when the dumps were written. A rank of the job (``ranks``) that
    left no dump is named where the others wait for it; without ``ranks`` it cannot be, and a
    warning says so where a group is short of a member.

    Each group is compared on its own (:func:`group_states`). Of the groups that disagree, the
    answer is the first (in the program's order, then by time) whose culprit waits in no other group: a rank
    missing from a data-parallel all-reduce because it is stuck in its tensor-parallel group is
    a victim, not the cause. In each group the expected call is its members' most common one;
    on a tie, the most common in the groups of the same description; then the lowest rank's.
    ranks: the ranks of the job (default: every rank with a dump, from ``records.attrs``).
    """
    job = job_ranks(records, ranks)
    gone, empty = without_dumps(records, job)
    states = group_states(records, job)
    members_unknown_warning(records, states, ranks)
    at = positions(collective_calls(records), records.attrs.get("progress"))
    members, desc = group_members(records, job), group_descriptions(records)
    inside = failed_inside(at, members)
    failed = {r: place_name(row.group, row.seq, row.op, desc) for r, row in inside.items()}
    idle = [r for r in empty if at.idle(r)]

    def verdict(seq: int, kind: str, calls: dict, culprits: list, group: str, why: str = ""):
        found = [r for r in culprits if r not in empty]
        return Mismatch(seq, kind, calls, empty + found, group, desc.get(group, ""), empty, gone, failed, why, idle)  # fmt: skip

    lost = waited_for_gone(at, members, set(gone)) if gone else None
    if lost is not None:  # the killed rank counts as missing from #1 on: say where it was lost
        return verdict(lost["seq"], "missing", lost["calls"], [], lost["group"])
    bad = states[~states["state"].isin(["healthy", "members unknown"])].sort_values(
        ["root", "order", "since_ms"], ascending=[False, True, True]
    )
    if bad.empty or not bad.iloc[0]["root"]:
        stuck = never_completed(at, members)
        if stuck is not None:
            in_it = [r for r in members[stuck["group"]] if r in inside]
            in_it = in_it or never_started(at, stuck["group"], stuck["seq"])
            return verdict(stuck["seq"], "never completed", stuck["calls"], in_it, stuck["group"])
    if bad.empty and inside:  # nobody waits, but a rank stopped where its peers went on
        rank, row = min(inside.items(), key=lambda kv: kv[1].created_ns)
        calls = {m: at.seen.get((m, row.group, row.seq)) for m in members[row.group]}
        return verdict(int(row.seq), "failed", calls, [rank], row.group)
    if bad.empty:
        return Mismatch(0, "empty dump", {}, empty, empty_dumps=empty, no_dumps=gone, idle=idle) if empty else None  # fmt: skip
    why = ""
    if not bad.iloc[0]["root"]:  # every culprit waits in another group: the waits form a cycle
        first, why = stopped_first(sorted(set().union(*map(set, bad["culprits"]))), at, desc)
        bad = bad[[first in c for c in bad["culprits"]]]
    top = bad.iloc[0]
    return verdict(int(top["seq"]), top["state"], top["calls"], top["culprits"], top["group"], why)
