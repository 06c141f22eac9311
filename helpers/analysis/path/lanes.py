"""Every lane of a run cut into intervals, and the dependency graph between them: the ground under
the critical path (:mod:`.walk`) and the what-if replay (:mod:`.replay`).

A lane (a CPU thread, a GPU stream) does one thing at a time. :func:`lane_intervals` cuts each
lane into consecutive intervals, each labelled with the innermost event that covers it (a
convolution inside ``aten::conv2d`` inside a module's annotation: the convolution), or with no
event: a gap. A collective matched on every rank (:func:`helpers.collective_waits`) is one
interval, whatever ran inside it (gloo's copies and additions). The backend's record of a send's
or a receive's transfer (``gloo:recv``) spans the time the transfer was under way, while the
thread did other work; it is cut to the wait at its end (:mod:`..point_to_point`). What each
interval waited for is the graph's (:mod:`.graph`; its builders, :mod:`.builders`, say what each
interval may have waited for).

Only what lies within each rank's recorded steps is kept, and a rank's step boundaries cut the
intervals of the lane of its steps (its *main* lane). The copies of CPU annotations that Kineto
draws on a GPU stream (``gpu_user_annotation``) are left out: they are ranges, not work, and
the stream's lane holds only what ran on it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ...traces.kinds import (
    COLLECTIVE_SPANS,
    GPU_CATEGORIES,
    GPU_COPY_CATEGORIES,
    NOT_WORK_KINDS,
    name_matches,
)
from ..collectives import (
    held_from_arrival,
    matched_collectives,
    on_every_rank,
    paired_by_guess,
    transfer_of,
)
from ..intervals import last_open, merge_intervals
from ..point_to_point import TRANSFER_RECORDS, sends_and_receives, waits_in_records
from ..windows import window_steps
from .builders import graph_of
from .findings import findings_said
from .graph import Graph
from .interval_arrays import event_rows
from .step_ends import step_end_rows

__all__ = ["Lanes", "lane_intervals", "lanes_of"]


@dataclass
class Lanes:
    """A run's lanes cut into intervals.

    ``intervals``: one row each, sorted by lane then time: ``lane_id, rank, start_us, end_us,
    event`` (the row label in ``events`` of the innermost event, -1 for a gap). ``graph``: what
    each interval's start and end waited for (:class:`.graph.Graph`). ``lanes``: one row per lane_id,
    ``rank, lane, worker, gpu, main``. ``keys``: interval row -> its collective's ``(key,
    index)`` as :func:`helpers.matched_collectives` numbers it (every collective is an interval
    of its own); ``held_us``: interval row -> how long its collective held it from its arrival;
    ``instance``: interval row -> the instance number of a collective matched on every rank;
    ``arrivals``: instance -> its interval rows, one per rank; ``transfer_us``: instance -> its
    shortest time held. ``steps``: each rank's steps (``rank, step, start_us, end_us``);
    ``step_ends``: step -> the interval of each rank's main lane that ended it
    (:func:`.step_ends.step_end_rows`). ``pairs``: the sends paired with their receives
    (:func:`..point_to_point.sends_and_receives`); ``records``: the labels of the records of
    sends and receives, whose waits are point to point (paired or not). ``events`` and
    ``window``: what they were cut from (:func:`lanes_of` holds a caller to them)."""

    intervals: pd.DataFrame
    lanes: pd.DataFrame
    steps: pd.DataFrame
    graph: Graph | None = None
    instance: dict[int, int] = field(default_factory=dict)
    arrivals: dict[int, list[int]] = field(default_factory=dict)
    transfer_us: dict[int, float] = field(default_factory=dict)
    keys: dict[int, tuple[str, int]] = field(default_factory=dict)
    held_us: dict[int, float] = field(default_factory=dict)
    step_ends: dict[int, list[int]] = field(default_factory=dict)
    pairs: pd.DataFrame | None = None
    records: np.ndarray | None = None
    events: pd.DataFrame | None = None
    window: str | None = None

    def main_lanes(self) -> dict[int, int]:
        """Each rank's main lane (the lane of its steps): rank -> lane_id."""
        main = self.lanes[self.lanes["main"]]
        return {int(r): int(i) for i, r in zip(main.index, main["rank"])}


