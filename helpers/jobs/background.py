"""A run that goes on while the notebook does other things: the handle
:func:`helpers.launch_in_background` returns.

    job = launch_in_background("train.py", nproc=2, args=["--seconds", "20"])
    job.wait_for_output("step 10")      # returns once a rank has printed it
    ...                                 # look at the job while it runs (helpers.live)
    job.stop()                          # or job.wait() for its own end

A thread follows the run exactly as :func:`helpers.launch` does (the same guard, the same
end and errors); the handle only asks that thread. ``wait()`` raises the run's error in the
caller; ``stop()`` ends every process of the run and is not an error. Used as a context
manager (``with launch_in_background(...) as job:``) the run is stopped when the block ends.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .runs import LaunchError, RunInterrupted, RunRecord

__all__ = ["BackgroundRun"]

# How a live handle's thread is started: given the stop event and a callback that receives the
# live run (an object with ``rank_lines``: {rank: recent lines}), it follows the run to its end.
Follow = Callable[[threading.Event, Callable[[object], None]], RunRecord]


class BackgroundRun:
    """A run under torchrun going on in the background: ``record`` (its :class:`RunRecord`,
    ``run_dir`` its folder), ``running``, ``output()``, ``wait_for_output()``, ``wait()`` and
    ``stop()``."""

    def __init__(self, record: RunRecord, follow: Follow):
        self.record = record
        self.replayed = False
        self._stop = threading.Event()
        self._live = None  # the live run, once the thread has started it
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._follow, args=(follow,), daemon=True)
        self._thread.start()

    @classmethod
    def from_recording(cls, replay: Callable[[], RunRecord]) -> BackgroundRun:
        """A handle on a recorded run (recorded mode): finished, with the recording's files,
        output and error (raised by ``wait()``)."""
        job = cls.__new__(cls)
        job.replayed, job._stop, job._live, job._error, job._thread = True, None, None, None, None
        try:
            job.record = replay()
        except LaunchError as err:  # the recorded run failed: wait() raises it
            job.record, job._error = err.record, err
        return job

    def _follow(self, follow: Follow) -> None:
        try:
            follow(self._stop, self._started)
        except BaseException as err:  # given to the caller by wait()
            self._error = err

    def _started(self, live: object) -> None:
        self._live = live

    @property
    def run_dir(self) -> Path:
        """The run's folder (``traces/<experiment>/<run id>/``)."""
        return self.record.run_dir

    @property
    def running(self) -> bool:
        """True while the run's processes are going (never for a recorded run)."""
        return self._thread is not None and self._thread.is_alive()

    def output(self, rank: int | None = None) -> dict[int, list[str]] | list[str]:
        """What the ranks printed (the last lines of each): ``{rank: lines}``, or one rank's
        lines with ``rank=``."""
        if self._live is not None:
            lines = {r: list(d) for r, d in sorted(self._live.rank_lines.items())}
        else:
            lines = {r: list(v) for r, v in sorted(self.record.output.items())}
        return lines if rank is None else lines.get(rank, [])

    def wait_for_output(self, pattern: str, timeout: float = 60.0) -> str:
        """Wait until a rank prints a line matching the regular expression ``pattern``; return
        the line (``[rankN] text``). A TimeoutError after ``timeout`` s, or when the run ends
        without it (the run's own error is raised if it failed)."""
        wanted = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            running = self.running  # before reading the output: its last lines come before the end
            for rank, lines in self.output().items():
                for line in lines:
                    if wanted.search(line):
                        return f"[rank{rank}] {line}"
            if not running:
                self._raise_error()
                raise TimeoutError(
                    f"run {self.record.relative_dir()} ended ({self.record.status}) and no rank "
                    f"printed a line matching {pattern!r}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no rank of run {self.record.relative_dir()} printed a line matching "
                    f"{pattern!r} in {timeout:g} s; the run goes on (stop() ends it)"
                )
            time.sleep(0.05)

    def wait(self, timeout: float | None = None) -> RunRecord:
        """Wait for the run's end and return its record, or raise its error (the errors of
        :func:`helpers.launch`). ``timeout``: a TimeoutError after that many seconds, the run
        going on. Interrupting the kernel while waiting stops the run (RunInterrupted)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while self.running:
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(
                        f"run {self.record.relative_dir()} is still running after {timeout:g} s "
                        f"of waiting; it goes on: stop() ends it"
                    )
                self._thread.join(0.1)  # running: the thread exists
        except KeyboardInterrupt:
            self.stop()
            raise RunInterrupted(
                f"run {self.record.relative_dir()} was interrupted while waiting; all its "
                f"processes were stopped",
                self.record,
            ) from None
        self._raise_error()
        return self.record

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def stop(self) -> RunRecord:
        """End the run now (every process of it) and return its record, status ``stopped``
        (or how it ended, if it had ended already). Not an error; a run that had failed
        before raises its error here too."""
        self._end()
        self._raise_error()
        return self.record

    def _end(self) -> None:
        """Ask the thread to stop the run, and wait until it has."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    def __enter__(self) -> BackgroundRun:
        return self

    def __exit__(self, *exc) -> None:
        self._end()

    def __repr__(self) -> str:
        state = "running" if self.running else self.record.status
        return f"BackgroundRun({self.record.experiment}/{self.record.run_id}: {state})"
