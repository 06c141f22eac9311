"""The critical path of a run too large to load whole, one rank at a time.

Between two collectives, a rank's part of the path depends on that rank alone: it walks back
through its own threads until it reaches a collective, where the rank that arrived last takes
over. So each rank's file is read on its own (:func:`rank_chains`): from every step end and every
collective arrival of the rank, the local walk of :func:`helpers.critical_path` is made back to
the collective that stops it, and only its sum per kind and op is kept, a *chain*. Then
:func:`path_summary_of_chains` strings the chains of all ranks together, step by step, through
each collective's last arrival (read from the collectives every rank keeps anyway), and gives the
table :func:`helpers.path_summary` gives for a run loaded whole. No two ranks' events are held
at once; a chain that starts before a step's window is counted in proportion to its part in it.
Sends and receives are not followed yet: a rank read alone has no peer, so a receive's wait
counts as its own rank's communication (the report says so of a run that sends and receives).
"""

from __future__ import annotations

import warnings
from bisect import bisect_right
from collections.abc import Collection, Sequence

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from ..collectives import matched_collectives, on_every_rank
from .dependencies import COLLECTIVE_KIND, DEPENDENCIES, UNTRACED, UNTRACED_NAME, segment_kind
from .graph import latest
from .lanes import Lanes, lane_intervals
from .walk import PathWalker, Stop, step_windows

__all__ = ["rank_chains", "path_summary_of_chains", "concat_chains", "CHAIN_COLUMNS"]

#: One row per chain and (kind, name) of work on it. A chain is a piece of one walk (``walk``,
#: from its segment ``begin``); a walk starts at the end of a ``step`` or at the ``arrival`` at
#: the collective ``key``/``index`` (``origin``; unused fields -1 and ""). Then the moments the
#: chain covers, and what follows it: another chain (``to_walk``/``to_begin``), a collective
#: (``to_key``/``to_index``), or nothing (-1 and "").
CHAIN_COLUMNS = ["rank", "walk", "begin", "origin", "step", "key", "index", "start_us", "stop_us", "to_walk", "to_begin", "to_key", "to_index", "kind", "name", "us"]  # fmt: skip
_TEXT = ["origin", "key", "to_key", "kind", "name"]  # categorical
RUN = -2  # the label of a segment that is a run of rows of own time (:meth:`_RankWalker.descend`)


class _RankWalker(PathWalker):
    """The walk of :func:`helpers.critical_path` on one rank, stopping at its collectives and
    where an earlier walk of the rank went on the same way: per row, the walk that took it first
    (``by``, -1: none), the position of its segment in that walk (``at``) and the moment that walk
    entered it (``entered``)."""

    def __init__(self, lanes: Lanes):
        super().__init__(lanes)
        n = len(self.starts)
        self.by = np.full(n, -1, dtype=np.int64)
        self.at = np.zeros(n, dtype=np.int64)
        self.entered = np.zeros(n)
        self.chain = -1

    def owner(self, row: int) -> tuple[int, int, float]:
        """The walk that took ``row`` first, its segment's position and the moment it entered."""
        return int(self.by[row]), int(self.at[row]), float(self.entered[row])

    def take(self, step, row, t, lo, rows, revisited):
        by = self.by[row]
        if by < 0:
            self.by[row], self.at[row], self.entered[row] = self.chain, len(rows), t
        elif by != self.chain and not revisited and self._same_way(row, t, self.entered[row]):
            entered = float(self.entered[row])
            mine: list[tuple] = []  # what this walk sees of the row above the earlier one
            super().take(step, row, t, lo, mine, revisited)
            rows += [(*s[:3], max(s[3], entered), *s[4:]) for s in mine if s[4] > entered]
            return Stop(row, min(t, entered), joined=True)
        return super().take(step, row, t, lo, rows, revisited)

    def descend(self, step, row, t, lo, rows):
        """The base walk's run of own time, each row owned by this walk unless an earlier walk
        owns it: there this one joins it (own time goes on the same way from any moment). The
        rows it takes are one segment, ``(step, lane, RUN, start, end, None, (low, high))``:
        rows ``low`` to ``high``, each from its start to the next one's (a rank's walks take
        hundreds of thousands of rows: :func:`_pieces` reads them as arrays)."""
        lane, starts = self.lane_of[row], self.starts
        last = max(self.run_first[row], bisect_right(starts, lo, self.first[lane], row + 1) - 1)
        by = self.by[last : row + 1]
        theirs = np.flatnonzero((by >= 0) & (by != self.chain))
        stop = last + int(theirs[-1]) if len(theirs) else -1  # the latest row an earlier walk took
        low = stop + 1 if stop >= 0 else last  # rows low..row are this walk's, whole
        if low <= row:
            # row r is entered at row r + 1's start, the last at t
            entered = np.append(self.arrays["start"][low + 1 : row + 1], t)
            taken = np.arange(low, row + 1)
            free = by[low - last :] < 0
            self.by[taken[free]] = self.chain
            self.at[taken[free]] = len(rows)  # all in one segment
            self.entered[taken[free]] = entered[free]
            start = starts[low]
            rows.append((step, lane, RUN, start if start > lo else lo, t, None, (low, row)))
            t = start
        if stop < 0:
            return lane, t
        start, entered_stop = starts[stop], float(self.entered[stop])
        if t > entered_stop:  # what this walk sees of the row above the earlier one
            rows.append((step, lane, self.label[stop], max(start if start > lo else lo, entered_stop), t, self.own_name[stop], None))  # fmt: skip
        return Stop(stop, min(t, entered_stop), joined=True)

    def _same_way(self, row: int, t: float, entered: float) -> bool:
        """Whether a walk entering ``row`` at ``t`` goes on as one that entered at ``entered``:
        always through its own time, never through a collective (another rank goes on), through
        a wait when both leave it for the same moment of what it waited for."""
        dependency = DEPENDENCIES[self.dependency[row]]
        if dependency.own_time or dependency.collective:
            return dependency.own_time
        source_time = self.source_time[row]
        return min(t, source_time) == min(entered, source_time)

    def collective(self, step: int, row: int, t: float, lo: float, rows: list):
        return Stop(row, t, joined=False)


