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
address (``_AGENT_PROGRAM`` in ``helpers/jobs/listeners.py``: torch 2.14 binds them to every
interface, and torchrun has no option for it); ``--local-addr`` makes that address the ranks'
``MASTER_ADDR``; gloo, TensorPipe and NCCL are told the interface by ``GLOO_SOCKET_IFNAME``,
``TP_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME``. The manifest records the torchrun command, as
you would type it.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import recorded
from ._guard import RUN_MARKER, processes_of_run, release_guard, start_guard, stop_run_processes
from ._liverun import LiveRun, conclude
from .background import BackgroundRun
from .device import Device, choose_device
from .listeners import (
    INTERFACE_VARIABLES,
    free_port,
    interface_address,
    loopback_interface,
    with_bound_stores,
)
from .runs import LOGS_DIR, MANIFEST_NAME, RunRecord, new_run_dir, usable_cores

__all__ = ["launch", "launch_in_background", "processes_of_run"]

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
        cores=usable_cores(),
    )
    record.save()
    if echo:
        print(f"launching {record.describe()}", flush=True)
    return record


def _listen_addresses(
    nproc: int, nnodes: int, interface: str | None, netns: Sequence[tuple[str, str]]
) -> tuple[str | None, list[str]]:
    """The interface a run listens on and each node's address (with ``netns``, the
    namespaces'); a ValueError for a run that cannot be."""
    if nproc < 1 or nnodes < 1 or (netns and (len(netns) != nnodes or not interface)):
        raise ValueError(
            f"nproc={nproc}, nnodes={nnodes}, {len(netns)} namespaces, interface={interface!r}: "
            f"need at least one rank and one node, and with netns= a namespace per node and the "
            f"interface that joins them"
        )
    if netns:
        return interface, [address for _, address in netns]
    interface = interface or loopback_interface()
    return interface, [interface_address(interface)] * nnodes


def _run_folders(
    experiment: str, traces_root: str | Path | None, nnodes: int
) -> tuple[str, Path, list[Path]]:
    """A new run's id and folder, and each node's folder (the run's own on one node)."""
    run_id, run_dir = new_run_dir(experiment, traces_root)
    node_dirs = [run_dir] if nnodes == 1 else [run_dir / f"node{n}" for n in range(nnodes)]
    return run_id, run_dir, node_dirs


def _watch_run(
    prepared: _Prepared,
    timeout: float,
    stop: threading.Event | None = None,
    on_start: Callable[[LiveRun], None] | None = None,
) -> RunRecord:
    """Start the agents of a ``prepared`` run under the run's guard and follow them to the end
    (or until ``stop`` is set; ``on_start`` is handed the live run): the record, or the error
    of the run raised. No process of the run outlives an exception."""
    record, o = prepared.record, prepared.options
    guard, guard_pipe = start_guard(record.run_dir / MANIFEST_NAME, record.run_id)
    try:
        run = LiveRun(record, prepared.programs, prepared.env, prepared.node_dirs, o.echo)
        if on_start is not None:
            on_start(run)
        outcome = run.watch(timeout, stop)
        error = conclude(run, outcome, timeout, o.rdzv_timeout, o.start_nodes)
    except BaseException:
        stop_run_processes([], record.run_id)
        raise
    finally:
        release_guard(guard, guard_pipe)
    if recorded.recording():
        recorded.save_recording(record, list(run.echoed), error, o.start_nodes)
    if error is not None:
        raise error
    return record


@dataclass(frozen=True)
class _Prepared:
    """A run ready to start: its record (and manifest), the agents' programs and environment,
    each node's folder, and what the launch was asked for."""

    record: RunRecord
    programs: list[list[str]]
    env: dict[str, str]
    node_dirs: list[Path]
    options: _Options


@dataclass(frozen=True)
class _Options:
    """What a launch was asked for, besides the script, its ranks and the device."""

    experiment: str | None
    args: Sequence[str]
    echo: bool
    env: dict[str, str] | None
    traces_root: str | Path | None
    interface: str | None
    nnodes: int = 1
    start_nodes: int = 1
    rdzv_timeout: float = 60.0
    netns: Sequence[tuple[str, str]] = ()


