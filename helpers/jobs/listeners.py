"""Where a run listens: the network interface, its address, and what listened, measured.

Every listener of a run binds one interface, the loopback one unless ``launch(interface=...)``
names another: torchrun's two TCPStore servers (each agent runs :data:`_AGENT_PROGRAM`, torchrun
with its stores bound to one address), gloo, TensorPipe and NCCL (told by
:data:`INTERFACE_VARIABLES`). :class:`ListenerWatch` samples what the processes of runs actually
listen on, for the doctor and the tests.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from ._guard import RUN_MARKER, processes_of_run

__all__ = [
    "INTERFACE_VARIABLES",
    "free_port",
    "loopback_interface",
    "interface_address",
    "Listener",
    "ListenerWatch",
    "listeners_of",
    "listeners_of_run",
]

# The variables that choose the network interface where each library listens and connects:
# gloo's pairs, TensorPipe (RPC), NCCL's bootstrap. Without them each binds the address that
# the host name resolves to, the LAN address on many laptops.
INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


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
    :class:`Listener`, one per socket. For the doctor and the tests: what a run exposes,
    measured."""

    def __init__(self, traces_root: str | Path, every: float = 0.1):
        self.traces_root = Path(traces_root).resolve()
        self.every = every
        self.seen: set[Listener] = set()
        self._sockets: set[tuple[str, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, daemon=True)

    def __enter__(self) -> ListenerWatch:
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
                    env = proc.environ()
                    run_dir = Path(env.get("RUN_DIR", "/")).resolve()
                    if RUN_MARKER in env and run_dir.is_relative_to(self.traces_root):
                        self.add(listeners_of(proc))
                except (psutil.Error, OSError, ValueError):
                    continue

    def add(self, listeners: list[Listener]) -> None:
        """Keep each socket of ``listeners`` once, as the first process seen holding it: a
        child that a run's process forks holds its parent's sockets (and command line) until it
        runs its own program, and a sample in that moment sees them again under its pid."""
        for listener in listeners:
            if (listener.address, listener.port) not in self._sockets:
                self._sockets.add((listener.address, listener.port))
                self.seen.add(listener)


def listeners_of(proc) -> list[Listener]:
    """The TCP sockets that ``proc`` (a ``psutil.Process`` of a run) listens on now, each told
    as the torchrun agent's or a rank's; psutil's errors pass through."""
    import psutil

    command = proc.cmdline()
    agent = _AGENT_PROGRAM in command or "torch.distributed.run" in command
    kind = "torchrun agent" if agent else "rank"
    return [
        Listener(kind, proc.pid, c.laddr.ip, c.laddr.port)
        for c in proc.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]


def listeners_of_run(run_id: str) -> list[Listener]:
    """Every TCP socket a process of the run ``run_id`` listens on now (processes that end
    while they are looked at are left out)."""
    import psutil

    found = []
    for proc in processes_of_run(run_id):
        try:
            found += listeners_of(proc)
        except (psutil.Error, OSError):
            continue
    return found


def with_bound_stores(command: list[str], address: str) -> list[str]:
    """The torchrun ``command`` run as :data:`_AGENT_PROGRAM`, its stores listening on
    ``address`` only."""
    at = command.index("torch.distributed.run") - 1  # "-m"
    return [*command[:at], "-c", _AGENT_PROGRAM, address, *command[at + 2 :]]
