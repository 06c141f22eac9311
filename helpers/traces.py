"""Load profiler traces (Kineto / Chrome JSON, one file per rank) into pandas, check them, merge them.

- :func:`load_trace` reads one file into a :class:`Trace` (header + events DataFrame).
- :func:`load_run` reads every rank of a run (a folder, a list of files or a
  ``RunRecord``) into one :class:`RunTraces` with a ``rank`` column and one time axis.
- :func:`merge_traces` writes all ranks into one Chrome trace for Perfetto.

Every problem with a file raises :class:`TraceError`, which names the file and
says what is wrong. Times are microseconds everywhere: ``start_us``/``end_us``
are absolute (µs since the Unix epoch), ``rel_us`` is µs since the earliest event
of the run, so ranks on one host line up.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import msgspec
import pandas as pd

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
# collectives (gloo:, nccl:, c10d::), NCCL kernels, and RPC calls (not the remote ops they cause)
COMM_PATTERN = re.compile(r"^(?:nccl|gloo|c10d|mpi)[:_]|^record_param_comms$|nccl(?:Dev)?Kernel"
                          r"|^ProcessGroup|^rpc_(?:async|sync|remote)#(?!.*#remote_op)", re.IGNORECASE)
RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
MERGED_KEY = "mergedRanks"

#: The kinds an event can be, in drawing order (see :func:`event_kind`).
KINDS = ["step", "compute", "communication", "optimizer", "data loading", "annotation",
         "gpu kernel", "gpu memory", "cuda runtime", "python", "other"]


class TraceError(ValueError):
    """A trace file (or a set of them) that cannot be used. ``path`` names the file."""

    def __init__(self, path: str | Path | None, problem: str):
        self.path = None if path is None else Path(path)
        self.problem = problem
        where = f"{_short(self.path)}: " if self.path is not None else ""
        super().__init__(where + problem)


def _short(path: Path | None) -> str:
    if path is None:
        return "?"
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


@dataclass
class TraceHeader:
    """What a trace says about itself (all optional in foreign traces)."""

    path: Path
    rank: int
    rank_source: str  # "distributedInfo", "file name", "argument" or "merged file"
    world_size: int | None = None
    backend: str | None = None
    process_groups: list = field(default_factory=list, repr=False)
    host: str | None = None
    run_id: str | None = None
    base_time_ns: int | None = None
    schema_version: int | None = None
    pids: list = field(default_factory=list)
    events: int = 0
    start_us: float = float("nan")
    end_us: float = float("nan")


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


# ---------------------------------------------------------------- reading files

class _Args(msgspec.Struct):
    """The few ``args`` of an event that become columns; the rest is skipped while parsing."""

    name: Any = None
    collective: Any = msgspec.field(default=None, name="Collective name")
    dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    stream: Any = None


class _Event(msgspec.Struct):
    ph: Any = None
    name: Any = ""
    cat: Any = ""
    pid: Any = ""
    tid: Any = ""
    ts: Any = None
    dur: Any = 0
    args: Optional[_Args] = None


class _Doc(msgspec.Struct):
    """The parts of a trace file the loader reads (decoded straight into these types, which
    is many times faster and smaller than building a dict per event)."""

    traceEvents: list[_Event]
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    schemaVersion: Any = None
    host_name: Any = None
    run_id: Any = None
    mergedRanks: Any = None
    world_size: Any = None
    backend: Any = None


_DOC = msgspec.json.Decoder(_Doc)
_NO_ARGS = _Args()
_BARE = msgspec.json.Decoder(list[_Event])


def _read_bytes(path: Path) -> bytes:
    """The (decompressed) bytes of a .json or .json.gz file, or a TraceError saying why not."""
    if not path.exists():
        raise TraceError(path, "no such file")
    if path.is_dir():
        raise TraceError(path, "is a folder; use load_run() for a folder of traces")
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except EOFError:
            raise TraceError(path, "the gzip stream ends early: the file is truncated "
                                   "(was the rank killed while writing it?)") from None
        except (OSError, zlib.error) as e:
            raise TraceError(path, f"broken gzip data ({e}); re-copy or re-record the file") from None
    elif path.name.endswith(".gz"):
        raise TraceError(path, "named .gz but is not gzip data; rename it or re-compress it")
    if not data or data.isspace():
        raise TraceError(path, "the file is empty (the profiler never wrote it, or the rank died "
                               "before exporting); re-run that rank")
    return data


def _decode_error(path: Path, err: msgspec.DecodeError) -> TraceError:
    text = str(err)
    if isinstance(err, msgspec.ValidationError):
        if "traceEvents" in text or " - at `$" not in text:  # a problem with the whole document
            return TraceError(path, "has no 'traceEvents' list: not a Chrome/Kineto trace "
                                    "(written by prof.export_chrome_trace or a trace handler?)")
        return TraceError(path, f"an event has an unexpected shape ({text}); the file is damaged")
    if "truncated" in text:
        return TraceError(path, "the JSON stops before it is complete: the file is truncated "
                                "(was the rank killed while writing it?); re-run, or drop this "
                                "file and load the others with strict=False")
    return TraceError(path, f"not valid JSON ({text}); is this a profiler trace?")


def _read_doc(path: Path) -> _Doc:
    """Parse a trace file into :class:`_Doc`, turning every failure into a TraceError."""
    data = _read_bytes(path)
    try:
        if data.lstrip()[:1] == b"[":  # the bare-array form of the Chrome trace format
            return _Doc(traceEvents=_BARE.decode(data))
        return _DOC.decode(data)
    except msgspec.DecodeError as err:
        raise _decode_error(path, err) from None


def _read_json(path: Path) -> dict:
    """Parse a trace file into plain Python objects, every field kept (for merging)."""
    data = _read_bytes(path)
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError as err:
        raise _decode_error(path, err) from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(path, "has no 'traceEvents' list: not a Chrome/Kineto trace")
    return doc


# ------------------------------------------------------------------- the header

def _rank_of(doc: _Doc, path: Path, rank: int | None) -> tuple[int, str]:
    if rank is not None:
        return int(rank), "argument"
    info = doc.distributedInfo
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"], "distributedInfo"
    m = RANK_IN_NAME.search(path.name)
    if m:
        return int(m.group(1)), "file name"
    raise TraceError(path, "cannot tell which rank wrote it: no 'distributedInfo' in the trace "
                           "and no 'rank<N>' in the file name. Pass it: "
                           "load_trace(path, rank=N), or load_run({rank: path, ...})")


def _header(doc: _Doc, path: Path, rank: int | None) -> TraceHeader:
    rank, source = _rank_of(doc, path, rank)
    info = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    base = doc.baseTimeNanoseconds
    return TraceHeader(
        path=path, rank=rank, rank_source=source,
        world_size=info.get("world_size"), backend=info.get("backend"),
        process_groups=info.get("pg_config") or [],
        host=doc.host_name, run_id=doc.run_id,
        base_time_ns=int(base) if isinstance(base, (int, float)) else None,
        schema_version=doc.schemaVersion,
    )


# ------------------------------------------------------------------- the events

def event_kind(name: str, cat: str) -> str:
    """The kind of one event, for colours and summaries (one of :data:`KINDS`)."""
    return _kinds(pd.Series([name]), pd.Series([cat]))[0]


def _kinds(names: pd.Series, cats: pd.Series) -> np.ndarray:
    """Vectorised :func:`event_kind`: rules from the most to the least specific."""
    names = names.astype(str)
    cats = cats.astype(str).str.lower()
    kind = np.full(len(names), "other", dtype=object)
    rules = [  # later rules win
        (cats.isin(["cpu_op", "operator"]), "compute"),
        (cats.eq("python_function"), "python"),
        (cats.isin(["cuda_runtime", "cuda_driver"]), "cuda runtime"),
        (cats.isin(["user_annotation", "gpu_user_annotation"]), "annotation"),
        (cats.eq("kernel"), "gpu kernel"),
        (cats.isin(["gpu_memcpy", "gpu_memset"]), "gpu memory"),
        (names.str.startswith("Optimizer."), "optimizer"),
        (names.str.contains(r"DataLoader|^dataloader", regex=True), "data loading"),
        (names.str.contains(COMM_PATTERN), "communication"),
        (names.str.match(r"ProfilerStep#\d+$"), "step"),
    ]
    for mask, value in rules:
        kind[np.asarray(mask, dtype=bool)] = value
    return kind


@dataclass
class _Columns:
    """The complete events of one file as plain lists and arrays (pandas comes once per run)."""

    rank: int | np.ndarray
    name: list
    cat: list
    pid: list
    tid: list
    start: np.ndarray  # absolute µs
    dur: np.ndarray
    collective: list
    shapes: list
    stream: list
    thread_names: dict
    skipped: int = 0
    merged: bool = False


def _extract(doc: _Doc, path: Path, rank: int, strict: bool) -> _Columns:
    """Pull the complete ('X') events of one parsed trace into columns; times in absolute µs."""
    raw = doc.traceEvents
    xs = [e for e in raw if e.ph == "X"]
    thread_names = {(str(e.pid), str(e.tid)): str(e.args.name) for e in raw
                    if e.ph == "M" and e.name == "thread_name" and e.args is not None
                    and e.args.name is not None}
    ts = [e.ts for e in xs]
    skipped = 0
    if None in ts:
        bad = [i for i, t in enumerate(ts) if t is None]
        if strict:
            raise TraceError(path, f"{len(bad)} complete events have no start time 'ts' (the "
                                   f"first is {xs[bad[0]].name!r}); the file is damaged. "
                                   f"Load with strict=False to skip them")
        dropped = set(bad)
        xs = [e for i, e in enumerate(xs) if i not in dropped]
        ts = [t for i, t in enumerate(ts) if i not in dropped]
        skipped = len(bad)
    args = [e.args or _NO_ARGS for e in xs]
    base_us = (doc.baseTimeNanoseconds or 0) / 1000.0
    try:
        start = np.asarray(ts, dtype=np.float64) + base_us
        dur = np.asarray([e.dur for e in xs], dtype=np.float64)
    except (TypeError, ValueError):
        raise TraceError(path, "an event has a start time or duration that is not a number; "
                               "the file is damaged") from None
    return _Columns(
        rank=rank,
        name=[e.name for e in xs], cat=[e.cat for e in xs],
        pid=[e.pid for e in xs], tid=[e.tid for e in xs],
        start=start, dur=dur,
        collective=[a.collective for a in args],
        shapes=[bytes(a.dims).translate(None, b" \t\r\n").decode() if a.dims else None
                for a in args],
        stream=[a.stream for a in args],
        thread_names=thread_names, skipped=skipped, merged=bool(doc.mergedRanks),
    )


def _frame(parts: Sequence[_Columns]) -> pd.DataFrame:
    """One DataFrame for the columns of several files, sorted by start time."""
    def join(attr: str) -> list:
        return [v for part in parts for v in getattr(part, attr)]

    n = sum(len(p.name) for p in parts)
    rank = np.concatenate([np.full(len(p.name), p.rank, dtype=np.int32)
                           if np.isscalar(p.rank) else np.asarray(p.rank, dtype=np.int32)
                           for p in parts]) if parts else np.empty(0, np.int32)
    name = pd.Categorical(join("name"))
    cat = pd.Categorical(join("cat"))
    pid = pd.Categorical([str(v) for v in join("pid")])
    tid = pd.Categorical([str(v) for v in join("tid")])
    start = np.concatenate([p.start for p in parts])
    dur = np.concatenate([p.dur for p in parts])
    # kinds depend on name and category together: classify each distinct pair once
    ncat = len(cat.categories) + 1
    pair = name.codes.astype(np.int64) * ncat + cat.codes.astype(np.int64)
    uniq, first = np.unique(pair, return_index=True)
    uniq_kind = _kinds(pd.Series(name[first]), pd.Series(cat[first]))
    kind = pd.Categorical(uniq_kind[np.searchsorted(uniq, pair)], categories=KINDS)
    frame = pd.DataFrame({
        "rank": rank, "name": name, "cat": cat, "kind": kind, "pid": pid, "tid": tid,
        "lane": _lanes(parts, rank, pid, tid, cat),
        "start_us": start, "dur_us": dur, "end_us": start + dur,
        "collective": pd.Categorical(join("collective")),
        "shapes": pd.Categorical(join("shapes")),
        "stream": pd.array(join("stream"), dtype="Int32"),
    })
    frame = frame.sort_values(["start_us", "end_us"], ascending=[True, False], kind="stable",
                              ignore_index=True)
    frame["step"] = _steps(frame)
    frame["rel_us"] = frame["start_us"] - (frame["start_us"].min() if n else 0.0)
    return frame


def _lanes(parts: Sequence[_Columns], rank: np.ndarray, pid: pd.Categorical,
           tid: pd.Categorical, cat: pd.Categorical) -> pd.Categorical:
    """A readable lane per (rank, pid, tid): the thread's name if the trace gives one,
    ``GPU p stream t`` for GPU events, else ``thread t`` (with the pid when a rank has
    several processes)."""
    names = {}
    merged = any(p.merged for p in parts)
    for part in parts:
        for key, label in part.thread_names.items():
            names[(part.rank if np.isscalar(part.rank) else int(key[0]),) + key] = label
    gpu = np.isin(np.asarray(cat.astype(str)), list(GPU_CATEGORIES))
    keys = pd.DataFrame({"rank": rank, "pid": pid, "tid": tid, "gpu": gpu})
    group = keys.groupby(["rank", "pid", "tid", "gpu"], observed=True, sort=False).ngroup()
    uniq = keys.drop_duplicates()  # first appearances: the same order as ngroup(sort=False)
    numeric = uniq["pid"].astype(str).str.fullmatch(r"-?\d+").to_numpy()
    cpu_pids = uniq[~uniq["gpu"].to_numpy() & numeric].groupby("rank")["pid"].nunique()
    labels = []
    for r, p, t, g in zip(uniq["rank"], uniq["pid"].astype(str), uniq["tid"].astype(str),
                          uniq["gpu"]):
        named = names.get((r, p, t))
        if merged and named:
            labels.append(named)
        elif g:
            labels.append(f"GPU {p} stream {t}")
        else:
            many = cpu_pids.get(r, 0) > 1 and re.fullmatch(r"-?\d+", p) is not None
            base = named or f"thread {t}"
            labels.append(f"{base} (pid {p})" if many else base)
    return pd.Categorical(np.array(labels, dtype=object)[group.to_numpy()])


def _steps(frame: pd.DataFrame) -> pd.Series:
    """The ``ProfilerStep#N`` each event starts in, on its own rank (``<NA>`` outside steps)."""
    values = np.zeros(len(frame), dtype=np.int64)
    inside = np.zeros(len(frame), dtype=bool)
    is_step = frame["kind"].to_numpy() == "step"
    if is_step.any():
        ranks = frame["rank"].to_numpy()
        starts_all = frame["start_us"].to_numpy()
        for rank in np.unique(ranks[is_step]):
            steps = frame[is_step & (ranks == rank)]
            numbers = steps["name"].astype(str).str.extract(STEP_NAME)[0].astype(int).to_numpy()
            starts, ends = steps["start_us"].to_numpy(), steps["end_us"].to_numpy()
            mine = np.flatnonzero(ranks == rank)
            pos = np.searchsorted(starts, starts_all[mine], side="right") - 1
            ok = (pos >= 0) & (starts_all[mine] < ends[np.clip(pos, 0, None)])
            values[mine] = numbers[np.clip(pos, 0, None)]
            inside[mine] = ok
    result = pd.array(values, dtype="Int32")
    result[~inside] = pd.NA
    return pd.Series(result, index=frame.index)


