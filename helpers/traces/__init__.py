"""Reading traces: per-rank profiler traces (Chrome trace JSON, gzip or not) into one pandas
DataFrame, checked, cached, merged for Perfetto, or read one rank at a time.

- ``load``: :func:`load_trace` (one file) and :func:`load_run` (a run's files, one frame
  with a ``rank`` column); every bad file raises :class:`TraceError`, naming it.
  :func:`distributed_info` reads only the start of a file: its world size and backend.
- ``export``: :func:`merge_traces` (every rank in one file for Perfetto) and
  :func:`gather_traces` (the nodes' folders of a run in one place).
- ``legacy_records``: the legacy profiler's raw records, kept while it parses them
  (:func:`kept_legacy_records`), and the RPC replies read from them (:func:`server_replies`).
- ``memory``: :func:`load_memory`, the allocations and frees that ``profile_memory=True``
  records, over time.
- ``rank_by_rank``: a run too large to load whole, summarised one rank at a time
  (:func:`summarise_run`, a :class:`RunSummary`).
- private, one module per step a file goes through, each importing only those above it in
  this list: ``_bytes`` (size bounds, gzip), ``_json`` (the one JSON decoder), ``_header``,
  ``_steps`` (profiler steps, GPU launches), ``_columns`` (events into columns), ``_file``
  (files into columns, in worker processes: ``_workers``, ``_progress``), ``_frame`` (a run's
  one DataFrame; ``_memory``), ``_cache`` (finished loads kept in ``.cache/``); ``_error``
  holds :class:`TraceError` (:class:`NotATrace` for a JSON file that is no trace) and
  :class:`TraceWarning`.
"""

from ._header import distributed_info
from .export import gather_traces, merge_traces
from .load import (
    NotATrace,
    RunTraces,
    Trace,
    TraceError,
    TraceHeader,
    TraceWarning,
    load_run,
    load_trace,
    run_files,
    trace_files,
)
from .legacy_records import kept_legacy_records, server_replies
from .memory import load_memory
from .rank_by_rank import RunSummary, kept_of_file, rank_events, summarise_run, summary_of

__all__ = [
    "load_trace",
    "load_run",
    "Trace",
    "RunTraces",
    "TraceHeader",
    "TraceError",
    "NotATrace",
    "TraceWarning",
    "trace_files",
    "run_files",
    "distributed_info",
    "merge_traces",
    "gather_traces",
    "load_memory",
    "kept_legacy_records",
    "server_replies",
    "summarise_run",
    "RunSummary",
    "rank_events",
    "kept_of_file",
    "summary_of",
]