def _prepare(script: Path, nproc: int, device: Device, o: _Options) -> _Prepared:
    """Everything a live launch does before its processes start."""
    interface, addresses = _listen_addresses(nproc, o.nnodes, o.interface, o.netns)
    run_id, run_dir, node_dirs = _run_folders(o.experiment or script.stem, o.traces_root, o.nnodes)
    commands = _agent_commands(
        script,
        o.args,
        nproc,
        o.nnodes,
        run_id,
        node_dirs,
        o.rdzv_timeout,
        addresses,
        o.netns,
    )
    record = _new_record(script, o.args, nproc, o.nnodes, device, run_dir, commands[0], o.echo)
    programs = [with_bound_stores(c, a) for c, a in zip(commands, addresses)]
    env = _rank_environment(device, run_id, interface, o.env)
    return _Prepared(record, programs[: o.start_nodes], env, node_dirs, o)


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
    """Run ``script`` under torchrun (``python -m torch.distributed.run``) until it ends.

    Args:
        script: the script to run (it must exist).
        nproc: ranks per node (default: one per GPU on a GPU node, else 2).
        experiment: the run's folder under ``traces/`` (default: the script's name).
        args: the script's arguments.
        timeout: seconds before the whole run is killed (:class:`RunTimedOut`).
        echo: print each rank's lines live, prefixed ``[rankN]``.
        nnodes: nodes, each a torchrun agent of its own, with its own folder ``node<N>/`` as
            its ``RUN_DIR``, that meets the others through the c10d rendezvous as on a cluster.
        start_nodes: start only that many of the nodes (default: all); the run then ends in
            :class:`RendezvousTimedOut`.
        rdzv_timeout: seconds the nodes wait for each other at the rendezvous.
        cpu: CPU and gloo even with GPUs.
        env: extra environment variables for the ranks (over the launcher's own).
        traces_root: the folder to use instead of ``traces/``.
        interface: where every listener of the run binds and the ranks connect (see the
            module): by default the loopback interface, so that nothing of a run on one
            machine can be reached from another; name the one that joins the nodes
            (``eth0``) when they are separate hosts.
        netns: ``(namespace, address)`` per node, each agent in its own network namespace
            (Linux, root), so that traffic between nodes crosses a real interface
            (``interface`` is then required, and names the interface inside them).

    Returns:
        The run's :class:`RunRecord` (its ``run.json`` is written whatever happens). In
        recorded mode, the matching recorded run, replayed.

    Raises:
        RankFailed: a rank failed (the error names it, its exit code and last lines).
        RunTimedOut, RendezvousTimedOut, RunInterrupted: no process of the run survives
            them, nor the death of the calling process.
    """
    start_nodes = nnodes if start_nodes is None else start_nodes
    options = _Options(experiment, args, echo, env, traces_root, interface, nnodes, start_nodes, rdzv_timeout, netns)  # fmt: skip
    script, nproc, device = _script_and_ranks(script, nproc, cpu)
    if recorded.replaying():
        return _replay(script, nproc, options)
    return _watch_run(_prepare(script, nproc, device, options), timeout)


def _script_and_ranks(script: str | Path, nproc: int | None, cpu: bool) -> tuple[Path, int, Device]:
    """The script (which must exist), the ranks per node, and the device of a launch."""
    script = _existing_script(script)
    device = choose_device(cpu=cpu)  # in recorded mode: the recordings' CPU
    return script, nproc or device.nproc(), device


def _replay(script: Path, nproc: int, o: _Options) -> RunRecord:
    """The launch answered by its recording (recorded mode)."""
    experiment = o.experiment or script.stem
    return recorded.replay(
        script, nproc, experiment, o.args, o.nnodes, o.start_nodes, o.echo, o.traces_root
    )


def launch_in_background(
    script: str | Path,
    nproc: int | None = None,
    *,
    experiment: str | None = None,
    args: Sequence[str] = (),
    timeout: float = 300.0,
    echo: bool = False,
    cpu: bool = False,
    env: dict[str, str] | None = None,
    traces_root: str | Path | None = None,
    interface: str | None = None,
) -> BackgroundRun:
    """Start ``script`` under torchrun like :func:`launch` (one node), but return at once.

    Every guarantee of :func:`launch` holds: the run's errors are raised by ``wait()``; no
    process of the run outlives ``stop()``, the timeout, or the process that started it (a
    notebook kernel restarted or killed included).

    Args:
        script: the script to run (it must exist).
        nproc: ranks (default: one per GPU on a GPU node, else 2).
        experiment: the run's folder under ``traces/`` (default: the script's name).
        args: the script's arguments.
        timeout: seconds before the whole run is killed.
        echo: print each rank's lines live; off by default, the lines are kept
            (``output()``) rather than printed into whichever cell runs at that moment.
        cpu: CPU and gloo even with GPUs.
        env: extra environment variables for the ranks.
        traces_root: the folder to use instead of ``traces/``.
        interface: where the run's listeners bind (default: loopback; see :func:`launch`).

    Returns:
        A :class:`BackgroundRun` to look at the run while it goes (its folder, its ranks'
        output), then ``wait()`` for its end or ``stop()`` it. In recorded mode the recording
        is replayed: the handle is already finished, with the recorded files and output.
    """
    options = _Options(experiment, args, echo, env, traces_root, interface)
    script, nproc, device = _script_and_ranks(script, nproc, cpu)
    if recorded.replaying():
        return BackgroundRun.from_recording(lambda: _replay(script, nproc, options))
    prepared = _prepare(script, nproc, device, options)
    return BackgroundRun(
        prepared.record,
        lambda stop, on_start: _watch_run(prepared, timeout, stop, on_start),
    )
