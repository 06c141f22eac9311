"""The critical path of a run read rank by rank, strung from each rank's part (:mod:`.rank_part`).

The ranks meet at their ports: a collective's arrival and end, a send's issue, a receive's
posting, their waits. :func:`ports_graph` joins every rank's ports with the whole run's edges
across ranks, made by the very builders of the whole run's graph that join ranks
(:func:`.builders.edges_of`), each port's own edge as the whole run's
(:func:`.builders.own_dependencies`), and bound by :func:`.graph.binding_edges`, the one rule of
the last arrival; each rank's end of a step is a port too, so that the rank that ended it last is
the binding edge of the step's end (:mod:`.step_ends`), as in the whole run's graph.
:func:`path_summary_of_parts` then walks each step back from its last rank's end, as
:func:`helpers.critical_path` walks the whole run: through a rank's pieces to where they stop,
across the binding edge there to the rank and port it leads to, and on through that port's
pieces, adding each piece's time per kind and op. A piece the walk enters or leaves at a moment
within it is cut exactly where that moment falls in its first or last segment; elsewhere the rank
is asked for its part again, cut at those moments (:func:`path_summary_of_parts`'s ``again``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..collectives import collectives_with_waits, paired_by_guess
from ..point_to_point import sends_and_receives
from .builders import INTERVAL_KINDS, LanesAndEvents, edges_of, own_dependencies
from .dependencies import COLLECTIVE_KIND, DEPENDENCIES, UNTRACED, UNTRACED_NAME
from .graph import Graph
from .interval_arrays import IntervalArrays
from .lanes import Lanes, link_instances
from .rank_part import CHAIN_COLUMNS, RankAsked
from .step_ends import last_to_end
from .walk import step_windows, summary_table

__all__ = ["PortGraph", "ports_graph", "path_summary_of_parts"]

_NO_PIECES = pd.DataFrame({c: pd.Series(dtype="int64") for c in CHAIN_COLUMNS})


@dataclass
class PortGraph:
    """The ranks' ports and the graph across ranks: ``ports`` (the ports that are intervals of
    the graph: the collectives matched on every rank, the sends' and receives' waits that are
    paired, and their ops, each rank's step ends; one per row, in the graph's order), ``graph``
    (:class:`.graph.Graph`) and ``step_ends`` (step -> each rank's port that ended it, as
    :attr:`.lanes.Lanes.step_ends`)."""

    ports: pd.DataFrame
    graph: Graph
    step_ends: dict[int, list[int]]

    def row_of(self, rank: int, port: str, label: int) -> int:
        """The interval of the port of ``rank`` of kind ``port`` whose event is ``label``."""
        if rank not in self._rows:  # the ranks the walk reaches
            mine = self._of_rank.get(rank, np.zeros(0, dtype=np.int64))
            kinds, labels = (self.ports[c].to_numpy()[mine].tolist() for c in ("port", "label"))
            self._rows[rank] = dict(zip(zip(kinds, labels), mine.tolist()))
        return self._rows[rank].get((port, label), -1)

    def __post_init__(self) -> None:
        self._of_rank = self.ports.groupby("rank", sort=False).indices
        self._rows: dict[int, dict[tuple, int]] = {}


def ports_graph(ports: pd.DataFrame, collectives: pd.DataFrame, steps: pd.DataFrame) -> PortGraph:  # fmt: skip
    """The graph across ranks of every rank's ``ports`` (:data:`.rank_part.PORT_COLUMNS`), its
    collectives matched on every rank as :func:`helpers.collective_waits` matches the run's
    ``collectives`` (every rank's, as :func:`helpers.summarise_run` keeps them), its sends and
    receives paired as :func:`helpers.sends_and_receives` pairs them, and each rank's end of
    each of its ``steps`` (as :func:`helpers.summarise_run` keeps them) a port of no time."""
    with warnings.catch_warnings():  # said once by the run's own collective_waits
        warnings.simplefilter("ignore", UserWarning)
        several = collectives["rank"].nunique() > 1
        matched = collectives_with_waits(collectives, None) if several else collectives.iloc[:0]
        ops = ports[ports["port"].isin(["send op", "recv op", "record"])].reset_index(drop=True)
        pairs = sends_and_receives(ops.assign(rank=ops["rank"].astype(int)))
    coll = _as_the_run_numbers(ports[ports["port"] == "collective"], matched)
    linked = matched[~paired_by_guess(matched)]  # as the whole run links them (.lanes)
    coll = coll[_instances(coll).isin(_instances(linked))] if len(linked) else coll.iloc[:0]
    paired = np.concatenate([pairs["receive_record"].to_numpy(), pairs["send_record"].to_numpy()])
    records = ops.loc[ops.index.isin(paired)]
    waits = ports[ports["port"] == "wait"].merge(records[["rank", "label"]], on=["rank", "label"])
    ends = ops[ops["port"].isin(["send op", "recv op"])]
    by_rank = steps.groupby(["rank", "step"], observed=True)["end_us"].max().reset_index()
    stepped = by_rank.assign(
        port="end of step", label=-1, key="", index=-1, start_us=by_rank["end_us"]
    )
    table = pd.concat([coll, waits, ends, stepped], ignore_index=True)
    intervals = pd.DataFrame({
        "lane_id": np.arange(len(table)), "rank": table["rank"].to_numpy(dtype=np.int64),
        "start_us": table["start_us"].to_numpy(float), "end_us": table["end_us"].to_numpy(float),
        "event": _event_labels(table, ops),
    })  # fmt: skip
    lanes = Lanes(intervals, pd.DataFrame(), pd.DataFrame(), pairs=pairs)
    _link(lanes, table)
    rows = len(table) - len(stepped) + np.arange(len(stepped))  # rank after rank
    lanes.step_ends = {int(s): at.tolist() for s, at in pd.Series(rows).groupby(stepped["step"].to_numpy())}  # fmt: skip
    kind_of = np.array([INTERVAL_KINDS.index(_PORT_KINDS[p]) for p in table["port"]], dtype=np.int64)  # fmt: skip
    run = LanesAndEvents(lanes, ops, IntervalArrays.of(intervals), None, kind_of)
    parts = edges_of(run, across_ranks=True)  # the whole run's builders that join ranks
    graph = Graph.of(parts, intervals, own_dependencies(run, parts))
    return PortGraph(table.reset_index(drop=True), graph, lanes.step_ends)


#: What each kind of port is, to the builders (:data:`.builders.INTERVAL_KINDS`).
_PORT_KINDS = {"collective": "collective", "wait": "point to point", "send op": "work", "recv op": "work", "end of step": "work"}  # fmt: skip


def _as_the_run_numbers(coll: pd.DataFrame, matched: pd.DataFrame) -> pd.DataFrame:
    """The collective ports ``coll``, each rank's numbered as it alone saw them (the how-manieth
    of its key), with the ``index`` the whole run gives them (``matched``, where NCCL kernels are
    lined up across ranks by their times, :mod:`..kernel_ends`)."""
    if matched.empty:
        return coll
    run = pd.Series(
        matched["index"].to_numpy(np.int64),
        index=pd.MultiIndex.from_arrays(
            [
                matched["rank"].to_numpy(np.int64),
                matched["key"].astype(str).to_numpy(),
                matched["position"].to_numpy(np.int64),
            ]
        ),  # fmt: skip
    )
    numbers = run.reindex(_instances(coll)).to_numpy()
    return coll.assign(index=np.where(np.isnan(numbers), coll["index"], numbers).astype(np.int64))


def _instances(frame: pd.DataFrame) -> pd.MultiIndex:
    """Each collective's ``(rank, key, index)`` in ``frame``."""
    return pd.MultiIndex.from_arrays([frame["rank"].to_numpy(np.int64), frame["key"].astype(str).to_numpy(), frame["index"].to_numpy(np.int64)])  # fmt: skip


