"""Keep the profiler's harmless C++ log lines out of a notebook.

The CUDA build of PyTorch prints lines such as ``USDT: ... profiler_start`` to file
descriptor 2 each time a profiler starts or stops, and on a machine without a GPU
``ERROR: ... gpuGetDeviceCount failed``; a rank's debug server (lesson 9) logs its start and
stop from ``WorkerServer.cpp``, with port 0 where it means "a free port". They say nothing
about your program.
:func:`hide_kineto_noise` filters exactly those lines from this process's stderr and
passes every other line through unchanged. The launcher applies the same filter to
the ranks' output (their log files keep everything).
"""

from __future__ import annotations

import os
import re
import threading

#: Lines that are noise from the profiler's C++ side, not messages for you.
NOISE = re.compile(r"USDT:|gpuGetDeviceCount failed|cudaGetDeviceCount|CUPTI|WorkerServer\.cpp")

__all__ = ["NOISE", "hide_kineto_noise"]

_installed = False


def hide_kineto_noise() -> None:
    """Drop the profiler's noise lines from fd 2 from now on (idempotent)."""
    global _installed
    if _installed:
        return
    read_end, write_end = os.pipe()
    target = os.dup(2)  # where stderr went until now (a notebook's capture pipe, a terminal)
    os.dup2(write_end, 2)
    os.close(write_end)

    def forward() -> None:
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            pending = b""
            while chunk := pipe.read(65536):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                kept = [line for line in lines if not NOISE.search(line.decode(errors="replace"))]
                if kept:
                    os.write(target, b"\n".join(kept) + b"\n")
            if pending:
                os.write(target, pending)

    threading.Thread(target=forward, name="kineto-noise-filter", daemon=True).start()
    _installed = True
