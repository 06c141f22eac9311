"""Start a script as real processes under torchrun and keep a record of the run.

The one call a notebook needs is :func:`launch`::

    run = launch("ranks.py", nproc=4, experiment="ranks")

It picks a free rendezvous port, chooses CPU + gloo or GPU + nccl, gives the run
its own folder ``traces/<experiment>/<run-id>/`` with a manifest ``run.json``,
prints each rank's output live with a ``[rankN]`` prefix, and returns a
:class:`RunRecord`. A failing rank, a timeout or an interrupted kernel raise an
error and leave no process of the run behind.

The script learns where to write and which backend to use from environment
variables that every rank receives:

``RUN_DIR``       the run's folder (write traces and other files there)
``DIST_BACKEND``  ``gloo`` on CPU, ``nccl`` on GPUs
``RUN_ID``        the run's id (also marks every process of the run)
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import queue
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import psutil

from .kineto_noise import NOISE  # harmless profiler lines: kept in the logs, not echoed

REPO_ROOT = Path(__file__).resolve().parents[1]
MANIFEST_NAME = "run.json"
RUN_MARKER = "RUN_ID"  # environment variable that marks every process of a run
LAST_LINES = 20  # lines of a failing rank's output quoted in the error



class LaunchError(RuntimeError):
    """A run did not finish cleanly. ``record`` is its :class:`RunRecord`."""

    def __init__(self, message: str, record: "RunRecord"):
        super().__init__(message)
        self.record = record


class RankFailed(LaunchError):
    """A rank exited with a non-zero code; the other ranks were stopped."""

    def __init__(self, message: str, record: "RunRecord", rank: int, exit_code: int,
                 last_lines: list[str]):
        super().__init__(message, record)
        self.rank = rank
        self.exit_code = exit_code
        self.last_lines = last_lines


class RunTimedOut(LaunchError):
    """The run was still going after its timeout and was killed as a whole."""


class RunInterrupted(LaunchError):
    """The kernel (or Ctrl-C) interrupted the run; every process was stopped."""


@dataclass
class RunRecord:
    """What one launch did: where it wrote, how each rank ended, what it printed.

    ``exit_codes`` maps each global rank to its exit code: -15 means torchrun
    stopped the rank (SIGTERM) after another one failed; ``None`` means no code was
    reported (the run was killed on a timeout or an interrupt, or the rank's node
    was stopped by the launcher after another node failed).
    ``nodes`` maps each node (torchrun agent) to the global ranks it ran.
    ``files`` maps paths relative to ``run_dir`` to sizes in bytes.
    """

    experiment: str
    run_id: str
    run_dir: Path
    command: list[str]
    script: str
    args: list[str]
    nproc: int
    nnodes: int
    world_size: int
    backend: str
    device: str
    started: str
    ended: str | None = None
    seconds: float | None = None
    status: str = "running"
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    nodes: dict[int, list[int]] = field(default_factory=dict)
    files: dict[str, int] = field(default_factory=dict)
    output: dict[int, list[str]] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def lines(self, rank: int) -> list[str]:
        """What a rank printed (stdout, then stderr), without blank lines and profiler noise."""
        return [line for line in self.output.get(rank, []) if line.strip() and not NOISE.search(line)]

    def paths(self, pattern: str = "*") -> list[Path]:
        """Files in the run folder matching a glob pattern (recursive), sorted."""
        return sorted(p for p in self.run_dir.rglob(pattern) if p.is_file())

    def relative_dir(self) -> str:
        """The run folder relative to the repository (what a notebook should show)."""
        try:
            return str(self.run_dir.resolve().relative_to(REPO_ROOT))
        except ValueError:
            return str(self.run_dir)

    def __repr__(self) -> str:
        return (f"RunRecord({self.experiment}/{self.run_id}: {self.status}, "
                f"{self.world_size} ranks, {self.backend}, {len(self.files)} files)")

    def to_json(self) -> dict:
        data = asdict(self)
        data["run_dir"] = self.relative_dir()
        data.pop("output")
        data["exit_codes"] = {str(k): v for k, v in self.exit_codes.items()}
        data["nodes"] = {str(k): v for k, v in self.nodes.items()}
        return data

    def save(self) -> Path:
        """Write the manifest ``run.json`` (atomically) and return its path."""
        self.files = _list_files(self.run_dir)
        path = self.run_dir / MANIFEST_NAME
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, run_dir: str | Path) -> "RunRecord":
        """Read the manifest of an earlier run from its folder."""
        run_dir = Path(run_dir)
        path = run_dir / MANIFEST_NAME
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no run manifest here; is this a run folder "
                                    f"made by helpers.launch?")
        data = json.loads(path.read_text())
        data["run_dir"] = run_dir
        data["exit_codes"] = {int(k): v for k, v in data["exit_codes"].items()}
        data["nodes"] = {int(k): v for k, v in data.get("nodes", {}).items()}
        return cls(**data)


def shorten_paths(text: str) -> str:
    """Write paths inside the repository relative to it (what a learner's screen should show)."""
    return text.replace(str(REPO_ROOT) + os.sep, "")


def _list_files(run_dir: Path) -> dict[str, int]:
    return {str(p.relative_to(run_dir)): p.stat().st_size
            for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name not in (MANIFEST_NAME, MANIFEST_NAME + ".tmp")}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def detect_device() -> tuple[str, str, int]:
    """``(device, backend, gpu_count)``: ``("cuda", "nccl", n)`` with GPUs, else ``("cpu", "gloo", 0)``."""
    try:
        import torch

        n = torch.cuda.device_count()
    except Exception:  # no torch or a broken driver: CPU it is
        n = 0
    return ("cuda", "nccl", n) if n > 0 else ("cpu", "gloo", 0)


def new_run_dir(experiment: str, traces_root: str | Path | None = None) -> tuple[str, Path]:
    """Create ``traces/<experiment>/<run-id>/`` (never reusing one) and return ``(run_id, path)``."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", experiment):
        raise ValueError(f"experiment={experiment!r}: use letters, digits, '-', '_' or '.' "
                         f"(it becomes a folder name)")
    root = Path(traces_root) if traces_root is not None else REPO_ROOT / "traces"
    while True:
        run_id = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)
        run_dir = root / experiment / run_id
        try:
            run_dir.mkdir(parents=True, exist_ok=False)
            return run_id, run_dir
        except FileExistsError:
            continue


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


def stop_run_processes(agents: Sequence[subprocess.Popen], run_id: str,
                       grace: float = 3.0) -> None:
    """Stop the torchrun agents and every worker of the run: SIGTERM, then SIGKILL after
    ``grace`` s.

    torchrun starts each worker in a session of its own, so killing torchrun's
    process group is not enough; workers are found by the ``RUN_ID`` marker in
    their environment as well as by being an agent's descendants.
    """
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


class RankLogs:
    """Follow the per-rank log files that torchrun writes with ``--redirects``.

    torchrun puts each worker's stdout and stderr in
    ``<log_dir>/<id>/attempt_<n>/<local_rank>/{stdout,stderr}.log``. Reading them
    ourselves (rather than torchrun's echo to the console) keeps each line whole and
    labelled with its rank. ``poll()`` returns the complete new lines as
    ``(rank, line)``; ``poll(final=True)`` also returns an unfinished last line.
    """

    def __init__(self, log_dir: Path, first_rank: int | None = 0):
        self.log_dir = log_dir
        self.first_rank = first_rank  # None until known (multi-node: from torchrun's log)
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}

    def poll(self, final: bool = False) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        if self.first_rank is None:
            return out
        # stdout before stderr, so an error message follows the output that led to it
        paths = self.log_dir.glob("*/attempt_*/*/std*.log")
        for path in sorted(paths, key=lambda p: (p.parent, p.name != "stdout.log")):
            offset = self._offsets.get(path, 0)
            try:
                with path.open("rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            self._offsets[path] = offset + len(data)
            data = self._partial.pop(path, b"") + data
            *complete, rest = data.split(b"\n")
            if rest and final:
                complete.append(rest)
            elif rest:
                self._partial[path] = rest
            rank = self.first_rank + int(path.parent.name)
            out.extend((rank, line.decode(errors="replace")) for line in complete)
        return out


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


class RendezvousTimedOut(LaunchError):
    """Not every node joined the rendezvous before its join timeout."""


_GLOBAL_RANKS = re.compile(r"global_ranks=\[(\d+)")


class _Agent:
    """One torchrun agent (one node) of a run: its process, its output, its ranks' logs."""

    def __init__(self, node: int, command: list[str], env: dict[str, str], node_dir: Path,
                 nnodes: int):
        self.node = node
        self.lines: list[str] = []
        self.logs = RankLogs(node_dir / "logs", first_rank=0 if nnodes == 1 else None)
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.finished = False
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env, text=True,
                                        errors="replace", bufsize=1, start_new_session=True)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.queue.put(line.rstrip("\n"))
        self.queue.put(None)

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
            self.lines.append(line)
            m = _GLOBAL_RANKS.search(line)
            if m and self.logs.first_rank is None:
                self.logs.first_rank = int(m.group(1))


def launch(
    script: str | Path,
    nproc: int | None = None,
    *,
    experiment: str | None = None,
    args: Sequence[str] = (),
    timeout: float = 300.0,
    echo: bool = True,
    nnodes: int = 1,
    start_nodes: int | None = None,
    rdzv_timeout: float = 60.0,
    netns: Sequence[tuple[str, str]] = (),
    cpu: bool = False,
    traces_root: str | Path | None = None,
    env: dict[str, str] | None = None,
    torchrun_args: Sequence[str] = (),
) -> RunRecord:
    """Run ``script`` under ``python -m torch.distributed.run`` and return its :class:`RunRecord`.

    nproc: processes (ranks) per node; default one per GPU, or 2 on a CPU machine.
    experiment: folder under ``traces/`` for this kind of run (default: the script's name).
    args: command-line arguments for the script.
    timeout: seconds before the whole run is killed and :class:`RunTimedOut` raised.
    echo: print each rank's output live, prefixed ``[rankN]``.
    nnodes: nodes of the job. Each node is a torchrun agent of its own on this machine, meeting
        the others through torchrun's c10d rendezvous as on a cluster, with its own folder
        ``node<N>/`` in the run folder (its ``RUN_DIR``), as on node-local disks.
    start_nodes: start only this many of the ``nnodes`` agents (to see what happens when a node
        never joins); the run then ends with :class:`RendezvousTimedOut`.
    rdzv_timeout: seconds the agents wait for every node to join.
    netns: ``(network namespace, address)`` per node, to run each node's agent in a network
        namespace of its own (Linux, root) so that traffic between nodes crosses a real
        interface; node 0's address hosts the rendezvous.
    cpu: run on the CPU with gloo even where GPUs are visible (hides them from the ranks).
    env: extra environment variables for every rank.
    torchrun_args: extra options for torchrun itself.

    Raises :class:`RankFailed` (naming the rank, its exit code and last lines),
    :class:`RunTimedOut`, :class:`RendezvousTimedOut` or :class:`RunInterrupted`; no
    process of the run survives any of them. The manifest ``run.json`` is written in every case.
    """
    script = Path(script)
    if not script.is_file():
        raise FileNotFoundError(f"script {script}: no such file (the working directory is "
                                f"{Path.cwd().name}/); write it first, e.g. with %%writefile")
    device, backend, gpus = ("cpu", "gloo", 0) if cpu else detect_device()
    if nproc is None:
        nproc = gpus or 2
    if nproc < 1 or nnodes < 1:
        raise ValueError(f"nproc={nproc}, nnodes={nnodes}: need at least one of each")
    start_nodes = nnodes if start_nodes is None else start_nodes
    experiment = experiment or script.stem
    run_id, run_dir = new_run_dir(experiment, traces_root)
    if netns and len(netns) != nnodes:
        raise ValueError(f"netns: {len(netns)} namespaces given for {nnodes} nodes")
    port = free_port()
    host = netns[0][1] if netns else "127.0.0.1"
    node_dirs = [run_dir] if nnodes == 1 else [run_dir / f"node{n}" for n in range(nnodes)]
    commands = []
    for node, node_dir in enumerate(node_dirs):
        prefix, rdzv_conf, local_addr = [], f"join_timeout={rdzv_timeout:g}", []
        if netns:
            namespace, address = netns[node]
            prefix = ["ip", "netns", "exec", namespace]
            rdzv_conf += f",is_host={int(node == 0)}"  # node 0's address hosts the rendezvous
            local_addr = [f"--local-addr={address}"]
        commands.append([
            *prefix, sys.executable, "-m", "torch.distributed.run",
            f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={host}:{port}", f"--rdzv-id={run_id}",
            f"--rdzv-conf={rdzv_conf}", *local_addr,
            "--redirects=3", f"--log-dir={node_dir / 'logs'}",
            *torchrun_args, str(script), *map(str, args),
        ])
    child_env = dict(os.environ)
    child_env.update({
        "DIST_BACKEND": backend, RUN_MARKER: run_id, "PYTHONUNBUFFERED": "1",
        "KINETO_LOG_LEVEL": child_env.get("KINETO_LOG_LEVEL", "5"),
        "LOGLEVEL": "INFO",  # torchrun then logs which global ranks each node got
    })
    if device == "cpu":
        child_env["OMP_NUM_THREADS"] = "1"
    if cpu:
        child_env["CUDA_VISIBLE_DEVICES"] = ""
    child_env.update(env or {})
    record = RunRecord(
        experiment=experiment, run_id=run_id, run_dir=run_dir,
        command=["python" if part == sys.executable else part for part in commands[0]],
        script=script.name, args=list(map(str, args)), nproc=nproc, nnodes=nnodes,
        world_size=nproc * nnodes, backend=backend, device=device,
        started=_dt.datetime.now().isoformat(timespec="seconds"),
    )
    record.save()
    if echo:
        nodes = f" on {nnodes} nodes" if nnodes > 1 else ""
        print(f"launching {script.name} with {record.world_size} ranks{nodes} ({device}, "
              f"{backend}) -> {record.relative_dir()}", flush=True)

    rank_lines: dict[int, deque[str]] = {}
    t0 = time.monotonic()
    agents = []
    for node, (command, node_dir) in enumerate(zip(commands[:start_nodes], node_dirs)):
        node_dir.mkdir(parents=True, exist_ok=True)
        agents.append(_Agent(node, command, {**child_env, "RUN_DIR": str(node_dir),
                                             "NODE_NAME": f"node{node}"}, node_dir, nnodes))

    def take_rank_lines(final: bool = False) -> None:
        for agent in agents:
            for rank, text in agent.logs.poll(final):
                text = shorten_paths(re.sub(rf"^\[rank{rank}\]: ?", "", text))  # torch's prefix
                rank_lines.setdefault(rank, deque(maxlen=2000)).append(text)
                if echo and not NOISE.search(text):
                    print(f"[rank{rank}] {text}", flush=True)

    def stop_all(grace: float = 3.0) -> None:
        stop_run_processes([a.process for a in agents], run_id, grace)

    def finish(status: str, exit_codes: dict[int, int | None]) -> None:
        take_rank_lines(final=True)
        record.status = status
        record.exit_codes = exit_codes
        record.nodes = {a.node: list(range(a.logs.first_rank, a.logs.first_rank + nproc))
                        for a in agents if a.logs.first_rank is not None}
        record.ended = _dt.datetime.now().isoformat(timespec="seconds")
        record.seconds = round(time.monotonic() - t0, 3)
        record.output = {r: list(d) for r, d in sorted(rank_lines.items())}
        record.save()

    unknown = {r: None for r in range(record.world_size)}
    try:
        while not all(a.finished for a in agents):
            if time.monotonic() - t0 > timeout:
                stop_all()
                finish("timeout", unknown)
                raise RunTimedOut(f"run {record.relative_dir()} was still going after "
                                  f"{timeout:g} s and was killed with all its processes; "
                                  f"raise timeout= if it needs longer", record)
            time.sleep(0.1)
            for agent in agents:
                agent.drain()
            take_rank_lines()
            if any(a.finished and a.process.returncode != 0 for a in agents):
                break  # one node failed: stop the others rather than let them hang
    except KeyboardInterrupt:
        stop_all()
        finish("interrupted", unknown)
        raise RunInterrupted(f"run {record.relative_dir()} was interrupted; all its "
                             f"processes were stopped", record) from None

    stop_all(grace=1.0)  # normally finds nothing left
    for agent in agents:
        agent.drain()
    if all(a.finished and a.process.returncode == 0 for a in agents):
        finish("ok", {r: 0 for r in range(record.world_size)})
        return record

    agent_lines = [line for a in agents for line in a.lines]
    if any("RendezvousTimeoutError" in line for line in agent_lines):
        finish("rendezvous timeout", unknown)
        raise RendezvousTimedOut(
            f"the rendezvous timed out after {rdzv_timeout:g} s: {start_nodes} of {nnodes} nodes "
            f"joined. Every node must run torchrun with the same --nnodes, --rdzv-endpoint "
            f"and --rdzv-id, and reach the endpoint's host and port", record)
    rank, failed = _failed_ranks(agent_lines)
    finish("failed", {r: failed.get(r) for r in range(record.world_size)})
    if rank is None:
        tail = "\n".join("    " + line for line in agent_lines[-LAST_LINES:])
        raise LaunchError(f"torchrun exited before any rank reported; its last lines:\n{tail}",
                          record)
    code = failed[rank]
    last = list(rank_lines.get(rank, []))[-LAST_LINES:]
    shown = "\n".join("    " + line for line in last) or "    (no output)"
    raise RankFailed(f"rank {rank} exited with code {code}; the other ranks were stopped. "
                     f"Last lines of rank {rank}:\n{shown}", record, rank, code, last)