def _event_labels(table: pd.DataFrame, ops: pd.DataFrame) -> np.ndarray:
    """Each port interval's event, as the pairs name them (the rows of ``ops``: a wait is its
    record's, an op its own), a label of its own past them (a collective), or -1 (a rank's end
    of a step: no event, its own edge of no time ``untraced``)."""
    of = pd.MultiIndex.from_arrays([ops[c].to_numpy(np.int64) for c in ("rank", "label")])
    at = of.get_indexer(pd.MultiIndex.from_arrays([table[c].to_numpy(np.int64) for c in ("rank", "label")]))  # fmt: skip
    collective = table["port"].to_numpy() == "collective"
    at[collective] = len(ops) + np.arange(collective.sum())
    return at.astype(np.int64)


def _link(lanes: Lanes, table: pd.DataFrame) -> None:
    """The collectives' instances of the port ``table``: each one's intervals on every rank (in
    the order of the ranks) and its transfer (the shortest time it held a rank from its
    arrival), as :mod:`.lanes` links them for the whole run."""
    coll = table[table["port"] == "collective"].sort_values("rank", kind="stable")
    keys, indices = coll["key"].astype(str).to_numpy(), coll["index"].to_numpy(np.int64)
    link_instances(lanes, coll.index.to_numpy(), keys, indices, coll["held_us"].to_numpy(float))


