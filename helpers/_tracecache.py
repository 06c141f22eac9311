"""The trace loader's cache: a finished load kept next to the traces, reused while no file changes.

One file per load in ``<folder>/.cache/events-<key>.npz``: the DataFrame's columns as plain
numpy arrays (codes of categorical columns, values and masks of nullable ones) and a JSON
description (categories, headers, skipped files). The key covers every trace file's path,
size and modification time, the load's options, and the cache format, so a changed,
added or removed file means a new key and a fresh load. Files are written under a
temporary name and renamed, so two notebooks loading the same run at once never read a
half-written cache; a damaged or unreadable cache is ignored. Nothing here unpickles.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from ._tracefile import TraceHeader
from .runs import CACHE_DIR

FORMAT = 1  # change when the columns or their meaning change
KEEP = 4  # cache files kept per folder (the most recent)


def cache_file(folder: Path, items, options: dict) -> Path | None:
    """The cache file of a load of ``items`` (with these options) from ``folder``: its name
    changes when a file changes. None when a file cannot be looked at."""
    stats = []
    try:
        for path, rank in items:
            st = path.stat()
            stats.append([str(path.resolve()), rank, st.st_size, st.st_mtime_ns])
    except OSError:
        return None
    key = hashlib.sha1(json.dumps([FORMAT, stats, options], sort_keys=True).encode()).hexdigest()
    return folder / CACHE_DIR / f"events-{key[:16]}.npz"


def read(path: Path):
    """``(events, headers, skipped)`` from the cache file, or None when it is not there."""
    try:
        if not path.is_file():
            return None
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(data["meta"].tobytes())
            columns = {name: _column(data, name, spec) for name, spec in meta["columns"].items()}
        events = pd.DataFrame(columns, copy=False)
        headers = [TraceHeader(**dict(h, path=Path(h["path"]))) for h in meta["headers"]]
        skipped = [(Path(p), why) for p, why in meta["skipped"]]
        os.utime(path)  # recently used: kept when older caches are pruned
        return events, headers, skipped
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile):
        return None


def _column(data, name: str, spec: dict):
    if spec["type"] == "category":
        categories = pd.Index(spec["categories"], dtype=spec["dtype"])
        return pd.Categorical.from_codes(data[f"{name}.codes"], categories=categories)
    if spec["type"] == "masked":
        return pd.arrays.IntegerArray(data[f"{name}.values"], data[f"{name}.mask"])
    return data[name]


def write(path: Path, events: pd.DataFrame, headers, skipped) -> None:
    """Keep a load in the cache file (silently nothing when it cannot be written)."""
    try:
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
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
        _prune(path.parent)
    except OSError:
        return


def _prune(cache_dir: Path) -> None:
    caches = sorted(cache_dir.glob("events-*.npz"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in caches[KEEP:]:
        old.unlink(missing_ok=True)
