"""Writing traces out: every rank in one file for Perfetto, and nodes' folders gathered into one.

- :func:`merge_traces` writes all ranks of a run into one Chrome trace (one process per rank),
  streamed a few thousand events at a time and written atomically.
- :func:`gather_traces` copies the trace files of several nodes' folders into one folder, as you
  would bring them together from node-local disks, without overwriting or following links out.

Both read what :mod:`helpers.traces` loads and raise its :class:`~helpers.traces.TraceError`.
"""

from __future__ import annotations

import contextlib
import gzip
import math
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import msgspec

from .._files import atomic_file
from ._bytes import read_bytes
from ._json import decode_event, raw_events, too_deep
from ..jobs.runs import show_path
from .load import RunTraces, TraceError, TraceHeader, load_run, trace_files

__all__ = ["merge_traces", "gather_traces", "written_by_merge"]

MERGED_KEY = "mergedRanks"  # the key of a merged trace: its ranks (the loader reads it)
_MERGED_START = b'{"' + MERGED_KEY.encode() + b'"'  # how merge_traces begins every file


def written_by_merge(path: str | Path) -> bool:
    """Whether ``path`` is a file that :func:`merge_traces` wrote (it begins with its ranks),
    told from its first bytes, without reading the file; False when it cannot be read."""
    try:
        with Path(path).open("rb") as raw:
            head = raw.read(2)
            raw.seek(0)
            f = gzip.GzipFile(fileobj=raw) if head == b"\x1f\x8b" else raw
            return f.read(len(_MERGED_START)) == _MERGED_START
    except (OSError, EOFError, gzip.BadGzipFile):
        return False


def merge_traces(
    run: RunTraces | str | Path, out: str | Path, *, gzip_output: bool | None = None
) -> Path:
    """Write all ranks into one Chrome trace: one process per rank (``rank N``, in rank
    order), one thread per original lane; every event of every file is kept, with times
    on the run's shared axis. Opens in https://ui.perfetto.dev and chrome://tracing.

    gzip_output: compress (default: when ``out`` ends in ``.gz``). Returns the path.

    The output is written as it is made, a few thousand events at a time, so merging needs
    about one file's bytes beyond the loaded run, not the whole merged trace in memory. It
    appears at ``out`` only once it is complete: a merge that fails leaves nothing behind.
    """
    if not isinstance(run, RunTraces):
        run = load_run(run)
    out = Path(out)
    if gzip_output is None:
        gzip_output = out.name.endswith(".gz")
    with (
        atomic_file(out) as file,
        (
            gzip.GzipFile(fileobj=file, mode="wb", compresslevel=5)
            if gzip_output
            else contextlib.nullcontext(file)
        ) as f,
    ):
        _write_merged(f, run)
    return out


def _write_merged(f: BinaryIO, run: RunTraces) -> None:
    """The merged trace of ``run``, written to ``f`` one batch of events at a time."""
    t0_us = float(run.events["start_us"].min())
    known = run.events.groupby(["rank", "pid", "tid"], observed=True)["lane"].first()
    lane_labels = {(int(r), str(p), str(t)): str(v) for (r, p, t), v in known.items()}
    first = run.headers[0]
    head = {
        MERGED_KEY: run.ranks,
        "world_size": first.world_size,
        "backend": first.backend,
        "baseTimeNanoseconds": int(round(t0_us * 1000)),
        "displayTimeUnit": "ms",
    }
    lane_ids: dict[tuple[int, str, str], int] = {}
    f.write(msgspec.json.encode(head)[:-1] + b',"traceEvents":[')
    separator = b""
    for header in run.headers:
        for batch in _batches(_merged_events(header, t0_us, lane_ids)):
            f.write(separator + msgspec.json.encode(batch)[1:-1])
            separator = b","
    names = _merged_names(run.ranks, lane_ids, lane_labels)
    f.write((separator + msgspec.json.encode(names)[1:-1] if names else b"") + b"]}")


