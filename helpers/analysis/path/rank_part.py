"""The critical path of a run too large to load whole, one rank at a time: each rank's part of it.

Between two moments where ranks meet (a collective, a send and its receive), a rank's part of
the path depends on that rank alone: it walks back through its own threads, on the rank's own
graph (:mod:`.graph`, the very builders of the whole run's), until it reaches one of them. So
each rank's file is read on its own (:func:`rank_part`): from every *port* of the rank (a step's
end; a collective's arrival; a point-to-point wait's start; a send's issue; a receive's
posting) the walk of :func:`helpers.critical_path` is made back to where it stops (a
collective, a send's or a receive's wait, or where an earlier walk of the rank went on the same
way), and only its sum per kind and op is kept, cut in *pieces* (where another walk joined it,
and at the moments it is asked to cut at). With them comes the table of the rank's ports (the
moments the graph across ranks joins). :mod:`.from_rank_parts` joins the ranks' ports with the whole
run's edges across ranks and strings the pieces into the path. No two ranks' events are held
at once.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ...traces.kinds import name_matches
from ..point_to_point import RECV_OP, SEND_OP, TRANSFER_RECORDS
from .dependencies import DEPENDENCIES, UNTRACED
from .lanes import Lanes, lane_intervals
from .walk import PathWalker, Stop, segment_names

__all__ = ["rank_part", "RankAsked", "CHAIN_COLUMNS", "PORT_COLUMNS"]

#: One row per piece and (kind, name) of work on it. A piece is a stretch of one walk
#: (``walk``, from its piece ``begin``); a walk starts at a port (``origin``: ``end`` of a
#: ``step``, ``arrival`` at the collective ``key``/``index``, ``wait``: the start of the wait of
#: the record ``label``, ``issue`` of the send ``label``, ``post`` of the receive ``label``;
#: unused fields -1 and ""). Then the moments the piece covers, ``(stop_us, start_us]``, and
#: what follows it: another piece (``to_walk``/``to_begin``), a collective
#: (``to_key``/``to_index``), the wait of a record (``to_label``), or nothing (-1 and ""). Its
#: latest segment's time (``first_us``) and earliest's (``last_us``), and whether this row's
#: (kind, name) is theirs (``first``, ``last``): a piece cut at a moment within either is cut
#: exactly.
CHAIN_COLUMNS = ["rank", "walk", "begin", "origin", "step", "key", "index", "label", "start_us", "stop_us", "to_walk", "to_begin", "to_key", "to_index", "to_label", "first_us", "last_us", "kind", "name", "us", "first", "last"]  # fmt: skip
_TEXT = ["origin", "key", "to_key", "kind", "name"]  # categorical
_INTS = ["rank", "walk", "begin", "step", "index", "to_walk", "to_begin", "to_index"]
RUN = -2  # the label of a segment that is a run of rows of own time (:meth:`_RankWalker.descend`)
#: The ports of a rank, one row each: ``rank, port`` (``collective``, ``wait``, ``send op``,
#: ``recv op``, ``record``), ``label`` (the event's label in the rank's events), ``key, index``
#: (a collective's), ``name, kind, lane, start_us, end_us`` (an interval's bounds: a
#: collective's from its arrival, a wait's cut to the wait), ``held_us`` (how long a
#: collective held the rank from its arrival), ``peer, tag, step`` (a send's or a receive's).
PORT_COLUMNS = ["rank", "port", "label", "key", "index", "name", "kind", "lane", "start_us", "end_us", "held_us", "peer", "tag", "step"]  # fmt: skip


@dataclass
class RankAsked:
    """What a rank's part is asked again with, once the whole run is known: the moments to cut
    its walks at (the steps' windows' bounds, the moments walks enter or leave them)."""

    cuts: np.ndarray = field(default_factory=lambda: np.zeros(0))


class _RankWalker(PathWalker):
    """The walk of :func:`helpers.critical_path` on one rank, stopping at its collectives, at
    its sends' and receives' waits (``stops``) and where an earlier walk of the rank went on the
    same way: per row, the walk that took it first (``by``, -1: none), the position of its
    segment in that walk (``at``) and the moment that walk entered it (``entered``)."""

    def __init__(self, lanes: Lanes, stops: np.ndarray):
        super().__init__(lanes, stops)
        self.stops = stops.tolist()
        n = len(self.starts)
        self.by = np.full(n, -1, dtype=np.int64)
        self.at = np.zeros(n, dtype=np.int64)
        self.entered = np.zeros(n)
        self.chain = -1

    def owner(self, row: int) -> tuple[int, int, float]:
        """The walk that took ``row`` first, its segment's position and the moment it entered."""
        return int(self.by[row]), int(self.at[row]), float(self.entered[row])

    def take(self, step, row, t, lo, rows, revisited):
        if self.stops[row]:  # a collective, a send's or a receive's wait: the run decides it
            return Stop(row, t, joined=False)
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
        if self.issued_inside:  # this walk takes its own time, from within (PathWalker.take)
            return False
        dependency = DEPENDENCIES[self.dependency[row]]
        if dependency.own_time or dependency.collective:
            return dependency.own_time
        source_time = self.source_time[row]
        return min(t, source_time) == min(entered, source_time)

    def collective(self, step: int, row: int, t: float, lo: float, rows: list):
        return Stop(row, t, joined=False)


