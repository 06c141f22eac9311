"""A running job, looked at while it runs (lesson 9): each rank's debug server on loopback,
and the questions the notebook asks every rank at once.

- ``debug_server``: in a rank, :func:`serve_debug_requests` starts PyTorch's per-rank worker
  server on 127.0.0.1 (the one place its private ``_WorkerServer`` is used).
- ``questions``: asked of a :class:`helpers.BackgroundRun`, answered as DataFrames:
  :func:`where_ranks_are`, :func:`rank_stacks`, :func:`profile_ranks`,
  :func:`flight_records_now`, :func:`wait_counters`, :func:`listening_sockets`; answers are
  bounded in size and time and kept in the run folder, so recorded mode replays them.
"""

from .debug_server import serve_debug_requests
from .questions import (
    MAX_ANSWER_MB,
    LiveRunError,
    debug_servers,
    flight_records_now,
    listening_sockets,
    profile_ranks,
    rank_stacks,
    saved_answers,
    saved_stacks,
    wait_counters,
    where_ranks_are,
)

__all__ = [
    "serve_debug_requests",
    "debug_servers",
    "where_ranks_are",
    "rank_stacks",
    "profile_ranks",
    "flight_records_now",
    "wait_counters",
    "listening_sockets",
    "saved_answers",
    "saved_stacks",
    "LiveRunError",
    "MAX_ANSWER_MB",
]
