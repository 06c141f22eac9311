"""A trace file's bytes, read within bounds: :func:`read_bytes` gives the (decompressed) bytes of a
``.json`` or ``.json.gz`` file, or a :class:`~helpers.traces.TraceError` saying why not.

A hostile file costs little: a file is read into one buffer without a second copy, and gzip data
is decompressed piece by piece and given up as soon as it passes :func:`max_trace_bytes`
(``PDP_MAX_TRACE_MB``) or expands more than :data:`MAX_GZIP_RATIO` times
(``PDP_MAX_GZIP_RATIO``).
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import BinaryIO

from ._error import TraceError

#: The most bytes one trace file may hold, decompressed (``PDP_MAX_TRACE_MB`` overrides it).
MAX_TRACE_BYTES = 2 * 1024**3
#: The most a gzip file may expand, as a multiple of its compressed size, once it is over
#: ``RATIO_FROM_BYTES`` (``PDP_MAX_GZIP_RATIO`` overrides it). Real traces expand 10-30x; a
#: gzip bomb (a small file of repeated bytes) about 1,000x.
MAX_GZIP_RATIO = 200
RATIO_FROM_BYTES = 64 * 1024**2
_CHUNK = 1 << 16  # compressed bytes read at a time (the expansion is checked that often)


def _limit(variable: str, default: float, scale: float) -> float:
    """The limit the environment variable sets (in units of ``scale``), else ``default``."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        value = float(text) * scale
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise TraceError(
            None, f"{variable}={text!r} is not a positive number; unset it or give a number"
        )
    return value


def max_trace_bytes() -> int:
    """The size limit of one decompressed trace file: ``PDP_MAX_TRACE_MB`` (MiB) if set,
    else :data:`MAX_TRACE_BYTES`."""
    return int(_limit("PDP_MAX_TRACE_MB", MAX_TRACE_BYTES, 1024**2))


def _mib(size: float) -> str:
    """``size`` bytes in MiB, as text (one decimal below 10 MiB)."""
    return f"{size / 1024**2:,.{1 if size < 10 * 1024**2 else 0}f} MiB"


def _too_big(path: Path, size: str, limit: int) -> TraceError:
    """The TraceError of a file over the size limit, saying how to raise it."""
    return TraceError(
        path,
        f"{size}, over the limit of {_mib(limit)} for one trace file (a "
        f"decompression bomb, or a very big trace). If you trust the file and have the "
        f"memory, raise the limit: set the environment variable PDP_MAX_TRACE_MB (MiB) "
        f"before loading, e.g. os.environ['PDP_MAX_TRACE_MB'] = '"
        f"{max(2 * limit // 1024**2, 1)}'; or record fewer steps per file",
    )


def _gunzip(path: Path, f: BinaryIO, limit: int, ratio: float) -> bytearray:
    """Decompress the gzip file ``f`` (one or more members) piece by piece, stopping as soon
    as the output passes ``limit`` bytes or ``ratio`` times the compressed bytes read."""
    out = bytearray()
    unzip, fed, read = zlib.decompressobj(wbits=31), False, 0
    pending = b""
    try:
        while True:
            if not pending:
                pending = f.read(_CHUNK)
                read += len(pending)
                if not pending:
                    if fed and not unzip.eof:  # output zlib still holds (at most one match)
                        out += unzip.flush()
                    break
            out += unzip.decompress(pending, 1 << 23)  # 8 MiB at most at a time
            fed, pending = True, unzip.unconsumed_tail
            if len(out) > limit:
                raise _too_big(path, f"decompresses to more than {_mib(len(out))}", limit)
            if len(out) > RATIO_FROM_BYTES and len(out) > ratio * read:
                raise TraceError(
                    path,
                    f"expands more than {ratio:.0f}x (from {_mib(read)} to over "
                    f"{_mib(len(out))}): a decompression bomb, not a trace (real "
                    f"traces expand 10-30x). If you trust it, set the environment variable "
                    f"PDP_MAX_GZIP_RATIO to a larger factor before loading",
                )
            if unzip.eof:  # another member may follow (concatenated gzip files)
                pending = unzip.unused_data
                while pending is not None and not pending.strip(b"\x00"):  # zero padding
                    more = f.read(_CHUNK)
                    read += len(more)
                    pending = more if more else None
                if pending is None:
                    return out
                pending = pending.lstrip(b"\x00")
                unzip, fed = zlib.decompressobj(wbits=31), False
    except zlib.error as e:
        raise TraceError(path, f"broken gzip data ({e}); re-copy or re-record the file") from None
    if fed and not unzip.eof:
        raise TraceError(
            path,
            "the gzip stream ends early: the file is truncated "
            "(was the rank killed while writing it?)",
        )
    return out


def read_bytes(path: Path) -> bytearray:
    """The (decompressed) bytes of a .json or .json.gz file, or a TraceError saying why not.

    The file is read into one buffer, without a second copy; gzip data is decompressed piece
    by piece and given up as soon as it passes :func:`max_trace_bytes` or expands more than
    :data:`MAX_GZIP_RATIO` times (``PDP_MAX_GZIP_RATIO``), so a small hostile file costs
    little memory."""
    if not path.exists():
        raise TraceError(path, "no such file")
    if path.is_dir():
        raise TraceError(path, "is a folder; use load_run() for a folder of traces")
    limit = max_trace_bytes()
    ratio = _limit("PDP_MAX_GZIP_RATIO", MAX_GZIP_RATIO, 1.0)
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if f.read(2) == b"\x1f\x8b":
                f.seek(0)
                data = _gunzip(path, f, limit, ratio)
            elif path.name.endswith(".gz"):
                raise TraceError(
                    path, "named .gz but is not gzip data; rename it or re-compress it"
                )
            elif size > limit:
                raise _too_big(path, f"is {_mib(size)}", limit)
            else:
                f.seek(0)
                data = bytearray(size)
                got = f.readinto(data)
                if got < size:  # the file shrank while being read
                    del data[got:]
    except OSError as e:
        raise TraceError(path, f"cannot be read ({e.strerror or e}); check the file") from None
    if not data or data.isspace():
        raise TraceError(
            path,
            "the file is empty (the profiler never wrote it, or the rank died "
            "before exporting); re-run that rank",
        )
    return data
