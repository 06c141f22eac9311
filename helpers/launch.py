"""Start a script as real processes under torchrun and keep a record of the run.

The one call a notebook needs is :func:`launch`::

    run = launch("ranks.py", nproc=4, experiment="ranks")

It picks a free rendezvous port, chooses CPU + gloo or GPUs + nccl (:func:`choose_device`),
gives the run its own folder ``traces/<experiment>/<run-id>/`` with a manifest ``run.json``,
prints each rank's output live with a ``[rankN]`` prefix, and returns a :class:`RunRecord`.
A failing rank, a timeout, an interrupted kernel, or the death of the process that called
``launch`` end the whole run: no torchrun agent or rank of it survives.

The contract between the launcher and a script: every rank receives

``RUN_DIR``       the folder to write traces and other files into (the node's folder on a
                  multi-node run). A script run by hand, without the launcher, uses the
                  current folder: ``os.environ.get("RUN_DIR", ".")``.
``DIST_BACKEND``  ``gloo`` or ``nccl``: pass it to ``init_process_group``. With ``nccl``
                  the rank uses GPU ``LOCAL_RANK``; with ``gloo`` it runs on the CPU
                  (GPUs are then hidden from it).
``RUN_ID``        the run's id (it also marks every process of the run).

plus torchrun's own ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``.

Where a run listens: on one interface, the loopback one unless ``interface=`` names another.
Each torchrun agent is torchrun itself with its two TCPStore servers bound to that interface's
address (:data:`_AGENT_PROGRAM`: torch 2.14 binds them to every interface, and torchrun has no
option for it); ``--local-addr`` makes that address the ranks' ``MASTER_ADDR``; gloo, TensorPipe
and NCCL are told the interface by ``GLOO_SOCKET_IFNAME``, ``TP_SOCKET_IFNAME`` and
``NCCL_SOCKET_IFNAME``. The manifest records the torchrun command, as you would type it.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from . import recorded
from ._guard import RUN_MARKER, processes_of_run, release_guard, start_guard, stop_run_processes
from .kineto_noise import NOISE  # harmless profiler lines: kept in the logs, not echoed
from .runs import (
    LOGS_DIR,
    MANIFEST_NAME,
    LaunchError,
    RankFailed,
    RendezvousTimedOut,
    RunInterrupted,
    RunRecord,
    RunTimedOut,
    _shorten_paths,
    new_run_dir,
    show_path,
)

__all__ = [
    "launch",
    "Device",
    "choose_device",
    "free_port",
    "loopback_interface",
    "interface_address",
    "INTERFACE_VARIABLES",
    "Listener",
    "ListenerWatch",
    "processes_of_run",
    "LaunchError",
    "RankFailed",
    "RunTimedOut",
    "RendezvousTimedOut",
    "RunInterrupted",
]

LAST_LINES = 20  # lines of a failing rank's output quoted in the error
TAIL_LINES = 2000  # lines of each rank's output (and of each agent's) kept in memory
MAX_LINE = 10_000  # characters of a line kept in memory; the log files on disk keep all
_READ_BYTES = 1 << 20  # read from a log file per poll, at most
_FINAL_BYTES = 4 << 20  # read from a log file at the end of a run, at most: its tail


# ----------------------------------------------------------------------------- device


@dataclass(frozen=True)
class Device:
    """Where the ranks run: ``kind`` ``cpu`` or ``cuda``, ``backend`` ``gloo`` or ``nccl``,
    ``gpus`` visible GPUs, and ``reason``: the choice in one sentence."""

    kind: str
    backend: str
    gpus: int
    reason: str

    def nproc(self, cpu: int = 2) -> int:
        """Ranks per node: one per GPU on a GPU node, ``cpu`` on the CPU."""
        return self.gpus if self.kind == "cuda" else cpu


def _visible_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # no torch, or a broken driver: no GPU
        return 0


def choose_device(cpu: bool = False, min_gpus: int = 2, gpus: int | None = None) -> Device:
    """CPU + gloo, or GPUs + nccl (one rank per GPU), and why.

    GPUs are used when at least ``min_gpus`` are visible (2 for a DDP job: each rank needs
    a GPU of its own, and one rank is not a distributed job); with fewer, the ranks run on
    the CPU with gloo. ``cpu=True`` forces the CPU; in recorded mode the device is the
    recordings' (the CPU). ``gpus`` overrides the count (for tests).
    """
    if recorded.replaying():
        return Device("cpu", "gloo", 0, "recorded mode: the runs are replayed from CPU recordings")
    n = _visible_gpus() if gpus is None else gpus
    if cpu:
        return Device("cpu", "gloo", n, "the CPU was asked for (cpu=True)")
    if n >= min_gpus:
        return Device("cuda", "nccl", n, f"{n} GPUs visible: one rank per GPU, nccl")
    if n == 0:
        return Device("cpu", "gloo", 0, "no GPU visible: ranks on the CPU, gloo")
    return Device(
        "cpu",
        "gloo",
        n,
        f"{n} GPU visible but {min_gpus} needed (a GPU per rank): ranks on the CPU, gloo",
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ where a run listens


def loopback_interface() -> str:
    """The name of this machine's loopback interface, the one holding 127.0.0.1 (``lo`` on
    Linux, ``lo0`` on macOS)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    return "lo0" if sys.platform == "darwin" else "lo"


