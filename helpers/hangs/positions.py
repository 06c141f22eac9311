"""Where each rank of a hung job is, from its Flight Recorder entries: the collective it is in,
what every rank called where, how far each rank got in each group, and which ranks left no dump
or an empty one (read by :mod:`.groups` and :mod:`.chains`).

A dump is a ring buffer (``TORCH_FR_BUFFER_SIZE`` entries, 2000 by default), and some tools dump
only the collectives still under way: a rank may have no entry for a collective it did call. Its
sequence numbers say so: each group numbers a rank's own collectives, so a rank whose newest entry
in a group is past N has called N (its entry was evicted); only a rank whose newest is before N
has not (:meth:`Positions.called`).

Read from where the ranks are: :func:`failed_inside` (ranks stopped in a collective their peers
completed), :func:`never_completed` (one every member is in, that never completed),
:func:`waited_for_gone` (where the others wait for a rank without a dump), and
:func:`stopped_first` (in a cycle of waits, the rank that stopped first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

__all__ = [
    "Positions",
    "collective_calls",
    "positions",
    "without_dumps",
    "failed_inside",
    "never_completed",
    "never_started",
    "waited_for_gone",
    "stopped_first",
    "place_name",
    "ranks_said",
    "VARYING_SIZES",
]

# Collectives whose inputs differ from rank to rank by design (each rank sends what it routes):
# their members are compared by the operation only.
VARYING_SIZES = ("all_to_all", "alltoall", "all_to_all_single", "alltoall_base", "all_to_allv")


def collective_calls(records: pd.DataFrame) -> pd.DataFrame:
    """Collectives only (no point-to-point), with ``call`` = the op and its input sizes, and
    ``key`` = what the members of a group must agree on: the call, or the op alone for an
    all-to-all (whose sizes differ by rank). The records' ``attrs`` are left behind: pandas
    deep-copies them into every frame made from this one (on NVIDIA's 16-rank dumps, 85 % of
    :func:`first_mismatch`'s time); read them from the records."""
    rows = records[~records["p2p"].astype(bool)]
    call = rows["op"] + " " + rows["input_sizes"]
    calls = rows.assign(
        call=call, key=call.where(~rows["collective"].isin(VARYING_SIZES), rows["op"])
    )
    calls.attrs = {}
    return calls


@dataclass
class Positions:
    """Where each rank's collectives are (rows of :func:`collective_calls`): ``seen``, what each
    rank called at each place, ``{(rank, group, seq): call}`` (``keys``: the same, as
    :func:`collective_calls`' ``key``); ``where``, each rank's row where it is
    (:func:`positions`); ``at``, ``{rank: (group, seq)}`` of it; ``tracked``, whether the dumps say
    when collectives completed (NCCL's do; gloo's stay "scheduled"); ``done``, the ``(rank, group,
    seq)`` of entries they say completed; ``newest``, ``{(rank, group): seq}`` of the last
    collective each rank issued in each group, ``completed``, of the last it completed (NCCL)."""

    seen: dict[tuple, str]
    keys: dict[tuple, str]
    where: pd.DataFrame
    at: dict[int, tuple]
    tracked: bool
    done: set[tuple]
    newest: dict[tuple, int]
    completed: dict[tuple, int]

    def finished(self, row) -> bool:
        """Whether the dumps say that ``row`` (an entry) completed."""
        last = self.completed.get((int(row.rank), row.group), -1)
        return row.state == "completed" or row.seq <= last

    def unfinished(self, row) -> bool:
        """Whether the dumps say that ``row`` (an entry) had not completed."""
        return self.tracked and not self.finished(row)

    def called(self, rank: int, group: str, seq: int) -> bool:
        """Whether ``rank`` issued collective ``seq`` of ``group``: it has an entry there, or a
        later one (the entry was evicted from its ring buffer, or left out as completed)."""
        return (rank, group, seq) in self.seen or self.newest.get((rank, group), 0) >= seq

    def idle(self, rank: int) -> bool:
        """Whether the dumps say ``rank`` completed collectives (NCCL's ``pg_status``): a rank
        with no entry under way then stopped outside them, not before its first."""
        return any(done > 0 for (r, _), done in self.completed.items() if r == rank)

    def completed_by(self, rank: int, group: str, seq: int) -> bool:
        """Whether the dumps say that ``rank`` completed collective ``seq`` of ``group``."""
        return (rank, group, seq) in self.done or self.completed.get((rank, group), -1) >= seq


def positions(calls: pd.DataFrame, progress: dict | None = None) -> Positions:
    """Where each rank is: with NCCL's states, its first collective that did not complete (its
    last when all did; one queued behind it is not where it waits); with gloo's, its last.
    ``progress``: ``{(rank, group): (enqueued, completed)}`` from the dumps' ``pg_status``
    (``records.attrs["progress"]``)."""
    progress = progress or {}
    ordered = calls.sort_values("created_ns", kind="stable")
    completed = {place: int(done) for place, (_, done) in progress.items()}
    newest = {
        (int(rank), group): int(seq)
        for (rank, group), seq in ordered.groupby(["rank", "group"])["seq"].max().items()
    }
    for place, (enqueued, _) in progress.items():
        newest[place] = max(newest.get(place, 0), int(enqueued))
    tracked = bool(completed) or bool(ordered["state"].isin(["started", "completed"]).any())
    last = pd.Series(
        [completed.get((r, g), -1) for r, g in zip(ordered["rank"], ordered["group"])],
        index=ordered.index,
        dtype="int64",
    )
    finished = (ordered["state"] == "completed") | (ordered["seq"] <= last)
    if tracked:
        open_ = ordered[~finished.to_numpy()].groupby("rank").head(1)
        done_ = ordered[~ordered["rank"].isin(open_["rank"]).to_numpy()].groupby("rank").tail(1)
        where = pd.concat([open_, done_]).sort_values("created_ns", kind="stable")
    else:
        where = ordered.groupby("rank").tail(1)
    place = list(zip(calls["rank"], calls["group"], calls["seq"]))
    seen, keys = dict(zip(place, calls["call"])), dict(zip(place, calls["key"]))
    at = {int(r.rank): (r.group, r.seq) for r in where.itertuples()}
    ended = ordered[finished.to_numpy()]
    done = set(zip(ended["rank"], ended["group"], ended["seq"]))
    return Positions(seen, keys, where, at, tracked, done, newest, completed)


def without_dumps(records: pd.DataFrame, job: list[int]) -> tuple[list[int], list[int]]:
    """The ranks of ``job`` that left no dump, and those with no entry at all (an empty dump or
    none), from :func:`load_flight_records`' ``records.attrs["ranks"]``."""
    entries = set(records["rank"].unique().tolist())
    with_dump = set(records.attrs.get("ranks") or entries)
    return sorted(set(job) - with_dump), sorted(set(job) - entries)


def failed_inside(at: Positions, members: dict[str, list[int]]) -> dict[int, Any]:
    """``{rank: its entry}`` for each rank inside a failure: the collective where it is (its
    first that did not complete) is one that every other member of the group completed, as
    NCCL's dumps say. Its peers got through; its own work stopped there (a GPU error, a dead
    link, a process killed inside it). Empty for dumps that do not say what completed (gloo's)."""
    failed = {}
    for r in at.where.itertuples() if at.tracked else ():
        others = [m for m in members.get(r.group, []) if m != r.rank]
        if at.unfinished(r) and others and all(at.completed_by(m, r.group, r.seq) for m in others):
            failed[int(r.rank)] = r
    return failed


def place_name(group: str, seq: int, op: str, desc: dict[str, str]) -> str:
    """A collective as the verdicts name it: "group 5 (ep)'s all_to_all #2".

    Args:
        group: the process group's name.
        seq: the collective's sequence number in that group.
        op: its operation (``nccl:all_to_all``; the backend's prefix is left out).
        desc: ``{group: description}`` (:func:`.groups.group_descriptions`).
    """
    return f"group {group} ({desc.get(group) or 'no description'})'s {op.split(':')[-1]} #{seq}"


def stopped_first(ranks: list[int], at: Positions, desc: dict[str, str]) -> tuple[int, str]:
    """Of ``ranks`` whose waits form a cycle (each waits for another of them), the one that
    stopped first, and why it was chosen: the one whose collective where it is (its oldest that
    never completed, with NCCL's states; its last, with gloo's) was issued first. Every other
    rank of the cycle issued collectives after it stopped, so it was still going then. The
    times are the dumps' clocks (each rank's own: on several machines, as close as they are)."""
    rows = at.where[at.where["rank"].isin(ranks)].sort_values("created_ns", kind="stable")
    first, then = rows.iloc[0], rows.iloc[1] if len(rows) > 1 else None
    said = f"rank {first['rank']} stopped first, in {place_name(first['group'], first['seq'], first['op'], desc)}"  # fmt: skip
    if then is not None:
        ahead = (then["created_ns"] - first["created_ns"]) / 1e6
        said += f", issued {ahead:.1f} ms before rank {then['rank']} stopped"
    others = [int(r) for r in rows["rank"].iloc[1:]]
    verb = "waits" if len(others) == 1 else "wait"
    return int(first["rank"]), f"the waits form a cycle ({ranks_said(sorted(ranks))}): {said}; {ranks_said(others)} {verb} for it"  # fmt: skip


def ranks_said(ranks: list[int]) -> str:
    """``[0, 1, 5]`` as "ranks 0, 1 and 5"; ``[4]`` as "rank 4"."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {', '.join(map(str, ranks[:-1]))} and {ranks[-1]}"


def waited_for_gone(at: Positions, members: dict[str, list[int]], gone: set[int]) -> dict | None:
    """The earliest collective where a rank with a dump waits with a member in ``gone`` (ranks
    that left no dump), as ``group, seq, calls``: where the job lost them, as far as it shows."""
    for r in at.where.itertuples():
        in_group = members.get(r.group, [])
        if gone & set(in_group):
            return {"group": r.group, "seq": int(r.seq), "calls": {m: at.seen.get((m, r.group, r.seq)) for m in in_group}}  # fmt: skip
    return None


def never_completed(at: Positions, members: dict[str, list[int]]) -> dict | None:
    """The earliest collective where a rank is that every member of its group is in too, having
    called it alike, and that the dumps say never completed (a rank failed or hangs inside it),
    as ``group, seq, calls``."""
    for r in at.where.itertuples():
        place = (r.group, r.seq)
        called = {m: at.seen.get((m, *place)) for m in members.get(r.group, [])}
        inside = all(at.keys.get((m, *place)) == r.key and at.at.get(m) == place for m in called)
        if at.unfinished(r) and inside:
            return {"group": r.group, "seq": int(r.seq), "calls": called}
    return None


def never_started(at: Positions, group: str, seq: int) -> list[int]:
    """The ranks at collective ``seq`` of ``group`` (where they are) whose entry there never
    started, where another's did (NCCL records "started" when timing is on): the GPU of such a
    rank never got to the collective its peers' GPUs are in. Empty where all or none started."""
    here = at.where[(at.where["group"] == group) & (at.where["seq"] == seq)]
    started = here["state"].isin(["started", "completed"])
    return sorted(int(r) for r in here.loc[~started, "rank"]) if started.any() else []
