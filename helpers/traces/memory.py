"""Memory over time: the ``[memory]`` events that ``profile_memory=True`` writes into a trace.

Each allocation and each free is an *instant* event (``"ph": "i"``, no duration) named
``[memory]``, with the bytes (positive: allocated, negative: freed), the device's running
totals after it (``Total Allocated``, ``Total Reserved``) and the device it is about
(``Device Type`` 0: the CPU, 1: a CUDA GPU, with its ``Device Id``). :func:`load_trace`
keeps only events with a duration, so these are read here, from the same bounded bytes and
with the same errors. :func:`load_memory_categories` reads the profiler's own category of
each allocation, where the job wrote its memory timeline beside its traces.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from ..jobs.runs import MEMORY_TIMELINE_DIR
from ._bytes import read_bytes
from ._error import TraceError
from ._header import header_of
from ._json import decode_memory, finite_number, memory_args
from .load import run_files

__all__ = [
    "load_memory", "load_memory_categories", "MEMORY_COLUMNS", "PROFILER_CATEGORIES",
    "in_learners_code",
]  # fmt: skip

#: The columns of :func:`load_memory`'s frame.
MEMORY_COLUMNS = [
    "rank", "device", "time_us", "bytes", "allocated", "reserved", "address", "tid",
]  # fmt: skip
_DEVICE_TYPES = {0: "cpu", 1: "cuda"}  # c10::DeviceType's numbers, as the trace writes them


def load_memory(source: Any, device: str | None = None) -> pd.DataFrame:
    """Every allocation and free that the profiler recorded, one row each, in time order.

    source: one trace file, or a run as :func:`helpers.load_run` takes it (a RunRecord, a
    folder, a list of files, ``{rank: file}``). device: only this device's rows: ``"cpu"``,
    ``"cuda"`` (every GPU) or ``"cuda:N"``; each device's totals are a pool of their own, never
    to be added to another's.

    Returns ``rank, device`` (``"cpu"``, ``"cuda:0"``...), ``time_us`` (µs on the same clock
    as ``load_trace``'s ``start_us``), ``bytes`` (allocated, or negative: freed), ``allocated``
    and ``reserved`` (the device's totals after it, in bytes), ``address`` (of the block, -1
    where the trace does not say) and ``tid`` (the thread that allocated or freed it, as the
    events' ``tid``). A file without ``[memory]``
    events (profiled without ``profile_memory=True``) is a :class:`TraceError`.
    """
    single = isinstance(source, (str, os.PathLike)) and Path(source).is_file()
    items = [(Path(source), None)] if single else run_files(source)[0]
    memory = pd.concat(
        [_memory_of_file(path, rank, single) for path, rank in items], ignore_index=True
    )
    if device is not None:
        kind = memory["device"].str.partition(":")[0]
        memory = memory[(memory["device"] == device) | (kind == device)]
        if memory.empty:
            raise TraceError(
                items[0][0] if single else None,
                f"no memory events of device {device!r} (the trace's devices are "
                f"{sorted(set(kind))}); is the model on that device?",
            )
    return memory.sort_values(["rank", "time_us"], kind="stable").reset_index(drop=True)


def _memory_of_file(path: Path, rank: int | None, single: bool) -> pd.DataFrame:
    """The ``[memory]`` events of one rank's file (see :func:`load_memory`)."""
    doc = decode_memory(path, read_bytes(path))
    if doc.mergedRanks:
        raise TraceError(path, "is a merged file of several ranks: read each rank's own file")
    header = header_of(doc, path, rank, single)  # type: ignore[arg-type]
    base_us = (header.base_time_ns or 0) / 1000.0
    rows = []
    for event in doc.traceEvents:
        if event.name != "[memory]":
            continue
        args, ts = memory_args(event.args), finite_number(event.ts)
        if args is None or ts is None:
            continue
        numbers = [_byte_count(v) for v in (args.bytes, args.allocated, args.reserved)]
        if numbers[0] is None:
            continue
        address = _byte_count(args.address)
        rows.append(
            (
                _device(args.device_type, args.device_id), ts + base_us, *numbers,
                -1 if address is None else address, str(event.tid)[:40],
            )
        )  # fmt: skip
    if not rows:
        raise TraceError(
            path,
            "holds no [memory] events: record the trace with profile_memory=True to see "
            "memory over time",
        )
    frame = pd.DataFrame(rows, columns=MEMORY_COLUMNS[1:]).fillna({"allocated": 0, "reserved": 0})
    frame.insert(0, "rank", np.int32(header.rank))
    frame["address"] = frame["address"].fillna(-1)
    counts = ["bytes", "allocated", "reserved", "address"]
    return frame.astype(dict.fromkeys(counts, np.int64))


def _byte_count(value: Any) -> int | None:
    """A count of bytes as an int, or None when it is not a number or beyond any memory."""
    number = finite_number(value)
    return None if number is None or abs(number) >= 2**62 else int(number)


def _device(device_type: Any, device_id: Any) -> str:
    """``"cpu"``, ``"cuda:N"``, or the trace's own numbers for another kind of device."""
    kind = _DEVICE_TYPES.get(device_type) if isinstance(device_type, int) else None
    if kind == "cpu":
        return kind
    number = device_id if isinstance(device_id, int) else str(device_id)[:20]
    return f"{kind or 'device type ' + str(device_type)[:20]}:{number}"


#: The profiler's memory categories by their number in ``export_memory_timeline``'s raw file
#: (``torch.profiler._memory_profiler._CATEGORY_TO_INDEX``; 7: none).
PROFILER_CATEGORIES = (
    "parameter", "optimizer state", "input", "temporary", "activation", "gradient",
    "autograd detail", None,
)  # fmt: skip
_CREATE = 2  # the raw file's action of an allocation (_ACTION_TO_INDEX[Action.CREATE])
_TIMELINE_EVENT = tuple[float, int, int, int]  # (ns, action, bytes, category)
_TIMELINE = msgspec.json.Decoder(list[_TIMELINE_EVENT])


def load_memory_categories(folder: str | os.PathLike) -> pd.DataFrame:
    """The profiler's own category of each allocation, where the job wrote its memory timeline
    beside its traces: ``prof.export_memory_timeline(f"{MEMORY_TIMELINE_DIR}/rank{rank}.raw.json.gz",
    device)`` inside ``on_trace_ready``. Read as the traces are (bounded in size and expansion).

    Returns ``rank``, ``alloc_us`` (µs, :func:`load_memory`'s clock), ``bytes`` and ``category``
    (one of :data:`PROFILER_CATEGORIES`), one row per allocation; empty where the folder has no
    such file. A file that is not such a timeline is a :class:`TraceError` naming it.
    """
    rows = []
    for path in sorted(Path(folder).rglob(f"{MEMORY_TIMELINE_DIR}/rank*.raw.json.gz")):
        rank = re.fullmatch(r"rank(\d+)\.raw\.json\.gz", path.name)
        if rank is None:
            continue
        try:
            events = _TIMELINE.decode(read_bytes(path))
        except (msgspec.DecodeError, UnicodeDecodeError) as err:
            raise TraceError(
                path, f"is not a memory timeline of export_memory_timeline ({err}); remove it "
                "or write it again with the job"
            ) from None  # fmt: skip
        rows += [
            (int(rank[1]), ns / 1e3, size, PROFILER_CATEGORIES[kind] if 0 <= kind < 8 else None)
            for ns, action, size, kind in events
            if action == _CREATE and ns > 0
        ]
    return pd.DataFrame(rows, columns=["rank", "alloc_us", "bytes", "category"])


_LIBRARIES = ("torch", "torchvision", "numpy", "site-packages", "dist-packages", "<")
_LIBRARY_PARTS = ("site-packages/", "dist-packages/", "/lib/python3")
_COMPILED = (".cpp", ".cc", ".cu", ".h", ".hpp", ".so", "??")


def in_learners_code(site: str) -> bool:
    """Whether a ``file:line`` is in the learner's code: not torch, another library, a module
    of Python's own (``threading.py``, ``/usr/lib/python3.11/...``) or compiled code (a CUDA
    memory snapshot's C++ frames)."""
    path = site.rpartition(":")[0]
    if not path or path.startswith(_LIBRARIES) or path.endswith(_COMPILED):
        return False
    if any(part in path for part in _LIBRARY_PARTS):  # a library or Python's own, anywhere
        return False
    top = path.split("/", 1)[0].removesuffix(".py")
    return top not in sys.stdlib_module_names
