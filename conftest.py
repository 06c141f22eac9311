"""Root pytest set-up for the notebooks.

Their stderr is never compared with nbval: Kineto (the profiler's C++ side) and torchrun write
harmless lines to stderr that differ between machines (a CUDA build on a CPU-only machine,
thread ids, times). What a lesson claims is asserted in the notebook's own code instead.

A notebook's kernel that dies as it starts, before running any cell, is started once more, with
a warning that shows what it wrote: jupyter_client picks a kernel's ports before the kernel binds
them, and on a machine where other processes are starting or finishing (rank processes, the
other test worker's kernel) one can be taken in between. A cell's failure is never retried.
"""

from __future__ import annotations

import tempfile
import warnings

import nbval.kernel

_start_new_kernel = nbval.kernel.start_new_kernel


def start_new_kernel(*args, **kwargs):
    """nbval's ``start_new_kernel``, started a second time where the kernel died before it
    replied; its first stderr kept in a temporary file (nbval sends it to /dev/null) to be
    shown."""
    with tempfile.TemporaryFile("w+") as stderr:
        try:
            return _start_new_kernel(*args, **{**kwargs, "stderr": stderr})
        except RuntimeError as error:
            stderr.seek(0)
            died, wrote = error, stderr.read()[-2000:] or "(nothing)"
    warnings.warn(
        f"a notebook's kernel died as it started ({died}): started again. It wrote: {wrote}",
        stacklevel=2,
    )
    return _start_new_kernel(*args, **kwargs)


nbval.kernel.start_new_kernel = start_new_kernel


def pytest_collectstart(collector):
    if collector.fspath and str(collector.fspath).endswith(".ipynb"):
        collector.skip_compare += ("stderr",)
