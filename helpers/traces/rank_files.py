"""One rank's file at a time: its events read from a Parquet cache beside the file, other
frames kept there beside them, and the pool of processes that reads files in parallel.

What a run too large to load whole needs of the parser (:mod:`helpers.analysis.rank_by_rank`
keeps of each rank what its analyses need, and answers them from that):

- :func:`rank_trace` (and :func:`rank_events`, its events): one rank's trace, as
  :func:`helpers.load_trace` gives it, kept as Parquet (``.cache/rank-<file>-<key>.parquet``
  beside the file, the header in its metadata) while the file has not changed;
- :func:`read_rank_part` and :func:`write_rank_part`: any other frame made of one rank's file
  (``what`` names it), kept the same way;
- :func:`each_in_processes` and :func:`worker_failure`: the loader's pool of worker processes,
  one file per task, and the :class:`TraceError` that names the file a worker failed on.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd

from . import _cache
from ._header import TraceHeader
from ._workers import each_in_processes, worker_failure
from .load import Trace, load_trace

__all__ = [
    "rank_trace",
    "rank_events",
    "header_note",
    "header_of_note",
    "read_rank_part",
    "write_rank_part",
    "each_in_processes",
    "worker_failure",
]


def rank_trace(path: str | Path, cache: bool = True, rank: int | None = None) -> Trace:
    """One rank's trace, as :func:`helpers.load_trace` gives it: read from the rank's Parquet
    cache (``.cache/rank-<file>-<key>.parquet`` beside the file, the header in its metadata)
    while the file has not changed, else decoded and, with ``cache``, kept there. Parquet is
    the data ecosystem's columnar format: DuckDB, Polars, Dask and Spark read these files as
    they are."""
    path = Path(path)
    where = _cache.rank_cache_file(path, "events", rank) if cache else None
    events = _cache.read_rank(where) if where is not None else None
    if events is not None and "header" in events.attrs:
        header = header_of_note(events.attrs.pop("header"), path)
        return Trace(header, events)
    trace = load_trace(path, rank)
    if where is not None:
        trace.events.attrs["header"] = header_note(trace.header)
        _cache.write_rank(where, trace.events)
        del trace.events.attrs["header"]
    return trace


def rank_events(path: str | Path, cache: bool = True, rank: int | None = None) -> pd.DataFrame:
    """One rank's events, as :func:`helpers.load_trace` gives them (:func:`rank_trace`)."""
    return rank_trace(path, cache, rank).events


def header_note(header: TraceHeader) -> dict:
    """``header`` as plain data, for a Parquet file's metadata (:func:`header_of_note` reads
    it back)."""
    return {**dataclasses.asdict(header), "path": str(header.path)}


def header_of_note(note: dict, path: str | Path) -> TraceHeader:
    """The :class:`TraceHeader` that :func:`header_note` wrote, of the file now at ``path``."""
    return TraceHeader(**{**note, "path": Path(path)})


def read_rank_part(path: str | Path, what: str, rank: int | None = None) -> pd.DataFrame | None:
    """The frame ``what`` kept of the file ``path`` (of ``rank``) by :func:`write_rank_part`,
    with its ``attrs``; None when none was kept, the file changed since, or the folder cannot
    hold a cache."""
    where = _cache.rank_cache_file(Path(path), what, rank)
    return _cache.read_rank(where) if where is not None else None


def write_rank_part(
    path: str | Path, what: str, rank: int | None, frame: pd.DataFrame
) -> None:
    """Keep ``frame`` as a Parquet part beside its trace file, ``attrs`` included; nothing
    where the folder cannot hold a cache.

    Args:
        path: the trace file it was made of.
        what: the part's name (``events``, ``kept``...).
        rank: the rank given when the file was read (None: none was given); part of the
            cache's key.
        frame: the part.
    """
    where = _cache.rank_cache_file(Path(path), what, rank)
    if where is not None:
        _cache.write_rank(where, frame)
