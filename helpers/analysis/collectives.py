"""The collectives of a run: which events hold them, the same collective matched on every
rank, and what that tells: waiting and transfer, the straggler, the collectives some rank never
joined (overlap with computation is in :mod:`.overlap`, bandwidth in :mod:`.bandwidth`, how far
the nodes' clocks disagree, read from the same matches, in :mod:`.clocks`).

All take the ``events`` DataFrame of ``load_run(...)``. The same questions get the same
answers on both backends: they read what the trace holds (NCCL's kernels on a GPU trace,
gloo's CPU spans on a CPU trace), and every GPU event belongs to the step whose CPU code
launched it.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
import pandas as pd

from ..traces.kinds import (
    GPU_CATEGORIES,
    GPU_COPY_CATEGORIES,
    GPU_WORK_KINDS,
    event_names,
    name_matches,
)
from .arrival import data_ready
from .intervals import busy_ms_per_group
from .kernel_ends import align_by_time
from .point_to_point import TRANSFER_RECORDS

__all__ = [
    "COLLECTIVE_NAMES",
    "NCCL_KERNELS",
    "collective_source",
    "matched_collectives",
    "collective_waits",
    "unmatched_collectives",
    "collectives_outside_windows",
    "waiting_per_step",
    "find_straggler",
    "straggler_of",
    "held_from_arrival",
    "transfer_of",
    "waiting_per_group",
]


#: Names of the collectives as the backends record them on the CPU (``gloo:all_reduce``,
#: ``nccl:all_reduce``). With gloo (and MPI) these spans are the collective itself; with
#: NCCL they only queue the work on the GPU, in a few µs.
COLLECTIVE_NAMES = r"^(?:gloo|nccl|mpi):"
#: Names of NCCL's GPU kernels, where an NCCL collective waits for its peers and moves data.
NCCL_KERNELS = r"^nccl(?:Dev)?Kernel"

_MATCHED_BY = {
    "seq": "sequence number",
    "identity": "collective, process group and message size, in order",
    "order": "name and order on each rank",
}


class CollectiveSource(NamedTuple):
    """Which events hold a run's collectives: a regular expression of their names, and those
    events in words."""

    pattern: str
    what: str


def collective_source(events: pd.DataFrame) -> CollectiveSource:
    """Which events hold a run's collectives, read from the trace itself (``.pattern``,
    ``.what``).

    NCCL kernels on the GPU when the trace has them (there an NCCL collective waits and
    moves data); otherwise the CPU spans ``gloo:*`` / ``nccl:*`` / ``mpi:*`` (gloo's are the
    collective itself). A trace with ``nccl:*`` spans but no NCCL kernels was profiled without
    CUDA activity, or NCCL launched none (a job of one rank): its spans measure only the
    queueing, and a warning says so."""
    if name_matches(events, NCCL_KERNELS).any():
        return CollectiveSource(NCCL_KERNELS, "NCCL kernels on the GPU")
    if name_matches(events, r"^nccl:").any():
        why = (
            "the trace has other GPU kernels but no NCCL kernel (NCCL launches none for a job of "
            "one rank)"
            if events["kind"].isin(GPU_WORK_KINDS).any()
            else "profile with ProfilerActivity.CUDA to record the kernels"
        )
        warnings.warn(
            "this trace has nccl:* spans but no NCCL kernels: the CPU spans only queue the "
            f"work, so waiting and transfer cannot be read from them. {why[0].upper()}{why[1:]}",
            stacklevel=3,
        )
    return CollectiveSource(COLLECTIVE_NAMES, "CPU spans (gloo:, nccl:, mpi:)")


def matched_collectives(events: pd.DataFrame, names: str | None) -> pd.DataFrame:
    """The collectives (``names``, or :func:`collective_source`'s choice), each with a ``key``
    and an ``index`` that are equal for the same collective on every rank, ``matched_by``, and
    ``position``: the how-manieth of its key on its rank (the index before NCCL kernels are
    lined up across ranks by their times, :mod:`.kernel_ends`).

    A collective is matched by what the trace records about it: its sequence number where
    present; else its collective name, process group and message size (the i-th such on
    each rank); else its event name (the i-th such on each rank). A warning says so where the
    ranks are each in several process groups and collectives do not say their group."""
    pattern = collective_source(events).pattern if names is None else names
    # Kineto's copies of CPU annotations on a GPU stream (gloo's spans of CUDA tensors) are no
    # collective of their own
    copies = events["cat"].isin(GPU_COPY_CATEGORIES).to_numpy()
    ev = events[name_matches(events, pattern) & ~copies].sort_values(["rank", "start_us"], kind="stable")  # fmt: skip
    ev = ev.assign(name=event_names(ev))
    label = ev["collective"].astype(str).where(ev["collective"].notna(), ev["name"])
    group = ev["process_group"].astype(str).where(ev["process_group"].notna(), "")
    by_seq = ev["seq"].notna().to_numpy()
    by_identity = ~by_seq & (ev["collective"].notna() & ev["msg_bytes"].notna()).to_numpy()
    rules = [by_seq, by_identity]
    how = np.select(rules, ["seq", "identity"], "order")
    key = np.select(
        rules,
        [
            "seq|" + label + "|" + group + "|" + ev["seq"].astype(str),
            "id|" + label + "|" + group + "|" + ev["msg_bytes"].astype(str),
        ],
        "order|" + ev["name"],
    )
    ev["key"] = key
    ev["matched_by"] = pd.Categorical([_MATCHED_BY[h] for h in how])
    ev["index"] = ev["position"] = ev.groupby(["rank", "key"]).cumcount()
    ev.attrs["world_size"] = events.attrs.get("world_size", np.inf)
    ev = align_by_time(
        ev, ev["cat"].isin(GPU_CATEGORIES).to_numpy(), name_matches(ev, POINT_TO_POINT)
    )
    ev["arrival_us"] = data_ready(events, ev)
    _warn_across_groups(events, ev)
    return ev


def _warn_across_groups(events: pd.DataFrame, matched: pd.DataFrame) -> None:
    """Warn where the ranks are in several process groups (their headers' ``pg_config``,
    :func:`helpers.load_run`) and collectives that do not say their group were matched by
    name or size and order: across the groups, one group's collective can be paired with
    another's."""
    groups = events.attrs.get("process_groups") or 1
    blind = matched["process_group"].isna().to_numpy() & (matched["matched_by"].astype(str) != _MATCHED_BY["seq"]).to_numpy()  # fmt: skip
    blind &= ~name_matches(matched, TRANSFER_RECORDS) & ~paired_by_guess(matched)  # no collective
    if groups > 1 and blind.any():
        warnings.warn(
            f"the ranks are in up to {groups} process groups each (their traces' pg_config), and "
            f"{int(blind.sum())} collectives do not say which: they were matched by name and "
            "order across the groups, which pairs one group's collective with another's. Give "
            "each its group from the Flight Recorder's dumps (with_groups_from_flight_records, "
            "lesson 13)",
            stacklevel=3,
        )


#: Point-to-point operations among the collectives' events: NCCL's send/receive kernels, the
#: backends' send and receive spans.
POINT_TO_POINT = r"(?i)SendRecv|^(?:gloo|nccl|mpi|c10d)[:_]+(?:send|recv)"


def paired_by_guess(matched: pd.DataFrame) -> np.ndarray:
    """Per row of :func:`matched_collectives`, whether it is a point-to-point operation matched
    only by its name and order: a send on one rank and a receive on another (two stages of a
    pipeline, or two ranks of a ring) cannot be paired by counting, so these are no collective
    instance that several ranks wait for."""
    if matched.empty:
        return np.zeros(0, dtype=bool)
    by_order = (matched["matched_by"].astype(str) == _MATCHED_BY["order"]).to_numpy()
    return by_order & name_matches(matched, POINT_TO_POINT)


def on_every_rank(ev: pd.DataFrame) -> pd.DataFrame:
    """The collectives seen on every rank they belong to: all loaded ranks, or, where the
    trace gives the group's size, that many ranks (a collective of a smaller group)."""
    ranks = ev["rank"].nunique()
    seen = ev.groupby(["key", "index"])["rank"].transform("nunique")
    expected = ev["group_size"].astype("Float64").clip(upper=ranks).fillna(ranks).to_numpy()
    return ev[seen.to_numpy() >= expected]


def unmatched_collectives(events: pd.DataFrame, names: str | None = None) -> pd.DataFrame:
    """The collectives that some rank they belong to never joined (by the rules of
    :func:`matched_collectives`): where the ranks called different collectives, or one rank
    called one more than the others, the mark of a job that hangs (lesson 8). One row per
    collective and rank that called it: ``name, index, rank, step, start_us, dur_us,
    missing`` (the ranks loaded that did not call it, their traces recording by then: one that
    ended early, a stalled rank's, looks the same); empty when every collective matches or only
    one rank is loaded. Sends and receives are no collective: they are left out
    (:func:`helpers.sends_and_receives` pairs them); so are the collectives missing only on
    ranks whose profiling had not begun yet (:func:`collectives_outside_windows`)."""
    lonely = _lonely(events, names)
    kept = lonely["missing"].map(len).to_numpy(dtype=int) > 0
    return lonely[kept].drop(columns="not_recording").reset_index(drop=True)


def collectives_outside_windows(events: pd.DataFrame, names: str | None = None) -> pd.DataFrame:
    """The collectives missing only on ranks whose traces were not recording yet (their profiling
    began after the collective had ended: TorchRec's ranks began a collective or two apart),
    which hold each rank that ran them for their own time: as :func:`unmatched_collectives`,
    with ``not_recording``, those ranks, in place of ``missing``."""
    lonely = _lonely(events, names)
    kept = lonely["missing"].map(len).to_numpy(dtype=int) == 0
    return lonely[kept].drop(columns="missing").reset_index(drop=True)


def _lonely(events: pd.DataFrame, names: str | None) -> pd.DataFrame:
    """The collectives not seen on every rank they belong to, with the ranks loaded that did not
    call them, split into ``missing`` (recording then) and ``not_recording``."""
    columns = ["name", "index", "rank", "step", "start_us", "dur_us", "missing", "not_recording"]  # fmt: skip
    ev = matched_collectives(events, names)
    ranks = sorted(int(r) for r in events["rank"].unique())
    if len(ranks) < 2 or ev.empty:
        return pd.DataFrame(columns=columns)
    kept = on_every_rank(ev).index
    lonely = ev[~ev.index.isin(kept) & ~paired_by_guess(ev)]  # a send has no partner by order
    seen = lonely.groupby(["key", "index"])["rank"].agg(lambda r: set(int(x) for x in r))
    first = events.groupby("rank")["start_us"].min()
    missing, away = [], []
    for key, i, end in zip(lonely["key"], lonely["index"], lonely["end_us"]):
        absent = sorted(set(ranks) - seen[(key, i)])
        recording = [r for r in absent if first[r] <= end]  # (a trace that ended early: a hang?)
        missing.append(recording)
        away.append([r for r in absent if r not in recording])
    out = lonely.assign(missing=missing, not_recording=away)
    return out[columns].sort_values(["start_us", "rank"]).reset_index(drop=True)


def collective_waits(events: pd.DataFrame, names: str | None = None) -> pd.DataFrame:
    """Split each collective into waiting and moving data, per rank.

    names: a regular expression on event names; by default what the trace holds (NCCL
    kernels on a GPU trace, gloo's CPU spans on a CPU trace: :func:`collective_source`).

    The same collective is found on every rank (by sequence number, or collective, process
    group and size, or name and order: column ``matched_by``). All ranks leave it at about
    the same moment, so the shortest duration among them approximates the transfer itself;
    the rest of each rank's duration is time spent waiting for the others. This needs no
    agreement between the ranks' clocks. With one rank loaded, the transfer is its duration.

    A rank that first waits inside the collective for its own GPU (gloo on CUDA tensors)
    arrives when that wait ends (``arrival_us``, :func:`data_ready`): waiting for its own GPU
    is not waiting for the others.

    Returns one row per collective and rank: ``name, index, rank, step, start_us, dur_us,
    arrival_us, transfer_us, wait_us, matched_by`` (and ``key``: what identifies the
    collective);
    collectives missing on some rank are left out, and so are gloo's records of sends and
    receives (:func:`helpers.sends_and_receives` pairs them). ``step`` is the step that
    launched a GPU kernel.
    """
    columns = ["name", "index", "rank", "step", "start_us", "dur_us", "arrival_us", "transfer_us", "wait_us"]  # fmt: skip
    return collectives_with_waits(events, names)[columns + ["matched_by", "key"]].reset_index(
        drop=True
    )


def collectives_with_waits(events: pd.DataFrame, names: str | None) -> pd.DataFrame:
    """The matched collectives with every column of ``events``, ``transfer_us`` and ``wait_us``
    (the backends' records of sends and receives left out: no collective)."""
    ev = matched_collectives(events, names)
    ev = on_every_rank(ev[~name_matches(ev, TRANSFER_RECORDS)])
    held = held_from_arrival(ev)
    ev = ev.assign(transfer_us=transfer_of(held, [ev["key"], ev["index"]]))
    ev["wait_us"] = held - ev["transfer_us"]
    return ev


def held_from_arrival(collectives: pd.DataFrame) -> pd.Series:
    """How long each collective held its rank from the rank's arrival (its data ready,
    ``arrival_us``) to its end, in µs."""
    return collectives["dur_us"] - (collectives["arrival_us"] - collectives["start_us"])


def transfer_of(held: pd.Series, instances) -> pd.Series:
    """Each collective's transfer, on ``held``'s index: the shortest time one instance (rows
    grouped by ``instances``, one per rank it ran on) held any of its ranks from its arrival.
    The rank that held it least arrived last, so all of its time was the transfer; the others
    waited the rest."""
    return held.groupby(instances).transform("min")


def waiting_per_step(events: pd.DataFrame, names: str | None = None) -> pd.DataFrame:
    """Time each rank spent waiting in collectives, per step, in ms (rows: step, columns: rank).

    Waiting is the first ``wait_us`` of each collective from the rank's arrival (see
    :func:`collective_waits`).
    Collectives run on several threads (or streams) at once, so the waiting intervals of
    one rank and step are joined and counted once: wall time, not a sum of durations.
    """
    waits = collective_waits(events, names).dropna(subset=["step"])
    waits = waits.assign(start_us=waits["arrival_us"], wait_end_us=waits["arrival_us"] + waits["wait_us"])  # fmt: skip
    table = busy_ms_per_group(waits, ["step", "rank"], "wait_end_us").unstack(
        "rank", fill_value=0.0
    )
    return table.rename_axis(index="step", columns="rank")


def straggler_of(waiting: pd.Series) -> int:
    """The straggler, from each rank's waiting in collectives (``waiting``: ms per rank, a
    median over steps): the rank that waits least, the one the others wait for. Every answer
    of the series to "who is the straggler" comes from here (:func:`find_straggler`,
    :func:`waiting_per_group`, the report). It is a different question from the critical
    path's last arrival (lesson 11): that one is asked of each collective and step, this one
    of a rank over the steps."""
    return int(waiting.idxmin())


def find_straggler(events: pd.DataFrame, names: str | None = None) -> int:
    """The rank the others wait for: the one that waits least in collectives (median per step).

    It always names a rank, even in a run without a straggler (two ranks never wait exactly as
    long): compare the others' waiting with a normal run's before calling it a straggler.
    """
    waits = waiting_per_step(events, names)
    if waits.empty:
        raise ValueError(
            "no collectives inside profiler steps: a straggler can only be found in "
            "traces with ProfilerStep#N and collectives (gloo:/nccl: spans or NCCL kernels)"
        )
    return straggler_of(waits.median())


def waiting_per_group(events: pd.DataFrame, names: str | None = None) -> pd.DataFrame:
    """Per process group: the member the others wait for, and how long they wait.

    Needs traces that name each collective's group (``process_group``: NCCL's do; for gloo's,
    ``with_groups_from_flight_records`` takes it from the Flight Recorder), so that each is
    matched within its own group. A member's waiting in a group is its waiting in that group's
    collectives per step (ms, overlaps counted once, as in :func:`waiting_per_step`), median
    over the steps.

    Returns one row per group: ``process_group, ranks, straggler`` (the member that waits
    least), ``straggler_wait_ms`` and ``others_wait_ms`` (the longest waiting of the other
    members). A group whose ``others_wait_ms`` is near zero has no straggler: its least waiting
    member is only the first to arrive by a hair. A group with one member loaded (a trace of one
    rank) has no row: nobody loaded waited for it.
    """
    waits = collectives_with_waits(events, names).dropna(subset=["step"])
    waits = waits[waits["process_group"].notna()]
    if waits.empty:
        raise ValueError(
            "no collective in a profiler step names its process group: recent NCCL traces do "
            "(record_param_comms' Process Group Name), older ones do not; for gloo traces, take "
            "the groups from the Flight Recorder first (with_groups_from_flight_records)"
        )
    waits = waits.assign(
        process_group=waits["process_group"].astype(str),
        start_us=waits["arrival_us"],
        wait_end_us=waits["arrival_us"] + waits["wait_us"],
    )
    per_step = busy_ms_per_group(waits, ["process_group", "rank", "step"], "wait_end_us")
    per_member = per_step.groupby(level=["process_group", "rank"]).median()
    rows = []
    for group, members in per_member.groupby(level="process_group"):
        members = members.droplevel("process_group")
        if len(members) < 2:  # one member loaded: nobody to wait for it
            continue
        straggler = straggler_of(members)
        rows.append(
            {
                "process_group": group,
                "ranks": sorted(int(r) for r in members.index),
                "straggler": straggler,
                "straggler_wait_ms": float(members[straggler]),
                "others_wait_ms": float(members.drop(straggler).max()),
            }
        )
    columns = ["process_group", "ranks", "straggler", "straggler_wait_ms", "others_wait_ms"]
    return pd.DataFrame(rows, columns=columns)