def interface_address(interface: str) -> str:
    """The IPv4 address of the network interface ``interface`` on this machine."""
    import psutil

    interfaces = psutil.net_if_addrs()
    ipv4 = [a.address for a in interfaces.get(interface, []) if a.family == socket.AF_INET]
    if not ipv4:
        have = ", ".join(
            f"{name} ({a.address})"
            for name, addrs in sorted(interfaces.items())
            for a in addrs
            if a.family == socket.AF_INET
        )
        raise ValueError(
            f"interface={interface!r}: no such network interface with an IPv4 address here; "
            f"this machine has {have or 'none'}. Name the interface that joins the nodes"
        )
    return ipv4[0]


# torchrun's agent as launch() runs it: torchrun itself, except that the two TCPStore servers it
# starts (the rendezvous store, and the store where the ranks meet: MASTER_ADDR:MASTER_PORT)
# listen on one address, the first argument, instead of every interface. torch 2.14 binds a
# TCPStore server to all interfaces whatever its host name; handed a socket already listening
# (master_listen_fd), it serves on that socket.
_AGENT_PROGRAM = """\
import runpy, socket, sys
import torch.distributed as dist
from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, dynamic_rendezvous

address = sys.argv.pop(1)

class BoundTCPStore(dist.TCPStore):
    def __init__(self, host_name, port, world_size=None, is_master=False, **kwargs):
        if is_master and kwargs.get("master_listen_fd") is None:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            listener = socket.socket(family, socket.SOCK_STREAM)
            try:
                listener.bind((address, port))
                listener.listen(socket.SOMAXCONN)
            except OSError as err:
                listener.close()
                raise dist.DistNetworkError(f"cannot listen on {address}:{port}: {err}")
            port = listener.getsockname()[1]
            kwargs["master_listen_fd"] = listener.detach()
        super().__init__(host_name, port, world_size, is_master, **kwargs)

def create_tcp_store_server(self, master_addr, master_port):
    return BoundTCPStore(master_addr, master_port, is_master=True, multi_tenant=True)

assert c10d_rendezvous_backend.TCPStore is dist.TCPStore
c10d_rendezvous_backend.TCPStore = BoundTCPStore
handler = dynamic_rendezvous.DynamicRendezvousHandler
assert handler._create_tcp_store_server
handler._create_tcp_store_server = create_tcp_store_server
runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
"""


@dataclass(frozen=True)
class Listener:
    """A TCP socket a process of a run listened on: ``process`` is ``torchrun agent`` or
    ``rank``."""

    process: str
    pid: int
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.address.split("%")[0]).is_loopback


class ListenerWatch:
    """The sockets that processes of runs under ``traces_root`` listen on, sampled every
    ``every`` seconds in a thread while the ``with`` block runs: ``seen``, a set of
    :class:`Listener`. For the doctor and the tests: what a run exposes, measured."""

    def __init__(self, traces_root: str | Path, every: float = 0.1):
        self.traces_root = Path(traces_root).resolve()
        self.every = every
        self.seen: set[Listener] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, daemon=True)

    def __enter__(self) -> "ListenerWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _sample_until_stopped(self) -> None:
        import psutil

        while not self._stop.wait(self.every):
            for proc in psutil.process_iter():
                try:
                    env, command = proc.environ(), proc.cmdline()
                    run_dir = Path(env.get("RUN_DIR", "/")).resolve()
                    if RUN_MARKER not in env or not run_dir.is_relative_to(self.traces_root):
                        continue
                    agent = _AGENT_PROGRAM in command or "torch.distributed.run" in command
                    kind = "torchrun agent" if agent else "rank"
                    for c in proc.net_connections(kind="inet"):
                        if c.status == psutil.CONN_LISTEN:
                            self.seen.add(Listener(kind, proc.pid, c.laddr.ip, c.laddr.port))
                except (psutil.Error, OSError, ValueError):
                    continue