def path_summary_of_parts(
    pieces: Mapping[int, pd.DataFrame],
    ports: pd.DataFrame,
    steps: pd.DataFrame,
    collectives: pd.DataFrame,
    leave_out: Collection[int] = (),
    again: Callable[[int, RankAsked], tuple[pd.DataFrame, pd.DataFrame]] | None = None,
    trail: list[tuple] | None = None,
) -> pd.DataFrame:
    """:func:`helpers.path_summary` by kind and name, from every rank's part of the path.

    Args:
        pieces: each rank's pieces (:func:`.rank_part.rank_part`), by rank.
        ports: every rank's ports (:func:`.rank_part.rank_part`).
        steps: every rank's steps, as :func:`helpers.summarise_run` keeps them.
        collectives: every rank's collectives, as :func:`helpers.summarise_run` keeps them.
        leave_out: steps to leave out (a stall or a hang).
        again: a rank's part made again as asked (its events read once more); None: a piece
            that cannot be cut exactly is cut in proportion to its time (the run's files gone).
        trail: a list to fill with the path's time in the order the walk adds it, each step
            from its end back: ``(step, rank, kind, name, us)``, one entry per kind and name of
            each piece it crosses (positive µs only, from the final pass over the steps).

    Returns:
        ``rank, kind, name, ms, ms_per_step, share``, heaviest first.
    """
    totals: dict[tuple, dict[int, float]] = {}
    if not pieces:  # a pass that kept no path (``critical=False``)
        return _table(totals)
    graph = ports_graph(ports, collectives, steps)
    windows = [w for w in step_windows(steps) if w[0] not in leave_out]
    last = last_to_end(graph.graph, graph.step_ends, [step for step, _, _ in windows])
    bounds = np.unique([b for _, lo, hi in windows for b in (lo, hi)])
    stringer = _Stringer(pieces, ports, graph)
    for asked_again in (False, True):  # as kept; then with the ranks cut inexactly made again
        totals, stringer.trail = {}, [] if trail is not None else None
        for step, lo, hi in windows:
            stringer.string(totals, step, last[step], lo, hi)
        if asked_again or not stringer.inexact or again is None:
            break
        for rank, moments in stringer.inexact.items():
            asked = RankAsked(np.unique(np.r_[bounds, sorted(moments)]))
            stringer.replace(rank, *again(rank, asked))
        stringer.inexact = {}
    if trail is not None:
        trail += stringer.trail
    return _table(totals)


class _RankPieces:
    """One rank's pieces and ports, as the walk looks them up."""

    def __init__(self, chains: pd.DataFrame, ports: pd.DataFrame):
        ids = [chains[c].to_numpy(np.int64) for c in ("walk", "begin")]
        order = np.lexsort(ids[::-1])
        ids = [i[order] for i in ids]
        first = np.flatnonzero(np.r_[True, (np.diff(np.stack(ids), axis=1) != 0).any(axis=0)])
        first = first[: len(order)]  # a rank of no pieces: none
        #: each piece's rows (``bounds[g]`` to ``bounds[g + 1]``) and its number by (walk, begin)
        self.bounds = np.r_[first, len(order)]
        self.piece_of = {c: g for g, c in enumerate(zip(*(i[first].tolist() for i in ids)))}
        heads = chains.iloc[order[first]]
        self.head = {c: heads[c].tolist() for c in ("start_us", "stop_us", "to_walk", "to_begin", "to_key", "to_index", "to_label", "first_us", "last_us")}  # fmt: skip
        self.kind, self.name = (chains[c].astype(str).to_numpy()[order] for c in ("kind", "name"))
        self.us = chains["us"].to_numpy(float)[order]
        self.first = chains["first"].to_numpy(bool)[order]
        self.last = chains["last"].to_numpy(bool)[order]
        #: the walk from each port: (``end``, step), (``arrival``, (key, index)), (origin, label)
        starts = heads[heads["begin"].to_numpy() == 0]
        self.walk_at = {}
        for w, o, st, k, i, lb in zip(*(starts[c].tolist() for c in ("walk", "origin", "step", "key", "index", "label"))):  # fmt: skip
            self.walk_at[(o, st if o == "end" else (k, i) if o == "arrival" else lb)] = w
        #: every port's interval (those not joined across ranks too): its start, kind and name
        self.port = {(p, lb): (s, k, n) for p, lb, s, k, n in zip(*(ports[c].tolist() for c in ("port", "label", "start_us", "kind", "name")))}  # fmt: skip
        self.label_of = {(k, i): lb for k, i, lb in zip(*(ports[c].tolist() for c in ("key", "index", "label"))) if k != ""}  # fmt: skip
        self.key_of = {lb: ki for ki, lb in self.label_of.items()}


