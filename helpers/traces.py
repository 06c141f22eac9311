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
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import orjson
import pandas as pd

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
COMM_PATTERN = re.compile(r"^(?:nccl|gloo|c10d|mpi)[:_]|^record_param_comms$|nccl(?:Dev)?Kernel|^ProcessGroup",
                          re.IGNORECASE)
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


# ---------------------------------------------------------------- reading bytes

def _read_json(path: Path) -> dict:
    """Parse a .json or .json.gz file, turning every failure into a TraceError."""
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
    elif path.suffix == ".gz":
        raise TraceError(path, "named .gz but is not gzip data; rename it or re-compress it")
    if not data.strip():
        raise TraceError(path, "the file is empty (the profiler never wrote it, or the rank died "
                               "before exporting); re-run that rank")
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        stripped = data.rstrip()
        if stripped[:1] in (b"{", b"[") and e.pos >= len(stripped) - 1:
            raise TraceError(path, f"the JSON stops before it is complete at byte {len(data)}: "
                                   "the file is truncated (was the rank killed while writing "
                                   "it?); re-run, or drop this file and load the others "
                                   "with strict=False") from None
        raise TraceError(path, f"not valid JSON ({e}); is this a profiler trace?") from None
    if isinstance(doc, list):  # the bare-array form of the Chrome trace format
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(path, "has no 'traceEvents' list: not a Chrome/Kineto trace "
                               "(written by prof.export_chrome_trace or a trace handler?)")
    return doc


# ------------------------------------------------------------------- the header

def _rank_of(doc: dict, path: Path, rank: int | None) -> tuple[int, str]:
    if rank is not None:
        return int(rank), "argument"
    info = doc.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"], "distributedInfo"
    m = RANK_IN_NAME.search(path.name)
    if m:
        return int(m.group(1)), "file name"
    raise TraceError(path, "cannot tell which rank wrote it: no 'distributedInfo' in the trace "
                           "and no 'rank<N>' in the file name. Pass it: "
                           "load_trace(path, rank=N), or load_run({rank: path, ...})")


