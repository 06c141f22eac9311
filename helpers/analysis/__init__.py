"""Answering questions: functions of the ``events`` DataFrame of a run (``load_run(...)``)
that return small DataFrames in milliseconds. One function per question; the same question
gets the same, true answer on a CPU trace (gloo spans) and a GPU trace (NCCL kernels), read
from what the trace holds.

The kinds of event (how each is recognised, its colour) are the parser's, defined once in
:mod:`helpers.traces.kinds`; every module here reads them from there.

- ``intervals``: wall time of overlapping intervals, counted once.
- ``steps``: step times, time per kind, the heaviest ops, time per line of a script.
- ``collectives``: the same collective matched on every rank; waiting against moving data,
  the straggler, the collectives some rank never joined; ``overlap``: how much of it ran
  hidden behind computation; ``arrival``: when each rank arrived at one (its data ready: a
  rank that first waits for its own GPU arrives when that ends); ``kernel_ends``: NCCL kernels
  without sequence numbers matched across ranks by their order, checked against their times
  (ranks whose profiling began a collective apart); ``bandwidth``: the bandwidth each
  achieved, as nccl-tests defines it.
- ``point_to_point``: each send paired with the receive that took its data (a pipeline's
  stages), from the peers and tags the trace records; how long each stage waited for the others.
- ``memory``: memory in use over time from a starting point, its peaks, what was alive at
  each peak, memory that grows step after step; where a CUDA snapshot's reserved memory went.
- ``allocations``: each allocation's life (paired with its free), its op, line, step, phase
  and category; the frees of blocks allocated before the trace.
- ``fsdp``: the phases of a sharded (FSDP2) step per unit and rank, from FSDP's annotations,
  and the phase each collective belongs to.
- ``gpu``: how long each GPU stream sat idle in a step.
- ``clocks``: how far the nodes' clocks disagree, and the events shifted to correct it.
- ``rpc``: the node of each event of an RPC trace, the calls and the remote work they caused
  (and whether each call encloses it), parallel lanes.
- ``overhead``: what profiling costs a training step.
- ``windows``: what the path is found in (the profiler's steps, the instances of an
  annotation, or the whole trace).
- ``path`` (a package): what held each step (the chain of work across the ranks that decided
  when it ended) and what shortening some of it would buy (a what-if, by re-timing the run's
  dependency graph); and the same path for a run too large to load whole.
- ``shift``: how far one sample moved from another, with its interval (:func:`step_shift`).
- ``compare``: two runs side by side (did a change work, by how much beyond the steps' noise,
  where on the critical path, which ops; a what-if against the second run).
- ``rank_by_rank``: a run too large to load whole, summarised one rank at a time
  (:func:`summarise_run`, a :class:`RunSummary` that answers this room's questions from the
  parts it kept of each rank).
"""

from .allocations import allocation_lives, freed_before_trace
from .bandwidth import bus_factor, collective_bandwidth
from .clocks import clock_offsets, shift_ranks
from .collectives import (
    COLLECTIVE_NAMES,
    NCCL_KERNELS,
    collective_source,
    collective_waits,
    collectives_outside_windows,
    find_straggler,
    matched_collectives,
    straggler_of,
    unmatched_collectives,
    waiting_per_group,
    waiting_per_step,
)
from .compare import RUN_NOISE, RunComparison, compare_runs, step_shift, within_noise
from .fsdp import ROOT_UNIT, fsdp_collectives, fsdp_phases
from .gpu import gpu_idle_time
from .intervals import busy_ms, busy_ms_per_group, merge_intervals
from .memory import (
    alive_at_peak,
    compare_memory,
    memory_growth,
    memory_of_runs,
    memory_over_time,
    memory_peaks,
    memory_verdict,
    peak_difference,
    peak_moments,
    snapshot_summary,
    step_peaks,
)
from .overhead import profiling_cost
from .overlap import communication_overlap
from .path import (
    critical_path,
    path_summary,
    replay_error,
    replay_step_times,
    step_windows,
    what_if,
    what_if_checks,
)
from .point_to_point import sends_and_receives, stage_waits
from .rank_by_rank import RunSummary, kept_of_file, summarise_run, summary_of
from .rpc import by_rpc_node, enclosure, max_parallel_lanes, rpc_calls
from .steps import step_times, time_by_source_line, time_per_kind, top_ops

__all__ = [
    "compare_runs",
    "RunComparison",
    "step_shift",
    "within_noise",
    "RUN_NOISE",
    "merge_intervals",
    "busy_ms",
    "busy_ms_per_group",
    "step_times",
    "time_per_kind",
    "top_ops",
    "time_by_source_line",
    "COLLECTIVE_NAMES",
    "NCCL_KERNELS",
    "collective_source",
    "matched_collectives",
    "collective_waits",
    "unmatched_collectives",
    "collectives_outside_windows",
    "waiting_per_step",
    "find_straggler",
    "straggler_of",
    "waiting_per_group",
    "communication_overlap",
    "collective_bandwidth",
    "bus_factor",
    "sends_and_receives",
    "stage_waits",
    "gpu_idle_time",
    "fsdp_phases",
    "fsdp_collectives",
    "ROOT_UNIT",
    "memory_over_time",
    "memory_peaks",
    "peak_moments",
    "alive_at_peak",
    "memory_growth",
    "step_peaks",
    "compare_memory",
    "memory_of_runs",
    "memory_verdict",
    "snapshot_summary",
    "peak_difference",
    "allocation_lives",
    "freed_before_trace",
    "clock_offsets",
    "shift_ranks",
    "by_rpc_node",
    "rpc_calls",
    "enclosure",
    "max_parallel_lanes",
    "profiling_cost",
    "critical_path",
    "path_summary",
    "step_windows",
    "what_if",
    "what_if_checks",
    "replay_error",
    "replay_step_times",
    "summarise_run",
    "RunSummary",
    "kept_of_file",
    "summary_of",
]
