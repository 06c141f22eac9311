"""The live part of a launch: each torchrun agent (a node) and its output, following the run
until it ends (:class:`LiveRun`, Ctrl-C included), and what the end means (:func:`conclude`: the
error to raise, if any)."""

from __future__ import annotations

import datetime as _dt
import queue
import re
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path

from ._guard import stop_run_processes
from ._ranklogs import TAIL_LINES, RankLogs, cut_line
from .kineto_noise import NOISE  # harmless profiler lines: kept in the logs, not echoed
from .runs import (
    LOGS_DIR,
    LaunchError,
    RankFailed,
    RendezvousTimedOut,
    RunInterrupted,
    RunRecord,
    RunTimedOut,
    shorten_paths,
)

LAST_LINES = 20  # lines of a failing rank's output quoted in the error


_GLOBAL_RANKS = re.compile(r"global_ranks=\[(\d+)")


class _Agent:
    """One torchrun agent (one node) of a run: its process, its output, its ranks' logs."""

    def __init__(
        self, node: int, command: list[str], env: dict[str, str], node_dir: Path, nnodes: int
    ):
        self.node = node
        self.lines: deque[str] = deque(maxlen=TAIL_LINES)  # torchrun's own output, its tail
        self.logs = RankLogs(node_dir / LOGS_DIR, first_rank=0 if nnodes == 1 else None)
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.finished = False
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.queue.put(line.rstrip("\n"))
        self.queue.put(None)

    @property
    def failed(self) -> bool:
        return self.finished and self.process.returncode != 0

    def drain(self) -> None:
        """Take torchrun's new output lines; learn the node's first global rank from them."""
        while True:
            try:
                line = self.queue.get_nowait()
            except queue.Empty:
                return
            if line is None:
                self.process.wait()
                self.finished = True
                return
            self.lines.append(cut_line(line))
            m = _GLOBAL_RANKS.search(line)
            if m and self.logs.first_rank is None:
                self.logs.first_rank = int(m.group(1))


class _CtrlC:
    """Inside its ``with`` block (on the main thread), Ctrl-C (SIGINT, also a notebook's
    interrupt button) sets ``pressed`` instead of raising KeyboardInterrupt wherever the code
    happens to be: raised in the middle of the launcher's own work, it could leave a lock
    taken (in a queue, say) and hang the launcher."""

    def __init__(self) -> None:
        self.pressed = False
        self._previous = None
        self._installed = False

    def _press(self, signum, frame) -> None:
        self.pressed = True

    def __enter__(self) -> _CtrlC:
        if threading.current_thread() is threading.main_thread():  # Python allows no other
            self._previous = signal.signal(signal.SIGINT, self._press)
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._installed:
            signal.signal(
                signal.SIGINT,
                self._previous if self._previous is not None else signal.default_int_handler,
            )


class LiveRun:
    """The live part of a launch: the agents, what the ranks print, how the run ends."""

    def __init__(
        self,
        record: RunRecord,
        commands: list[list[str]],
        env: dict[str, str],
        node_dirs: Sequence[Path],
        echo: bool,
    ):
        self.record, self.echo = record, echo
        self.rank_lines: dict[int, deque[str]] = {}  # each rank's last TAIL_LINES lines
        self.echoed: deque[tuple[int, str]] = deque(maxlen=TAIL_LINES * record.world_size)
        self.t0 = time.monotonic()
        self.agents: list[_Agent] = []
        for node, (command, node_dir) in enumerate(zip(commands, node_dirs)):
            node_dir.mkdir(parents=True, exist_ok=True)
            self.agents.append(
                _Agent(
                    node,
                    command,
                    {**env, "RUN_DIR": str(node_dir), "NODE_NAME": f"node{node}"},
                    node_dir,
                    record.nnodes,
                )
            )

    def take_rank_lines(self, final: bool = False) -> None:
        """Keep (and echo) what the ranks printed since the last call."""
        for agent in self.agents:
            for rank, text in agent.logs.poll(final):
                text = shorten_paths(re.sub(rf"^\[rank{rank}\]: ?", "", text))  # torch's prefix
                self.rank_lines.setdefault(rank, deque(maxlen=TAIL_LINES)).append(text)
                if not NOISE.search(text):
                    self.echoed.append((rank, text))
                    if self.echo:
                        print(f"[rank{rank}] {text}", flush=True)

    def watch(self, timeout: float, stop: threading.Event | None = None) -> str:
        """Follow the run until every agent ends (``ok`` or ``failed``: one failed node
        ends the watch), the timeout passes (``timeout``), the kernel is interrupted
        (``interrupted``) or ``stop`` is set (``stopped``). The run's processes are stopped
        in every case."""
        outcome = "ok"
        with _CtrlC() as ctrl_c:
            while not all(a.finished for a in self.agents):
                if ctrl_c.pressed:
                    outcome = "interrupted"
                    break
                if stop is not None and stop.is_set():
                    outcome = "stopped"
                    break
                if time.monotonic() - self.t0 > timeout:
                    outcome = "timeout"
                    break
                time.sleep(0.1)
                for agent in self.agents:
                    agent.drain()
                self.take_rank_lines()
                if any(a.failed for a in self.agents):
                    break  # one node failed: stop the others rather than let them hang
            stop_run_processes(
                [a.process for a in self.agents],
                self.record.run_id,
                grace=1.0 if outcome == "ok" else 3.0,
            )  # normally finds nothing left
            for agent in self.agents:
                agent.drain()
        if outcome == "ok" and not all(a.finished and not a.failed for a in self.agents):
            outcome = "failed"
        return outcome

    def finish(self, status: str, exit_codes: dict[int, int | None]) -> None:
        """Write the run's end into its record and manifest."""
        self.take_rank_lines(final=True)
        record = self.record
        record.status = status
        record.exit_codes = exit_codes
        record.nodes = {
            a.node: list(range(a.logs.first_rank, a.logs.first_rank + record.nproc))
            for a in self.agents
            if a.logs.first_rank is not None
        }
        record.ended = _dt.datetime.now().isoformat(timespec="seconds")
        record.seconds = round(time.monotonic() - self.t0, 3)
        record.output = {r: list(d) for r, d in sorted(self.rank_lines.items())}
        record.save()


