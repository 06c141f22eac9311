"""Helpers for the Profiling Distributed PyTorch notebooks, one module per job:

- ``launch``: start a script under torchrun, keep a record of the run, stop it whole
- ``device``: CPU + gloo or GPUs + nccl, and why
- ``background``: the handle of a run started in the background (``launch_in_background``)
- ``live``: ask a running job's ranks for their stacks, a profile, Flight Recorder entries
- ``debug_server``: in a rank, its debug server on loopback (what ``live`` asks)
- ``runs``: the run folder and its manifest (``RunRecord``), paths as a learner sees them
- ``recorded``: replay runs that ship with the series, for machines that cannot launch
- ``traces``: load and check per-rank profiler traces into one DataFrame (the private
  ``_trace*`` modules read, decode and cache the files)
- ``trace_export``: one merged trace for Perfetto; gather the nodes' folders of a run
- ``rank_by_rank``: a run too large to load whole, analysed one rank at a time
- ``kinds``: the kinds of trace event (how each is recognised, its colour), defined once
- ``intervals``: wall time of overlapping intervals, counted once
- ``analysis``: step times, time per kind, top ops, time by source line, GPU idle time
- ``collectives``: waiting vs moving data, stragglers, overlap, bandwidth, clock offsets
- ``overhead``: what profiling costs a training step
- ``plotting``: per-rank timelines, and each rank's collectives side by side
- ``flight_recorder``: Flight Recorder dumps of a hung job, in pandas
- ``exercises``: the checks of the lessons' exercises
- ``lessons``: bring a script that an earlier lesson writes
- ``doctor``: the pre-flight check of a machine (``python -m helpers.doctor``)
- ``kineto_noise``: keep the profiler's harmless C++ log lines out of a notebook

Everything a lesson uses is importable from here in one line, for example
``from helpers import launch, load_run, plot_rank_timeline``.
"""

from .analysis import (
    COLLECTIVE_NAMES,
    NCCL_KERNELS,
    bus_factor,
    busy_ms,
    by_rpc_node,
    clock_offsets,
    collective_bandwidth,
    collective_source,
    collective_waits,
    communication_overlap,
    find_straggler,
    gpu_idle_time,
    max_parallel_lanes,
    shift_ranks,
    step_times,
    time_by_source_line,
    time_per_kind,
    top_ops,
    waiting_per_step,
)
from .background import BackgroundRun
from .debug_server import serve_debug_requests
from .exercises import check, evaluate
from .flight_recorder import (
    FlightRecorderError,
    analyse_with_pytorch,
    first_mismatch,
    load_flight_records,
)
from .kinds import KIND_COLORS, KIND_NAMES, KINDS, event_kind
from .kineto_noise import hide_kineto_noise
from .launch import (
    Device,
    LaunchError,
    RankFailed,
    RendezvousTimedOut,
    RunInterrupted,
    RunTimedOut,
    choose_device,
    launch,
    launch_in_background,
    processes_of_run,
)
from .lessons import script_from_lesson
from .live import (
    LiveRunError,
    debug_servers,
    flight_records_now,
    listening_sockets,
    profile_ranks,
    rank_stacks,
    wait_counters,
    where_ranks_are,
)
from .overhead import profiling_cost
from .plotting import plot_collective_sequences, plot_rank_timeline, step_window
from .rank_by_rank import RunSummary, summarise_run
from .recorded import RecordingMissing, use_recorded_runs
from .runs import RunRecord, new_run_dir, show_path
from .trace_export import gather_traces, merge_traces
from .traces import RunTraces, Trace, TraceError, TraceWarning, load_run, load_trace

__all__ = [
    # launching
    "launch",
    "choose_device",
    "Device",
    "RunRecord",
    "new_run_dir",
    "show_path",
    "processes_of_run",
    "use_recorded_runs",
    "RecordingMissing",
    "LaunchError",
    "RankFailed",
    "RunTimedOut",
    "RendezvousTimedOut",
    "RunInterrupted",
    # a run looked at while it goes (lesson 9)
    "launch_in_background",
    "BackgroundRun",
    "serve_debug_requests",
    "debug_servers",
    "listening_sockets",
    "rank_stacks",
    "where_ranks_are",
    "profile_ranks",
    "flight_records_now",
    "wait_counters",
    "LiveRunError",
    # traces
    "load_trace",
    "load_run",
    "merge_traces",
    "gather_traces",
    "Trace",
    "RunTraces",
    "TraceError",
    "TraceWarning",
    "summarise_run",
    "RunSummary",
    # kinds, analysis, plots
    "KINDS",
    "KIND_NAMES",
    "KIND_COLORS",
    "event_kind",
    "step_times",
    "time_per_kind",
    "top_ops",
    "time_by_source_line",
    "busy_ms",
    "collective_source",
    "collective_waits",
    "waiting_per_step",
    "communication_overlap",
    "collective_bandwidth",
    "bus_factor",
    "gpu_idle_time",
    "find_straggler",
    "max_parallel_lanes",
    "clock_offsets",
    "shift_ranks",
    "by_rpc_node",
    "COLLECTIVE_NAMES",
    "NCCL_KERNELS",
    "plot_rank_timeline",
    "step_window",
    # hangs
    "load_flight_records",
    "first_mismatch",
    "analyse_with_pytorch",
    "FlightRecorderError",
    "plot_collective_sequences",
    # the series
    "check",
    "evaluate",
    "script_from_lesson",
    "hide_kineto_noise",
    "profiling_cost",
]
