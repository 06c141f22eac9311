"""The trace loader's cache: a finished load kept next to the traces, reused while no file changes.

One file per load in ``<folder>/.cache/events-<key>.npz``: the DataFrame's columns as plain
numpy arrays (codes of categorical columns, values and masks of nullable ones) and a JSON
description (categories, headers, skipped files). The key covers every trace file's path,
size and modification time, the load's options, :data:`LOADER_VERSION` and a fingerprint of
the loader's own source, so a changed, added or removed file, or a new version of the loader
(new columns, new kinds), means a new key and a fresh load.

Files are written atomically (:func:`helpers._files.atomic_file`: a temporary file, renamed),
so two notebooks loading the same run at once never read a half-written cache; temporary files
left by a writer that died are removed once they are :data:`STALE_AFTER_S` old. A damaged or
unreadable cache file is removed with a :class:`~helpers.traces.TraceWarning` and the run is
loaded from its traces again; a cache that cannot be written is no cache, never a failed load.
Nothing here unpickles, and a cache file is read only within its own size.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .._files import atomic_file
from ._error import TraceWarning
from ._header import TraceHeader
from ..jobs.runs import CACHE_DIR, show_path

#: Bump when the loader's columns, their meaning or the kinds change: every cached load made
#: by an older loader is then ignored. (A change to the loader's source does it as well, see
#: :func:`_loader_fingerprint`; the number says it on purpose.)
LOADER_VERSION = 10  # 10: functional collectives are communication; 9: a send's and a receive's peer and tag; 8: what a cuda_sync event waited for; 7: a GPU copy of a step is no step; 6: a process group with its ranks; 5: a thread named twice keeps its own name
KEEP = 4  # cache files kept per folder (the most recent)
STALE_AFTER_S = 600  # a temporary file this old was left by a writer that died
#: The modules that make a frame (their source is part of the key), from helpers/.
_HELPERS = Path(__file__).resolve().parents[1]
_SOURCES = (
    "traces/load.py", "traces/_cache.py", "traces/_frame.py", "traces/_file.py",
    "traces/_bytes.py", "traces/_json.py", "traces/_header.py", "traces/_columns.py",
    "traces/_steps.py", "traces/kinds.py",
    # what a rank-by-rank pass keeps of each rank (its parts, its chains of the critical path)
    "traces/rank_files.py", "analysis/rank_by_rank.py", "analysis/collectives.py",
    "analysis/point_to_point.py", "analysis/windows.py",
    *sorted(f"analysis/path/{p.name}" for p in (_HELPERS / "analysis" / "path").glob("*.py")),
)  # fmt: skip


@functools.lru_cache(maxsize=1)
def _loader_fingerprint() -> str:
    """A hash of the source of the modules that build the frame ("" where it cannot be
    read): a release that changes them never reads a frame an older one cached."""
    digest = hashlib.sha1()
    try:
        for name in _SOURCES:
            digest.update((_HELPERS / name).read_bytes())
    except OSError:
        return ""
    return digest.hexdigest()[:16]


def cache_file(
    folder: Path, items: Sequence[tuple[Path, int | None]], options: dict
) -> Path | None:
    """The cache file of a load of ``items`` (with these options) from ``folder``: its name
    changes when a file or the loader changes. None when a file cannot be looked at."""
    stats = []
    try:
        for path, rank in items:
            st = path.stat()
            stats.append([str(path.resolve()), rank, st.st_size, st.st_mtime_ns])
    except OSError:
        return None
    key = json.dumps([LOADER_VERSION, _loader_fingerprint(), stats, options], sort_keys=True)
    return folder / CACHE_DIR / f"events-{hashlib.sha1(key.encode()).hexdigest()[:16]}.npz"


def read(path: Path) -> tuple[pd.DataFrame, list[TraceHeader], list] | None:
    """``(events, headers, skipped)`` from the cache file, or None when it is not there or
    cannot be used (then it is removed, with a TraceWarning saying so)."""
    try:
        if not path.is_file():
            return None
    except OSError:
        return None
    try:
        _check_archive(path)
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(data["meta"].tobytes())
            columns = {name: _column(data, name, spec) for name, spec in meta["columns"].items()}
        events = pd.DataFrame(columns, copy=False)
        headers = [TraceHeader(**dict(h, path=Path(h["path"]))) for h in meta["headers"]]
        skipped = [(Path(p), why) for p, why in meta["skipped"]]
    except Exception as err:  # any damage at all: the traces are still there to load
        _discard(path, err)
        return None
    try:
        os.utime(path)  # recently used: kept when older caches are pruned
    except OSError:
        pass
    _sweep(path.parent)
    return events, headers, skipped


def _check_archive(path: Path) -> None:
    """Raise ValueError unless the file is an uncompressed archive whose members fit in it,
    as ``np.savez`` writes them: no member can then expand beyond the file's own size."""
    size = path.stat().st_size
    with zipfile.ZipFile(path) as archive:
        members = archive.infolist()
    if any(m.compress_type != zipfile.ZIP_STORED for m in members):
        raise ValueError("a compressed member (this loader writes none)")
    if sum(m.file_size for m in members) > size:
        raise ValueError("members larger than the file")


