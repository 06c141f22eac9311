"""What a trace says about itself: :class:`TraceHeader`, each field checked for its type and range.

The rank comes from the argument, the trace's ``distributedInfo`` or the file name (in that
order); world size, backend and run id from ``distributedInfo``; the time base from
``baseTimeNanoseconds``. Fields of other shapes than expected are dropped rather than carried into
comparisons and the cache; a rank or a time beyond what the frames hold is a
:class:`~helpers.traces.TraceError`.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._error import TraceError
from ._json import Doc, finite_number

RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
MAX_RANK = 2**31 - 1  # ranks are int32 in the frames
_DISTRIBUTED_INFO = re.compile(r'"distributedInfo"\s*:\s*')
#: How much of a trace's start :func:`distributed_info` reads (Kineto writes the header first).
PEEK_BYTES = 1 << 20


@dataclass
class TraceHeader:
    """What a trace says about itself (all optional in foreign traces), and what loading it
    had to change (``notes``)."""

    path: Path
    rank: int
    rank_source: str  # "distributedInfo", "file name", "argument", "assumed" or "merged file"
    world_size: int | None = None
    backend: str | None = None
    run_id: str | None = None
    base_time_ns: int | None = None
    pids: list = field(default_factory=list)
    start_us: float = float("nan")
    end_us: float = float("nan")
    gpu_events_without_launch: int = 0  # GPU events whose CPU launch is not in the trace
    process_groups: int | None = None  # groups of 2 ranks or more the rank is in (pg_config)
    notes: list[str] = field(default_factory=list)

    @property
    def merged(self) -> bool:
        """Whether :func:`merge_traces` wrote the file (its ``mergedRanks``; each event's rank is
        its pid), whether it holds several ranks or one: the one test of a merged file once it
        is read."""
        return self.rank_source == "merged file"


def rank_in_name(name: str) -> int | None:
    """The N of ``rank<N>`` in a file name; None when there is none, -1 when N has more
    digits than any rank (it is then no rank at all)."""
    m = RANK_IN_NAME.search(name)
    if m is None:
        return None
    return int(m.group(1)) if len(m.group(1)) <= 10 else -1


def header_of(doc: Doc, path: Path, rank: int | None, single: bool) -> TraceHeader:
    """What the trace says about itself, each field checked for its type and range. ``single``:
    the file is loaded on its own, so a trace that names no rank is taken as rank 0."""
    if doc.mergedRanks:
        _merged_pids(doc, path)
        return TraceHeader(
            path=path,
            rank=-1,
            rank_source="merged file",
            world_size=_world_size(doc.world_size),
            backend=_scalar(doc.backend, str),
            base_time_ns=_base_time_ns(doc, path),
        )
    rank, source = _rank_of(doc, path, rank, single)
    info = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    return TraceHeader(
        path=path,
        rank=rank,
        rank_source=source,
        world_size=_world_size(info.get("world_size")),
        backend=_scalar(info.get("backend"), str),
        run_id=_scalar(doc.run_id, str, int, float),
        base_time_ns=_base_time_ns(doc, path),
        process_groups=_process_groups(info.get("pg_config")),
    )


def _process_groups(config: Any) -> int | None:
    """How many process groups of 2 ranks or more the rank is in, from its header's
    ``pg_config`` (one entry per group the rank belongs to); None where the header has none."""
    if not isinstance(config, list):
        return None
    sizes = [c.get("pg_size") for c in config if isinstance(c, dict)]
    return sum(1 for n in sizes if isinstance(n, int) and not isinstance(n, bool) and n >= 2)


def describe(
    header: TraceHeader,
    start: np.ndarray,
    dur: np.ndarray,
    pid: tuple[np.ndarray, list],
    notes: list[str],
    unlaunched: int,
) -> None:
    """Fill in what the header says of the events loaded (in place): pids, span, notes."""
    if unlaunched:
        notes.append(
            f"{unlaunched} GPU events have no CPU launch in the trace (launched before the "
            f"profiler's window, or a trace without correlation ids); their step is <NA> (no step)"
        )
    header.pids = sorted(pid[1][c] for c in np.unique(pid[0]) if c >= 0)
    header.notes = notes
    header.gpu_events_without_launch = unlaunched
    header.start_us, header.end_us = float(start.min()), float((start + dur).max())


def _is_rank(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_RANK


def _rank_of(doc: Doc, path: Path, rank: int | None, single: bool) -> tuple[int, str]:
    """The rank that wrote the file and where it was read: the argument, the trace's
    ``distributedInfo``, the file name; a TraceError when one of them is not a rank."""
    pass_it = "pass its rank: load_trace(path, rank=N) or load_run({rank: path, ...})"
    if rank is not None:
        try:
            number = int(rank)  # numpy integers too
        except (TypeError, ValueError, OverflowError):
            number = -1
        if not _is_rank(number):
            raise TraceError(path, f"rank={rank!r} is not a rank (an int from 0 to {MAX_RANK})")
        return number, "argument"
    info = doc.distributedInfo
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        if not _is_rank(info["rank"]):
            raise TraceError(
                path,
                f"its distributedInfo says rank {str(info['rank'])[:30]}, which is no rank "
                f"(0 to {MAX_RANK}): the header is damaged; {pass_it}",
            )
        return info["rank"], "distributedInfo"
    number = rank_in_name(path.name)
    if number is not None:
        if not _is_rank(number):
            raise TraceError(
                path,
                f"the rank in its file name has more digits than any rank (0 to {MAX_RANK}); "
                f"rename the file, or {pass_it}",
            )
        return number, "file name"
    if single:
        return 0, "assumed"
    raise TraceError(
        path,
        "cannot tell which rank wrote it: no 'distributedInfo' in the trace "
        "and no 'rank<N>' in the file name. Pass the ranks: "
        "load_run({rank: path, ...})",
    )


def _base_time_ns(doc: Doc, path: Path) -> int | None:
    """``baseTimeNanoseconds`` as an int (None when absent or not a number); a TraceError
    when it is beyond any time in 64-bit nanoseconds."""
    base = doc.baseTimeNanoseconds
    if not (isinstance(base, int) and not isinstance(base, bool)):  # int: exact, as Kineto writes
        number = finite_number(base)
        if number is None:
            return None
        base = int(number)
    if abs(base) >= 2**63:
        raise TraceError(
            path,
            f"its baseTimeNanoseconds ({str(base)[:30]}...) is beyond any time in 64-bit "
            f"nanoseconds: the header is damaged; re-record the trace, or delete that key "
            f"(times are then read as they are)",
        )
    return base


def _scalar(value: Any, *types: type) -> Any:
    """``value`` when it is one of ``types`` (bools are not ints), else None: header fields
    of other shapes are dropped rather than carried into comparisons and the cache."""
    if isinstance(value, bool) and bool not in types:
        return None
    return value if isinstance(value, types) else None


def _world_size(value: Any) -> int | None:
    return value if _is_rank(value) and value > 0 else None


def _merged_pids(doc: Doc, path: Path) -> None:
    """A merged file's events have their rank as pid; a TraceError naming one that does not."""
    for pid in {e.pid for e in doc.traceEvents}:
        if not _is_rank(pid):
            raise TraceError(
                path,
                f"is a merged trace (it has 'mergedRanks') but an event's pid, "
                f"{str(pid)[:40]!r}, is not a rank number: it was not written by "
                f"merge_traces, or was edited. Load the per-rank files instead",
            )


def distributed_info(path: Path, limit: int = PEEK_BYTES) -> dict[str, Any]:
    """The ``world_size`` and ``backend`` of a trace's ``distributedInfo``, read from its first
    ``limit`` bytes only (decompressed; Kineto writes that header before the events), so that a
    run too large to load can still be checked file by file. A field that is absent, of
    another shape, or beyond those bytes (a trace that puts its header after its events) is
    None; so is every field of a file that cannot be read."""
    try:
        with path.open("rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
        opener = gzip.open if gzipped else open
        with opener(path, "rb") as f:
            start = f.read(limit).decode("utf-8", errors="replace")
        found = _DISTRIBUTED_INFO.search(start)
        info = json.JSONDecoder().raw_decode(start, found.end())[0] if found else {}
    except (OSError, EOFError, zlib.error, ValueError, RecursionError):  # damaged or hostile
        info = {}
    if not isinstance(info, dict):
        info = {}
    return {
        "world_size": _world_size(info.get("world_size")),
        "backend": _scalar(info.get("backend"), str),
    }