def _header(doc: dict, path: Path, rank: int | None) -> TraceHeader:
    rank, source = _rank_of(doc, path, rank)
    info = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    base = doc.get("baseTimeNanoseconds")
    return TraceHeader(
        path=path, rank=rank, rank_source=source,
        world_size=info.get("world_size"), backend=info.get("backend"),
        process_groups=info.get("pg_config") or [],
        host=doc.get("host_name") or doc.get("hostname"),
        run_id=doc.get("run_id"),
        base_time_ns=int(base) if isinstance(base, (int, float)) else None,
        schema_version=doc.get("schemaVersion"),
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


def _lane_names(doc_events: list, pid: pd.Series, tid: pd.Series, cat: pd.Series) -> pd.Series:
    """A readable lane per (pid, tid): the thread's name if the trace gives one,
    ``GPU p stream t`` for GPU events, else ``thread t``."""
    names = {}
    for e in doc_events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            label = (e.get("args") or {}).get("name")
            if label:
                names[(str(e.get("pid")), str(e.get("tid")))] = str(label)
    gpu = cat.isin(list(GPU_CATEGORIES)).to_numpy()
    keys = pd.DataFrame({"pid": pid.astype(str), "tid": tid.astype(str), "gpu": gpu})
    uniq = keys.drop_duplicates()
    cpu_pids = uniq.loc[~uniq.gpu & uniq.pid.str.fullmatch(r"-?\d+"), "pid"].nunique()
    labels = {}
    for p, t, g in uniq.itertuples(index=False):
        if g:
            labels[(p, t, g)] = f"GPU {p} stream {t}"
        else:
            base = names.get((p, t)) or f"thread {t}"
            numeric = re.fullmatch(r"-?\d+", p) is not None
            labels[(p, t, g)] = f"{base} (pid {p})" if cpu_pids > 1 and numeric else base
    return pd.Series([labels[k] for k in zip(keys.pid, keys.tid, keys.gpu)], dtype="category")


def _events_frame(doc: dict, path: Path, rank: int, strict: bool) -> tuple[pd.DataFrame, int]:
    """The complete ('X') events of one parsed trace as a DataFrame; times in absolute µs."""
    raw = doc["traceEvents"]
    xs = [e for e in raw if isinstance(e, dict) and e.get("ph") == "X"]
    ts = [e.get("ts") for e in xs]
    skipped = 0
    if None in ts:
        bad = [i for i, t in enumerate(ts) if t is None]
        if strict:
            first = xs[bad[0]]
            raise TraceError(path, f"{len(bad)} complete events have no start time 'ts' (the "
                                   f"first is {first.get('name')!r}); the file is damaged. Load "
                                   f"with strict=False to skip them")
        keep = np.ones(len(xs), dtype=bool)
        keep[bad] = False
        xs = [e for e, k in zip(xs, keep) if k]
        ts = [t for t, k in zip(ts, keep) if k]
        skipped = len(bad)
    args = [e.get("args") or {} for e in xs]
    base_us = (doc.get("baseTimeNanoseconds") or 0) / 1000.0
    try:
        start = np.asarray(ts, dtype=np.float64) + base_us
        dur = np.asarray([e.get("dur", 0) for e in xs], dtype=np.float64)
    except (TypeError, ValueError):
        raise TraceError(path, "an event has a start time or duration that is not a number; "
                               "the file is damaged") from None
    name = pd.Series([e.get("name", "") for e in xs], dtype="category")
    cat = pd.Series([e.get("cat", "") for e in xs], dtype="category")
    pid = pd.Series([str(e.get("pid", "")) for e in xs], dtype="category")
    tid = pd.Series([str(e.get("tid", "")) for e in xs], dtype="category")
    # kinds depend on name and category together: classify each distinct pair once
    ncat = len(cat.cat.categories) + 1
    pair = name.cat.codes.to_numpy(np.int64) * ncat + cat.cat.codes.to_numpy(np.int64)
    uniq, first = np.unique(pair, return_index=True)
    uniq_kind = _kinds(name.iloc[first].reset_index(drop=True), cat.iloc[first].reset_index(drop=True))
    kind = pd.Categorical(uniq_kind[np.searchsorted(uniq, pair)], categories=KINDS)
    frame = pd.DataFrame({
        "rank": np.full(len(xs), rank, dtype=np.int32),
        "name": name, "cat": cat, "kind": kind, "pid": pid, "tid": tid,
        "lane": _lane_names(raw, pid, tid, cat),
        "start_us": start, "dur_us": dur, "end_us": start + dur,
        "collective": pd.Series([a.get("Collective name") for a in args], dtype="category"),
        "shapes": pd.Series([_shapes(a.get("Input Dims")) for a in args], dtype="category"),
        "stream": pd.array([a.get("stream") for a in args], dtype="Int32"),
    })
    frame["step"] = _steps(frame)
    return frame, skipped


def _shapes(dims) -> str | None:
    return None if dims is None else orjson.dumps(dims).decode()


def _steps(frame: pd.DataFrame) -> pd.Series:
    """The ``ProfilerStep#N`` each event starts in (``<NA>`` outside every step)."""
    out = pd.array(np.full(len(frame), pd.NA), dtype="Int32")
    is_step = frame["kind"].to_numpy() == "step"
    if not is_step.any():
        return pd.Series(out, index=frame.index)
    steps = frame.loc[is_step, ["name", "start_us", "end_us"]].sort_values("start_us")
    numbers = steps["name"].astype(str).str.extract(STEP_NAME)[0].astype(int).to_numpy()
    starts, ends = steps["start_us"].to_numpy(), steps["end_us"].to_numpy()
    pos = np.searchsorted(starts, frame["start_us"].to_numpy(), side="right") - 1
    inside = (pos >= 0) & (frame["start_us"].to_numpy() < ends[np.clip(pos, 0, None)])
    values = np.where(inside, numbers[np.clip(pos, 0, None)], 0)
    result = pd.array(values, dtype="Int32")
    result[~inside] = pd.NA
    return pd.Series(result, index=frame.index)


# ------------------------------------------------------------------ public API

def load_trace(path: str | Path, rank: int | None = None, *, strict: bool = True) -> Trace:
    """Read one trace file (``.json`` or ``.json.gz``) into a :class:`Trace`.

    rank: which rank wrote it, when neither ``distributedInfo`` nor the file name says.
    strict: raise on events without a start time (default) or skip and count them.

    The DataFrame has one row per complete event, sorted by start: ``rank, name,
    cat, kind, pid, tid, lane, start_us, dur_us, end_us, collective, shapes,
    stream, step`` (and ``rel_us``, µs since the trace's first event).
    """
    path = Path(path)
    doc = _read_json(path)
    if doc.get(MERGED_KEY):
        return _load_merged(doc, path)
    header = _header(doc, path, rank)
    events, skipped = _events_frame(doc, path, header.rank, strict)
    events = events.sort_values(["start_us", "end_us"], ascending=[True, False],
                                kind="stable", ignore_index=True)
    _describe(header, events)
    events["rel_us"] = events["start_us"] - header.start_us
    return Trace(header, events, skipped)


def _describe(header: TraceHeader, events: pd.DataFrame) -> None:
    header.events = len(events)
    header.pids = sorted(events["pid"].astype(str).unique().tolist())
    if len(events):
        header.start_us = float(events["start_us"].min())
        header.end_us = float(events["end_us"].max())


def _load_merged(doc: dict, path: Path) -> Trace:
    """Read back a file written by :func:`merge_traces` (pid = rank)."""
    events, _ = _events_frame(doc, path, -1, strict=True)
    events["rank"] = events["pid"].astype(int).astype(np.int32)
    lanes = {str(e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    events["lane"] = events["tid"].astype(str).map(lanes).astype("category")
    events = events.sort_values(["start_us", "end_us"], ascending=[True, False],
                                kind="stable", ignore_index=True)
    header = TraceHeader(path=path, rank=-1, rank_source="merged file",
                         world_size=doc.get("world_size"), backend=doc.get("backend"))
    _describe(header, events)
    events["rel_us"] = events["start_us"] - header.start_us
    return Trace(header, events)


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
             same_run: bool = True) -> RunTraces:
    """Load every rank's trace of one run into a :class:`RunTraces`.

    source: a run folder, a ``RunRecord``, a list of files, or ``{rank: file}``
        (for traces that do not say their rank).
    strict: raise :class:`TraceError` on the first bad file (default), or skip bad
        files and list them in ``.skipped``.
    ranks: only keep these ranks.
    same_run: check that the files come from one run (same world size and backend,
        same ``run_id`` where recorded, ranks active at the same time).

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

    traces: list[Trace] = []
    skipped: list[tuple[Path, str]] = []
    for path, rank in items:
        try:
            trace = load_trace(path, rank, strict=strict)
        except TraceError as err:
            if strict:
                raise
            skipped.append((path, err.problem))
            continue
        if trace.header.rank_source == "merged file":
            skipped.append((path, "a merged trace of several ranks, not one rank's"))
            continue
        if trace.skipped_events:
            skipped.append((path, f"{trace.skipped_events} events without a start time skipped"))
        if ranks is None or trace.header.rank in set(ranks):
            traces.append(trace)
    if not traces:
        raise TraceError(None, "no usable trace among: " + "; ".join(
            f"{_short(p)} ({why})" for p, why in skipped))
    _check_ranks(traces)
    if same_run:
        _check_same_run(traces)
    events = pd.concat([t.events for t in traces], ignore_index=True)
    for column in ("name", "cat", "pid", "tid", "lane", "collective", "shapes"):
        events[column] = events[column].astype("category")
    events = events.sort_values(["start_us", "end_us"], ascending=[True, False],
                                kind="stable", ignore_index=True)
    events["rel_us"] = events["start_us"] - events["start_us"].min()
    headers = sorted((t.header for t in traces), key=lambda h: (h.rank, h.start_us))
    return RunTraces(events, headers, skipped)


def _check_ranks(traces: Sequence[Trace]) -> None:
    """Two files may share a rank only as two windows of one process (same pid, no overlap)."""
    by_rank: dict[int, list[TraceHeader]] = {}
    for t in traces:
        by_rank.setdefault(t.header.rank, []).append(t.header)
    for rank, headers in by_rank.items():
        headers.sort(key=lambda h: h.start_us)
        for a, b in zip(headers, headers[1:]):
            if set(a.pids) != set(b.pids) or b.start_us < a.end_us:
                raise TraceError(b.path, f"claims rank {rank}, like {_short(a.path)}; two files "
                                         f"of one rank must be separate windows of one process. "
                                         f"Remove the duplicate, or pass files as {{rank: path}}")


def _check_same_run(traces: Sequence[Trace]) -> None:
    first = traces[0].header
    for t in traces[1:]:
        h = t.header
        for attr in ("world_size", "backend", "run_id"):
            x, y = getattr(first, attr), getattr(h, attr)
            if x is not None and y is not None and x != y:
                raise TraceError(h.path, f"comes from a different run than {_short(first.path)} "
                                         f"({attr} {y!r} vs {x!r}); load each run's folder on "
                                         f"its own")
    spans: dict[int, tuple[float, float]] = {}
    for t in traces:
        lo, hi = spans.get(t.header.rank, (np.inf, -np.inf))
        spans[t.header.rank] = (min(lo, t.header.start_us), max(hi, t.header.end_us))
    if len(spans) > 1:
        latest_start = max(s for s, _ in spans.values())
        earliest_end = min(e for _, e in spans.values())
        if latest_start > earliest_end:
            late = max(spans, key=lambda r: spans[r][0])
            early = min(spans, key=lambda r: spans[r][1])
            path = next(t.header.path for t in traces if t.header.rank == late)
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
        for (r, p, t), lane in lane_ids.items():
            if r != rank:
                continue
            label = lane_labels.get((r, p, t)) or f"pid {p} tid {t}"
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
    data = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    tmp = out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_bytes(gzip.compress(data, compresslevel=5) if gzip_output else data)
    os.replace(tmp, out)
    return out
