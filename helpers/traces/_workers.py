"""One job per file, in worker processes when there are several: the loader's and the
rank-by-rank summary's one way of doing it, with the progress bar and the failures of a worker
told apart from the failures of a file."""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from ._progress import progress_bar
from ._error import TraceError


def each_in_processes(
    fn: Callable[..., Any],
    jobs: Sequence[tuple],
    workers: int,
    what: str,
    progress: bool | None,
) -> list[Any]:
    """``fn(*job)`` for every job, in order, with a progress bar (``what``, counted in files;
    see :func:`._progress.progress_bar` for ``progress``). With ``workers`` > 1 the jobs
    run in that many processes (fork on Linux: they start with everything imported; spawn
    elsewhere), and a job whose call raised, or whose worker died, gives the exception in its
    place (see :func:`worker_failure`); with one worker an exception is raised as it comes."""
    bar = progress_bar(len(jobs), what, "file", progress)
    try:
        if workers <= 1:
            results = []
            for job in jobs:
                results.append(fn(*job))
                bar.update()
            return results
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=_context()) as pool:
            futures = [pool.submit(fn, *job) for job in jobs]
            for _ in as_completed(futures):
                bar.update()
            return [future.exception() or future.result() for future in futures]
    finally:
        bar.close()


def _context() -> Any:
    fork = "fork" in multiprocessing.get_all_start_methods() and sys.platform.startswith("linux")
    return multiprocessing.get_context("fork" if fork else "spawn")


def worker_failure(error: BaseException, path: Path) -> TraceError:
    """The TraceError naming ``path`` for a job of :func:`each_in_processes` that gave
    ``error``: the file's own TraceError, or why its worker could not read it (a worker killed
    for its memory breaks the pool: every file it had not read says so)."""
    if isinstance(error, TraceError):
        return error
    if isinstance(error, BrokenProcessPool):
        return TraceError(
            path,
            "the worker process reading it stopped (killed for using too much memory?); "
            "load with workers=1, or fewer ranks at once (ranks=)",
        )
    return TraceError(path, f"could not be read in a worker ({type(error).__name__}: {error})")
