"""How the trace layer speaks of a problem: :class:`TraceError` when a file cannot be used
(:class:`NotATrace` when it is no trace at all, :class:`DifferentRuns` when files cannot be of
one run), :class:`TraceWarning` when it was loaded, but
not exactly as written.

Every module of the trace layer raises these; :mod:`helpers.traces` hands them on to the lessons.
"""

from __future__ import annotations

from pathlib import Path

from ..jobs.runs import show_path


class TraceError(ValueError):
    """A trace file (or a set of them) that cannot be used. ``path`` names the file."""

    def __init__(self, path: str | Path | None, problem: str):
        self.path = None if path is None else Path(path)
        self.problem = problem
        super().__init__(f"{show_path(self.path)}: {problem}" if self.path is not None else problem)

    def __reduce__(self):  # rebuilt from (path, problem) when it comes back from a worker
        return TraceError, (self.path, self.problem)


class NotATrace(TraceError):
    """A JSON file that is no trace at all (no ``traceEvents``): a run's manifest, a recording's,
    a report's data. Beside real traces it is left out and listed, never fatal."""

    def __reduce__(self):
        return NotATrace, (self.path, self.problem)


class DifferentRuns(TraceError):
    """Files that cannot be one run: two claim the same rank, or their headers (world size,
    backend, run id) or their times disagree. ``path`` names the file found at odds."""

    def __reduce__(self):
        return DifferentRuns, (self.path, self.problem)


class TraceWarning(UserWarning):
    """A trace was loaded, but not exactly as written (bytes replaced, events left out)."""