def lane_intervals(
    events: pd.DataFrame,
    alone: bool = False,
    names: str | None = None,
    window: str | None = None,
) -> Lanes:
    """Every lane of ``events`` cut into intervals, and the graph of what each waited for (see
    the module).

    Args:
        events: a run's events (``load_run(...).events``).
        alone: ``events`` are one rank's, read on their own (a run read rank by rank): its
            collectives are intervals of their own as in the whole run, linked to no other
            rank's.
        names: the collectives' names (default: :func:`helpers.collective_source`'s choice).
        window: the windows that are the steps (:func:`..windows.window_steps`; default:
            ``ProfilerStep#N``).

    Raises:
        ValueError: there is no such window.
    """
    steps = window_steps(events, window)
    by_rank = steps.groupby("rank", observed=True)
    bounds = pd.DataFrame({"lo": by_rank["start_us"].min(), "hi": by_rank["end_us"].max()})
    copies = events["cat"].isin(GPU_COPY_CATEGORIES).to_numpy()
    ev = events[~events["kind"].isin(NOT_WORK_KINDS).to_numpy() & ~copies].join(
        bounds, on="rank", how="inner"
    )
    ev = ev[(ev["end_us"] > ev["lo"]).to_numpy() & (ev["start_us"] < ev["hi"]).to_numpy()]
    with warnings.catch_warnings():  # said by the report's own reading of the pairs
        warnings.simplefilter("ignore", UserWarning)
        pairs = sends_and_receives(ev)
    ev = waits_in_records(ev)
    lanes = _lane_table(ev, steps)
    with warnings.catch_warnings():  # said once by the run's own collective_waits
        warnings.simplefilter("ignore", UserWarning)
        spans = matched_collectives(events, names)
    spans = spans[spans.index.isin(ev.index) & ~name_matches(spans, TRANSFER_RECORDS)]
    # a send's or a receive's span paired by guess is no interval of its own (its record is cut
    # to its wait); a kernel is one, whether or not the ranks' kernels are one collective
    spans = spans[~paired_by_guess(spans) | spans["cat"].isin(GPU_CATEGORIES).to_numpy()]
    ev, spans = _from_data_ready(ev, spans)
    result = Lanes(
        _intervals(ev, lanes, spans, steps, bounds),
        lanes,
        steps[["rank", "step", "start_us", "end_us"]],
        pairs=pairs,
        records=ev.index[name_matches(ev, TRANSFER_RECORDS)].to_numpy(),
        events=events,
        window=window,
    )
    several = not alone and events["rank"].nunique() > 1
    linked = on_every_rank(spans[~paired_by_guess(spans)]) if several else spans.iloc[:0]
    _link_collectives(result, spans, linked)
    result.step_ends = step_end_rows(result.intervals, result.steps, result.main_lanes())
    result.graph = graph_of(result, ev, events[(events["cat"] == "cuda_sync").to_numpy()])
    cycles = findings_said(result, ev, "cycle")
    if cycles:
        warnings.warn(cycles, stacklevel=2)
    return result


def lanes_of(events: pd.DataFrame, lanes: Lanes | None = None, window: str | None = None) -> Lanes:
    """The lanes of ``events`` cut with ``window`` (:func:`lane_intervals`): ``lanes`` where
    given, checked to be cut from these events with this ``window``, else cut now.

    Raises:
        ValueError: ``lanes`` were cut from other events, or with another window.
    """
    if lanes is None:
        return lane_intervals(events, window=window)
    if lanes.events is not None and not _same_events(lanes.events, events):
        raise ValueError(
            f"lanes= were cut from other events ({len(lanes.events)} events) than the ones "
            f"given ({len(events)}): pass the events they were cut from, or leave lanes= out "
            "to have them cut from these"
        )
    if lanes.window != window:
        raise ValueError(
            f"lanes= were cut with window={lanes.window!r}, not {window!r}: pass the same "
            "window, or leave lanes= out"
        )
    return lanes