def _merged_events(header: TraceHeader, t0_us: float, lane_ids: dict) -> Iterator[dict]:
    """The events of one rank's file as the merged trace has them: pid the rank, tid its
    lane, ts on the run's axis; names (``M`` events) and events without a time left out."""
    path = header.path
    base_us = (header.base_time_ns or 0) / 1000.0
    try:
        for raw in raw_events(path, read_bytes(path)):
            e = decode_event(path, raw)
            if not isinstance(e, dict) or "ts" not in e or e.get("ph") == "M":
                continue  # process and thread names are written anew
            key = (header.rank, str(e.get("pid", "")), str(e.get("tid", "")))
            try:
                ts = float(e["ts"]) + base_us - t0_us
            except (TypeError, ValueError, OverflowError):
                continue
            if not math.isfinite(ts):
                continue
            e["pid"], e["tid"] = header.rank, lane_ids.setdefault(key, len(lane_ids) + 1)
            e["ts"] = ts
            yield e
    except TraceError:
        raise
    except RecursionError:
        raise too_deep(path) from None
    except Exception as err:  # the file changed since it was loaded, for one
        raise TraceError(
            path,
            f"could not be merged ({type(err).__name__}: {str(err)[:200]}); load the run "
            f"again, or leave this file out",
        ) from err


def _batches(events: Iterable[dict], size: int = 2_000) -> Iterator[list[dict]]:
    """``events`` in lists of ``size`` (the last may be shorter; none is empty)."""
    batch: list[dict] = []
    for e in events:
        batch.append(e)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _merged_names(ranks: list[int], lane_ids: dict, lane_labels: dict) -> list[dict]:
    """The metadata events that name and order the processes (ranks) and threads (lanes)."""
    meta = []
    for (rank, p, t), lane in lane_ids.items():
        label = lane_labels.get((rank, p, t)) or f"pid {p} tid {t}"
        meta.append(
            {"ph": "M", "name": "thread_name", "pid": rank, "tid": lane, "args": {"name": label}}
        )
        meta.append(
            {
                "ph": "M",
                "name": "thread_sort_index",
                "pid": rank,
                "tid": lane,
                "args": {"sort_index": lane},
            }
        )
    for rank in ranks:
        meta.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": rank,
                "tid": 0,
                "args": {"name": f"rank {rank}"},
            }
        )
        meta.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": rank,
                "tid": 0,
                "args": {"sort_index": rank},
            }
        )
    return meta


def gather_traces(node_dirs: Sequence[str | Path], dest: str | Path) -> list[Path]:
    """Copy the trace files of several nodes' folders into one folder, as you would bring
    them together from node-local disks; returns the copies. Two nodes with a file of the
    same name raise :class:`TraceError` rather than overwrite one with the other.

    Only files inside the node folders are gathered: a symbolic link that leads out of its
    node's folder raises a :class:`TraceError` naming it (nothing is copied then), and a
    link already in ``dest`` where a copy would go is never written through."""
    dest = Path(dest)
    copies: dict[str, Path] = {}
    for node_dir in node_dirs:
        root = Path(node_dir).resolve()
        for path in trace_files(node_dir):
            real = path.resolve()
            if not real.is_relative_to(root):
                raise TraceError(
                    path,
                    f"is a symbolic link to {show_path(real)}, outside the node's folder "
                    f"{show_path(root)}; gather_traces copies only files inside the folders "
                    f"it is given: replace the link by the trace itself, or remove it",
                )
            if path.name in copies:
                raise TraceError(
                    path,
                    f"has the same name as {show_path(copies[path.name])}; "
                    f"name trace files after their rank",
                )
            copies[path.name] = real
    for name in copies:
        if (dest / name).is_symlink():
            raise TraceError(
                dest / name,
                "is a symbolic link, and gather_traces does not write through links: "
                "remove it, or gather into a new folder",
            )
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name, path in sorted(copies.items()):
        target = dest / name
        shutil.copy2(path, target)
        out.append(target)
    return out