def rank_chains(events: pd.DataFrame) -> pd.DataFrame:
    """One rank's chains (:data:`CHAIN_COLUMNS`), from its events alone; empty without steps.

    Each interval of the rank is walked once: a walk that reaches one an earlier walk took, and
    would go on from it as that walk did, stops there, and the earlier walk is cut at that
    moment, so the chains add up to what a walk from every start would see, in time linear in
    the rank's events."""
    if not (events["kind"] == "step").any():
        return pd.DataFrame(columns=CHAIN_COLUMNS)
    lanes = lane_intervals(events, alone=True)
    walker = _RankWalker(lanes)
    rank = int(events["rank"].iloc[0])
    lo = float(lanes.steps["start_us"].min()) - 1.0
    main = walker.main[rank]
    starts = [("end", int(s), "", -1, main, float(e)) for s, e in zip(lanes.steps["step"], lanes.steps["end_us"])]  # fmt: skip
    starts += [("arrival", -1, key, index, int(walker.lane_of[row]), float(walker.starts[row]))
               for row, (key, index) in lanes.keys.items()]  # fmt: skip
    walks, cuts = [], {}
    for number, (origin, step, key, index, lane, t) in enumerate(starts):
        walker.chain = number
        segments: list[tuple] = []
        stopped = walker.walk(0, lane, t, lo, segments)
        walks.append(((origin, step, key, index, t), segments, stopped))
        if stopped is not None and stopped.joined:
            joined, at, _ = walker.owner(stopped.row)
            cuts.setdefault(joined, set()).add((at, stopped.moment))
    return _pieces(rank, walks, cuts, walker, lanes, events)


def _named(events: pd.DataFrame, labels: np.ndarray, reasons: np.ndarray, reason_names: list[str]) -> tuple[pd.Categorical, pd.Categorical]:  # fmt: skip
    """Each segment's ``(kind, name)``, by its event's label and its reason (a code into
    ``reason_names``), as :func:`helpers.critical_path` names them: two categoricals (a rank has
    hundreds of thousands of segments, of a few hundred names)."""
    pos = events.index.get_indexer(labels)
    known = pos >= 0
    at = np.maximum(pos, 0)
    name = events["name"].astype("category")
    kind = events["kind"].astype("category")
    # kinds: the events' kinds, then the dependencies' own kinds for their segments
    given = [segment_kind(r) for r in reason_names]
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


