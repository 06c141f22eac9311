"""What held each step: the chain of work, across the ranks, that decided when each step ended.

:func:`critical_path` walks each step backwards in time, from the moment its last rank ended it
(the binding edge of the step's end, :mod:`.step_ends`) to the moment its first rank began it,
along the lanes of :func:`.lanes.lane_intervals`:

- on a thread doing work of its own (an op, a data loader's fetch, the optimizer, untraced
  time between events), that work held the thread: the path takes it and goes on before it;
- a thread that waited (a gap or a bare annotation that ended when something on another lane
  of its rank ended: gloo's thread finishing a collective, the autograd thread's last op, a GPU
  kernel for a CUDA synchronisation) was held by what it waited for: the path moves there
  (``wake-up``: the few µs between);
- a collective matched on every rank ends when the last rank has arrived, plus its transfer: the
  path takes the transfer and moves to the rank that arrived **last** (arrival, not duration:
  a collective makes every rank's end the same), at its arrival; a receive likewise ends when
  the later of its send (on another rank) and its own posting happened, plus the transfer;
- on a worker lane (a GPU stream, gloo's collective thread), the gap before an event leads to
  what issued it (``launch``: the kernel's launch call, found by its correlation, or gloo's
  ``c10d::`` call), unless the lane was still busy with its previous event (``queue``);
- GPU work issued by the CPU and CUDA synchronisation are read the same way: a kernel's start
  leads to its launch, a synchronisation's end to the kernel that ended it, an NCCL kernel's end
  to the rank whose kernel started last.

The segments of one step tile its wall time without gaps or overlaps: from the moment the last
rank ended the step before (for the first step, the moment the first rank began it) to the
moment the last rank ended this one (:func:`step_windows`: the windows of successive steps
follow each other, so no moment is counted twice). Where the path reaches a rank's step start
before the window's, it goes on into that rank's previous step: what made it start late. Ranks are compared
on one time axis: ranks of one machine share a clock; across machines, correct the offsets first
(:func:`helpers.clock_offsets`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import NamedTuple

import numpy as np
import pandas as pd

from ...traces.kinds import GPU_WORK_KINDS, event_names
from .dependencies import (
    DEPENDENCIES,
    UNTRACED,
    UNTRACED_NAME,
    WORK,
    dependency_names,
    own_reason,
    segment_kind,
)
from .gpu_work import launching_ops
from .graph import INFERRED_SAYS
from .lanes import Lanes, lanes_of
from .step_ends import last_to_end

__all__ = [
    "critical_path",
    "path_summary",
    "named_for_fixing",
    "kind_said",
    "path_of",
    "step_windows",
    "summary_table",
]

_COLUMNS = ["step", "rank", "lane", "name", "kind", "start_us", "end_us", "dur_us", "reason", "to_rank", "waited_for", "launched_by", "launched_within"]  # fmt: skip
#: The waits that another lane of the rank ended (the path's evidence names what ended them).
_WOKEN = dependency_names(lambda d: not (d.own_time or d.collective) and d.segment_kind is not None)  # fmt: skip


def critical_path(
    events: pd.DataFrame, window: str | None = None, lanes: Lanes | None = None
) -> pd.DataFrame:
    """For every step of ``events`` (``load_run(...).events``), the chain of work that decided
    when the step ended, one row per segment, in time order (``window``: other windows than
    the profiler's steps, :func:`..windows.window_steps`: ``"trace"`` for the whole trace, or the
    name of an annotation that marks each iteration, its instances numbered from 0 in
    ``step``):

    ``step, rank, lane, name, kind, start_us, end_us, dur_us``: where the path was and what it
    was doing; ``reason``: ``work`` (an event's own time), ``untraced`` (time on a thread with
    no event: Python between ops, a sleep, an input pipeline), ``transfer`` (a collective after
    its last rank arrived; ``rank`` is that last rank), ``receive`` (a receive's wait after its
    send was issued, ``rank`` the sender's, or after it was posted), ``launch`` (an issued GPU
    kernel or gloo collective not started yet), ``queue`` (a worker lane busy with earlier
    work), ``wake-up`` (a thread resuming after what it waited for on another thread), ``sync``
    (a thread in a CUDA call that waited for the GPU), ``stream wait`` (a GPU stream held
    until another stream's work ended); ``to_rank``: where the path goes on after a transfer
    when that is another rank (else ``<NA>``); ``waited_for``: for a wake-up, a sync, a launch
    or a stream wait, what ended the wait, as ``name · rank · lane`` (the segment lasts from
    that end to the wait's: the closer, the surer the rule), followed by ``(inferred)`` where
    the trace does not say what the wait was for and it was matched from the CUDA calls around
    it, ``(inferred from timing)`` where from what ended just before it, else ``""``;
    ``launched_by``: for GPU work,
    the op that launched it (the innermost op around its launch call, ``aten::mm``), else
    ``""``; ``launched_within``: for GPU work, the innermost ``record_function`` annotation
    around its launch (what you wrote: ``slow_op``), else ``""``
    (:func:`named_for_fixing` names GPU work after it).

    ``lanes``: the lanes of ``events`` when already cut (:func:`.lanes.lane_intervals`), to
    share with :func:`helpers.what_if`. The rules are in the module's docstring. Raises
    ValueError without the windows asked for, or with ``lanes`` of other events."""
    return path_of(lanes_of(events, lanes, window), events)


class Stop(NamedTuple):
    """Where a walk stopped before its window's start: the interval ``row``, the ``moment``, and
    ``joined``: True where an earlier walk went on from there, False where the run decides
    (a collective, a send's or a receive's wait)."""

    row: int
    moment: float
    joined: bool


#: A segment of the path, as the walk makes them (plain tuples: hundreds of thousands a rank):
#: ``(step, lane_id, label, start, end, reason, to_rank)``.
SEGMENT = ("step", "lane_id", "label", "start", "end", "reason", "to_rank")


def path_of(lanes: Lanes, events: pd.DataFrame) -> pd.DataFrame:
    """:func:`critical_path` from lanes already cut (:func:`.lanes.lane_intervals`)."""
    walker = PathWalker(lanes)
    windows = step_windows(lanes.steps)
    last = last_to_end(lanes.graph, lanes.step_ends, [step for step, _, _ in windows])
    rows = [row for step, lo, hi in windows for row in walker.step(step, last[step], lo, hi)]
    raw = pd.DataFrame(rows, columns=list(SEGMENT))
    table = lanes.lanes
    lane_id = raw["lane_id"].to_numpy(dtype=np.int64)
    reason = raw["reason"].to_numpy()
    code = {d.name: i for i, d in enumerate(DEPENDENCIES)}
    codes = np.array([code[r] for r in reason], dtype=np.int64)
    kinds, names = segment_names(events, raw["label"].to_numpy(), codes)
    launched = launching_ops(events).reindex(raw["label"]).fillna("")
    path = pd.DataFrame(
        {
            "step": raw["step"].astype(int),
            "rank": table["rank"].to_numpy()[lane_id].astype(int) if len(raw) else [],
            "lane": table["lane"].to_numpy()[lane_id].astype(str) if len(raw) else [],
            "name": np.asarray(names, dtype=object),
            "kind": np.asarray(kinds, dtype=object),
            "start_us": raw["start"],
            "end_us": raw["end"],
            "dur_us": raw["end"] - raw["start"],
            "reason": reason,
            "to_rank": raw["to_rank"].astype("Int64"),
            "waited_for": _waited_for(walker, raw, event_names(events)),
            "launched_by": launched["launched_by"].to_numpy(),
            "launched_within": launched["launched_within"].to_numpy(),
        }
    )
    return path[_COLUMNS]


def segment_names(events: pd.DataFrame, labels: np.ndarray, reasons: np.ndarray) -> tuple[pd.Categorical, pd.Categorical]:  # fmt: skip
    """Each segment's ``(kind, name)``, by its event's label and its reason (a code into
    :data:`.dependencies.DEPENDENCIES`): the event's name and kind (untraced where there is no
    event), unless the reason gives the segment a kind of its own. Two categoricals (a rank has
    hundreds of thousands of segments, of a few hundred names)."""
    pos = events.index.get_indexer(labels)
    known = pos >= 0
    at = np.maximum(pos, 0)
    name = events["name"].astype("category")
    kind = events["kind"].astype("category")
    # kinds: the events' kinds, then the dependencies' own kinds for their segments
    given = [segment_kind(d.name) for d in DEPENDENCIES]
    kinds = list(dict.fromkeys([*map(str, kind.cat.categories), UNTRACED.segment_kind, *[g for g in given if g]]))  # fmt: skip
    code = {k: i for i, k in enumerate(kinds)}
    event_kind = np.array(
        [code[str(k)] for k in kind.cat.categories] + [code[UNTRACED.segment_kind]]
    )
    kind_codes = np.where(
        known, event_kind[kind.cat.codes.to_numpy()[at]], code[UNTRACED.segment_kind]
    )
    by_reason = np.array([code[g] if g else -1 for g in given], dtype=np.int64)[reasons]
    kind_codes = np.where(by_reason >= 0, by_reason, kind_codes)
    names = [*map(str, name.cat.categories), UNTRACED_NAME]
    name_codes = np.where(known, name.cat.codes.to_numpy()[at], len(names) - 1)
    return pd.Categorical.from_codes(kind_codes, kinds), pd.Categorical.from_codes(name_codes, names)  # fmt: skip


def _waited_for(walker: PathWalker, raw: pd.DataFrame, names: pd.Series) -> list[str]:
    """Per segment of a wait that another lane ended (:data:`_WOKEN`: a wake-up, a sync, a
    launch, a stream wait), what ended it, as ``"gloo:all_reduce · rank 0 · thread 812
    (pt_gloo_runloop)"``: the evidence of the rule, whose segment lasts from that end to the
    wait's (the few µs between), followed by ``(inferred)`` or ``(inferred from timing)``
    where the trace does not say it (:data:`.graph.INFERRED_SAYS`, :mod:`.gpu_waits`); ``""``
    for the others."""
    table = walker.lanes.lanes
    out = [""] * len(raw)
    woken = np.flatnonzero(raw["reason"].isin(_WOKEN).to_numpy())
    for i, lane, end in zip(woken, raw["lane_id"].to_numpy()[woken], raw["end"].to_numpy()[woken]):
        row = walker.row_at(int(lane), float(end))
        source = walker.source[row] if row >= 0 else -1
        if source >= 0:
            label, at = walker.label[source], walker.lane_of[source]
            name = names.get(label, UNTRACED_NAME) if label >= 0 else UNTRACED_NAME
            out[i] = f"{name} · rank {table.at[at, 'rank']} · {table.at[at, 'lane']}"
            out[i] += INFERRED_SAYS[walker.inferred[row]]
    return out


class PathWalker:
    """Walks the lanes backwards along the graph's binding edges, one step at a time (see the
    module and :mod:`.graph`)."""

    def __init__(self, lanes: Lanes, stops: np.ndarray | None = None):
        """``stops``: per interval, whether a walk stops there (a subclass's stops, no own time
        to walk through)."""
        self.lanes, iv, graph = lanes, lanes.intervals, lanes.graph
        lane_ids = iv["lane_id"].to_numpy()
        # plain lists: the walk reads them one value at a time
        self.first = np.searchsorted(lane_ids, np.arange(len(lanes.lanes)), side="left").tolist()
        self.past = np.searchsorted(lane_ids, np.arange(len(lanes.lanes)), side="right").tolist()
        self.starts, self.ends = iv["start_us"].tolist(), iv["end_us"].tolist()
        self.label, self.rank = iv["event"].tolist(), iv["rank"].tolist()
        n = graph.intervals
        binding = graph.binding[1 : 2 * n : 2]  # each interval's end: the edge that decided it
        dependency = graph.dependency[binding]
        self.dependency = dependency.tolist()
        #: the same as arrays, for the walks that read many rows at once
        self.arrays = {"start": iv["start_us"].to_numpy(), "label": iv["event"].to_numpy()}
        self.arrays["dependency"] = dependency
        # the node it waited for (a last arrival) and when the walk goes on there: where it is
        # the start of a call still under way when the interval ended (an issue inside the
        # call, a copy that began before its call returned), in that call at the interval's end
        source, source_time = graph.came_from(binding)
        #: per interval, whether its end was issued by a call still under way: the walk then
        #: enters that call before its end (``issued_inside``: it just did)
        self.under_way, self.issued_inside = graph.during[binding].tolist(), False
        self.source_time = source_time.tolist()
        self.source = (source // 2).tolist()  # the interval of that node
        self.inferred = graph.inferred[binding].tolist()
        self.lane_of = lane_ids.tolist()
        #: per dependency code: its own time?, a collective?, named after the next event?, name
        self.rules = [(d.own_time, d.collective, d.names_next, d.name) for d in DEPENDENCIES]
        own = np.array([d.own_time for d in DEPENDENCIES], dtype=bool)[dependency]
        own &= True if stops is None else ~stops
        own_names = np.array([d.name if d.own_time else None for d in DEPENDENCIES], dtype=object)
        self.own_name = np.where(own, own_names[dependency], None).tolist()
        # the first row of each run of own time on a lane, that a walk takes in one go
        fresh = np.r_[True, (lane_ids[1:] != lane_ids[:-1]) | ~own[:-1]]
        self.run_first = np.maximum.accumulate(np.where(fresh, np.arange(len(own)), 0)).tolist()
        self.main = lanes.main_lanes()

    def row_at(self, lane: int, t: float) -> int:
        """The interval of ``lane`` that holds the moment just before ``t`` (-1: none)."""
        lo = self.first[lane]
        i = bisect_left(self.starts, t, lo, self.past[lane]) - 1
        return i if i >= lo else -1

    def step(self, step: int, rank: int, lo: float, hi: float) -> list[tuple]:
        """The path of one step over its window ``(lo, hi]``, from the end of ``rank``'s (the
        last to end it), in time order: ``(step, lane_id, label, start, end, reason, to_rank)``
        per segment."""
        rows: list[tuple] = []
        self.walk(step, self.main[rank], hi, lo, rows)
        return rows[::-1]

    def walk(self, step: int, lane: int, t: float, lo: float, rows: list) -> tuple | None:
        """Walk back from ``t`` on ``lane`` to ``lo``, adding segments to ``rows`` (latest
        first); None at ``lo`` or the lane's beginning, else the :class:`Stop` where a subclass
        stopped it (:class:`~helpers.analysis.path.rank_part._RankWalker`: where the run decides,
        or where an earlier walk went on)."""
        seen: set[tuple[int, float]] = set()
        row = -1
        while t > lo:
            before = row - 1  # most often the walk goes on with the lane's interval before
            if row > self.first[lane] and self.lane_of[row] == lane and self.starts[before] < t <= self.starts[row]:  # fmt: skip
                row = before
            else:
                row = self.row_at(lane, t)
            revisited = (lane, t) in seen
            seen.add((lane, t))
            if row < 0 or self.ends[row] < t:  # nothing recorded on this lane until t
                start = self.ends[row] if row >= 0 else lo
                rows.append((step, lane, -1, max(start, lo), t, UNTRACED.name, None))
                if row < 0:
                    return None
                t = start
                continue
            went = self.take(step, row, t, lo, rows, revisited)
            if went is None or isinstance(went, Stop):
                return went
            lane, t = went
        return None

    def take(self, step: int, row: int, t: float, lo: float, rows: list, revisited: bool):
        """Add what held ``row``'s lane until ``t`` (its binding edge: where ``t`` is its end);
        return where the walk goes on."""
        if self.own_name[row] is not None and not revisited:
            return self.descend(step, row, t, lo, rows)
        lane, start, label = self.lane_of[row], self.starts[row], self.label[row]
        own, collective, names_next, name = self.rules[self.dependency[row]]
        # its own time: a walk that came back to it (in a cycle), or that entered it before its
        # end from what it issued (a call under way), which its end's binding did not hold
        inside, self.issued_inside = self.issued_inside and t < self.ends[row], False
        if revisited or own or inside:
            reason = name if own else own_reason(DEPENDENCIES[self.dependency[row]], label)
            rows.append((step, lane, label, start if start > lo else lo, t, reason, None))
            return lane, start
        if collective:
            return self.collective(step, row, t, lo, rows)
        source_time = self.source_time[row]
        if source_time < t:
            if names_next and row + 1 < len(self.label):
                label = self.label[row + 1]  # the launch of what starts after the gap
            rows.append((step, lane, label, source_time if source_time > lo else lo, t, name, None))  # fmt: skip
        self.issued_inside = self.under_way[row]
        return self.lane_of[self.source[row]], min(source_time, t)

    def descend(self, step: int, row: int, t: float, lo: float, rows: list):
        """``row`` and the rows before it on its lane that are own time too, down to ``lo``:
        each its own time, the walk going on where the last began."""
        lane = self.lane_of[row]
        last = max(self.run_first[row], bisect_right(self.starts, lo, self.first[lane], row + 1) - 1)  # fmt: skip
        starts, label, own_name = self.starts, self.label, self.own_name
        for r in range(row, last - 1, -1):
            start = starts[r]
            rows.append((step, lane, label[r], start if start > lo else lo, t, own_name[r], None))
            t = start
        return lane, t

    def collective(self, step: int, row: int, t: float, lo: float, rows: list):
        """A collective: its transfer, from the last arrival on, then that rank's way to it."""
        label = self.label[row]
        last = self.source[row]  # the last arrival (its own, where it arrived last)
        begin = min(self.source_time[row], t)
        moved = self.rank[last] != self.rank[row]
        here, to_rank = (last, int(self.rank[row])) if moved else (row, None)
        reason = self.rules[self.dependency[row]][3]
        rows.append((step, self.lane_of[here], label, max(begin, lo), t, reason, to_rank))
        return self.lane_of[here], begin


