"""Load profiler traces (Kineto / Chrome JSON, one file per rank) into pandas, check them, merge them.

- :func:`load_trace` reads one file into a :class:`Trace` (header + events DataFrame).
- :func:`load_run` reads every rank of a run (a folder, a list of files or a ``RunRecord``)
  into one :class:`RunTraces` with a ``rank`` column and one time axis.
- :func:`merge_traces` writes all ranks into one Chrome trace for Perfetto.
- :func:`gather_traces` brings several nodes' trace folders together.

Every problem with a file raises :class:`TraceError`, which names the file and says what is
wrong; a file that loads but not exactly as written (bad bytes replaced, events left out)
gives a :class:`TraceWarning`. Times are microseconds everywhere: ``start_us``/``end_us``
are absolute (µs since the Unix epoch), ``rel_us`` is µs since the earliest event of the
run, so ranks on one host line up.

Big runs: files are decoded in parallel worker processes when there are many large ones,
a progress line appears on stderr when a load takes more than a couple of seconds, and the
result is cached next to the traces (``.cache/``), so loading the same unchanged run again
is a fraction of the first time. ``ranks=`` and ``steps=`` load only part of a run.
"""

from __future__ import annotations

import contextlib
import gzip
import math
import os
import shutil
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from . import _tracecache
from ._tracefile import (
    GPU_CATEGORIES,
    FileColumns,
    TraceError,
    TraceHeader,
    TraceWarning,
    code_dtype,
    decode_error,
    is_bare_array,
    rank_in_name,
    read_bytes,
    read_file,
    too_deep,
)
from .kinds import KIND_NAMES, event_kind
from .runs import CACHE_DIR, LOGS_DIR, MANIFEST_NAME, show_path, usable_cores

__all__ = [
    "TraceError",
    "TraceWarning",
    "TraceHeader",
    "Trace",
    "RunTraces",
    "load_trace",
    "load_run",
    "trace_files",
    "merge_traces",
    "gather_traces",
]

MERGED_KEY = "mergedRanks"
PROGRESS_AFTER_S = 2.0  # a load that takes longer shows a progress line
PARALLEL_FROM_BYTES = 64_000_000  # files of at least this much in all are read in parallel


@dataclass
class Trace:
    """One trace file: its header and its complete events (one row each)."""

    header: TraceHeader
    events: pd.DataFrame
    skipped_events: int = 0


@dataclass
class RunTraces:
    """The traces of one run: ``events`` (all ranks, one time axis), ``headers`` (one per file)
    and ``skipped`` (``(file, problem)`` pairs left out in lenient mode)."""

    events: pd.DataFrame
    headers: list[TraceHeader]
    skipped: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        return sorted({h.rank for h in self.headers})


# --------------------------------------------------------- one frame from many files


def _fill(parts: Sequence[FileColumns], take, n: int, dtype, order) -> np.ndarray:
    """One array of ``n`` from a per-file array, in ``order`` if given. ``take(part)`` returns
    the part's array and lets it go, so that memory is freed as the run's array fills."""
    out = np.empty(n, dtype=dtype)
    pos = 0
    for part in parts:
        chunk = take(part)
        out[pos : pos + len(chunk)] = chunk
        pos += len(chunk)
        del chunk
    return out if order is None else out[order]


def _take(attribute: str):
    """A ``take`` for :func:`_fill`: the part's array, which the part no longer holds."""

    def take(part: FileColumns) -> np.ndarray:
        value = getattr(part, attribute)
        setattr(part, attribute, None)
        return value

    return take


#: The text columns of every file, kept as categorical columns of the frame.
TEXT_COLUMNS = (
    "name", "cat", "pid", "tid", "collective", "shapes", "stream", "process_group", "call_from",
)  # fmt: skip
#: The numeric columns that describe a collective (from ``record_param_comms`` / kernel args).
COMM_NUMBERS = ("msg_bytes", "group_size", "seq")


def _take_number(column: str):
    """A ``take`` for :func:`_fill`: one of the part's numbers, which the part no longer holds."""

    def take(part: FileColumns) -> np.ndarray:
        return part.numbers.pop(column)

    return take


