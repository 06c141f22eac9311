"""Reading trace files into columns: the part of loading done once per file.

:func:`read_file` turns a ``.json`` / ``.json.gz`` Chrome or Kineto trace into a
:class:`FileColumns` (its header, and its complete events as numpy arrays and codes), every
problem a :class:`~helpers.traces.TraceError` naming the file; :func:`read_files` reads
several, in worker processes when they are many and large, with a progress bar for long loads.
Everything a worker returns pickles. The public API is in :mod:`helpers.traces`.

One file goes through the layer below in order: its bytes within bounds
(:mod:`._bytes`), its JSON decoded (:mod:`._json`), its header
(:mod:`._header`), its columns (:mod:`._columns`), each event's step and
each GPU event's launch (:mod:`._steps`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from ._bytes import read_bytes
from ._columns import (
    call_sites,
    columns_of,
    comm_numbers,
    compact,
    complete_events,
    ints_of_rows,
    kind_codes,
    lanes,
    thread_names,
    times,
)
from ._error import NotATrace, TraceError
from ._header import TraceHeader, describe, header_of
from ._json import decode, too_deep
from ._steps import GPU_CATEGORIES, in_steps, launches, link_rows, recorded_at, step_numbers
from ._workers import each_in_processes, worker_failure
from ..jobs.runs import usable_cores

PARALLEL_FROM_BYTES = 64_000_000  # files of at least this much in all are read in parallel


@dataclass
class FileColumns:
    """The complete events of one file: times as float64 arrays (absolute µs), text columns
    as ``(codes, values)`` with code -1 for a missing value (the lane of each event among
    them), ``ranks`` per event for a merged file, each event's kind, its step, each GPU
    event's launch time, and the numbers that describe a collective."""

    header: TraceHeader
    start: np.ndarray
    dur: np.ndarray
    text: dict[str, tuple[np.ndarray, list]]
    ranks: np.ndarray | None
    kind: np.ndarray  # int8 codes into helpers.traces.kinds.KIND_NAMES
    step: np.ndarray  # the ProfilerStep#N each event starts in (GPU events: launched in), or -1
    # for none (the frame's <NA>)
    launch: np.ndarray  # when the CPU launched each GPU event (absolute µs); NaN otherwise
    # msg_bytes, group_size, seq of collectives, wait_stream (the stream a cuda_sync event
    # waited for), and a send's or a receive's peer and tag; -1 if unknown
    numbers: dict[str, np.ndarray]
    waits_for: np.ndarray  # when the CUDA event a cuda_sync event waited on was recorded; NaN
    skipped: int = 0


# ------------------------------------------------------------------------ one file


def read_columns(
    path: Path,
    rank: int | None = None,
    strict: bool = True,
    steps: tuple[int, int] | None = None,
    single: bool = False,
) -> FileColumns:
    """Read one trace file into :class:`FileColumns` (see :func:`helpers.traces.load_trace`
    for the arguments); every problem is a :class:`TraceError` naming the file."""
    notes: list[str] = []
    doc = decode(path, read_bytes(path), notes)
    xs, meta = _complete_events(path, doc, notes)
    header = header_of(doc, path, rank, single)
    xs, start, dur, skipped = times(path, xs, strict, notes)
    start += (header.base_time_ns or 0) / 1000.0
    text = columns_of(xs)
    numbers, text["process_group"] = comm_numbers(xs, text["collective"][0], text["name"])
    text["call_from"] = call_sites(xs, text["cat"])
    linked = link_rows(text["cat"])
    correlation = ints_of_rows(xs, "args.correlation", linked["correlation"])
    external_id = ints_of_rows(xs, "args.external_id", linked["external_id"])
    record = ints_of_rows(xs, "args.wait_record", linked["sync"])
    numbers["wait_stream"] = ints_of_rows(xs, "args.wait_stream", linked["sync"])
    names = thread_names(meta)
    del doc, xs, meta  # free the decoded file before the columns are kept
    order = np.lexsort((-(start + dur), start))  # by start; a parent before its children
    start, dur, correlation, external_id, record = (
        a[order] for a in (start, dur, correlation, external_id, record)
    )
    text, numbers = _rows_of_columns(text, numbers, order)
    ranks = None
    if header.merged:
        pid_codes, pids = text["pid"]
        ranks = np.asarray([int(p) for p in pids], dtype=np.int32)[pid_codes]
    gpu_codes, cats = text["cat"]
    gpu = np.array([c in GPU_CATEGORIES for c in cats] + [False])[gpu_codes]
    steps_of = step_numbers(start, start + dur, text["name"], gpu)
    launch, unlaunched = launches(steps_of, start, gpu, correlation, external_id, ranks)
    waits_for = recorded_at(start, gpu, correlation, record, ranks)
    del correlation, external_id, record
    if steps is not None:
        keep = in_steps(path, start, start + dur, text["name"], steps_of, gpu, steps)
        start, dur, steps_of, launch = start[keep], dur[keep], steps_of[keep], launch[keep]
        waits_for = waits_for[keep]
        text, numbers = _rows_of_columns(text, numbers, keep)
        ranks = None if ranks is None else ranks[keep]
        unlaunched = int((gpu[keep] & np.isnan(launch)).sum())
    describe(header, start, dur, text["pid"], notes, unlaunched)
    kind = kind_codes(text["name"], text["cat"])
    each_rank = np.full(len(start), header.rank, np.int32) if ranks is None else ranks
    text["lane"] = lanes(each_rank, text["pid"], text["tid"], text["cat"], names, ranks is not None)
    return FileColumns(
        header, start, dur, compact(text), ranks, kind, steps_of, launch, numbers, waits_for,
        skipped,
    )