# ------------------------------------------------------------------ public API

def _read_one(path: Path, rank: int | None, strict: bool) -> tuple[TraceHeader, _Columns]:
    doc = _read_doc(path)
    if doc.mergedRanks:
        header = TraceHeader(path=path, rank=-1, rank_source="merged file",
                             world_size=doc.world_size, backend=doc.backend)
        columns = _extract(doc, path, -1, strict)
        columns.rank = np.asarray([int(p) for p in columns.pid], dtype=np.int32)
    else:
        header = _header(doc, path, rank)
        columns = _extract(doc, path, header.rank, strict)
    header.events = len(columns.name)
    header.pids = sorted({str(p) for p in columns.pid})
    if len(columns.start):
        header.start_us = float(columns.start.min())
        header.end_us = float((columns.start + columns.dur).max())
    return header, columns


def load_trace(path: str | Path, rank: int | None = None, *, strict: bool = True) -> Trace:
    """Read one trace file (``.json`` or ``.json.gz``) into a :class:`Trace`.

    rank: which rank wrote it, when neither ``distributedInfo`` nor the file name says.
    strict: raise on events without a start time (default) or skip and count them.

    The DataFrame has one row per complete event, sorted by start: ``rank, name,
    cat, kind, pid, tid, lane, start_us, dur_us, end_us, collective, shapes,
    stream, step, rel_us`` (µs since the trace's first event). A file written by
    :func:`merge_traces` loads with each event's own rank.
    """
    header, columns = _read_one(Path(path), rank, strict)
    return Trace(header, _frame([columns]), columns.skipped)