_FAILURE = re.compile(r"rank\s*:\s*(\d+).*?\n\s*exitcode\s*:\s*(-?\d+)")


def _failed_ranks(agent_lines: Iterable[str]) -> tuple[int | None, dict[int, int]]:
    """``(root-cause rank, {rank: exit code})`` from torchrun's failure summary.

    torchrun lists every rank that did not exit 0, including those it stopped with
    SIGTERM (exit code -15) after the first failure, and names the first failure
    under "Root Cause".
    """
    text = "\n".join(agent_lines)
    codes = {int(r): int(c) for r, c in _FAILURE.findall(text)}
    _, _, root_part = text.partition("Root Cause")
    root = _FAILURE.search(root_part)
    return (int(root.group(1)) if root else None), codes


#: What a rank's last lines say when it failed because a peer went away (gloo's TCP pairs, the
#: TCPStore): a consequence of another rank's failure, not a failure of its own.
PEER_GONE = re.compile(
    r"Connection closed by peer|Connection reset by peer|remote worker crashing|Broken pipe"
)
SIGTERM_EXIT = -15  # a rank that torchrun stopped after another had failed


def _first_failure(
    root: int | None, failed: dict[int, int], lines: dict[int, list[str]]
) -> int | None:
    """The rank that failed first. torchrun names the failure with the earliest timestamp, but
    its timestamps are whole seconds, and among ranks that failed in the same second it names
    the lowest: often a rank that only failed because the first one's connections closed. So
    a root cause whose log says a peer went away gives way to the lowest failed rank whose log
    does not (ranks torchrun stopped with SIGTERM are no candidates)."""
    if root is None or not _after_a_peer(lines.get(root, [])):
        return root
    own = [
        r
        for r, code in sorted(failed.items())
        if code != SIGTERM_EXIT and not _after_a_peer(lines.get(r, []))
    ]
    return own[0] if own else root


def _after_a_peer(lines: Sequence[str]) -> bool:
    return any(PEER_GONE.search(line) for line in list(lines)[-LAST_LINES:])


def _quoted(lines: Sequence[str]) -> str:
    return "\n".join("    " + line for line in lines) or "    (no output)"


def conclude(
    run: LiveRun, outcome: str, timeout: float, rdzv_timeout: float, started_nodes: int
) -> LaunchError | None:
    """Record how the run ended; the error to raise, or None when it went well."""
    record = run.record
    unknown = {r: None for r in range(record.world_size)}
    where = record.relative_dir()
    if outcome == "ok":
        run.finish("ok", {r: 0 for r in range(record.world_size)})
        return None
    if outcome == "stopped":  # asked for (a background run's stop()): not an error
        run.finish("stopped", unknown)
        return None
    if outcome == "interrupted":
        run.finish("interrupted", unknown)
        return RunInterrupted(
            f"run {where} was interrupted; all its processes were stopped", record
        )
    if outcome == "timeout":
        run.finish("timeout", unknown)
        return RunTimedOut(
            f"run {where} was still going after {timeout:g} s and was killed "
            f"with all its processes; raise timeout= if it needs longer",
            record,
        )
    agent_lines = [line for a in run.agents for line in a.lines]
    if any("RendezvousTimeoutError" in line for line in agent_lines):
        run.finish("rendezvous timeout", unknown)
        return RendezvousTimedOut(
            f"the rendezvous timed out after {rdzv_timeout:g} s: {started_nodes} of "
            f"{record.nnodes} nodes joined. Every node must run torchrun with the same --nnodes, "
            f"--rdzv-endpoint and --rdzv-id, and reach the endpoint's host and port",
            record,
        )
    root, failed = _failed_ranks(agent_lines)
    rank = _first_failure(root, failed, run.rank_lines)
    run.finish("failed", {r: failed.get(r) for r in range(record.world_size)})
    if rank is None:
        return LaunchError(
            f"torchrun exited before any rank reported; its last lines:\n"
            f"{_quoted(agent_lines[-LAST_LINES:])}",
            record,
        )
    last = [line for line in run.rank_lines.get(rank, []) if not NOISE.search(line)][-LAST_LINES:]
    return RankFailed(
        f"rank {rank} exited with code {failed[rank]}; the other ranks were "
        f"stopped. Last lines of rank {rank}:\n{_quoted(last)}",
        record,
        rank,
        failed[rank],
        last,
    )
