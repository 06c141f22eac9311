"""A CUDA memory snapshot, read safely: the caching allocator's blocks, one row each.

``torch.cuda.memory._dump_snapshot(path)`` pickles ``torch.cuda.memory._snapshot()``, plain
data (its docstring gives the shape): ``segments``, each one ``cudaMalloc`` the allocator keeps
(its *reserved* memory), each cut into ``blocks``: in use by a tensor (``active_allocated``),
freed but waiting for another stream to finish with it (``active_awaiting_free``), or cached
and free (``inactive``). With ``torch.cuda.memory._record_memory_history()`` on before the
allocations, each block carries the stack that allocated it (innermost frame first).

A pickle can run any code when ``pickle.load`` reads it, and so does the reader of
``pytorch.org/memory_viz`` that takes it. Here it is read only by the series' checked reader of
plain data (:mod:`helpers._plaindata`), bounded by :data:`MAX_SNAPSHOT_BYTES` and the other
``MAX_SNAPSHOT_*`` (read at each call, so raising one works).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

from .._plaindata import Bounds, Refused, read_plain_data
from ._error import TraceError
from .memory import in_learners_code

__all__ = ["load_memory_snapshot", "SNAPSHOT_COLUMNS", "MAX_SNAPSHOT_BYTES"]

#: The most bytes a snapshot file may hold. A snapshot grows with ``max_entries`` of the
#: history and the depth of its stacks, several KB an entry: 256 MiB is about 100,000 entries.
MAX_SNAPSHOT_BYTES = 256 * 2**20
#: The most values (every reference counted) and pickle instructions a snapshot may hold.
MAX_SNAPSHOT_ITEMS = 40_000_000
#: The most lists, dicts and tuples a snapshot may make.
MAX_SNAPSHOT_CONTAINERS = 10_000_000
#: The deepest nesting: snapshot, segments, a segment, its blocks, a block, its frames, a
#: frame is 7 levels; an entry's annotation may add a few.
MAX_SNAPSHOT_DEPTH = 12

#: The columns of :func:`load_memory_snapshot`'s frame.
SNAPSHOT_COLUMNS = [
    "device", "segment", "segment_bytes", "stream", "address", "bytes", "requested", "state",
    "line", "frames",
]  # fmt: skip
STATES = ("active_allocated", "active_awaiting_free", "inactive")


def _bounds() -> Bounds:
    return Bounds(
        MAX_SNAPSHOT_BYTES, MAX_SNAPSHOT_ITEMS, MAX_SNAPSHOT_CONTAINERS, MAX_SNAPSHOT_DEPTH,
        what="a CUDA memory snapshot", settings="helpers.traces.snapshot.MAX_SNAPSHOT_",
    )  # fmt: skip


def load_memory_snapshot(path: str | os.PathLike) -> pd.DataFrame:
    """The blocks of the CUDA memory snapshot at ``path`` (a pickle of ``_dump_snapshot`` or
    the same dictionary as JSON), read without running any of it.

    Returns one row per block, its segment's rows together: ``device``, ``segment`` (the
    segment's address), ``segment_bytes`` (its size: the segments' sizes add up to the memory
    reserved), ``stream``, ``address``, ``bytes`` (the block's size), ``requested`` (what the
    tensor asked for; the rest is rounding), ``state`` (one of :data:`STATES`), ``line``
    (``file:line`` of the innermost frame in the learner's code that allocated it; missing
    without a recorded history) and ``frames`` (how many frames were recorded). A segment
    without blocks is a row of its own, ``state`` ``inactive``. A file that is not a
    snapshot, or fails a check, is a :class:`TraceError` naming it.
    """
    path = Path(path)
    try:
        snapshot = read_plain_data(path, _bounds())
    except Refused as err:
        raise TraceError(path, str(err)) from None
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("segments"), list):
        raise TraceError(
            path, "has no 'segments' list: not a snapshot of torch.cuda.memory._snapshot()"
        )
    try:
        rows = [row for segment in snapshot["segments"] for row in _blocks(segment)]
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise TraceError(
            path, f"has a segment or block of the wrong shape ({type(err).__name__}: "
            f"{str(err)[:80]}): not a snapshot of torch.cuda.memory._snapshot()"
        ) from None  # fmt: skip
    return pd.DataFrame(rows, columns=SNAPSHOT_COLUMNS)


def _blocks(segment: dict) -> list[tuple]:
    """The rows of one segment's blocks."""
    start, size = int(segment["address"]), int(segment["total_size"])
    where = (int(segment.get("device", 0)), start, size, int(segment.get("stream", 0)))
    blocks = segment.get("blocks") or [{"address": start, "size": size, "state": "inactive"}]
    rows = []
    for block in blocks:
        state = str(block["state"])
        if state not in STATES:
            raise ValueError(f"a block's state is {state[:30]!r}")
        frames = block.get("frames") or []
        size = int(block["size"])
        requested = int(block.get("requested_size", size if state != "inactive" else 0))
        rows.append((*where, int(block["address"]), size, requested, state, _line(frames), len(frames)))  # fmt: skip
    return rows


def _line(frames: list[Any]) -> str | None:
    """``file:line`` of the innermost frame in the learner's code, or None."""
    for frame in frames:
        site = f"{frame['filename']}:{int(frame['line'])}"
        if in_learners_code(site):
            return site
    return None