def _complete_events(path: Path, doc, notes: list[str]) -> tuple[list, list]:
    """The document's complete events and its metadata events; a :class:`NotATrace` for a JSON
    file with no ``traceEvents``, a TraceError for a trace with no complete event."""
    if doc.traceEvents is msgspec.UNSET:
        raise NotATrace(
            path,
            "is not a trace: it has no traceEvents (a run's or a recording's manifest, or "
            "another JSON file); name the trace files, or leave this one out",
        )
    xs, meta = complete_events(doc.traceEvents, notes)
    if not xs:
        empty = " (its traceEvents list is empty)" if not doc.traceEvents else ""
        raise TraceError(
            path,
            f"holds no events with a duration (ph X, or B/E pairs){empty}: "
            f"nothing to load. Did the profiler record anything?",
        )
    return xs, meta


def _rows_of_columns(text: dict, numbers: dict, rows: np.ndarray) -> tuple[dict, dict]:
    """The text columns and the numbers at ``rows`` (an order or a mask)."""
    text = {column: (codes[rows], values) for column, (codes, values) in text.items()}
    return text, {column: values[rows] for column, values in numbers.items()}


def read_file(
    path: Path,
    rank: int | None = None,
    strict: bool = True,
    steps: tuple[int, int] | None = None,
    single: bool = False,
) -> FileColumns:
    """:func:`read_columns`, with every failure a :class:`TraceError` naming the file: input
    that got past the checks (or a bug it uncovers) ends here too, with the exception's type
    in the message, so that one file can never take a whole load down with a raw error."""
    try:
        return read_columns(path, rank, strict, steps, single)
    except TraceError:
        raise
    except RecursionError:
        raise too_deep(path) from None
    except MemoryError:
        raise TraceError(
            path,
            "ran out of memory while reading it: load fewer ranks (ranks=) or steps "
            "(steps=), or use a machine with more memory",
        ) from None
    except Exception as err:
        raise TraceError(
            path,
            f"could not be read ({type(err).__name__}: {str(err)[:200]}): the file is "
            f"damaged or not a profiler trace; re-record it, or load the others with "
            f"strict=False",
        ) from err


# ---------------------------------------------------------------------- many files


def read_files(
    items: Sequence[tuple[Path, int | None]],
    strict: bool,
    steps: tuple[int, int] | None,
    workers: int | None,
    progress: bool | None,
) -> list[FileColumns | TraceError]:
    """Each file's FileColumns, or the TraceError that says why not, in the order given; in
    parallel worker processes when ``workers`` > 1 (default: one per core when the files
    are many and large). ``progress``: the bar of :func:`._progress.progress_bar`."""
    jobs = [(path, rank, strict, steps, len(items) == 1) for path, rank in items]
    workers = _default_workers(items) if workers is None else workers
    results = each_in_processes(_read_or_error, jobs, workers, "loading traces", progress)
    return [
        worker_failure(result, path) if isinstance(result, BaseException) else result
        for result, (path, _) in zip(results, items)
    ]


def _read_or_error(
    path: Path, rank: int | None, strict: bool, steps: tuple[int, int] | None, single: bool
) -> FileColumns | TraceError:
    """The file's columns, or the TraceError that says why not (every failure is one)."""
    try:
        return read_file(path, rank, strict, steps, single)
    except TraceError as err:
        return err


def _default_workers(items: Sequence[tuple[Path, int | None]]) -> int:
    """1, or one worker per usable core (at most one per file) when the files are many and
    together at least :data:`PARALLEL_FROM_BYTES`."""
    sizes = [p.stat().st_size if p.is_file() else 0 for p, _ in items]
    if len(items) < 2 or sum(sizes) < PARALLEL_FROM_BYTES:
        return 1
    return max(1, min(usable_cores(), len(items)))