def _codes(parts: Sequence[FileColumns], column: str, n: int, order) -> tuple[np.ndarray, list]:
    """Codes into one list of distinct values for a text column of every file."""
    index: dict = {}
    luts = {}
    for part in parts:
        _, values = part.text[column]
        luts[id(part)] = np.array(
            [index.setdefault(v, len(index)) for v in values] + [-1], np.int32
        )

    def take(part: FileColumns) -> np.ndarray:
        codes, _ = part.text.pop(column)
        return luts[id(part)][codes]

    return _fill(parts, take, n, code_dtype(len(index)), order), list(index)


def _categorical(codes: np.ndarray, values: list) -> pd.Categorical:
    return pd.Categorical.from_codes(codes, categories=pd.Index(values, dtype="str"))


def _kinds(name: tuple[np.ndarray, list], cat: tuple[np.ndarray, list]) -> pd.Categorical:
    """The kind of every event, classifying each distinct (name, category) pair once."""
    width = len(cat[1]) + 1  # code -1 (no category) becomes 0
    inverse, pairs = pd.factorize(name[0].astype(np.int64) * width + cat[0] + 1)
    names, cats = name[1] + [""], [""] + cat[1]
    lookup = np.array(
        [KIND_NAMES.index(event_kind(names[p // width], cats[p % width])) for p in pairs],
        dtype=np.int8,
    )
    return pd.Categorical.from_codes(lookup[inverse], categories=KIND_NAMES)


def _lanes(
    rank: np.ndarray, pid: tuple, tid: tuple, cat: tuple, thread_names: dict, merged: bool
) -> pd.Categorical:
    """A readable lane per (rank, pid, tid): the thread's name if the trace gives one,
    ``GPU p stream t`` for GPU events, else ``thread t`` (with the pid when a rank has
    several processes)."""
    gpu_cat = np.array([c in GPU_CATEGORIES for c in cat[1]] + [False])
    n_pid, n_tid = len(pid[1]) + 1, len(tid[1]) + 1
    key = ((rank.astype(np.int64) * n_pid + pid[0] + 1) * n_tid + tid[0] + 1) * 2 + gpu_cat[cat[0]]
    inverse, keys = pd.factorize(key)
    lanes = pd.DataFrame(
        {
            "rank": keys // (2 * n_tid * n_pid),
            "gpu": (keys % 2).astype(bool),
            "pid": [pid[1][i] if i >= 0 else "" for i in (keys // (2 * n_tid)) % n_pid - 1],
            "tid": [tid[1][i] if i >= 0 else "" for i in (keys // 2) % n_tid - 1],
        }
    )
    numeric = lanes["pid"].str.fullmatch(r"-?\d+")
    cpu_pids = lanes[~lanes["gpu"] & numeric].groupby("rank")["pid"].nunique()
    labels = []
    for r, p, t, g, num in zip(lanes["rank"], lanes["pid"], lanes["tid"], lanes["gpu"], numeric):
        named = thread_names.get((r, p, t))
        if merged and named:
            labels.append(named)
        elif g:
            labels.append(f"GPU {p} stream {t}")
        else:
            base = named or f"thread {t}"
            labels.append(f"{base} (pid {p})" if cpu_pids.get(r, 0) > 1 and num else base)
    codes, values = pd.factorize(np.array(labels, dtype=object))
    return _categorical(codes[inverse].astype(np.int32), list(values))


def _frame(parts: Sequence[FileColumns]) -> pd.DataFrame:
    """One DataFrame for the events of several files, sorted by start (each file arrives
    sorted, so the merge is cheap); built column by column to keep memory low."""
    n = sum(len(p.start) for p in parts)
    merged = any(p.ranks is not None for p in parts)
    thread_names = {
        (p.header.rank if p.ranks is None else int(pid),) + (pid, tid): label
        for p in parts
        for (pid, tid), label in p.thread_names.items()
    }
    for part in parts:  # a rank per event, for the merge below
        if part.ranks is None:
            part.ranks = np.full(len(part.start), part.header.rank, np.int32)
    start = _fill(parts, _take("start"), n, np.float64, None)
    order = np.argsort(start, kind="stable") if len(parts) > 1 else None
    start = start if order is None else start[order]
    dur = _fill(parts, _take("dur"), n, np.float64, order)
    rank = _fill(parts, _take("ranks"), n, np.int32, order)
    step = _fill(parts, _take("step"), n, np.int32, order)
    launch = _fill(parts, _take("launch"), n, np.float64, order)
    numbers = {c: _fill(parts, _take_number(c), n, np.int64, order) for c in COMM_NUMBERS}
    text = {c: _codes(parts, c, n, order) for c in TEXT_COLUMNS}
    del order
    kind = _kinds(text["name"], text["cat"])
    name = _categorical(*text["name"])
    end = start + dur
    stream_lut = np.array([-1 if v is None else v for v in text["stream"][1]] + [-1], np.int64)
    stream = stream_lut[text["stream"][0]]
    frame = pd.DataFrame(
        {
            "rank": rank,
            "name": name,
            "cat": _categorical(*text["cat"]),
            "kind": kind,
            "pid": _categorical(*text["pid"]),
            "tid": _categorical(*text["tid"]),
            "lane": _lanes(rank, text["pid"], text["tid"], text["cat"], thread_names, merged),
            "start_us": start,
            "dur_us": dur,
            "end_us": end,
            "collective": _categorical(*text["collective"]),
            "shapes": _categorical(*text["shapes"]),
            "stream": pd.arrays.IntegerArray(stream, stream < 0),
            "step": pd.arrays.IntegerArray(step, step < 0),
            "rel_us": start - (start[0] if n else 0.0),
            "launch_us": launch,
            "process_group": _categorical(*text["process_group"]),
            "call_from": _categorical(*text["call_from"]),
            **{c: pd.arrays.IntegerArray(v, v < 0) for c, v in numbers.items()},
        },
        copy=False,
    )
    return frame


# ---------------------------------------------------------------- reading many files


class _Progress:
    """``loading traces: k/N files`` on stderr, once a load has taken ``PROGRESS_AFTER_S``."""

    def __init__(self, total: int, show: bool | None):
        self.total, self.done, self.show = total, 0, show
        self.t0 = time.monotonic()
        self.shown = False

    def step(self) -> None:
        self.done += 1
        late = time.monotonic() - self.t0 > PROGRESS_AFTER_S
        if self.show or (self.show is None and late):
            print(
                f"\rloading traces: {self.done}/{self.total} files",
                end="",
                file=sys.stderr,
                flush=True,
            )
            self.shown = True

    def close(self) -> None:
        if self.shown:
            print(f" in {time.monotonic() - self.t0:.1f} s", file=sys.stderr, flush=True)


def _read_or_error(
    path: Path, rank: int | None, strict: bool, steps, single: bool
) -> FileColumns | TraceError:
    """The file's columns, or the TraceError that says why not (every failure is one)."""
    try:
        return read_file(path, rank, strict, steps, single)
    except TraceError as err:
        return err


def _default_workers(items: Sequence[tuple[Path, int | None]]) -> int:
    sizes = [p.stat().st_size if p.is_file() else 0 for p, _ in items]
    if len(items) < 2 or sum(sizes) < PARALLEL_FROM_BYTES:
        return 1
    return max(1, min(usable_cores(), len(items)))


def _read_files(
    items: Sequence[tuple[Path, int | None]],
    strict: bool,
    steps,
    workers: int | None,
    progress: bool | None,
) -> list:
    """Each file's FileColumns (or its TraceError), in the order given; in parallel worker
    processes when ``workers`` > 1."""
    jobs = [(path, rank, strict, steps, len(items) == 1) for path, rank in items]
    workers = _default_workers(items) if workers is None else workers
    bar = _Progress(len(jobs), progress)
    try:
        if workers <= 1:
            results = []
            for job in jobs:
                results.append(_read_or_error(*job))
                bar.step()
            return results
        import multiprocessing

        # fork: workers start at once with everything imported (Linux); elsewhere spawn
        method = (
            "fork"
            if "fork" in multiprocessing.get_all_start_methods()
            and sys.platform.startswith("linux")
            else "spawn"
        )
        context = multiprocessing.get_context(method)
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context) as pool:
            futures = [pool.submit(_read_or_error, *job) for job in jobs]
            for future in futures:
                future.add_done_callback(lambda _: bar.step())
            return [_result(future, path) for future, (path, _) in zip(futures, items)]
    finally:
        bar.close()


def _result(future, path: Path) -> FileColumns | TraceError:
    """A worker's result, or a TraceError naming the file when the worker itself failed
    (a worker killed for its memory breaks the pool: every file it had not read says so)."""
    try:
        return future.result()
    except BrokenProcessPool:
        return TraceError(
            path,
            "the worker process reading it stopped (killed for using too much memory?); "
            "load with workers=1, or fewer ranks at once (ranks=)",
        )
    except Exception as err:  # its result could not be sent back, for one
        return TraceError(path, f"could not be read in a worker ({type(err).__name__}: {err})")


# ------------------------------------------------------------------ public API


def _warn_notes(headers: Iterable[TraceHeader]) -> None:
    for h in headers:
        if h.notes:
            warnings.warn(TraceWarning(f"{show_path(h.path)}: " + "; ".join(h.notes)), stacklevel=3)


def load_trace(
    path: str | Path,
    rank: int | None = None,
    *,
    strict: bool = True,
    steps: tuple[int, int] | None = None,
) -> Trace:
    """Read one trace file (``.json`` or ``.json.gz``) into a :class:`Trace`.

    rank: which rank wrote it, when neither ``distributedInfo`` nor the file name says (a
        trace that says nothing is taken as rank 0, one process: ``header.rank_source`` is
        then ``"assumed"``).
    strict: raise on events without a start time or with a negative duration (default), or
        leave them out and count them.
    steps: ``(first, last)``: only the events inside ``ProfilerStep#first`` .. ``#last``.

    The DataFrame has one row per complete event, sorted by start: ``rank, name, cat, kind,
    pid, tid, lane, start_us, dur_us, end_us, collective, shapes, stream, step, rel_us``
    (µs since the trace's first event), ``launch_us`` and, for collectives where the trace
    records them, ``process_group, msg_bytes, group_size, seq``; ``call_from`` is where a
    Python function was called from (``file:line``; traces made with ``with_stack=True``). ``step`` is the
    ``ProfilerStep#N`` an event starts in, except for GPU events: they carry the step whose
    CPU code launched them (a kernel often runs after its step's CPU work has ended), and
    ``launch_us`` is when that launch happened (``start_us - launch_us`` is the time the
    kernel waited in its stream's queue). A GPU event whose launch is not in the trace gets
    step -1 (``header.gpu_events_without_launch`` counts them). A file written by
    :func:`merge_traces` loads with each event's own rank.
    """
    part = read_file(Path(path), rank, strict, steps, single=True)
    _warn_notes([part.header])
    return Trace(part.header, _frame([part]), part.skipped)


def trace_files(folder: str | Path) -> list[Path]:
    """The trace files under a folder: ``*.json`` and ``*.json.gz``, recursively, sorted;
    the run manifest, torchrun's logs and the loader's cache are left out."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TraceError(folder, "no such folder")
    files = [
        p
        for p in folder.rglob("*")
        if p.is_file()
        and (p.name.endswith(".json") or p.name.endswith(".json.gz"))
        and p.name != MANIFEST_NAME
        and not {LOGS_DIR, CACHE_DIR} & set(p.relative_to(folder).parts[:-1])
    ]
    return sorted(files)


def _items(source) -> tuple[list[tuple[Path, int | None]], Path | None]:
    """``(path, rank or None)`` for each file of ``source``, and its folder when it is one."""
    if hasattr(source, "run_dir"):  # a RunRecord
        source = source.run_dir
    if isinstance(source, dict):
        return [(Path(p), r) for r, p in source.items()], None
    if isinstance(source, (str, os.PathLike)):
        items = [(p, None) for p in trace_files(source)]
        if not items:
            raise TraceError(
                source,
                "no trace files (*.json, *.json.gz) in this folder; did the "
                "profiled ranks run to the end of their active window?",
            )
        return items, Path(source)
    items = [(Path(p), None) for p in source]
    if not items:
        raise TraceError(None, "no trace files given")
    return items, None


def _wanted(items, wanted: set[int] | None):
    """Leave out, before reading them, files whose name says they are of a rank not wanted."""
    if wanted is None:
        return items
    return [
        (p, r)
        for p, r in items
        if r in wanted or r is None and ((n := rank_in_name(p.name)) is None or n in wanted)
    ]


def load_run(
    source,
    *,
    strict: bool = True,
    ranks: Iterable[int] | None = None,
    steps: tuple[int, int] | None = None,
    same_run: bool = True,
    expect_ranks: Iterable[int] | None = None,
    workers: int | None = None,
    cache: bool = True,
    progress: bool | None = None,
) -> RunTraces:
    """Load every rank's trace of one run into a :class:`RunTraces`.

    source: a run folder, a ``RunRecord``, a list of files, or ``{rank: file}``.
    strict: raise :class:`TraceError` on the first bad file (default), or skip bad files
        and list them in ``.skipped`` (whatever is wrong with a file, it is a TraceError).
    ranks: only these ranks (files named ``rank<N>...`` of other ranks are not even read).
    steps: ``(first, last)``: only events inside ``ProfilerStep#first`` .. ``#last``.
    same_run: check that the files come from one run (world size, backend, run id, times).
    expect_ranks: ranks that must be there; a missing one raises a TraceError naming it.
    workers: processes decoding files at once (default: one per core for big runs, else 1).
    cache: keep the result in ``.cache/`` of a run folder and reuse it while no file changes.
    progress: a progress line on stderr (default: only when the load takes over 2 s).

    ``events`` gets ``rel_us``: µs since the earliest event of the whole run.

    Input is bounded: a file over 2 GiB decompressed, or a gzip file that expands more
    than 200x, is refused with a TraceError before it takes the memory (set the
    environment variables ``PDP_MAX_TRACE_MB`` / ``PDP_MAX_GZIP_RATIO`` to allow more).
    """
    wanted = None if ranks is None else set(ranks)  # read once: ranks may be an iterator
    items, folder = _items(source)
    items = _wanted(items, wanted)
    options = {
        "strict": strict,
        "ranks": None if wanted is None else sorted(wanted),
        "steps": steps,
    }
    cache_file = _tracecache.cache_file(folder, items, options) if cache and folder else None
    cached = _tracecache.read(cache_file) if cache_file else None
    if cached is not None:
        run = RunTraces(*cached)
    else:
        run = _load_files(items, strict, wanted, steps, workers, progress)
        if cache_file:
            _tracecache.write(cache_file, run.events, run.headers, run.skipped)
    _check_expected(run.headers, expect_ranks, folder)
    _check_ranks(run.headers)
    if same_run:
        _check_same_run(run.headers)
    return run


def _load_files(
    items, strict: bool, wanted: set[int] | None, steps, workers, progress
) -> RunTraces:
    parts: list[FileColumns] = []
    skipped: list[tuple[Path, str]] = []
    for (path, _), result in zip(items, _read_files(items, strict, steps, workers, progress)):
        if isinstance(result, TraceError):
            if strict:
                raise result
            skipped.append((path, result.problem))
        elif result.header.rank_source == "merged file":
            skipped.append((path, "a merged trace of several ranks, not one rank's"))
        elif wanted is None or result.header.rank in wanted:
            if result.skipped:
                skipped.append((path, f"{result.skipped} events left out"))
            parts.append(result)
    if not parts:
        raise TraceError(
            None,
            "no usable trace among: " + "; ".join(f"{show_path(p)} ({why})" for p, why in skipped),
        )
    headers = sorted((p.header for p in parts), key=lambda h: (h.rank, h.start_us))
    _warn_notes(headers)
    return RunTraces(_frame(parts), headers, skipped)


def _check_expected(headers: Sequence[TraceHeader], expect_ranks, folder) -> None:
    if expect_ranks is None:
        return
    missing = sorted(set(expect_ranks) - {h.rank for h in headers})
    if missing:
        raise TraceError(
            folder,
            f"no trace from rank{'s' if len(missing) > 1 else ''} "
            f"{', '.join(map(str, missing))}: check that "
            f"{'they' if len(missing) > 1 else 'it'} profiled and "
            f"that every node's folder was gathered",
        )


def _check_ranks(headers: Sequence[TraceHeader]) -> None:
    """Two files may share a rank only as two windows of one process (same pid, no overlap)."""
    by_rank: dict[int, list[TraceHeader]] = {}
    for h in headers:
        by_rank.setdefault(h.rank, []).append(h)
    for rank, same in by_rank.items():
        same.sort(key=lambda h: h.start_us)
        for a, b in zip(same, same[1:]):
            if set(a.pids) != set(b.pids) or b.start_us < a.end_us:
                raise TraceError(
                    b.path,
                    f"claims rank {rank}, like {show_path(a.path)}; two "
                    f"files of one rank must be separate windows of one "
                    f"process. Remove the duplicate, or pass files as "
                    f"{{rank: path}}",
                )


def _check_same_run(headers: Sequence[TraceHeader]) -> None:
    first = headers[0]
    for h in headers[1:]:
        for attr in ("world_size", "backend", "run_id"):
            x, y = getattr(first, attr), getattr(h, attr)
            if x is not None and y is not None and x != y:
                raise TraceError(
                    h.path,
                    f"comes from a different run than {show_path(first.path)} "
                    f"({attr} {y!r} vs {x!r}); load each run's folder on "
                    f"its own",
                )
    spans: dict[int, tuple[float, float]] = {}
    for h in headers:
        lo, hi = spans.get(h.rank, (np.inf, -np.inf))
        spans[h.rank] = (min(lo, h.start_us), max(hi, h.end_us))
    if len(spans) > 1:
        latest_start = max(s for s, _ in spans.values())
        earliest_end = min(e for _, e in spans.values())
        if latest_start > earliest_end:
            late = max(spans, key=lambda r: spans[r][0])
            early = min(spans, key=lambda r: spans[r][1])
            path = next(h.path for h in headers if h.rank == late)
            gap = (latest_start - earliest_end) / 1e6
            raise TraceError(
                path,
                f"rank {late} starts {gap:.3f} s after rank {early} has "
                f"finished: the ranks were not running at the same time, so "
                f"these look like files of different runs. Load each run on "
                f"its own, or pass same_run=False if this is intended",
            )


# ------------------------------------------------------------- merging, gathering


class _RawEvents(msgspec.Struct):
    """A trace's events, each kept as its raw JSON (views into the file's bytes)."""

    traceEvents: list[msgspec.Raw] = msgspec.field(default_factory=list)


_RAW_DOC = msgspec.json.Decoder(_RawEvents)
_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])  # the bare-array form


def _raw_events(path: Path) -> list[msgspec.Raw]:
    """The events of a trace file, each as its raw JSON, to be decoded one at a time while
    merging: the file's bytes plus a small object per event, instead of a dict per event."""
    data = read_bytes(path)
    try:
        if is_bare_array(data):
            return _RAW_LIST.decode(data)
        return _RAW_DOC.decode(data).traceEvents
    except msgspec.DecodeError as err:
        raise decode_error(path, err) from None
    except RecursionError:
        raise too_deep(path) from None


def _event(path: Path, raw: msgspec.Raw) -> object:
    """One event decoded from its raw JSON (bytes that are not UTF-8 replaced)."""
    try:
        try:
            return msgspec.json.decode(raw)
        except UnicodeDecodeError:
            return msgspec.json.decode(bytes(raw).decode("utf-8", errors="replace"))
    except msgspec.DecodeError as err:
        raise decode_error(path, err) from None


def _merged_events(header: TraceHeader, t0_us: float, lane_ids: dict) -> Iterator[dict]:
    """The events of one rank's file as the merged trace has them: pid the rank, tid its
    lane, ts on the run's axis; names (``M`` events) and events without a time left out."""
    path = header.path
    base_us = (header.base_time_ns or 0) / 1000.0
    try:
        for raw in _raw_events(path):
            e = _event(path, raw)
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


def merge_traces(
    run: RunTraces | str | Path, out: str | Path, *, gzip_output: bool | None = None
) -> Path:
    """Write all ranks into one Chrome trace: one process per rank (``rank N``, in rank
    order), one thread per original lane; every event of every file is kept, with times
    on the run's shared axis. Opens in https://ui.perfetto.dev and chrome://tracing.

    gzip_output: compress (default: when ``out`` ends in ``.gz``). Returns the path.

    The output is written as it is made, a few thousand events at a time, so merging needs
    about one file's bytes beyond the loaded run, not the whole merged trace in memory.
    """
    if not isinstance(run, RunTraces):
        run = load_run(run)
    out = Path(out)
    if gzip_output is None:
        gzip_output = out.name.endswith(".gz")
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
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with (
            open(tmp, "wb") as file,
            (
                gzip.GzipFile(fileobj=file, mode="wb", compresslevel=5)
                if gzip_output
                else contextlib.nullcontext(file)
            ) as f,
        ):
            f.write(msgspec.json.encode(head)[:-1] + b',"traceEvents":[')
            separator = b""
            for header in run.headers:
                for batch in _batches(_merged_events(header, t0_us, lane_ids)):
                    f.write(separator + msgspec.json.encode(batch)[1:-1])
                    separator = b","
            names = _merged_names(run.ranks, lane_ids, lane_labels)
            f.write((separator + msgspec.json.encode(names)[1:-1] if names else b"") + b"]}")
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)  # no half-written file left behind
        raise
    return out


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
