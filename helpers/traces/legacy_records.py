"""The legacy profiler's raw records: what it recorded before its parser made events of them.

``torch.autograd.profiler_legacy.profile`` collects one list of records per thread (a ``push``
where a range begins, a ``pop`` where it ends, remote records sent back by RPC servers among
them) and, when its block ends, turns them into events with the private
``profiler_legacy._parse_legacy_records``. The parser drops records (lesson 5 shows when); to
see what it dropped, keep the records it was given (:func:`kept_legacy_records`) and read them
(:func:`server_replies`). Both are used inside an RPC worker, in the script lesson 5 writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["kept_legacy_records", "server_replies"]


@contextmanager
def kept_legacy_records() -> Iterator[dict]:
    """While the block runs, every call of the legacy profiler's private parser keeps the raw
    records it parses in the yielded dict, under ``"records"`` (the profiler's own events are
    unchanged). Enter it before the profiler, so that it is still active when the profiler's
    block ends::

        with kept_legacy_records() as kept, profiler_legacy.profile() as prof:
            ...
        kept["records"]  # one list of records per thread
    """
    from torch.autograd import profiler_legacy  # imported by a worker that profiles, only

    kept: dict = {}
    parse = profiler_legacy._parse_legacy_records  # private: profile.__exit__ calls it
    profiler_legacy._parse_legacy_records = lambda records: parse(kept.setdefault("records", records))
    try:
        yield kept
    finally:
        profiler_legacy._parse_legacy_records = parse


def server_replies(records: Iterable[Iterable[Any]], names: Iterable[str]) -> list[dict]:
    """What the RPC servers sent back, read from the raw records: one dict per reply, in the
    order the requests started on the server: ``request`` (what it ran: ``"aten::add"``,
    ``"server: udf call 2"``), ``server_thread``, ``start_ms`` (after the first reply's start),
    ``records_doubled`` (every record came twice: the same handle pushed twice in a row) and
    ``in_profile`` (its events reached the profile: its first record's name is in ``names``,
    the names of the profile's events)."""
    names = set(names)
    replies = []
    for thread_records in records:
        pushes = [r for r in thread_records if r.kind() == "push"]
        if not pushes or not pushes[0].is_remote():
            continue
        first = pushes[0]
        replies.append(
            {
                "request": first.name().split("#remote_op: ", 1)[-1],
                "server_thread": first.thread_id(),
                "start_us": first.start_us(),
                "records_doubled": any(a.handle() == b.handle() for a, b in zip(pushes, pushes[1:])),
                "in_profile": first.name() in names,
            }
        )
    start = min((r["start_us"] for r in replies), default=0)
    for reply in replies:
        reply["start_ms"] = round((reply.pop("start_us") - start) / 1e3, 3)
    return sorted(replies, key=lambda r: r["start_ms"])