def _same_events(cut: pd.DataFrame, given: pd.DataFrame) -> bool:
    """Whether ``given`` is ``cut`` or a copy of it: the same rows, ranks, lanes, names, times."""
    columns = ["rank", "lane", "name", "start_us", "end_us"]
    if cut is given or len(cut) != len(given):
        return cut is given
    hashed = [pd.util.hash_pandas_object(f[columns], index=True).to_numpy() for f in (cut, given)]  # fmt: skip
    return bool(np.array_equal(*hashed))


def _from_data_ready(ev: pd.DataFrame, matched: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """``ev`` and ``matched`` with each collective that opens with its rank waiting for its own
    GPU (gloo on CUDA tensors, :func:`..arrival.data_ready`) cut to the collective itself:
    from where its data was ready to the first event its thread ran after that within it (the
    copy of the result back to the GPU, its CUDA calls), which are intervals of their own."""
    if matched.empty:
        return ev, matched
    later = matched[(matched["arrival_us"] > matched["start_us"]).to_numpy()]
    if later.empty:
        return ev, matched
    starts, ends = ev["start_us"].copy(), ev["end_us"].copy()
    done = later["end_us"].to_numpy(dtype=float).copy()
    for (rank, lane), rows in later.groupby(["rank", "lane"], observed=True).indices.items():
        on = ev[(ev["rank"] == rank).to_numpy() & (ev["lane"] == lane).to_numpy()]
        on = np.sort(on["start_us"].to_numpy())
        ready = later["arrival_us"].to_numpy()[rows]
        after = on[np.minimum(np.searchsorted(on, ready, side="right"), len(on) - 1)]
        inside = (after > ready) & (after < done[rows])
        done[rows[inside]] = after[inside]
    starts.loc[later.index] = later["arrival_us"].to_numpy()
    ends.loc[later.index] = done
    matched = matched.copy()
    matched.loc[later.index, "end_us"] = done
    matched.loc[later.index, "dur_us"] = done - later["start_us"].to_numpy()
    return ev.assign(start_us=starts, end_us=ends, dur_us=ends - starts), matched


def _intervals(ev, lanes, matched, steps, window) -> pd.DataFrame:
    """Every lane of ``lanes`` (:func:`_lane_table`) cut into intervals (:func:`_flatten`) over
    its rank's ``window``, a main lane's at its steps' bounds too, lane after lane."""
    cuts = {r: np.unique(g[["start_us", "end_us"]].to_numpy()) for r, g in steps.groupby("rank")}
    parts = []
    times = ev[["rank", "lane", "start_us", "end_us"]]  # all _flatten reads: no copy of the rest
    by_lane = dict(list(times.groupby(["rank", "lane"], observed=True, sort=False)))
    for lane_id, (rank, lane, main) in enumerate(zip(lanes["rank"], lanes["lane"], lanes["main"])):
        mine = by_lane.get((rank, lane), times.iloc[:0])
        spans = matched[(matched["rank"] == rank).to_numpy() & (matched["lane"] == lane).to_numpy()]
        part = _flatten(mine, spans.index, window.at[rank, "lo"], window.at[rank, "hi"])
        if main:
            part = _cut(part, cuts[rank])
        parts.append((part, lane_id, rank))
    # each lane's intervals follow each other in time: the lanes one after the other are sorted
    frames, lane_ids, ranks = zip(*parts)
    sizes = [len(f) for f in frames]
    columns = ("start_us", "end_us", "event")
    intervals = pd.DataFrame(
        {c: np.concatenate([f[c].to_numpy() for f in frames]) for c in columns}
    )
    intervals["lane_id"] = np.repeat(lane_ids, sizes)
    intervals["rank"] = np.repeat(ranks, sizes)
    return intervals


def _lane_table(ev: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, lane): a worker lane (only GPU events, or only gloo's collectives and
    what runs inside them), a GPU lane, the lane of the rank's steps (which may hold no other
    event)."""
    main = steps.groupby("rank", observed=True)["lane"].first()
    collective = name_matches(ev, COLLECTIVE_SPANS)
    on_gpu = ev["cat"].isin(GPU_CATEGORIES).to_numpy()
    starts, ends = ev["start_us"].to_numpy(), ev["end_us"].to_numpy()
    rows = []
    for (rank, lane), at in ev.groupby(["rank", "lane"], observed=True, sort=True).indices.items():  # fmt: skip
        gpu = bool(on_gpu[at].all())
        inside = _inside(starts[at], ends[at], collective[at])
        rows.append((rank, str(lane), gpu or inside, gpu))
    for rank, lane in main.items():
        if (rank, str(lane)) not in {(r, lane_) for r, lane_, _, _ in rows}:
            rows.append((rank, str(lane), False, False))
    table = pd.DataFrame(rows, columns=["rank", "lane", "worker", "gpu"])
    table = table.sort_values(["rank", "lane"], ignore_index=True)
    table["main"] = [str(main.get(r)) == lane for r, lane in zip(table["rank"], table["lane"])]
    return table


def _inside(starts: np.ndarray, ends: np.ndarray, spans: np.ndarray) -> bool:
    """Whether some of the events (their ``starts`` and ``ends``) are ``spans`` and every event
    lies within one of those."""
    if not spans.any():
        return False
    span_starts, span_ends = merge_intervals(starts[spans], ends[spans])
    at = np.searchsorted(span_starts, starts, side="right") - 1
    return bool((at >= 0).all() and (ends <= span_ends[np.maximum(at, 0)]).all())


def _flatten(ev: pd.DataFrame, whole: pd.Index, begin: float, finish: float) -> pd.DataFrame:
    """One lane's time, from its rank's first step's start (``begin``) or its first event,
    whichever is earlier, to its rank's last step's end (``finish``) or its last event's end,
    whichever is later, cut into intervals labelled by the innermost event covering each (-1:
    a gap). The events in ``whole`` (collectives) stay one interval each: nothing
    inside them is looked at."""
    if len(whole):  # leave out what lies within one of them: some began no later and ends no sooner
        spans = ev.loc[whole].sort_values("start_us")
        latest_end = np.maximum.accumulate(spans["end_us"].to_numpy())
        at = np.searchsorted(spans["start_us"].to_numpy(), ev["start_us"].to_numpy(), "right") - 1
        inside = (at >= 0) & (ev["end_us"].to_numpy() <= latest_end[np.maximum(at, 0)])
        ev = ev[~inside | ev.index.isin(whole)]
    if ev.empty:  # a lane with nothing but its steps
        return pd.DataFrame({"start_us": [begin], "end_us": [finish], "event": [-1]})
    order = np.lexsort((-ev["end_us"].to_numpy(), ev["start_us"].to_numpy()))
    starts, ends = ev["start_us"].to_numpy()[order], ev["end_us"].to_numpy()[order]
    labels = ev.index.to_numpy()[order]
    first, last = min(starts[0], begin), max(ends.max(), finish)
    # sorted by a merge of runs (the starts are, the ends nearly): many times np.unique's sort
    bounds = np.sort(np.concatenate([starts, ends, [first, last]]), kind="stable")
    bounds = bounds[np.r_[True, bounds[1:] != bounds[:-1]]]
    parent = last_open(np.arange(len(starts)) - 1, ends, starts)  # open when each began
    at = last_open(np.searchsorted(starts, bounds[:-1], side="right") - 1, ends, bounds[:-1], parent)  # fmt: skip
    label = np.where(at >= 0, labels[np.maximum(at, 0)], -1)
    new = np.r_[True, label[1:] != label[:-1]] if len(label) else np.zeros(0, dtype=bool)
    begins = bounds[:-1][new]
    return pd.DataFrame({"start_us": begins, "end_us": np.r_[begins[1:], last][: len(begins)], "event": label[new]})  # fmt: skip


def _cut(frame: pd.DataFrame, cuts: np.ndarray) -> pd.DataFrame:
    """``frame``'s intervals, each split at the ``cuts`` that fall strictly inside it."""
    starts, ends = frame["start_us"].to_numpy(), frame["end_us"].to_numpy()
    first = np.searchsorted(cuts, starts, side="right")
    last = np.searchsorted(cuts, ends, side="left")
    if (last <= first).all():
        return frame
    pieces = np.maximum(last - first, 0) + 1
    of = np.repeat(np.arange(len(frame)), pieces)
    k = np.arange(len(of)) - np.repeat(
        np.cumsum(pieces) - pieces, pieces
    )  # piece k of its interval
    cut = np.repeat(first, pieces) + k  # the cut that ends piece k (if it is not the last)
    top = len(cuts) - 1
    return pd.DataFrame(
        {
            "start_us": np.where(k == 0, starts[of], cuts[np.clip(cut - 1, 0, top)]),
            "end_us": np.where(k == pieces[of] - 1, ends[of], cuts[np.clip(cut, 0, top)]),
            "event": frame["event"].to_numpy()[of],
        }
    )