def _rows_of(segments: list[tuple], walker: _RankWalker) -> tuple[np.ndarray, ...]:
    """The segments row by row, each run of own time as its rows: for each, the segment it is
    part of, its label, its reason (a code into the list returned last) and its µs."""
    _, _, labels, a, b, reasons, to = zip(*segments)  # columns
    run = np.array(labels) == RUN
    code = {d.name: i for i, d in enumerate(DEPENDENCIES)}
    reason = np.array([code.setdefault(r, len(code)) if r else -1 for r in reasons], np.int64)
    bounds = np.zeros((len(segments), 2), np.int64)  # a run's first and last row; else 0, 0
    bounds[run] = np.array([to[i] for i in np.flatnonzero(run)], np.int64).reshape(-1, 2)
    low, high = bounds.T
    counts = high - low + 1
    of = np.repeat(np.arange(len(segments)), counts)
    row = np.repeat(low - (np.cumsum(counts) - counts), counts) + np.arange(len(of))
    in_run, a, b = run[of], np.array(a, float)[of], np.array(b, float)[of]
    starts = walker.arrays["start"]
    start = np.where(in_run, starts[row], a)
    end = np.where(in_run & (row < high[of]), starts[np.minimum(row + 1, len(starts) - 1)], b)
    us = np.minimum(end, b) - np.maximum(start, a)
    label = np.where(in_run, walker.arrays["label"][row], np.array(labels)[of])
    reason = np.where(in_run, walker.arrays["dependency"][row], reason[of])
    keep = ~in_run | (us > 0)  # a run cut in pieces: each row in the pieces it overlaps
    return of[keep], label[keep], reason[keep], us[keep], list(code)  # codes in order


def _split(segments: list[tuple], cuts: list[tuple[int, float]], end: float) -> list[tuple]:
    """A walk's segments (latest first) cut at ``cuts`` (position of a segment, moment within
    it; latest first): one ``(segments, stop)`` per piece, ``end`` the walk's last moment."""
    pieces, piece, at = [], [], 0
    for position, moment in cuts:
        while at < len(segments) and (at < position or segments[at][3] >= moment):
            piece.append(segments[at])  # above the cut
            at += 1
        if at < len(segments) and segments[at][3] < moment < segments[at][4]:
            head = segments[at]
            piece.append((*head[:3], moment, *head[4:]))
            segments = segments[:at] + [(*head[:4], moment, *head[5:])] + segments[at + 1 :]
        stop = min(moment, segments[at][4]) if at < len(segments) else end
        pieces.append((piece, stop))
        piece = []
    pieces.append((piece + segments[at:], end))
    return pieces


def _pieces(rank, walks, cuts, walker, lanes, events) -> pd.DataFrame:
    """The walks cut where later walks joined them, each piece summed per (kind, name), with
    what follows it (:data:`CHAIN_COLUMNS`)."""
    order = {n: sorted(c, key=lambda c: (c[0], -c[1])) for n, c in cuts.items()}
    piece_of = {(n, c): i + 1 for n, cs in order.items() for i, c in enumerate(cs)}
    heads, sizes, segments_of_pieces = [], [], []
    for number, ((origin, step, key, index, t), segments, stopped) in enumerate(walks):
        end = stopped.moment if stopped is not None else segments[-1][3] if segments else t
        pieces = _split(segments, order.get(number, []), end)
        start_t = t
        for begin, (piece, stop) in enumerate(pieces):
            then = (-1, -1, "", -1)
            if begin + 1 < len(pieces):  # the next piece of this walk
                then = (number, begin + 1, "", -1)
            elif stopped is not None and stopped.joined:
                joined, at, _ = walker.owner(stopped.row)
                then = (joined, piece_of[(joined, (at, stopped.moment))], "", -1)
            elif stopped is not None:
                then = (-1, -1, *lanes.keys[stopped.row])
            piece = piece or [(0, 0, -1, 0.0, 0.0, UNTRACED.name, None)]  # nothing: untraced, 0 µs
            segments_of_pieces += piece
            sizes.append(len(piece))
            heads.append((rank, number, begin, origin, step, key, index, start_t, stop, *then))
            start_t = stop
    of, labels, reasons, us, reason_names = _rows_of(segments_of_pieces, walker)
    kinds, names = _named(events, labels, reasons, reason_names)
    of_piece = np.repeat(np.arange(len(sizes)), sizes)[of]
    keys = pd.DataFrame({"piece": of_piece, "kind": kinds.codes, "name": names.codes, "us": us})
    sums = keys.groupby(["piece", "kind", "name"], sort=False)["us"].sum().reset_index()
    head = pd.DataFrame(heads, columns=CHAIN_COLUMNS[:13]).iloc[sums["piece"].to_numpy()]
    rows = head.reset_index(drop=True).assign(
        kind=_used(sums["kind"], kinds.categories),
        name=_used(sums["name"], names.categories),
        us=sums["us"],  # fmt: skip
    )
    numbers = dict.fromkeys(["rank", "walk", "begin", "step", "index", "to_walk", "to_begin", "to_index"], "int32")  # fmt: skip
    return rows[CHAIN_COLUMNS].astype({**dict.fromkeys(_TEXT, "category"), **numbers})


