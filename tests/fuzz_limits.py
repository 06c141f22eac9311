"""Limits the fuzz tests put around one read of a hostile input, so that a reader that would
take all of the machine's memory fails its test instead of taking the machine down."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

try:
    import resource
except ImportError:  # Windows: no address-space limit, the tests' own bounds still apply
    resource = None

GiB = 1024**3


def _virtual_size() -> int | None:
    """This process's address space (``VmSize``) in bytes; None where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@contextlib.contextmanager
def address_space(extra: int = 2 * GiB) -> Iterator[None]:
    """Within the block, the process may map at most ``extra`` bytes beyond what it has now:
    an allocation past that raises MemoryError at once (the reader under test should then
    say so, and the test fail) rather than the kernel killing the process. A no-op where the
    limit cannot be set (no ``resource``, no /proc, or a hard limit already lower)."""
    size = _virtual_size()
    if resource is None or size is None:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    wanted = size + extra
    if hard != resource.RLIM_INFINITY and hard < wanted:
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (wanted, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