def _link_collectives(lanes: Lanes, spans: pd.DataFrame, linked: pd.DataFrame) -> None:
    """Each collective's interval (``spans``, :func:`helpers.matched_collectives`' rows, each an
    interval of its own) with its ``(key, index)`` and how long it held its rank from its
    arrival; and the instances of those matched on every rank they belong to (``linked``, some
    of the spans): each one's interval on every rank, and its transfer (the shortest time it
    held a rank)."""
    if spans.empty:
        return
    labelled = event_rows(lanes.intervals, "first")
    at = pd.Index(labelled["event"].to_numpy()).get_indexer(spans.index)
    row = np.where(at >= 0, labelled.index.to_numpy()[np.maximum(at, 0)], -1)
    keys, indices = spans["key"].astype(str).to_numpy(), spans["index"].to_numpy()
    held = held_from_arrival(spans).to_numpy(float)
    found = row >= 0
    lanes.keys.update(zip(row[found].tolist(), zip(keys[found].tolist(), indices[found].tolist())))  # fmt: skip
    lanes.held_us.update(zip(row[found].tolist(), held[found].tolist()))
    kept = found & spans.index.isin(linked.index)
    link_instances(lanes, row[kept], keys[kept], indices[kept], held[kept])


def link_instances(lanes: Lanes, rows: np.ndarray, keys: np.ndarray, indices: np.ndarray, held: np.ndarray) -> None:  # fmt: skip
    """The instances of collectives, one per ``(key, index)`` numbered in the order met, put in
    ``lanes``: each one's rows (its arrivals, in the order given) and its transfer, the shortest
    time it held a rank from its arrival.

    Args:
        lanes: where the instances go (``instance``, ``arrivals``, ``transfer_us``).
        rows: the collectives' intervals, one per rank an instance is on.
        keys: each one's key (:func:`helpers.matched_collectives`).
        indices: each one's index among those of its key.
        held: how long each held its rank from its arrival (µs; NaN: not measured).
    """
    numbers, _ = pd.factorize(pd.MultiIndex.from_arrays([keys, indices]))
    transfer = transfer_of(pd.Series(held, dtype=float), numbers).to_numpy()
    order = np.argsort(numbers, kind="stable")
    rows, of = np.asarray(rows)[order].tolist(), numbers[order].tolist()
    lanes.instance.update(zip(rows, of))
    for number, row in zip(of, rows):
        lanes.arrivals.setdefault(number, []).append(row)
    lanes.transfer_us.update(zip(numbers.tolist(), transfer.astype(float).tolist()))