def _used(codes: pd.Series, categories: pd.Index) -> pd.Categorical:
    """A categorical of ``codes`` into ``categories``, with only those used, in sorted order."""
    used = pd.Categorical.from_codes(codes, categories).remove_unused_categories()
    return used.set_categories(sorted(used.categories))


def concat_chains(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Several ranks' chains in one frame, their text columns categorical over all of them (a
    run of hundreds of ranks has millions of rows of a few hundred names)."""
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame(columns=CHAIN_COLUMNS)
    kinds = {c: pd.CategoricalDtype(union_categoricals([f[c].astype("category") for f in frames]).categories) for c in _TEXT}  # fmt: skip
    return pd.concat([f.astype(kinds) for f in frames], ignore_index=True)


def path_summary_of_chains(
    chains: pd.DataFrame,
    steps: pd.DataFrame,
    collectives: pd.DataFrame,
    leave_out: Collection[int] = (),
) -> pd.DataFrame:
    """:func:`helpers.path_summary` by kind and name, from what a rank-by-rank read keeps.

    Args:
        chains: every rank's chains (:func:`rank_chains`).
        steps: every rank's steps, as :func:`helpers.summarise_run` keeps them.
        collectives: every rank's collectives, numbered as each rank's own
            :func:`helpers.matched_collectives` numbers them.
        leave_out: steps to leave out (a stall or a hang).

    Returns:
        ``rank, kind, name, ms, ms_per_step, share``, heaviest first.
    """
    totals: dict[tuple, dict[int, float]] = {}
    if chains.empty:  # a pass that kept no path (``critical=False``)
        return _table(totals)
    links = _Links(chains, collectives)
    ends = steps.groupby(["step", "rank"])["end_us"].max()
    for step, lo, hi in step_windows(steps):
        if step not in leave_out:
            links.string(totals, step, int(ends.loc[step].idxmax()), lo, hi)
    return _table(totals)


class _Links:
    """The chains of every rank, and the collectives' arrivals that string them together."""

    def __init__(self, chains: pd.DataFrame, collectives: pd.DataFrame):
        with warnings.catch_warnings():  # said once by the run's own collective_waits
            warnings.simplefilter("ignore", UserWarning)
            every = matched_collectives(collectives, None)
        matched = on_every_rank(every)
        self.arrive = {(k, i, r): s for k, i, r, s in zip(*_lists(matched, "key", "index", "rank", "start_us"))}  # fmt: skip
        self.ranks_of = matched.groupby(["key", "index"])["rank"].agg(list).to_dict()
        self.names_of = dict(zip(zip(*_lists(every, "key", "index")), map(str, every["name"].tolist())))  # fmt: skip
        # the chains' rows in (rank, walk, begin) order, each chain a slice of them: no frame per
        # chain (a run of hundreds of ranks has hundreds of thousands of chains)
        ids = [chains[c].to_numpy(np.int64) for c in ("rank", "walk", "begin")]
        order = np.lexsort(ids[::-1])
        ids = [i[order] for i in ids]
        first = np.flatnonzero(np.r_[True, (np.diff(np.stack(ids), axis=1) != 0).any(axis=0)])
        self.bounds = np.r_[first, len(order)]
        self.chain_of = {c: g for g, c in enumerate(zip(*(i[first].tolist() for i in ids)))}
        heads = chains.iloc[order[first]]
        self.head = {c: heads[c].to_numpy() for c in ("start_us", "stop_us", "to_walk", "to_begin", "to_key", "to_index")}  # fmt: skip
        text = {c: chains[c].astype("category") for c in ("kind", "name")}
        self.kind, self.name = (text[c].cat.codes.to_numpy()[order] for c in ("kind", "name"))
        self.kinds, self.names = (text[c].cat.categories.to_numpy() for c in ("kind", "name"))
        self.us = chains["us"].to_numpy(float)[order]
        starts = heads[heads["begin"].to_numpy() == 0]
        self.at_end = {(r, s): w for r, s, w, o in zip(*_lists(starts, "rank", "step", "walk", "origin")) if o == "end"}  # fmt: skip
        self.at_arrival = {(r, k, i): w for r, k, i, w, o in zip(*_lists(starts, "rank", "key", "index", "walk", "origin")) if o == "arrival"}  # fmt: skip

    def string(self, totals: dict, step: int, rank: int, lo: float, hi: float) -> None:
        """Add ``step``'s path, from its end ``hi`` on ``rank`` back to ``lo``, to ``totals``:
        each chain's work in proportion to its part of ``(lo, t]``; what no chain covers (a
        rank's trace begins, a chain missing) is that rank's untraced time, never lost."""
        chain, t, seen = (rank, self.at_end.get((rank, step), -1), 0), hi, set()
        while t > lo and chain in self.chain_of and chain not in seen:
            seen.add(chain)
            g = self.chain_of[chain]
            start, stop = float(self.head["start_us"][g]), float(self.head["stop_us"][g])
            share = 1.0 if start <= stop else max(min(t, start) - max(stop, lo), 0.0) / (start - stop)  # fmt: skip
            for at in range(self.bounds[g], self.bounds[g + 1]):
                where = (rank, self.kinds[self.kind[at]], self.names[self.name[at]])
                _add(totals, where, step, self.us[at] * share)
            t = max(min(t, stop), lo)
            key, index = self.head["to_key"][g], int(self.head["to_index"][g])
            if self.head["to_walk"][g] >= 0:  # the rest of an earlier walk of the same rank
                chain = (rank, int(self.head["to_walk"][g]), int(self.head["to_begin"][g]))
            elif key != "":
                rank, t = self._across(totals, step, rank, key, index, t, lo)
                chain = (rank, self.at_arrival.get((rank, key, index), -1), 0)
            else:
                break  # the rank's trace begins
        if t > lo:
            _add(totals, (rank, UNTRACED.segment_kind, UNTRACED_NAME), step, t - lo)

    def _across(self, totals: dict, step: int, rank: int, key: str, index: int, t: float, lo: float) -> tuple[int, float]:  # fmt: skip
        """The collective ``key``/``index`` that ``rank``'s walk reached at ``t``: its transfer
        from the last arrival on (never after ``t``) added; the rank and moment the path goes on
        from."""
        walk = self.at_arrival.get((rank, key, index), -1)
        # a collective not matched on every rank holds this rank alone, from its arrival on
        alone = float(self.head["start_us"][self.chain_of[(rank, walk, 0)]]) if walk >= 0 else t
        mine = min(self.arrive.get((key, index, rank), alone), t)
        walked = [int(r) for r in self.ranks_of.get((key, index), []) if (int(r), key, index) in self.at_arrival]  # fmt: skip
        last = rank
        if walked:  # the last arrival decides, as in the graph (ties: this rank)
            times = np.array([self.arrive[(key, index, r)] for r in walked])
            others = np.array([r != rank for r in walked], dtype=np.int64)
            last = walked[int(latest(times, np.zeros(len(walked), np.int64), others)[0])]
        begin = min(self.arrive.get((key, index, last), mine), t)
        if last == rank or begin <= mine:
            last, begin = rank, mine
        _add(totals, (last, COLLECTIVE_KIND, self.names_of.get((key, index), key)), step, t - max(begin, lo))  # fmt: skip
        return last, begin


def _lists(frame: pd.DataFrame, *columns: str) -> list[list]:
    """``frame``'s ``columns`` as lists of Python values (many times faster to walk than a
    Series of text)."""
    return [frame[c].tolist() for c in columns]


def _add(totals: dict, where: tuple, step: int, us: float) -> None:
    per_step = totals.setdefault(where, {})
    per_step[step] = per_step.get(step, 0.0) + us


def _table(totals: dict) -> pd.DataFrame:
    if not totals:
        return pd.DataFrame(columns=["rank", "kind", "name", "ms", "ms_per_step", "share"])
    index = pd.MultiIndex.from_tuples(list(totals), names=["rank", "kind", "name"])
    per_step = pd.DataFrame(list(totals.values()), index=index).fillna(0.0) / 1e3
    ms = per_step.sum(axis=1)
    table = pd.DataFrame({"ms": ms, "ms_per_step": per_step.median(axis=1), "share": ms / ms.sum()})
    return table.sort_values("ms", ascending=False).reset_index()
