"""Inside a rank: PyTorch's per-rank debug server, listening on loopback only.

torch 2.14's ``torch.distributed.debug.start_debug_server()`` starts two things: in every
rank a small HTTP *worker server* whose handlers return the rank's Python stacks, its Flight
Recorder entries as JSON, its wait counters, or a ``torch.profiler`` capture of N seconds; and
on rank 0 a web *frontend* that asks every rank's worker server and shows the answers. In 2.14
the worker servers listen on ``::`` and the frontend on every interface, with no option to
change it, and their handlers run a profiler or dump stacks for anyone who asks.

A script of this series calls :func:`serve_debug_requests` instead: it starts only the worker
server, through the private class ``torch._C._distributed_c10d._WorkerServer``, bound to
127.0.0.1, and writes its address to ``RUN_DIR/debug_server/rank<N>.json`` where the notebook
(:mod:`.questions`) finds it; the notebook then does the frontend's job itself. This module
is the one place the series touches that private API: if a later torch changes it, this is
what to change.
"""

from __future__ import annotations

import atexit
import json
import os
import urllib.request
from pathlib import Path

from .._files import write_atomically

__all__ = ["serve_debug_requests", "start_worker_server", "ask_server", "SERVERS_FOLDER"]

SERVERS_FOLDER = "debug_server"  # in the run folder: rank<N>.json, each rank's address


def start_worker_server(host: str = "127.0.0.1") -> tuple[object, str]:
    """PyTorch's worker server on ``host`` and a free port, with the ``torch_profile`` handler
    registered: the server (``shutdown()`` stops it) and its address ``http://host:port``."""
    import torch.distributed.debug._handlers  # noqa: F401  registers the torch_profile handler
    from torch._C._distributed_c10d import _WorkerServer

    server = _WorkerServer(host, 0)
    where = f"[{host}]" if ":" in host else host
    return server, f"http://{where}:{server.port}"


def serve_debug_requests(host: str = "127.0.0.1") -> str:
    """Start this rank's debug server on ``host`` (loopback unless you name another address:
    never one an untrusted network reaches) and a free port; return its address
    (``http://127.0.0.1:<port>``), also written to ``RUN_DIR/debug_server/rank<RANK>.json``.
    The server stops when the process exits."""
    server, address = start_worker_server(host)
    atexit.register(server.shutdown)
    rank = int(os.environ.get("RANK", "0"))
    folder = Path(os.environ.get("RUN_DIR", ".")) / SERVERS_FOLDER
    record = {"rank": rank, "address": address, "pid": os.getpid()}
    write_atomically(folder / f"rank{rank}.json", json.dumps(record))  # never half a file
    return address


def ask_server(address: str, handler: str, timeout: float, max_bytes: int) -> bytes | None:
    """POST ``/handler/<handler>`` to a rank's debug server. Network errors (``OSError``,
    ``http.client.HTTPException``) pass through.

    Args:
        address: the server's ``http://host:port``.
        handler: the question (``dump_traceback``, ``fr_trace_json``...).
        timeout: seconds each network operation may wait (urllib's timeout).
        max_bytes: the most of the answer to read.

    Returns:
        The answer, or None when it is longer than ``max_bytes``.
    """
    request = urllib.request.Request(f"{address}/handler/{handler}", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read(max_bytes + 1)
    return None if len(body) > max_bytes else body