def rank_part(events: pd.DataFrame, asked: RankAsked | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """One rank's part of the critical path, from its events alone: its pieces
    (:data:`CHAIN_COLUMNS`) and its ports (:data:`PORT_COLUMNS`); both empty without steps.

    Each interval of the rank is walked once: a walk that reaches one an earlier walk took, and
    would go on from it as that walk did, stops there, and the earlier walk is cut at that
    moment, so the pieces add up to what a walk from every port would see, in time linear in
    the rank's events. ``asked``: where to cut its walks (by default, nowhere)."""
    asked = RankAsked() if asked is None else asked
    if not (events["kind"] == "step").any():
        return pd.DataFrame(columns=CHAIN_COLUMNS), pd.DataFrame(columns=PORT_COLUMNS)
    lanes = lane_intervals(events, alone=True)
    iv = lanes.intervals
    stops = np.isin(iv["event"].to_numpy(), lanes.records) & (iv["event"].to_numpy() >= 0)
    stops[np.fromiter(lanes.keys, dtype=np.int64, count=len(lanes.keys))] = True  # collectives
    walker = _RankWalker(lanes, stops)
    rank = int(events["rank"].iloc[0])
    ports = _ports(rank, events, lanes, walker, stops)
    # down to the rank's first interval (the start of the earliest event still open at its
    # first step), not its first step's start: the run's first step begins with the rank that
    # began it first, and the whole run's walk goes on through what came before this rank's
    # step (lesson 15's sharded ranks began theirs 33 ms apart)
    lo = float(iv["start_us"].min()) - 1.0
    walks, cuts = [], {}
    for number, (origin, step, key, index, label, lane, t) in enumerate(_origins(walker, lanes, ports)):  # fmt: skip
        walker.chain = number
        segments: list[tuple] = []
        stopped = walker.walk(0, lane, t, lo, segments)
        walks.append(((origin, step, key, index, label, t), segments, stopped))
        if stopped is not None and stopped.joined:
            joined, at, _ = walker.owner(stopped.row)
            cuts.setdefault(joined, set()).add((at, stopped.moment))
    for number, (_, segments, _) in enumerate(walks):
        for cut in _cuts_within(segments, asked.cuts):
            cuts.setdefault(number, set()).add(cut)
    return _pieces(rank, walks, cuts, walker, lanes, events), ports


def _origins(walker: _RankWalker, lanes: Lanes, ports: pd.DataFrame) -> list[tuple]:
    """Where the rank's walks start: ``(origin, step, key, index, label, lane_id, moment)``."""
    rank = int(lanes.steps["rank"].iloc[0])
    main = walker.main[rank]
    lane_id = dict(zip(lanes.lanes["lane"].astype(str), lanes.lanes.index))
    found = [("end", int(s), "", -1, -1, main, float(e)) for s, e in zip(lanes.steps["step"], lanes.steps["end_us"])]  # fmt: skip
    found += [("arrival", -1, key, index, -1, int(walker.lane_of[row]), float(walker.starts[row]))
              for row, (key, index) in lanes.keys.items()]  # fmt: skip
    for port, origin, at in (("wait", "wait", "start_us"), ("send op", "issue", "end_us"), ("recv op", "post", "start_us")):  # fmt: skip
        mine = ports[ports["port"] == port]
        found += [(origin, -1, "", -1, int(label), lane_id[str(lane)], float(t))
                  for label, lane, t in zip(mine["label"], mine["lane"], mine[at]) if str(lane) in lane_id]  # fmt: skip
    return found


def _ports(rank: int, events: pd.DataFrame, lanes: Lanes, walker: _RankWalker, stops: np.ndarray) -> pd.DataFrame:  # fmt: skip
    """The rank's ports (:data:`PORT_COLUMNS`): its collectives (from their arrival to their
    interval's end), its sends' and receives' waits (as its intervals have them), ops and
    records, as the walks and the graph across ranks meet them."""
    iv = lanes.intervals
    label = iv["event"].to_numpy()
    rows = []
    for row, (key, index) in lanes.keys.items():
        rows.append((rank, "collective", int(label[row]), key, int(index), walker.starts[row], walker.ends[row], lanes.held_us[row]))  # fmt: skip
    for row in np.flatnonzero(stops & np.isin(label, lanes.records)):
        rows.append((rank, "wait", int(label[row]), "", -1, walker.starts[row], walker.ends[row], np.nan))  # fmt: skip
    table = pd.DataFrame(rows, columns=["rank", "port", "label", "key", "index", "start_us", "end_us", "held_us"])  # fmt: skip
    ops = events[events["name"].isin([SEND_OP, RECV_OP]).to_numpy() | name_matches(events, TRANSFER_RECORDS)]  # fmt: skip
    ops = pd.DataFrame({
        "rank": rank,
        "port": np.where(ops["name"] == SEND_OP, "send op", np.where(ops["name"] == RECV_OP, "recv op", "record")),  # fmt: skip
        "label": ops.index.to_numpy(), "key": "", "index": -1,
        "start_us": ops["start_us"].to_numpy(), "end_us": ops["end_us"].to_numpy(),
        "peer": ops["peer"].to_numpy(), "tag": ops["tag"].to_numpy(), "step": ops["step"].to_numpy(),
    })  # fmt: skip
    table = pd.concat([table, ops], ignore_index=True) if len(ops) else table
    of = events.reindex(table["label"].to_numpy())
    table["name"] = of["name"].astype(str).to_numpy()
    table["kind"] = of["kind"].astype(str).to_numpy()
    table["lane"] = of["lane"].astype(str).to_numpy()
    return table.reindex(columns=PORT_COLUMNS)


def _cuts_within(segments: list[tuple], moments: np.ndarray) -> list[tuple[int, float]]:
    """The cuts ``(position of a segment, moment)`` of a walk's ``segments`` (latest first,
    each ``(..., start, end, ...)``) at the ``moments`` strictly within its time: within a
    segment, or where one ends and the next (later) one begins."""
    if not segments or not len(moments):
        return []
    found = []
    top = segments[0][4]
    for position, segment in enumerate(segments):
        inside = moments[(moments > segment[3]) & (moments <= segment[4]) & (moments < top)]
        found += [(position, float(m)) for m in inside]
    return found


def _rows_of(segments: list[tuple], walker: _RankWalker) -> tuple[np.ndarray, ...]:
    """The segments row by row, each run of own time as its rows: for each, the segment it is
    part of, its label, its reason (a code into :data:`.dependencies.DEPENDENCIES`), its µs and
    when it begins."""
    _, _, labels, a, b, reasons, to = zip(*segments)  # columns
    run = np.array(labels) == RUN
    code = {d.name: i for i, d in enumerate(DEPENDENCIES)}
    reason = np.array([code[r] if r else -1 for r in reasons], np.int64)
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
    begins = np.maximum(start, a)
    return of[keep], label[keep], reason[keep], us[keep], begins[keep]


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
    for number, ((origin, step, key, index, label, t), segments, stopped) in enumerate(walks):
        end = stopped.moment if stopped is not None else segments[-1][3] if segments else t
        pieces = _split(segments, order.get(number, []), end)
        start_t = t
        for begin, (piece, stop) in enumerate(pieces):
            then = (-1, -1, "", -1, -1)
            if begin + 1 < len(pieces):  # the next piece of this walk
                then = (number, begin + 1, "", -1, -1)
            elif stopped is not None and stopped.joined:
                joined, at, _ = walker.owner(stopped.row)
                then = (joined, piece_of[(joined, (at, stopped.moment))], "", -1, -1)
            elif stopped is not None and stopped.row in lanes.keys:
                then = (-1, -1, *lanes.keys[stopped.row], -1)
            elif stopped is not None:  # a send's or a receive's wait
                then = (-1, -1, "", -1, int(walker.label[stopped.row]))
            piece = piece or [(0, 0, -1, 0.0, 0.0, UNTRACED.name, None)]  # nothing: untraced, 0 µs
            segments_of_pieces += piece
            sizes.append(len(piece))
            heads.append(
                (rank, number, begin, origin, step, key, index, label, start_t, stop, *then)
            )
            start_t = stop
    of, labels, reasons, us, begins = _rows_of(segments_of_pieces, walker)
    kinds, names = segment_names(events, labels, reasons)
    piece = np.repeat(np.arange(len(sizes)), sizes)[of]
    kind, name = kinds.codes.astype(np.int64), names.codes.astype(np.int64)
    latest_first = np.lexsort((-begins, piece))  # a run's rows come earliest first
    timed = latest_first[us[latest_first] > 0]  # a segment of no time is no piece's end
    ends = _ends_of(piece[timed], kind[timed], name[timed], us[timed], len(sizes))
    # each (piece, kind, name) once, in the order met, with its µs
    combined = (piece * len(kinds.categories) + kind) * len(names.categories) + name
    group = pd.factorize(combined)[0]
    firsts = np.empty(group.max(initial=-1) + 1, dtype=np.int64)
    firsts[group[::-1]] = np.arange(len(group))[::-1]  # the first row of each: written last
    piece, kind, name = piece[firsts], kind[firsts], name[firsts]
    head = dict(zip(CHAIN_COLUMNS[:15], zip(*heads)))
    columns = {c: np.asarray(head[c], dtype=object if c in _TEXT else None)[piece] for c in CHAIN_COLUMNS[:15]}  # fmt: skip
    columns.update(
        first_us=ends["first_us"][piece], last_us=ends["last_us"][piece],
        kind=_used(kind, kinds.categories), name=_used(name, names.categories),
        us=np.bincount(group, weights=us),
        first=(kind == ends["first_kind"][piece]) & (name == ends["first_name"][piece]),
        last=(kind == ends["last_kind"][piece]) & (name == ends["last_name"][piece]),
    )  # fmt: skip
    for c in _TEXT[:3]:
        columns[c] = pd.Categorical(columns[c])
    for c, kind in {**dict.fromkeys(_INTS, np.int32), "label": np.int64, "to_label": np.int64}.items():  # fmt: skip
        columns[c] = columns[c].astype(kind)
    return pd.DataFrame({c: columns[c] for c in CHAIN_COLUMNS})


def _ends_of(piece: np.ndarray, kind: np.ndarray, name: np.ndarray, us: np.ndarray, pieces: int) -> dict[str, np.ndarray]:  # fmt: skip
    """Per piece (of ``pieces``), its latest segment and its earliest (each segment's piece,
    kind, name and µs given latest first), each as the (kind, name) of its run of segments of
    that kind and name and the µs of that run (a piece cut within it is cut exactly); a piece
    of no time: -1 and 0."""
    fresh = np.r_[True, (piece[1:] != piece[:-1]) | (kind[1:] != kind[:-1]) | (name[1:] != name[:-1])]  # fmt: skip
    run = np.cumsum(fresh) - 1
    run_us = np.bincount(run, weights=us)
    first = np.flatnonzero(np.r_[True, piece[1:] != piece[:-1]])[: len(piece)]  # each piece's first
    last = np.r_[first[1:], len(piece)] - 1
    ends = {c: np.full(pieces, -1, np.int64) for c in ("first_kind", "first_name", "last_kind", "last_name")}  # fmt: skip
    ends.update(first_us=np.zeros(pieces), last_us=np.zeros(pieces))
    for end, at in (("first", first), ("last", last)):
        ends[f"{end}_kind"][piece[at]] = kind[at]
        ends[f"{end}_name"][piece[at]] = name[at]
        ends[f"{end}_us"][piece[at]] = run_us[run[at]]
    return ends


def _used(codes: np.ndarray, categories: pd.Index) -> pd.Categorical:
    """A categorical of ``codes`` into ``categories``, with only those used, in sorted order."""
    used = pd.Categorical.from_codes(codes, categories).remove_unused_categories()
    return used.set_categories(sorted(used.categories))