def _with_bound_stores(command: list[str], address: str) -> list[str]:
    """The torchrun ``command`` run as :data:`_AGENT_PROGRAM`, its stores listening on
    ``address`` only."""
    at = command.index("torch.distributed.run") - 1  # "-m"
    return [*command[:at], "-c", _AGENT_PROGRAM, address, *command[at + 2 :]]


# ------------------------------------------------------------ one torchrun agent (a node)


class _RankLogs:
    """Follow the per-rank log files that torchrun writes with ``--redirects``.

    torchrun puts each worker's stdout and stderr in
    ``<log_dir>/<id>/attempt_<n>/<local_rank>/{stdout,stderr}.log``. Reading them
    ourselves (rather than torchrun's echo to the console) keeps each line whole and
    labelled with its rank. ``poll()`` returns the complete new lines as
    ``(rank, line)``; ``poll(final=True)`` also returns an unfinished last line.

    Memory stays bounded whatever a rank prints: a poll reads at most ``_READ_BYTES`` of a
    file, the final one its last ``_FINAL_BYTES`` (saying how much it skipped), and a line
    longer than ``MAX_LINE`` characters is cut. The files keep everything.
    """

    def __init__(self, log_dir: Path, first_rank: int | None = 0):
        self.log_dir = log_dir
        self.first_rank = first_rank  # None until known (multi-node: from torchrun's log)
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self._cutting: set[Path] = set()  # files in the middle of a line too long to keep

    def poll(self, final: bool = False) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        if self.first_rank is None:
            return out
        # stdout before stderr, so an error message follows the output that led to it
        paths = self.log_dir.glob("*/attempt_*/*/std*.log")
        for path in sorted(paths, key=lambda p: (p.parent, p.name != "stdout.log")):
            rank = self.first_rank + int(path.parent.name)
            offset = self._offsets.get(path, 0)
            try:
                with path.open("rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    if final and size - offset > _FINAL_BYTES:
                        skipped, offset = size - _FINAL_BYTES - offset, size - _FINAL_BYTES
                        self._partial.pop(path, None)
                        self._cutting.add(path)  # the tail starts inside a line
                        out.append((rank, f"[{skipped:,} bytes not shown: see {show_path(path)}]"))
                    f.seek(offset)
                    data = f.read(_FINAL_BYTES if final else _READ_BYTES)
            except OSError:
                continue
            self._offsets[path] = offset + len(data)
            out.extend((rank, line) for line in self._lines(path, data, final))
        return out

    def _lines(self, path: Path, data: bytes, final: bool) -> list[str]:
        """The complete lines of ``path`` that ``data`` ends, each cut to ``MAX_LINE``."""
        *complete, rest = (self._partial.pop(path, b"") + data).split(b"\n")
        if path in self._cutting:  # drop the rest of a line already cut
            if complete:
                complete.pop(0)
                self._cutting.discard(path)
            else:
                rest = b""
        if len(rest) > MAX_LINE:  # a line too long to wait for: cut it now
            complete.append(rest)
            rest = b""
            self._cutting.add(path)
        if rest and final:
            complete.append(rest)
        elif rest:
            self._partial[path] = rest
        return [_cut(line.decode(errors="replace")) for line in complete]


def _cut(line: str) -> str:
    """``line``, cut to ``MAX_LINE`` characters."""
    return line if len(line) <= MAX_LINE else line[:MAX_LINE] + " [line cut]"


_GLOBAL_RANKS = re.compile(r"global_ranks=\[(\d+)")


class _Agent:
    """One torchrun agent (one node) of a run: its process, its output, its ranks' logs."""

    def __init__(
        self, node: int, command: list[str], env: dict[str, str], node_dir: Path, nnodes: int
    ):
        self.node = node
        self.lines: deque[str] = deque(maxlen=TAIL_LINES)  # torchrun's own output, its tail
        self.logs = _RankLogs(node_dir / LOGS_DIR, first_rank=0 if nnodes == 1 else None)
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
            self.lines.append(_cut(line))
            m = _GLOBAL_RANKS.search(line)
            if m and self.logs.first_rank is None:
                self.logs.first_rank = int(m.group(1))


# ------------------------------------------------------------------ the steps of a launch


def _agent_commands(
    script: Path,
    args: Sequence[str],
    nproc: int,
    nnodes: int,
    run_id: str,
    node_dirs: Sequence[Path],
    rdzv_timeout: float,
    addresses: Sequence[str],
    netns: Sequence[tuple[str, str]],
) -> list[list[str]]:
    """The torchrun command of each node, which is known to the others by its address in
    ``addresses``; node 0 hosts the rendezvous. With ``netns`` each node's agent runs in its
    network namespace."""
    endpoint = f"{addresses[0]}:{free_port(addresses[0]) if not netns else free_port()}"
    commands = []
    for node, node_dir in enumerate(node_dirs):
        prefix, rdzv_conf = [], f"join_timeout={rdzv_timeout:g}"
        if netns:
            prefix = ["ip", "netns", "exec", netns[node][0]]
        rdzv_conf += f",is_host={int(node == 0)}"  # not left to torchrun's guess by host name
        commands.append(
            [
                *prefix,
                sys.executable,
                "-m",
                "torch.distributed.run",
                f"--nnodes={nnodes}",
                f"--nproc-per-node={nproc}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}",
                f"--rdzv-id={run_id}",
                f"--rdzv-conf={rdzv_conf}",
                f"--local-addr={addresses[node]}",
                "--redirects=3",
                f"--log-dir={node_dir / LOGS_DIR}",
                str(script),
                *map(str, args),
            ]
        )
    return commands


# The variables that choose the network interface where each library listens and connects:
# gloo's pairs, TensorPipe (RPC), NCCL's bootstrap. Without them each binds the address that
# the host name resolves to, the LAN address on many laptops.
INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def _rank_environment(
    device: Device, run_id: str, interface: str, extra: dict[str, str] | None
) -> dict[str, str]:
    """The environment every agent and rank starts with (``RUN_DIR`` is added per node):
    ours over the caller's environment, ``extra`` over ours."""
    env = dict(os.environ)
    env.update(
        {
            "DIST_BACKEND": device.backend,
            RUN_MARKER: run_id,
            "PYTHONUNBUFFERED": "1",
            "KINETO_LOG_LEVEL": env.get("KINETO_LOG_LEVEL", "5"),
            "LOGLEVEL": "INFO",  # torchrun then logs which global ranks each node got
            **dict.fromkeys(INTERFACE_VARIABLES, interface),
        }
    )
    if device.kind == "cpu":
        env["OMP_NUM_THREADS"] = "1"  # ranks share the cores: one thread each
        if device.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ""  # gloo on the CPU: hide the GPUs
    env.update(extra or {})
    return env


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

    def __enter__(self) -> "_CtrlC":
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


class _Run:
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
                text = _shorten_paths(re.sub(rf"^\[rank{rank}\]: ?", "", text))  # torch's prefix
                self.rank_lines.setdefault(rank, deque(maxlen=TAIL_LINES)).append(text)
                if not NOISE.search(text):
                    self.echoed.append((rank, text))
                    if self.echo:
                        print(f"[rank{rank}] {text}", flush=True)

    def watch(self, timeout: float) -> str:
        """Follow the run until every agent ends (``ok`` or ``failed``: one failed node
        ends the watch), the timeout passes (``timeout``) or the kernel is interrupted
        (``interrupted``). The run's processes are stopped in every case."""
        outcome = "ok"
        with _CtrlC() as ctrl_c:
            while not all(a.finished for a in self.agents):
                if ctrl_c.pressed:
                    outcome = "interrupted"
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


def _quoted(lines: Sequence[str]) -> str:
    return "\n".join("    " + line for line in lines) or "    (no output)"


def _conclude(
    run: _Run, outcome: str, timeout: float, rdzv_timeout: float, started_nodes: int
) -> LaunchError | None:
    """Record how the run ended; the error to raise, or None when it went well."""
    record = run.record
    unknown = {r: None for r in range(record.world_size)}
    where = record.relative_dir()
    if outcome == "ok":
        run.finish("ok", {r: 0 for r in range(record.world_size)})
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
    rank, failed = _failed_ranks(agent_lines)
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


def _existing_script(script: str | Path) -> Path:
    script = Path(script)
    if not script.is_file():
        raise FileNotFoundError(
            f"script {script}: no such file (the working directory is "
            f"{Path.cwd().name}/); write it first, e.g. with %%writefile"
        )
    return script


def _new_record(
    script: Path,
    args: Sequence[str],
    nproc: int,
    nnodes: int,
    device: Device,
    run_dir: Path,
    command: list[str],
    echo: bool,
) -> RunRecord:
    """The record of a run that is starting, saved as its manifest (and announced)."""
    record = RunRecord(
        experiment=run_dir.parent.name,
        run_id=run_dir.name,
        run_dir=run_dir,
        command=["python" if part == sys.executable else part for part in command],
        script=script.name,
        args=list(map(str, args)),
        nproc=nproc,
        nnodes=nnodes,
        world_size=nproc * nnodes,
        backend=device.backend,
        device=device.kind,
        started=_dt.datetime.now().isoformat(timespec="seconds"),
    )
    record.save()
    if echo:
        print(f"launching {record.describe()}", flush=True)
    return record


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
    cpu: bool = False,
    env: dict[str, str] | None = None,
    traces_root: str | Path | None = None,
    interface: str | None = None,
    netns: Sequence[tuple[str, str]] = (),
) -> RunRecord:
    """Run ``script`` under torchrun (``python -m torch.distributed.run``); return its RunRecord.

    nproc: ranks per node (default: one per GPU on a GPU node, else 2). experiment: the folder
    under ``traces/`` (default: the script's name). args: the script's arguments. timeout:
    seconds before the whole run is killed (:class:`RunTimedOut`). echo: print each rank's
    lines live, prefixed ``[rankN]``. nnodes: nodes, each a torchrun agent of its own that
    meets the others through the c10d rendezvous as on a cluster, with its own folder
    ``node<N>/`` as its ``RUN_DIR``; start_nodes: start only that many (the run then ends in
    :class:`RendezvousTimedOut` after ``rdzv_timeout`` s). cpu: CPU and gloo even with GPUs.
    env: extra environment variables for the ranks (over the launcher's own). traces_root:
    instead of ``traces/``.

    interface: the network interface where every listener of the run binds and where the ranks
    connect: torchrun's two stores, gloo, TensorPipe (RPC), NCCL's bootstrap. By default the
    loopback interface, so that nothing of a run on one machine can be reached from another;
    name the interface that joins the nodes (``eth0``) when they are separate hosts.
    netns: ``(namespace, address)`` per node, each agent in its own network namespace
    (Linux, root), so that traffic between nodes crosses a real interface (``interface``,
    which then names the interface inside the namespaces, is required).

    Raises :class:`RankFailed` (naming the rank, its exit code and last lines),
    :class:`RunTimedOut`, :class:`RendezvousTimedOut` or :class:`RunInterrupted`: no process
    of the run survives them, nor the death of the calling process. ``run.json`` is written
    in every case. In recorded mode the matching recorded run is replayed instead.
    """
    script = _existing_script(script)
    start_nodes = nnodes if start_nodes is None else start_nodes
    device = choose_device(cpu=cpu)  # in recorded mode: the recordings' CPU
    nproc = nproc or device.nproc()
    if recorded.replaying():
        return recorded.replay(
            script, nproc, experiment or script.stem, args, nnodes, start_nodes, echo, traces_root
        )
    if nproc < 1 or nnodes < 1 or (netns and (len(netns) != nnodes or not interface)):
        raise ValueError(
            f"nproc={nproc}, nnodes={nnodes}, {len(netns)} namespaces, interface={interface!r}: "
            f"need at least one rank and one node, and with netns= a namespace per node and the "
            f"interface that joins them"
        )
    if netns:
        addresses = [address for _, address in netns]
    else:
        interface = interface or loopback_interface()
        addresses = [interface_address(interface)] * nnodes
    run_id, run_dir = new_run_dir(experiment or script.stem, traces_root)
    node_dirs = [run_dir] if nnodes == 1 else [run_dir / f"node{n}" for n in range(nnodes)]
    commands = _agent_commands(
        script, args, nproc, nnodes, run_id, node_dirs, rdzv_timeout, addresses, netns
    )
    record = _new_record(script, args, nproc, nnodes, device, run_dir, commands[0], echo)
    programs = [_with_bound_stores(c, a) for c, a in zip(commands, addresses)]
    guard, guard_pipe = start_guard(run_dir / MANIFEST_NAME, run_id)
    try:
        run = _Run(
            record,
            programs[:start_nodes],
            _rank_environment(device, run_id, interface, env),
            node_dirs,
            echo,
        )
        error = _conclude(run, run.watch(timeout), timeout, rdzv_timeout, start_nodes)
    except BaseException:
        stop_run_processes([], run_id)
        raise
    finally:
        release_guard(guard, guard_pipe)
    if recorded.recording():
        recorded.save_recording(record, list(run.echoed), error, start_nodes)
    if error is not None:
        raise error
    return record
