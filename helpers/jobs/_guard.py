"""Finding and stopping every process of a run, and the guard that does it when the launcher dies.

Every process of a run (torchrun agents and ranks) carries ``RUN_ID=<run id>`` in its
environment. torchrun starts each rank in a session of its own, so a rank is found by that
marker, not only as a descendant of its agent.

The guard is a small separate process started by :func:`helpers.launch` for each run. It
holds the read end of a pipe whose write end only the launching process has. When the
launcher finishes the run it writes ``done`` and the guard exits. When the launching
process ends any other way (SIGKILL, SIGTERM, the OOM killer, a crashed kernel) the pipe
closes without ``done``: the guard stops every process of the run and marks the run's
manifest ``launcher died``. This file runs as a plain script (``python _guard.py MANIFEST
RUN_ID``), so the guard starts without importing the helpers package.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import psutil

RUN_MARKER = "RUN_ID"  # the environment variable that marks every process of a run
DONE = b"done"


def processes_of_run(run_id: str) -> list[psutil.Process]:
    """Every live process whose environment carries ``RUN_ID=<run_id>``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(RUN_MARKER) == run_id:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def stop_run_processes(agents: Sequence[subprocess.Popen], run_id: str, grace: float = 3.0) -> None:
    """Stop the torchrun agents and every rank of the run: SIGTERM, then SIGKILL after
    ``grace`` seconds."""
    procs: dict[int, psutil.Process] = {}
    for agent in agents:
        try:
            root = psutil.Process(agent.pid)
            procs[root.pid] = root
            for child in root.children(recursive=True):
                procs[child.pid] = child
        except psutil.Error:
            pass
    for proc in processes_of_run(run_id):
        procs[proc.pid] = proc
    for proc in procs.values():
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(list(procs.values()), timeout=grace)
    for proc in alive + processes_of_run(run_id):
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace)
    for agent in agents:
        try:
            agent.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass


def _mark_launcher_died(path: Path) -> None:
    """Say in the manifest (``path``) that the run ended because its launcher did."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if data.get("status") != "running":
        return
    data["status"] = "launcher died"
    data["ended"] = _dt.datetime.now().isoformat(timespec="seconds")
    data["exit_codes"] = {
        rank: None for rank in data.get("exit_codes") or map(str, range(data.get("world_size", 0)))
    }
    tmp = path.with_suffix(f".json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def start_guard(manifest: Path, run_id: str) -> tuple[subprocess.Popen, int]:
    """Start the guard of a run; returns it and the pipe's write end (close it with
    :func:`release_guard` when the run is over)."""
    read_end, write_end = os.pipe()
    guard = subprocess.Popen(
        [sys.executable, "-I", __file__, str(manifest), run_id],
        stdin=read_end,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # not killed with the launcher's group
    os.close(read_end)
    return guard, write_end


def release_guard(guard: subprocess.Popen, write_end: int) -> None:
    """Tell the guard the launcher has finished the run, and let it go."""
    try:
        os.write(write_end, DONE)
    finally:
        os.close(write_end)
    guard.wait(timeout=10)


def _guard_main(manifest: str, run_id: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is the launcher's
    said = sys.stdin.buffer.read()  # returns when the launcher writes done or dies
    if DONE in said:
        return
    stop_run_processes([], run_id)
    _mark_launcher_died(Path(manifest))


if __name__ == "__main__":
    _guard_main(*sys.argv[1:3])