def step_windows(steps: pd.DataFrame) -> list[tuple[int, float, float]]:
    """Each step's wall time ``(step, start_us, end_us)``: from the moment the last rank ended
    the step before (or, for the first step, the moment the first rank began it) to the moment
    the last rank ended this one. The windows follow each other without overlap, so that no
    moment is counted in two steps (ranks end a step at different moments)."""
    ends = steps.groupby("step")["end_us"].max().sort_index()
    starts = steps.groupby("step")["start_us"].min()
    windows, previous = [], None
    for step, hi in ends.items():
        lo = float(starts[step]) if previous is None else previous
        windows.append((int(step), lo, float(hi)))
        previous = float(hi)
    return windows


def named_for_fixing(path: pd.DataFrame) -> pd.DataFrame:
    """``path`` (:func:`critical_path`) with each segment of GPU work (a kernel's or a copy's own
    time) named after what launched it: the annotation around its launch (``launched_within``:
    ``slow_op``), else the op (``launched_by``: ``aten::mm``); its kind kept. What a fix names,
    and what :func:`helpers.what_if` removes by that name, the GPU work launched within it
    going with it."""
    gpu = path["kind"].isin(GPU_WORK_KINDS).to_numpy() & (path["reason"] == WORK.name).to_numpy()
    launcher = path["launched_within"].where(path["launched_within"] != "", path["launched_by"])
    named = gpu & (launcher != "").to_numpy()
    return path.assign(name=path["name"].where(~named, launcher))


