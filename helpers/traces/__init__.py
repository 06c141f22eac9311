"""Reading traces: per-rank profiler traces (Chrome trace JSON, gzip or not) into one pandas
DataFrame, checked, cached, merged for Perfetto, or read one rank at a time.

- ``load``: :func:`load_trace` (one file) and :func:`load_run` (a run's files, one frame
  with a ``rank`` column); every bad file raises :class:`TraceError`, naming it.
  :func:`distributed_info` reads only the start of a file: its world size and backend;
  :func:`rank_in_name`, the rank a file's name says (``rank3...``).
- ``export``: :func:`merge_traces` (every rank in one file for Perfetto) and
  :func:`gather_traces` (the nodes' folders of a run in one place).
- ``legacy_records``: the legacy profiler's raw records, kept while it parses them
  (:func:`kept_legacy_records`), and the RPC replies read from them (:func:`server_replies`).
- ``memory``: :func:`load_memory`, the allocations and frees that ``profile_memory=True``
  records, over time; :func:`load_memory_categories`, the profiler's category of each, where
  the job wrote its memory timeline beside its traces.
- ``snapshot``: :func:`load_memory_snapshot`, a CUDA memory snapshot's blocks (reserved,
  allocated, cached free, the line that allocated each), read by the checked reader of plain
  data (``helpers._plaindata``): a snapshot is a pickle, and never runs code here.
- ``kinds``: the kinds of event, defined once: how the loader recognises each (its ``kind``
  column), its colour and drawing layer; event names as text (:func:`event_names`,
  :func:`name_matches`). The analysis and the drawings read them from here.
- ``rank_files``: one rank's file at a time (:func:`rank_events`, its events kept as Parquet;
  other frames of it kept beside them; the pool of worker processes), for a run too large to
  load whole (:mod:`helpers.analysis.rank_by_rank`).
- private, one module per step a file goes through, each importing only those above it in
  this list: ``_bytes`` (size bounds, gzip), ``_json`` (the one JSON decoder), ``_header``,
  ``_steps`` (profiler steps, GPU launches), ``_columns`` (events into columns), ``_file``
  (files into columns, in worker processes: ``_workers``, ``_progress``), ``_frame`` (a run's
  one DataFrame; ``_memory``), ``_cache`` (finished loads kept in ``.cache/``); ``_error``
  holds :class:`TraceError` (:class:`NotATrace` for a JSON file that is no trace,
  :class:`DifferentRuns` for files that cannot be one run) and
  :class:`TraceWarning`.
"""

from ._header import distributed_info, rank_in_name
from .export import gather_traces, merge_traces
from .load import (
    DifferentRuns,
    NotATrace,
    RunTraces,
    Trace,
    TraceError,
    TraceHeader,
    TraceWarning,
    load_run,
    check_one_run,
    load_trace,
    run_files,
    trace_files,
)
from .legacy_records import kept_legacy_records, server_replies
from .memory import load_memory, load_memory_categories
from .snapshot import load_memory_snapshot
from .kinds import KIND_COLORS, KIND_NAMES, KINDS, event_kind, event_names, name_matches
from .rank_files import rank_events

__all__ = [
    "load_trace",
    "load_run",
    "Trace",
    "RunTraces",
    "TraceHeader",
    "TraceError",
    "NotATrace",
    "DifferentRuns",
    "TraceWarning",
    "trace_files",
    "run_files",
    "check_one_run",
    "distributed_info",
    "rank_in_name",
    "merge_traces",
    "gather_traces",
    "load_memory",
    "load_memory_categories",
    "load_memory_snapshot",
    "kept_legacy_records",
    "server_replies",
    "rank_events",
    "KINDS",
    "KIND_NAMES",
    "KIND_COLORS",
    "event_kind",
    "event_names",
    "name_matches",
]
