"""Helpers for the Profiling Distributed PyTorch notebooks: one folder per job, each a room
whose ``__init__`` says what it does and what it exports.

- ``jobs``: run a script under torchrun and keep a record of the run; recorded mode
- ``traces``: per-rank profiler traces into one DataFrame, each event of a kind; merged for
  Perfetto; one rank's file at a time
- ``analysis``: questions asked of a run's events (steps, collectives, GPU, clocks, the
  critical path), of a run in memory or summarised rank by rank
- ``drawing``: per-rank timelines and the other figures of the series
- ``hangs``: the Flight Recorder's dumps of a hung job, read group by group (lessons 8 and 13)
- ``report``: one HTML report of any folder of traces (``python -m helpers.report``)
- ``live``: a running job's debug servers and the questions asked of them (lesson 9)
- ``exercises``: the checks of the lessons' exercises, one module per lesson
- ``doctor``: the pre-flight check of a machine (``python -m helpers.doctor``)
- ``rehearsal``: the GPU rehearsal of the series (``python -m helpers.rehearsal``)

A room imports only the rooms before it in this order: ``jobs``, ``traces``, ``analysis``,
``drawing``, ``hangs``, ``report``, ``live``, ``exercises``, ``doctor``, ``rehearsal``
(``_files``, atomic writes, is shared by all; ``tests/test_layout.py`` checks it).

Everything a lesson uses is importable from here in one line, for example
``from helpers import launch, load_run, plot_rank_timeline``: this package's names are the
union of the rooms' own.
"""

from . import analysis, drawing, exercises, hangs, jobs, live, report, traces
from .analysis import *  # noqa: F403
from .drawing import *  # noqa: F403
from .exercises import *  # noqa: F403
from .hangs import *  # noqa: F403
from .jobs import *  # noqa: F403
from .live import *  # noqa: F403
from .report import *  # noqa: F403
from .traces import *  # noqa: F403

__all__ = [
    *jobs.__all__,
    *traces.__all__,
    *analysis.__all__,
    *drawing.__all__,
    *report.__all__,
    *hangs.__all__,
    *live.__all__,
    *exercises.__all__,
]
