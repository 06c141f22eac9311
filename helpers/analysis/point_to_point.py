"""Sends paired with their receives: the point-to-point traffic of a pipeline (one stage sends
its activations to the next, which sends the gradients back).

A send on one rank and the receive on another that took its data carry the same pair of ranks
and the same tag, and come in the same order: the i-th send from rank 0 to rank 1 with tag 0 is
taken by the i-th receive on rank 1 from rank 0 with tag 0 (MPI's rule, which gloo keeps;
NCCL ignores tags and pairs by order alone). The trace says the peer and the tag in the ``Concrete Inputs`` of ``c10d::send`` and
``c10d::recv_`` when the profiler ran with ``record_shapes=True`` (the loader's ``peer`` and
``tag`` columns).

On gloo, each op also leaves the backend's record of the transfer, ``gloo:send`` or
``gloo:recv``, on the same thread: it begins when the op is issued and ends when a wait saw it
done (``work.wait()``; ``dist.recv`` waits at once). A receive's record therefore ends when its
data had arrived and the thread went on.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from ..traces.kinds import NOT_WORK_KINDS, name_matches
from .intervals import merge_intervals

__all__ = [
    "sends_and_receives",
    "stage_waits",
    "waits_in_records",
    "TRANSFER_RECORDS",
    "SEND_OP",
    "RECV_OP",
]

#: The backends' records of a send's or a receive's transfer, on the thread that issued it.
TRANSFER_RECORDS = r"^(?:gloo|mpi):(?:send|recv)$"
#: The ops that issue a send and post a receive.
SEND_OP, RECV_OP = "c10d::send", "c10d::recv_"
_SEND, _RECV = SEND_OP, RECV_OP
#: How far two ranks' clocks in one run may disagree (µs): a receive may seem to have its data
#: this much before its send began (up to 70 µs seen between the processes of one machine, in
#: PyTorch's pipelining on gloo beside two busy processes); a pair further apart was shifted.
CLOCK_SLACK_US = 200.0
_COLUMNS = [
    "sender", "receiver", "tag", "index", "step", "send", "receive", "send_record",
    "receive_record", "sent_us", "posted_us", "received_us",
]  # fmt: skip


def sends_and_receives(events: pd.DataFrame) -> pd.DataFrame:
    """Each send paired with the receive that took its data, one row per pair, in the order the
    receives were posted: ``sender, receiver, tag, index`` (the pair's place among the sends from
    ``sender`` to ``receiver`` with that tag), ``step`` (the receiver's), ``send`` and
    ``receive`` (the row labels in ``events`` of the ``c10d::send`` and ``c10d::recv_`` ops),
    ``send_record`` and ``receive_record`` (the labels of their ``gloo:send`` and ``gloo:recv``
    records, -1 where there is none),
    ``sent_us`` (when the send was issued: its op's end), ``posted_us`` (when the receive was
    posted: its op's start) and ``received_us`` (when a wait saw its data arrive: its record's
    end; NaN without a record).

    Ranks are the peers' ranks in the ops' process group: in a job of several groups a warning
    says the pairs may be wrong. A receive whose data came before its send began (a trace
    that begins after some sends) is left out, with a warning. A trace whose sends and receives
    carry no peer (recorded without ``record_shapes=True``) gives no pair and a warning that
    says what to record."""
    ops = events[events["name"].isin([_SEND, _RECV]).to_numpy()]
    if ops.empty:  # most runs: no pandas work on empty tables (10-20 ms a rank read alone)
        return pd.DataFrame({c: np.zeros(0, float if c.endswith("_us") else int) for c in _COLUMNS})
    known = ops[ops["peer"].notna().to_numpy() & ops["tag"].notna().to_numpy()]
    if len(known) < len(ops):
        warnings.warn(
            f"{len(ops) - len(known)} of {len(ops)} sends and receives do not say their peer: "
            "they are left unpaired. Profile with record_shapes=True to record it",
            stacklevel=2,
        )
    sends = _numbered(known[(known["name"] == _SEND).to_numpy()], "sender", "receiver")
    recvs = _numbered(known[(known["name"] == _RECV).to_numpy()], "receiver", "sender")
    pairs = recvs.merge(sends, on=["sender", "receiver", "tag", "index"], suffixes=("", "_s"))
    if len(pairs) and (events.attrs.get("process_groups") or 1) > 1:
        warnings.warn(
            "the ranks are in several process groups, and a send's or a receive's peer is its "
            "rank in the op's group: pairs of ops in a group other than the default one may be "
            "wrong",
            stacklevel=2,
        )
    records = _records_of(events, pairs["label"].to_numpy())
    received = np.where(records >= 0, events["end_us"].reindex(records).to_numpy(), np.nan)
    # its data came before it was sent, by more than the clocks can disagree
    impossible = received < pairs["start_us_s"].to_numpy() - CLOCK_SLACK_US
    if impossible.any():
        warnings.warn(
            f"{int(impossible.sum())} receives had their data before the send paired with them "
            "began: a trace that begins after some sends (or a backend that ignores tags, as "
            "NCCL does) shifts the pairs; they are left out. Profile every rank over the same "
            "steps",
            stacklevel=2,
        )
        pairs, records, received = pairs[~impossible], records[~impossible], received[~impossible]
    sent = _records_of(events, pairs["label_s"].to_numpy())
    return _pair_table(pairs, sent, records, received)


def _pair_table(pairs: pd.DataFrame, sent, records, received) -> pd.DataFrame:
    """:func:`sends_and_receives`' table of the ``pairs`` merged from both sides, with the
    labels of their records and when the receives had their data."""
    table = pd.DataFrame(
        {
            "sender": pairs["sender"].to_numpy(dtype=np.int64),
            "receiver": pairs["receiver"].to_numpy(dtype=np.int64),
            "tag": pairs["tag"].to_numpy(dtype=np.int64),
            "index": pairs["index"].to_numpy(dtype=np.int64),
            "step": pairs["step"].to_numpy(),
            "send": pairs["label_s"].to_numpy(),
            "receive": pairs["label"].to_numpy(),
            "send_record": sent,
            "receive_record": records,
            "sent_us": pairs["end_us_s"].to_numpy(),
            "posted_us": pairs["start_us"].to_numpy(),
            "received_us": received,
        }
    )
    return table.sort_values("posted_us", kind="stable", ignore_index=True)[_COLUMNS]


def _numbered(ops: pd.DataFrame, own: str, other: str) -> pd.DataFrame:
    """``ops`` (sends or receives) with their rank as ``own``, their peer as ``other``, and
    their ``index`` among those of the same ranks and tag, in order."""
    ops = ops.sort_values(["rank", "start_us"], kind="stable")
    table = pd.DataFrame(
        {
            own: ops["rank"].to_numpy(dtype=np.int64),
            other: ops["peer"].to_numpy(dtype=np.int64),
            "tag": ops["tag"].to_numpy(dtype=np.int64),
            "label": ops.index.to_numpy(),
            "start_us": ops["start_us"].to_numpy(),
            "end_us": ops["end_us"].to_numpy(),
            "step": ops["step"].to_numpy(),
        }
    )
    table["index"] = table.groupby([own, other, "tag"]).cumcount()
    return table


def _records_of(events: pd.DataFrame, ops: np.ndarray) -> np.ndarray:
    """For each op (row labels), the label of the backend's record of its transfer: the
    :data:`TRANSFER_RECORDS` event on its rank and lane that began within it (-1: none)."""
    found = np.full(len(ops), -1, dtype=np.int64)
    records = events[name_matches(events, TRANSFER_RECORDS)]
    if records.empty or not len(ops):
        return found
    by_lane = {key: g for key, g in records.groupby(["rank", "lane"], observed=True)}
    of = events.loc[ops]
    for i, (rank, lane, start, end) in enumerate(
        zip(of["rank"], of["lane"], of["start_us"], of["end_us"])
    ):
        mine = by_lane.get((rank, lane))
        if mine is None:
            continue
        starts = mine["start_us"].to_numpy()
        at = np.searchsorted(starts, start, side="left")
        if at < len(starts) and starts[at] <= end:
            found[i] = mine.index[at]
    return found


def waits_in_records(ev: pd.DataFrame) -> pd.DataFrame:
    """``ev`` (a run's events, or some of them) with each transfer record
    (:data:`TRANSFER_RECORDS`) cut to the wait at its end: it begins where the last other
    event of its lane that ended within it ended (the thread did that work while the transfer
    was under way, an ``isend`` waited for at the end of the step), or where it began if none
    did. What is left is the time the thread was held by the transfer."""
    is_record = name_matches(ev, TRANSFER_RECORDS)
    if not is_record.any():
        return ev
    starts, ends = ev["start_us"].to_numpy().copy(), ev["end_us"].to_numpy()
    with_records = set(ev.loc[is_record, ["rank", "lane"]].itertuples(index=False, name=None))
    for key, at in ev.groupby(["rank", "lane"], observed=True).indices.items():
        if key not in with_records:
            continue
        others = np.sort(ends[at[~is_record[at]]])
        mine = at[is_record[at]]
        before = np.searchsorted(others, ends[mine], side="left") - 1  # the last other end
        last = np.where(before >= 0, others[np.maximum(before, 0)], -np.inf)
        starts[mine] = np.maximum(starts[mine], last)
    return ev.assign(start_us=starts, dur_us=ev["end_us"].to_numpy() - starts)


def stage_waits(events: pd.DataFrame) -> pd.DataFrame:
    """How long each rank of a pipeline waited for the others in each step: the time its
    threads spent in the waits at the end of its sends' and receives' records
    (:func:`waits_in_records`, overlapping waits counted once). In a pipeline this is the
    stage's bubble (the other stages had not sent its input or its gradient yet) plus the
    transfers themselves.

    Returns one row per rank and step that sent or received: ``rank, step, step_ms,
    waiting_ms, share`` (of the step), ``sends, receives`` (ops in the step); empty for a
    run without them."""
    cut = waits_in_records(events[~events["kind"].isin(NOT_WORK_KINDS).to_numpy()])
    records = cut[name_matches(cut, TRANSFER_RECORDS)]
    steps = events[(events["kind"] == "step").to_numpy()].dropna(subset=["step"])
    bounds = steps.groupby(["rank", "step"]).agg(lo=("start_us", "min"), hi=("end_us", "max"))
    ops = events[events["name"].isin([_SEND, _RECV]).to_numpy()].dropna(subset=["step"])
    counts = ops.groupby(["rank", "step", "name"], observed=True).size()
    rows = []
    for (rank, step), mine in records.groupby(["rank", "step"], observed=True):
        if (rank, step) not in bounds.index:
            continue
        lo, hi = bounds.loc[(rank, step)]
        starts, ends = merge_intervals(mine["start_us"].clip(lo, hi), mine["end_us"].clip(lo, hi))
        waiting, step_ms = float((ends - starts).sum()) / 1e3, (hi - lo) / 1e3
        sends, receives = (int(counts.get((rank, step, n), 0)) for n in (_SEND, _RECV))
        rows.append((int(rank), int(step), step_ms, waiting, waiting / step_ms, sends, receives))
    columns = ["rank", "step", "step_ms", "waiting_ms", "share", "sends", "receives"]
    return pd.DataFrame(rows, columns=columns)