def trace_files(folder: str | Path) -> list[Path]:
    """The trace files under a folder: ``*.json`` and ``*.json.gz``, recursively, sorted;
    the run manifest ``run.json`` and files under ``logs/`` are left out."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TraceError(folder, "no such folder")
    files = [p for p in folder.rglob("*") if p.is_file()
             and (p.name.endswith(".json") or p.name.endswith(".json.gz"))
             and p.name != "run.json" and "logs" not in p.relative_to(folder).parts[:-1]]
    return sorted(files)


def load_run(source, *, strict: bool = True, ranks: Iterable[int] | None = None,
             same_run: bool = True, expect_ranks: Iterable[int] | None = None) -> RunTraces:
    """Load every rank's trace of one run into a :class:`RunTraces`.

    source: a run folder, a ``RunRecord``, a list of files, or ``{rank: file}``
        (for traces that do not say their rank).
    strict: raise :class:`TraceError` on the first bad file (default), or skip bad
        files and list them in ``.skipped``.
    ranks: only keep these ranks.
    same_run: check that the files come from one run (same world size and backend,
        same ``run_id`` where recorded, ranks active at the same time).
    expect_ranks: ranks that must be there; a missing one raises :class:`TraceError` naming it.

    ``events`` gets ``rel_us``: µs since the earliest event of the whole run.
    """
    if hasattr(source, "run_dir"):  # a RunRecord
        source = source.run_dir
    if isinstance(source, dict):
        items = [(Path(p), r) for r, p in source.items()]
    elif isinstance(source, (str, os.PathLike)):
        items = [(p, None) for p in trace_files(source)]
        if not items:
            raise TraceError(source, "no trace files (*.json, *.json.gz) in this folder; did the "
                                     "profiled ranks run to the end of their active window?")
    else:
        items = [(Path(p), None) for p in source]
    if not items:
        raise TraceError(None, "no trace files given")
    wanted = None if ranks is None else set(ranks)

    loaded: list[tuple[TraceHeader, _Columns]] = []
    skipped: list[tuple[Path, str]] = []
    for path, rank in items:
        try:
            header, columns = _read_one(path, rank, strict)
        except TraceError as err:
            if strict:
                raise
            skipped.append((path, err.problem))
            continue
        if header.rank_source == "merged file":
            skipped.append((path, "a merged trace of several ranks, not one rank's"))
            continue
        if columns.skipped:
            skipped.append((path, f"{columns.skipped} events without a start time skipped"))
        if wanted is None or header.rank in wanted:
            loaded.append((header, columns))
    if not loaded:
        raise TraceError(None, "no usable trace among: " + "; ".join(
            f"{_short(p)} ({why})" for p, why in skipped))
    headers = sorted((h for h, _ in loaded), key=lambda h: (h.rank, h.start_us))
    if expect_ranks is not None:
        missing = sorted(set(expect_ranks) - {h.rank for h in headers})
        if missing:
            where = source if isinstance(source, (str, os.PathLike)) else None
            raise TraceError(where, f"no trace from rank{'s' if len(missing) > 1 else ''} "
                                    f"{', '.join(map(str, missing))}: check that "
                                    f"{'they' if len(missing) > 1 else 'it'} profiled and "
                                    f"that every node's folder was gathered")
    _check_ranks(headers)
    if same_run:
        _check_same_run(headers)
    return RunTraces(_frame([c for _, c in loaded]), headers, skipped)


def _check_ranks(headers: Sequence[TraceHeader]) -> None:
    """Two files may share a rank only as two windows of one process (same pid, no overlap)."""
    by_rank: dict[int, list[TraceHeader]] = {}
    for h in headers:
        by_rank.setdefault(h.rank, []).append(h)
    for rank, same in by_rank.items():
        same.sort(key=lambda h: h.start_us)
        for a, b in zip(same, same[1:]):
            if set(a.pids) != set(b.pids) or b.start_us < a.end_us:
                raise TraceError(b.path, f"claims rank {rank}, like {_short(a.path)}; two files "
                                         f"of one rank must be separate windows of one process. "
                                         f"Remove the duplicate, or pass files as {{rank: path}}")


def _check_same_run(headers: Sequence[TraceHeader]) -> None:
    first = headers[0]
    for h in headers[1:]:
        for attr in ("world_size", "backend", "run_id"):
            x, y = getattr(first, attr), getattr(h, attr)
            if x is not None and y is not None and x != y:
                raise TraceError(h.path, f"comes from a different run than {_short(first.path)} "
                                         f"({attr} {y!r} vs {x!r}); load each run's folder on "
                                         f"its own")
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
            raise TraceError(path, f"rank {late} starts {gap:.3f} s after rank {early} has "
                                   f"finished: the ranks were not running at the same time, so "
                                   f"these look like files of different runs. Load each run on "
                                   f"its own, or pass same_run=False if this is intended")


def merge_traces(run: RunTraces | str | Path, out: str | Path, *, gzip_output: bool | None = None) -> Path:
    """Write all ranks into one Chrome trace: one process per rank (``rank N``, in rank
    order), one thread per original lane; every event of every file is kept, with times
    on the run's shared axis. Opens in https://ui.perfetto.dev and chrome://tracing.

    gzip_output: compress (default: when ``out`` ends in ``.gz``). Returns the path.
    """
    if not isinstance(run, RunTraces):
        run = load_run(run)
    out = Path(out)
    if gzip_output is None:
        gzip_output = out.name.endswith(".gz")
    t0_us = float(run.events["start_us"].min())
    known = run.events.groupby(["rank", "pid", "tid"], observed=True)["lane"].first()
    lane_labels = {(int(r), str(p), str(t)): str(v) for (r, p, t), v in known.items()}
    merged: list[dict] = []
    lane_ids: dict[tuple[int, str, str], int] = {}
    for header in run.headers:
        doc = _read_json(header.path)
        base_us = (doc.get("baseTimeNanoseconds") or 0) / 1000.0
        rank = header.rank
        for e in doc["traceEvents"]:
            if not isinstance(e, dict) or "ts" not in e or e.get("ph") == "M":
                continue  # process and thread names are written anew below
            key = (rank, str(e.get("pid", "")), str(e.get("tid", "")))
            if key not in lane_ids:
                lane_ids[key] = len(lane_ids) + 1
            e = dict(e)
            e["pid"], e["tid"] = rank, lane_ids[key]
            e["ts"] = float(e["ts"]) + base_us - t0_us
            merged.append(e)
    for (rank, p, t), lane in lane_ids.items():
        label = lane_labels.get((rank, p, t)) or f"pid {p} tid {t}"
        merged.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": lane,
                       "args": {"name": label}})
        merged.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": lane,
                       "args": {"sort_index": lane}})
    for rank in run.ranks:
        merged.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        merged.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
    first = run.headers[0]
    doc = {MERGED_KEY: run.ranks, "world_size": first.world_size, "backend": first.backend,
           "baseTimeNanoseconds": int(round(t0_us * 1000)), "displayTimeUnit": "ms",
           "traceEvents": merged}
    data = msgspec.json.encode(doc)
    tmp = out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_bytes(gzip.compress(data, compresslevel=5) if gzip_output else data)
    os.replace(tmp, out)
    return out


def gather_traces(node_dirs: Sequence[str | Path], dest: str | Path) -> list[Path]:
    """Copy the trace files of several nodes' folders into one folder, as you would bring
    them together from node-local disks; returns the copies. Two nodes with a file of the
    same name raise :class:`TraceError` rather than overwrite one with the other."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    copies: dict[str, Path] = {}
    for node_dir in node_dirs:
        for path in trace_files(node_dir):
            if path.name in copies:
                raise TraceError(path, f"has the same name as {_short(copies[path.name])}; "
                                       f"name trace files after their rank")
            copies[path.name] = path
    out = []
    for name, path in sorted(copies.items()):
        target = dest / name
        shutil.copy2(path, target)
        out.append(target)
    return out


def shift_ranks(events: pd.DataFrame, ranks: Iterable[int], offset_us: float) -> pd.DataFrame:
    """A copy of ``events`` with the given ranks' times moved by ``offset_us`` (as if their
    host's clock were that far ahead); ``rel_us`` is recomputed for the whole run."""
    out = events.copy()
    mine = out["rank"].isin(list(ranks))
    for column in ("start_us", "end_us"):
        out.loc[mine, column] = out.loc[mine, column] + offset_us
    out["rel_us"] = out["start_us"] - out["start_us"].min()
    return out
