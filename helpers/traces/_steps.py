"""Steps and launches: which ``ProfilerStep#N`` each event belongs to, and which CPU call launched
each GPU event.

A CPU event belongs to the step it starts in. A GPU event (kernel, memcpy, memset, GPU
annotation) often runs after its step's CPU work has ended, so it belongs to the step whose CPU
code launched it: a kernel carries the ``correlation`` id of the CUDA runtime call that launched
it, a GPU annotation the ``External id`` of its CPU annotation. All of it on numpy arrays of one
file's events, sorted by start.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ._error import TraceError

STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
#: The categories of events on a GPU's timeline (each is matched to its launch): its work, the
#: copies of CPU annotations drawn on a stream, and the synchronisation events Kineto records
#: with ``enable_cuda_sync_events`` (``cuda_sync``: a stream waiting for an event, a CPU call
#: waiting for the GPU), which carry the correlation of the CUDA call that made them.
GPU_CATEGORIES = frozenset(
    {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"}
)


def step_numbers(
    start: np.ndarray, end: np.ndarray, name: tuple[np.ndarray, list], gpu: np.ndarray
) -> np.ndarray:
    """The ``ProfilerStep#N`` each event (sorted by start) starts in; -1 outside every step.
    The steps are the CPU's ``ProfilerStep#N`` events (``gpu``: the events on a GPU, whose
    copies of them are not steps)."""
    of_event = _step_of_name(name, gpu)
    steps = np.flatnonzero(of_event >= 0)
    if not len(steps):
        return np.full(len(start), -1, np.int32)
    pos = np.searchsorted(start[steps], start, side="right") - 1
    inside = (pos >= 0) & (start < end[steps][np.clip(pos, 0, None)])
    return np.where(inside, of_event[steps][np.clip(pos, 0, None)], -1).astype(np.int32)


def _first_equal(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """For each of ``wanted``, the position in ``keys`` of the first equal key, or -1."""
    if not len(keys):
        return np.full(len(wanted), -1, np.int64)
    order = np.argsort(keys, kind="stable")
    pos = np.minimum(np.searchsorted(keys[order], wanted), len(keys) - 1)
    return np.where(keys[order][pos] == wanted, order[pos], -1)


def _rows_of(rows: np.ndarray, found: np.ndarray) -> np.ndarray:
    """``rows[found]`` where ``found`` >= 0, else -1."""
    if not len(rows):
        return np.full(len(found), -1, np.int64)
    return np.where(found >= 0, rows[np.maximum(found, 0)], -1)


def launches(
    step: np.ndarray,
    start: np.ndarray,
    gpu: np.ndarray,
    correlation: np.ndarray,
    external_id: np.ndarray,
    ranks: np.ndarray | None,
) -> tuple[np.ndarray, int]:
    """Give every GPU event the step of the CPU event that launched it (in place on ``step``).

    A kernel, memcpy or memset carries the ``correlation`` id of the CUDA runtime call that
    launched it (the ``ac2g`` flow arrows of the trace join the same pairs); a GPU annotation
    carries the ``External id`` of its CPU annotation. Returns the launch time of each GPU
    event (NaN for CPU events and for GPU events whose launch is not in the trace: their step
    becomes -1) and the number of GPU events without a launch. In a merged file ids repeat
    across ranks, so each rank is matched on its own."""
    launch = np.full(len(step), np.nan)
    if not gpu.any():
        return launch, 0
    missing = 0
    for rows in _each_rank(len(step), ranks):
        kernels = rows[gpu[rows]]
        if not len(kernels):
            continue
        cpu = rows[~gpu[rows]]
        by_correlation = cpu[correlation[cpu] >= 0]
        source = _rows_of(
            by_correlation, _first_equal(correlation[by_correlation], correlation[kernels])
        )
        if (source < 0).any():  # GPU annotations, and traces without correlation ids
            rest = np.flatnonzero((source < 0) & (external_id[kernels] >= 0))
            by_external = cpu[external_id[cpu] >= 0]
            found = _first_equal(external_id[by_external], external_id[kernels[rest]])
            source[rest] = _rows_of(by_external, found)
        linked = source >= 0
        step[kernels] = np.where(linked, step[np.maximum(source, 0)], -1)
        launch[kernels[linked]] = start[source[linked]]
        missing += int((~linked).sum())
    return launch, missing


def recorded_at(
    start: np.ndarray,
    gpu: np.ndarray,
    correlation: np.ndarray,
    record: np.ndarray,
    ranks: np.ndarray | None,
) -> np.ndarray:
    """When the CPU recorded the CUDA event that each event waited on: for a ``cuda_sync``
    event that names one (``record``, the ``wait_on_cuda_event_record_corr_id`` of a stream or
    CPU waiting for an event), the start of the ``cudaEventRecord`` call with that correlation;
    NaN for every other event and where the call is not in the trace. The event completes when
    the work its stream was given before that moment has run."""
    at = np.full(len(start), np.nan)
    if not (record >= 0).any():
        return at
    for rows in _each_rank(len(start), ranks):
        waits = rows[record[rows] >= 0]
        calls = rows[~gpu[rows] & (correlation[rows] >= 0)]
        source = _rows_of(calls, _first_equal(correlation[calls], record[waits]))
        at[waits[source >= 0]] = start[source[source >= 0]]
    return at


def _each_rank(n: int, ranks: np.ndarray | None) -> list[np.ndarray]:
    """The rows of each rank's events (all ``n`` rows when the file is one rank's): in a
    merged file ids repeat across ranks, so each rank is matched on its own."""
    if ranks is None:
        return [np.arange(n)]
    return [np.flatnonzero(ranks == r) for r in np.unique(ranks)]


def _step_of_name(name: tuple[np.ndarray, list], gpu: np.ndarray) -> np.ndarray:
    """N for each ``ProfilerStep#N`` event on the CPU, -1 for every other event (a copy of the
    step on a GPU stream included)."""
    numbers = np.array(
        [int(m.group(1)) if (m := STEP_NAME.match(v)) else -1 for v in name[1]] + [-1],
        dtype=np.int64,
    )
    return np.where(gpu, -1, numbers[name[0]])


def in_steps(
    path: Path,
    start: np.ndarray,
    end: np.ndarray,
    name: tuple[np.ndarray, list],
    step: np.ndarray,
    gpu: np.ndarray,
    steps: tuple[int, int],
) -> np.ndarray:
    """Which events belong to ``ProfilerStep#first`` .. ``#last`` (inclusive): CPU events that
    start inside those steps, GPU events launched in them (wherever they run)."""
    first, last = steps
    numbers = _step_of_name(name, gpu)
    found = sorted(set(numbers[numbers >= 0].tolist()))
    inside = (numbers >= first) & (numbers <= last)
    if not inside.any():
        raise TraceError(
            path,
            f"steps={steps}: no ProfilerStep#{first}..#{last} here; steps "
            f"present: {found or 'none (was a schedule used?)'}",
        )
    t0, t1 = start[inside].min(), end[inside].max()
    return np.where(gpu, (step >= first) & (step <= last), (start >= t0) & (start < t1))


def link_rows(cat: tuple[np.ndarray, list]) -> dict[str, np.ndarray]:
    """The events whose ids can link a GPU event to its launch (the others are not read):
    ``correlation`` on GPU events and runtime/driver calls, ``External id`` on annotations
    (a GPU annotation and its CPU annotation share it); and the ``cuda_sync`` events, which say
    what they waited for (``sync``). None of them in a CPU-only trace."""
    codes, cats = cat
    gpu = [c in GPU_CATEGORIES for c in cats]
    if not any(gpu):
        none = np.array([], np.int64)
        return {"correlation": none, "external_id": none, "sync": none}
    launches = [g or "runtime" in c or "driver" in c for c, g in zip(cats, gpu)]
    annotations = [c in ("gpu_user_annotation", "user_annotation") for c in cats]
    if "gpu_user_annotation" not in cats:
        annotations = [False] * len(cats)

    def rows(wanted: list[bool]) -> np.ndarray:
        return np.flatnonzero(np.append(np.asarray(wanted, bool), False)[codes])

    return {
        "correlation": rows(launches),
        "external_id": rows(annotations),
        "sync": rows([c == "cuda_sync" for c in cats]),
    }
