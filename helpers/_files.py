"""Writing a file so that a reader never sees half of it: the one atomic write of the helpers."""

from __future__ import annotations

import contextlib
import os
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
