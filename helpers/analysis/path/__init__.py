"""What held each step, and what fixing it would buy: the critical path across the ranks and its
what-if, on one dependency graph of the run's moments.

- ``dependencies``: the kinds of dependency, one registry of values that every other module
  reads by their flags;
- ``lanes``: every lane of a run (a thread, a GPU stream) cut into intervals, with its graph;
- ``wakers``: what ended each wait (a waker on another lane, a worker lane's event's issuer);
- ``builders``: the edges of what each interval may have waited for, every candidate, and
  ``gpu_waits``: those of a CPU thread waiting for the GPU and of a stream waiting for another
  (``gpu_work``: the GPU work they read, and the op that launched each kernel);
- ``step_ends``: a step's end as a node of the graph, and the rank that ended it last, where
  its path begins;
- ``graph``: the graph of edges, the last arrival that binds each moment, the replay of the
  run's times, and what is wrong with a graph (:func:`validate`; ``findings``: said in a
  sentence);
- ``walk``: the critical path, walked back along the binding edges (:func:`critical_path`);
- ``replay``: the run re-timed as measured and with some work made shorter (:func:`what_if`);
- ``rank_part`` and ``from_rank_parts``: the same path for a run too large to load whole, from
  each rank's part of it.
"""

from .graph import validate
from .replay import replay_error, replay_step_times, what_if, what_if_checks
from .walk import critical_path, path_summary, step_windows

__all__ = [
    "critical_path",
    "path_summary",
    "step_windows",
    "what_if",
    "replay_error",
    "replay_step_times",
    "what_if_checks",
    "validate",
]