def kind_said(kind: str) -> str:
    """How a row of the path's summary says its ``kind``: GPU work named after what launched it
    (:func:`named_for_fixing`) is that op's GPU work."""
    return {"gpu kernel": "its GPU kernels", "gpu memory": "its GPU copies"}.get(kind, kind)


def path_summary(path: pd.DataFrame, by: list[str] | str = "kind") -> pd.DataFrame:
    """Time on the critical path per ``rank`` and ``by`` (``"kind"``, ``"name"``, or a list of
    columns of the path), heaviest first: ``ms`` over all steps, ``ms_per_step`` (the median over
    steps, a step without it counting 0) and ``share`` of the path's time."""
    by = [by] if isinstance(by, str) else list(by)
    keys = ["rank", *[b for b in by if b != "rank"]]
    per_step = path.groupby([*keys, "step"], observed=True)["dur_us"].sum() / 1e3
    return summary_table(per_step.unstack("step", fill_value=0.0))


def summary_table(per_step: pd.DataFrame) -> pd.DataFrame:
    """:func:`path_summary`'s table of the path's time per step (``per_step``: ms; rows
    indexed by ``rank`` and what the path is summed by, columns: steps): ``ms``,
    ``ms_per_step`` and ``share``, heaviest first (times equal to the ns in the order of the
    index: sums of the same times in another order differ in their last bits)."""
    ms = per_step.sum(axis=1)
    table = pd.DataFrame({"ms": ms, "ms_per_step": per_step.median(axis=1), "share": ms / ms.sum()})
    table = table.sort_index()
    order = np.lexsort((np.arange(len(table)), -table["ms"].round(6).to_numpy()))
    return table.iloc[order].reset_index()