def _discard(path: Path, err: Exception) -> None:
    """Remove a cache file that could not be read, with a TraceWarning saying so."""
    warnings.warn(
        TraceWarning(
            f"{show_path(path)}: the cached load could not be read "
            f"({type(err).__name__}: {str(err)[:120]}); it is removed and the run is loaded "
            f"from its trace files"
        ),
        stacklevel=4,
    )
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def _column(data: Any, name: str, spec: dict) -> Any:
    """One column of the frame from the arrays ``data`` of a cache file, as ``spec`` says."""
    if spec["type"] == "category":
        categories = pd.Index(spec["categories"], dtype=spec["dtype"])
        return pd.Categorical.from_codes(data[f"{name}.codes"], categories=categories)
    if spec["type"] == "masked":
        return pd.arrays.IntegerArray(data[f"{name}.values"], data[f"{name}.mask"])
    return data[name]


def write(path: Path, events: pd.DataFrame, headers: list[TraceHeader], skipped: list) -> None:
    """Keep a load in the cache file (silently nothing when it cannot be written)."""
    try:
        arrays = _arrays(events, headers, skipped)
        with atomic_file(path) as f:  # nothing is left behind when it fails
            np.savez(f, **arrays)
        _prune(path.parent)
    except Exception:  # a cache that cannot be written is no cache, not a failed load
        pass


def _arrays(events: pd.DataFrame, headers: list[TraceHeader], skipped: list) -> dict:
    """The arrays of the cache file: each column's (codes of a categorical one, values and
    mask of a nullable one), and ``meta``, the JSON that describes them, the headers and the
    files skipped."""
    arrays, columns = {}, {}
    for name in events.columns:
        values = events[name].array
        if isinstance(values, pd.Categorical):
            arrays[f"{name}.codes"] = values.codes
            columns[name] = {
                "type": "category",
                "categories": values.categories.tolist(),
                "dtype": str(values.categories.dtype),
            }
        elif isinstance(values, pd.arrays.IntegerArray):
            arrays[f"{name}.values"] = values.to_numpy(values.dtype.numpy_dtype, na_value=0)
            arrays[f"{name}.mask"] = np.asarray(values.isna())
            columns[name] = {"type": "masked"}
        else:
            arrays[name] = np.asarray(values)
            columns[name] = {"type": "array"}
    meta = {
        "columns": columns,
        "headers": [dict(asdict(h), path=str(Path(h.path).resolve())) for h in headers],
        "skipped": [[str(p), why] for p, why in skipped],
    }
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    return arrays


def _prune(cache_dir: Path) -> None:
    """Keep the :data:`KEEP` most recently used cache files of the folder."""
    caches = sorted(cache_dir.glob("events-*.npz"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in caches[KEEP:]:
        old.unlink(missing_ok=True)
    _sweep(cache_dir)


def _sweep(cache_dir: Path) -> None:
    """Remove the temporary files that writers which died left behind (any older than
    :data:`STALE_AFTER_S`; a writer alive now finishes in seconds)."""
    now = time.time()
    try:
        for tmp in cache_dir.glob("*events-*.tmp"):  # .events-*: atomic_file's name
            try:
                if now - tmp.stat().st_mtime > STALE_AFTER_S:
                    tmp.unlink()
            except OSError:
                pass  # gone already, or not ours to remove
    except OSError:
        pass


# ---------------------------------------------------------- one rank's events, as Parquet


def rank_cache_file(path: Path, what: str = "events", rank: int | None = None) -> Path | None:
    """Where one rank's trace ``path`` keeps ``what`` (its events, or a part of them) as
    Parquet, in ``.cache/`` of its folder: the name changes when the file (its path, size,
    modification time), the rank it was read as (``rank``) or the loader changes. None when the
    file cannot be looked at."""
    try:
        st = path.stat()
    except OSError:
        return None
    stat = [str(path.resolve()), st.st_size, st.st_mtime_ns]
    key = json.dumps([LOADER_VERSION, _loader_fingerprint(), stat, rank])
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return path.parent / CACHE_DIR / f"rank-{path.name}-{digest}-{what}.parquet"


def read_rank(cache: Path) -> pd.DataFrame | None:
    """A frame kept by :func:`write_rank`, or None when there is no usable cache."""
    try:
        frame = pd.read_parquet(cache)
    except Exception:  # missing, half-written by a killed writer, or unreadable: no cache
        return None
    for name in frame.columns:  # Parquet gives an empty category list no type: the loader's
        column = frame[name]
        if isinstance(column.dtype, pd.CategoricalDtype) and column.cat.categories.dtype == object:
            frame[name] = column.cat.set_categories(column.cat.categories.astype("str"))
    return frame


def write_rank(cache: Path, frame: pd.DataFrame, index: bool = False) -> None:
    """Keep a frame of one rank as Parquet (with its index if ``index``); the same file's
    older caches of the same part go. A cache that cannot be written is no cache, not a
    failed load."""
    try:
        with atomic_file(cache) as file:
            frame.to_parquet(file, index=index)
        file_part, _, what = cache.name.removesuffix(".parquet").rsplit("-", 2)
        for old in cache.parent.glob(f"{file_part}-*-{what}.parquet"):
            if old != cache:
                old.unlink(missing_ok=True)
    except Exception:
        pass
