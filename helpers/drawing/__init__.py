"""Drawing: the series' figures with matplotlib, one colour per kind of event everywhere
(:data:`helpers.analysis.KIND_COLORS`), axes in milliseconds, rows labelled by rank.

- ``timeline``: :func:`plot_rank_timeline`, one row per rank (lanes per thread or GPU stream,
  ranks grouped by node) on one time axis; :func:`plot_timelines`, several of them one above
  the other on equal spans; :func:`step_window`, the time span of a step.
- ``critical_path``: :func:`plot_critical_path`, one step's timelines with the chain of work
  that decided when it ended drawn across the ranks.
- ``compare``: :func:`plot_run_comparison`, two runs compared: what moved on the critical
  path, per rank and kind (:func:`helpers.compare_runs`).
- ``fsdp``: :func:`plot_fsdp_phases`, a sharded step by phase, one row per unit and rank.
- ``gpu``: :func:`plot_launch_lag`, each step's CPU time above the GPU work it launched.
- ``memory``: :func:`plot_memory`, memory in use over time, one line per rank;
  :func:`plot_alive_at_peak`, what was alive at each rank's peak, by category.
- ``show``: :func:`show_figure`, a figure shown in a notebook with its alternative text.
- ``sequences``: :func:`plot_collective_sequences`, each rank's collectives in the order it
  called them, side by side (a hung job's Flight Recorder dumps).
"""

from .compare import plot_run_comparison, run_comparison_alt
from .critical_path import plot_critical_path
from .fsdp import PHASE_COLORS, plot_fsdp_phases
from .gpu import plot_launch_lag
from .memory import CATEGORY_COLOURS, plot_alive_at_peak, plot_memory
from .sequences import plot_collective_sequences
from .show import show_figure
from .timeline import (
    COLLAPSED_COMMUNICATION,
    STEP_TICK,
    plot_rank_timeline,
    plot_timelines,
    step_window,
)

__all__ = [
    "plot_run_comparison",
    "run_comparison_alt",
    "plot_rank_timeline",
    "plot_timelines",
    "plot_critical_path",
    "plot_launch_lag",
    "plot_fsdp_phases",
    "PHASE_COLORS",
    "step_window",
    "plot_collective_sequences",
    "plot_memory",
    "plot_alive_at_peak",
    "CATEGORY_COLOURS",
    "show_figure",
    "COLLAPSED_COMMUNICATION",
    "STEP_TICK",
]
