"""Where each rank of a hung job is, from its Flight Recorder entries: the collective it is in,
what every rank called where, and which ranks left no dump or an empty one (read by
:mod:`.groups` and :mod:`.chains`)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

__all__ = ["Positions", "positions", "without_dumps"]


@dataclass
class Positions:
    """Where each rank's collectives are (rows of :func:`collective_calls`): ``seen``, what each
    rank called at each place, ``{(rank, group, seq): call}``; ``where``, each rank's row where
    it is (:func:`positions`); ``at``, ``{rank: (group, seq)}`` of it; ``tracked``, whether the
    dumps say when collectives completed (NCCL's do; gloo's stay "scheduled"); ``done``, the
    ``(rank, group, seq)`` they say completed."""

    seen: dict[tuple, str]
    where: pd.DataFrame
    at: dict[int, tuple]
    tracked: bool
    done: set[tuple]

    def unfinished(self, row) -> bool:
        """Whether the dumps say that ``row`` (an entry) had not completed."""
        return self.tracked and row.state != "completed"


def positions(calls: pd.DataFrame) -> Positions:
    """Where each rank is: with NCCL's states, its first collective that did not complete (its
    last when all did; one queued behind it is not where it waits); with gloo's, its last."""
    ordered = calls.sort_values("created_ns", kind="stable")
    tracked = bool(ordered["state"].isin(["started", "completed"]).any())
    if tracked:
        open_ = ordered[(ordered["state"] != "completed").to_numpy()].groupby("rank").head(1)
        done = ordered[~ordered["rank"].isin(open_["rank"]).to_numpy()].groupby("rank").tail(1)
        where = pd.concat([open_, done]).sort_values("created_ns", kind="stable")
    else:
        where = ordered.groupby("rank").tail(1)
    seen = dict(zip(zip(calls["rank"], calls["group"], calls["seq"]), calls["call"]))
    at = {int(r.rank): (r.group, r.seq) for r in where.itertuples()}
    completed = calls[(calls["state"] == "completed").to_numpy()]
    done = set(zip(completed["rank"], completed["group"], completed["seq"]))
    return Positions(seen, where, at, tracked, done)


def without_dumps(records: pd.DataFrame, job: list[int]) -> tuple[list[int], list[int]]:
    """The ranks of ``job`` that left no dump, and those with no entry at all (an empty dump or
    none), from :func:`load_flight_records`' ``records.attrs["ranks"]``."""
    entries = set(records["rank"].unique().tolist())
    with_dump = set(records.attrs.get("ranks") or entries)
    return sorted(set(job) - with_dump), sorted(set(job) - entries)
