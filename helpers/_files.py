"""Writing a file so that a reader never sees half of it: the one atomic write of the helpers;
and handing memory freed by a big load back to the system."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[BinaryIO]:
    """An open binary file that becomes ``path`` when the ``with`` block ends without an
    error (written next to it, then renamed over it); on an error nothing is left behind and
    an existing ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as file:
            yield file
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomically(path: str | Path, data: bytes | str) -> Path:
    """Write ``data`` (text is UTF-8 encoded) to ``path`` atomically (:func:`atomic_file`);
    return ``path``."""
    with atomic_file(path) as file:
        file.write(data.encode() if isinstance(data, str) else data)
    return Path(path)


@functools.lru_cache(maxsize=1)
def _glibc_trim() -> object | None:
    """glibc's ``malloc_trim``, or None on other systems."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, for one)
        return None


def give_back_freed_memory() -> None:
    """Hand memory that Python and numpy have freed back to the system, where the C library
    allows it (glibc on Linux: ``malloc_trim``). glibc keeps freed blocks of under a few MB for
    its own reuse, and a load that frees thousands of small arrays (each file's) while it
    allocates a few big ones (the run's) would otherwise hold both. Nothing elsewhere."""
    trim = _glibc_trim()
    if trim is not None:
        trim(0)