class _Stringer:
    """The walk of the whole run's path over every rank's pieces and the graph across ranks;
    a rank's pieces are looked up only once the walk reaches the rank."""

    def __init__(self, pieces: Mapping[int, pd.DataFrame], ports: pd.DataFrame, graph: PortGraph):  # fmt: skip
        self.graph, self.given, self.ports = graph, pieces, ports
        self.port_rows = ports.groupby("rank", sort=False).indices
        self.pieces: dict[int, _RankPieces] = {}
        self.inexact: dict[int, set] = {}
        self.trail: list[tuple] | None = None

    def replace(self, rank: int, chains: pd.DataFrame, ports: pd.DataFrame) -> None:
        """Take ``rank``'s part as ``chains`` and ``ports`` from now on."""
        self.pieces[rank] = _RankPieces(chains, ports)

    def of(self, rank: int) -> _RankPieces:
        """``rank``'s pieces and ports."""
        if rank not in self.pieces:
            ports = self.ports.iloc[self.port_rows.get(rank, np.zeros(0, dtype=np.int64))]
            self.pieces[rank] = _RankPieces(self.given.get(rank, _NO_PIECES), ports)
        return self.pieces[rank]

    def string(self, totals: dict, step: int, rank: int, lo: float, hi: float) -> None:
        """Add ``step``'s path, from its end ``hi`` on ``rank`` back to ``lo``, to ``totals``."""
        at, t, seen = (rank, self.of(rank).walk_at.get(("end", step), -1), 0), hi, set()
        while t > lo and at not in seen:
            seen.add(at)
            rank = at[0]
            pieces = self.of(rank)
            if at[1:] not in pieces.piece_of:  # the rank's trace has nothing here: untraced time
                break
            g = pieces.piece_of[at[1:]]
            t = self._add(totals, step, rank, g, t, lo)
            if t <= lo:
                return
            head = {c: v[g] for c, v in pieces.head.items()}
            if head["to_walk"] >= 0:
                at = (rank, head["to_walk"], head["to_begin"])
            elif head["to_key"] != "":
                label = pieces.label_of.get((head["to_key"], head["to_index"]), -1)
                at, t = self._across(totals, step, rank, ("collective", label), t, lo)
            elif head["to_label"] >= 0:
                at, t = self._across(totals, step, rank, ("wait", head["to_label"]), t, lo)
            else:
                break  # the rank's trace begins
        if t > lo:
            self._put(totals, (rank, UNTRACED.segment_kind, UNTRACED_NAME), step, t - lo)

    def _add(self, totals: dict, step: int, rank: int, g: int, t: float, lo: float) -> float:
        """Add piece ``g`` of ``rank``'s time within ``(lo, t]``; return where it stops (or ``lo``)."""
        pieces = self.pieces[rank]
        start, stop = pieces.head["start_us"][g], pieces.head["stop_us"][g]
        if min(t, start) <= max(stop, lo):  # none of it within (lo, t]: the walk enters below
            return max(min(t, stop), lo)
        top, bottom = max(start - t, 0.0), max(lo - stop, 0.0)
        span = start - stop
        exact = (top == 0 or top <= pieces.head["first_us"][g]) and (bottom == 0 or bottom <= pieces.head["last_us"][g])  # fmt: skip
        if (top or bottom) and not exact:
            self.inexact.setdefault(rank, set()).update(m for m in (t, lo) if stop < m < start)
        for at in range(pieces.bounds[g], pieces.bounds[g + 1]):
            us = pieces.us[at]
            if exact:
                cut = (top if pieces.first[at] else 0.0) + (bottom if pieces.last[at] else 0.0)
                if cut and us - cut <= 1e-6:  # all outside (lo, t]: the walk never took it
                    continue
                us -= cut
            elif span > 0:
                us *= max(min(t, start) - max(stop, lo), 0.0) / span
            self._put(totals, (rank, pieces.kind[at], pieces.name[at]), step, us)
        return max(min(t, stop), lo)

    def _across(self, totals: dict, step: int, rank: int, port: tuple, t: float, lo: float) -> tuple[tuple, float]:  # fmt: skip
        """Where the path goes on from the port ``(kind, label)`` of ``rank`` that its walk
        reached at ``t``: the graph's binding edge there, as the whole run's walk takes it."""
        graph, pieces = self.graph, self.pieces[rank]
        row = graph.row_of(rank, *port)
        start, kind, name = pieces.port[port]
        edge = graph.graph.binding[2 * row + 1] if row >= 0 else -1
        if edge < 0 or DEPENDENCIES[graph.graph.dependency[edge]].own_time or self._in_itself(row, edge):  # fmt: skip
            # a collective not matched on every rank, a wait not paired or one that began once
            # its data was there: its own time, then on from its start
            self._put(totals, (rank, kind, name), step, t - max(start, lo))
            origin = "arrival" if port[0] == "collective" else "wait"
            what = pieces.key_of[port[1]] if port[0] == "collective" else port[1]
            walk = pieces.walk_at.get((origin, what), -1)
            return (rank, walk, self._begin_at(rank, walk, start)), start
        sources, times = graph.graph.came_from([edge])  # as the whole run's walk steps back
        begin = min(float(times[0]), t)
        j = int(sources[0]) // 2
        other = int(graph.ports["rank"].iat[j])
        self._put(totals, (other, COLLECTIVE_KIND, name), step, t - max(begin, lo))
        kind, label = graph.ports["port"].iat[j], int(graph.ports["label"].iat[j])
        origin = {"collective": "arrival", "send op": "issue", "recv op": "post"}[kind]
        # a collective's walk is known by its numbering on its rank alone (the graph's is the run's)
        what = self.of(other).key_of.get(label) if kind == "collective" else label
        walk = self.of(other).walk_at.get((origin, what), -1)
        return (other, walk, self._begin_at(other, walk, begin)), begin

    def _put(self, totals: dict, where: tuple, step: int, us: float) -> None:
        """Add ``us`` of ``where`` (rank, kind, name) to ``step``'s totals, and to the trail."""
        per_step = totals.setdefault(where, {})
        per_step[step] = per_step.get(step, 0.0) + us
        if self.trail is not None and us > 0:
            self.trail.append((step, *where, us))

    def _in_itself(self, row: int, edge: int) -> bool:
        """Whether the binding ``edge`` into port ``row`` is a call still under way on the port's
        own lane (a send's record waiting on the thread whose ``c10d::send`` issued it): the
        whole run's walk goes on in that call at the port's end, on that lane, which is the
        port itself, so it takes the port's own time."""
        graph = self.graph.graph
        if not graph.during[edge]:
            return False
        j = int(graph.came_from([edge])[0][0]) // 2
        ports = self.graph.ports
        return bool(ports["rank"].iat[j] == ports["rank"].iat[row] and ports["lane"].iat[j] == ports["lane"].iat[row])  # fmt: skip

    def _begin_at(self, rank: int, walk: int, t: float) -> int:
        """The piece of ``walk`` of ``rank`` that holds the moment just before ``t``."""
        pieces, begin = self.of(rank), 0
        while (walk, begin + 1) in pieces.piece_of and pieces.head["stop_us"][pieces.piece_of[(walk, begin)]] >= t:  # fmt: skip
            begin += 1
        return begin


def _table(totals: dict) -> pd.DataFrame:
    """:func:`helpers.path_summary`'s table of ``totals`` (µs per step, by rank, kind, name)."""
    if not totals:
        return pd.DataFrame(columns=["rank", "kind", "name", "ms", "ms_per_step", "share"])
    index = pd.MultiIndex.from_tuples(list(totals), names=["rank", "kind", "name"])
    per_step = pd.DataFrame(list(totals.values()), index=index).fillna(0.0) / 1e3
    return summary_table(per_step)
