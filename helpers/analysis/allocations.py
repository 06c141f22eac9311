"""Each allocation's life: when a block was allocated and freed, by which op and which line of
the learner's code, in which step and phase, and of what kind (its category).

:func:`helpers.load_memory` gives the profiler's ``[memory]`` events, one per allocation or free
of a block at an ``address``. Here each allocation is paired with the free of the same block
(same rank, device and address, the next event there), and placed among the rank's events on
the thread that allocated it: the innermost op around it (``op``), where in the learner's own
code it came from (``line``, with ``with_stack``: the ``file:line`` of the innermost call into
torch made from it, or the learner's function whose own body allocated; a trace without call
sites, as torch 2.11 writes them, gives the learner's innermost function, ``job.py(41): forward``),
the ``ProfilerStep`` and the phase (forward, backward, optimizer).

The category is the profiler's own where the job wrote its memory timeline
(``export_memory_timeline`` to ``memory-timeline/rank<N>.raw.json.gz`` beside the traces, read
by :func:`helpers.load_memory_categories`: each of its allocations is one of the trace's, the
same moment and size), and otherwise inferred from the phase and the life: an allocation freed
within its phase is ``temporary``, except one of the optimizer freed after the op of PyTorch's
that made it (``aten::sqrt``'s result, freed after the division that used it), which the
profiler does not count as a temporary (it gives none on a GPU), and which has none here; one of the forward freed during the backward an
``activation``, and so is one held into the next step and freed there (or, made in the last
step, not freed before the trace ended), or one never freed of a line that keeps memory of the
forward step after step (a copy kept by the learner's code, which the profiler calls an
activation; a buffer made once is not, and the last step, whose memory may be freed after
the trace, does not count), but where the learner's own statement made it outside
any call into torch (``batch = x + 0.0``), held into the next step or never freed, that is an
``input``; one of the backward alive at the step's end is a
``gradient``, one of the optimizer alive at the step's end ``optimizer state``; anything else
has none. ``benchmarks/memory_categories.py`` measures how well this agrees with the
profiler's own.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..traces.memory import in_learners_code
from .intervals import last_open

__all__ = ["allocation_lives", "freed_before_trace", "step_at", "CATEGORIES", "LIFE_COLUMNS"]

#: The profiler's categories (``torch.profiler._memory_profiler.Category``), as named here.
CATEGORIES = (
    "parameter", "optimizer state", "input", "temporary", "activation", "gradient",
    "autograd detail",
)  # fmt: skip

#: The columns of :func:`allocation_lives`'s frame.
LIFE_COLUMNS = [
    "rank", "device", "address", "bytes", "alloc_us", "free_us", "tid", "step", "phase", "op",
    "line", "category", "category_from",
]  # fmt: skip

_BACKWARD = "autograd::engine::evaluate_function"


def allocation_lives(
    memory: pd.DataFrame, events: pd.DataFrame, categories: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Each allocation of ``memory`` (:func:`helpers.load_memory`'s frame) with its life.

    events: the run's events (``load_run(...).events``), for the op, line, step and phase.
    categories: the profiler's own (:func:`helpers.load_memory_categories`), or None to infer
    them (the module says how).

    Returns one row per allocation (:data:`LIFE_COLUMNS`): ``bytes``, ``alloc_us`` and
    ``free_us`` (NaN: not freed before the trace ended), ``step`` (NaN outside the profiler's
    steps), ``phase`` (``forward``, ``backward``, ``optimizer`` or ``outside steps``), ``op``,
    ``line`` (None where no call of the learner's code was around it, or the trace has no
    Python calls), ``category`` (None where neither knows) and ``category_from``
    (``profiler`` or ``inferred``). The frees of blocks allocated before the trace began are
    :func:`freed_before_trace`'s.
    """
    lives, _ = _paired(memory)
    placed = [
        _placed(mine, events[(events["rank"] == rank).to_numpy()])
        for rank, mine in lives.groupby("rank", sort=True)
    ]
    lives = (
        pd.concat(placed, ignore_index=True)
        if placed
        else lives.assign(step=np.nan, _own=False, _leaf_end=np.nan)
    )
    lives["category"] = _inferred(lives, events)
    lives["category_from"] = "inferred"
    if categories is not None and not categories.empty:
        lives = _profilers(lives, categories)
    lives = lives[LIFE_COLUMNS].sort_values(["rank", "alloc_us"], kind="stable")
    return lives.reset_index(drop=True)


def freed_before_trace(memory: pd.DataFrame) -> pd.DataFrame:
    """The bytes that ``memory`` (:func:`helpers.load_memory`'s frame) freed of blocks that no
    allocation in it made: allocated before the trace began (the profiler warns of them), or
    at an address the trace does not give. Returns ``rank, device, bytes``, one row each."""
    return _paired(memory)[1]


def _profilers(lives: pd.DataFrame, categories: pd.DataFrame) -> pd.DataFrame:
    """``lives`` with the profiler's category where it has one allocation of the same rank and
    size within a microsecond (the two files write the same moment, rounded apart)."""
    lives = lives.sort_values("alloc_us", kind="stable").reset_index(drop=True)
    theirs = categories.rename(columns={"category": "theirs"}).sort_values("alloc_us")
    matched = pd.merge_asof(
        lives[["rank", "bytes", "alloc_us"]].astype({"rank": np.int64, "bytes": np.int64}),
        theirs.astype({"rank": np.int64, "bytes": np.int64}).assign(found=True),
        on="alloc_us", by=["rank", "bytes"], direction="nearest", tolerance=1.0,
    )  # fmt: skip
    found = matched["found"].eq(True).to_numpy()
    lives.loc[found, "category"] = matched.loc[found, "theirs"].to_numpy()
    lives.loc[found, "category_from"] = "profiler"
    return lives


def _paired(memory: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each allocation with the time of its free (the next event at its address, when that is a
    free of as many bytes), and the bytes freed of blocks that no allocation in the trace made.
    """
    keys = ["rank", "device", "address"]
    rows = memory.sort_values([*keys, "time_us"], kind="stable").reset_index(drop=True)
    same = np.ones(len(rows), dtype=bool)
    for key in keys:
        column = rows[key].to_numpy()
        same[1:] &= column[1:] == column[:-1]
    same[0] = False
    nbytes = rows["bytes"].to_numpy()
    known = rows["address"].to_numpy() >= 0
    frees_previous = same & known & (nbytes < 0) & (np.r_[0, nbytes[:-1]] == -nbytes)
    freed_next = np.r_[frees_previous[1:], False]
    times = rows["time_us"].to_numpy()
    lives = rows[nbytes > 0].assign(
        alloc_us=times[nbytes > 0],
        free_us=np.where(freed_next, np.r_[times[1:], np.nan], np.nan)[nbytes > 0],
    )
    unmatched = rows[(nbytes < 0) & ~frees_previous]
    freed_before = (
        (-unmatched["bytes"]).groupby([unmatched["rank"], unmatched["device"]]).sum()
        .rename("bytes").reset_index()
    )  # fmt: skip
    return lives[["rank", "device", "address", "bytes", "alloc_us", "free_us", "tid"]], freed_before


def _placed(lives: pd.DataFrame, events: pd.DataFrame) -> pd.DataFrame:
    """One rank's allocations with their ``step``, ``phase``, ``op`` and ``line``."""
    step = step_at(events, lives["alloc_us"].to_numpy())
    inside = ~np.isnan(step)
    phase = np.where(inside, "forward", "outside steps").astype(object)
    op = np.full(len(lives), None, dtype=object)
    line = np.full(len(lives), None, dtype=object)
    own = np.zeros(len(lives), dtype=bool)
    leaf_end = np.full(len(lives), np.nan)
    for tid in lives["tid"].unique():
        mine = (lives["tid"] == tid).to_numpy()
        moments = lives["alloc_us"].to_numpy()[mine]
        on_thread = events[(events["tid"].astype(str) == tid).to_numpy()]
        python = (on_thread["kind"] == "python").to_numpy()
        ops = on_thread[~python & (on_thread["kind"] != "step").to_numpy()]
        op[mine], phase_here, leaf_end[mine] = _op_and_phase(ops, moments)
        phase[mine] = np.where(phase_here == "", phase[mine], phase_here)
        line[mine], own[mine] = _user_line(on_thread[python], moments)
    return lives.assign(step=step, phase=phase, op=op, line=line, _own=own, _leaf_end=leaf_end)


def step_at(events: pd.DataFrame, moments: np.ndarray) -> np.ndarray:
    """The profiler step (``ProfilerStep#N``'s N) that each of ``moments`` falls in, among one
    rank's ``events``; NaN outside every step."""
    steps = events[(events["kind"] == "step").to_numpy()].sort_values("start_us")
    if steps.empty:
        return np.full(len(moments), np.nan)
    at = np.searchsorted(steps["start_us"].to_numpy(), moments, side="right") - 1
    inside = (at >= 0) & (moments < steps["end_us"].to_numpy()[np.maximum(at, 0)])
    number = steps["step"].astype(float).to_numpy()
    return np.where(inside, number[np.maximum(at, 0)], np.nan)


def _chains(frame: pd.DataFrame, moments: np.ndarray) -> tuple[pd.DataFrame, list[np.ndarray]]:
    """``frame`` sorted by start (longest first), and for each of ``moments`` the events open at
    it, innermost first: level k is an array of row positions (-1: none)."""
    frame = frame.assign(_len=-frame["dur_us"]).sort_values(["start_us", "_len"], kind="stable")
    starts, ends = frame["start_us"].to_numpy(), frame["end_us"].to_numpy()
    parent = last_open(np.arange(len(frame)) - 1, ends, starts)
    cand = last_open(np.searchsorted(starts, moments, side="right") - 1, ends, moments, parent)
    levels = []
    while (cand >= 0).any():
        levels.append(cand)
        cand = np.where(cand >= 0, parent[np.maximum(cand, 0)], -1)
    return frame, levels


def _op_and_phase(ops: pd.DataFrame, moments: np.ndarray) -> tuple[np.ndarray, ...]:
    """For each moment, the innermost op open at it (None: none), the phase that the ops
    around it say (``backward``, ``optimizer``, or "" where none says), and the end of the
    outermost op of PyTorch's own open at it (an ``aten::`` op or a backward function; NaN:
    none), within which the profiler calls what is made and freed a temporary."""
    op = np.full(len(moments), None, dtype=object)
    phase = np.full(len(moments), "", dtype=object)
    leaf_end = np.full(len(moments), np.nan)
    if ops.empty:
        return op, phase, leaf_end
    frame, levels = _chains(ops, moments)
    names = frame["name"].astype(str).to_numpy()
    ends = frame["end_us"].to_numpy()
    is_op = frame["cat"].astype(str).isin(["cpu_op", "operator"]).to_numpy()
    is_leaf = is_op & pd.Series(names).str.startswith(("aten::", _BACKWARD)).to_numpy()
    for level in reversed(levels):  # outermost first: the innermost op and phase win
        ok = level >= 0
        at = np.maximum(level, 0)
        name = names[at]
        op = np.where(ok & is_op[at], name, op)
        leaf_end = np.where(ok & is_leaf[at] & np.isnan(leaf_end), ends[at], leaf_end)
        phase = np.where(ok & pd.Series(name).str.startswith(_BACKWARD).to_numpy(), "backward", phase)  # fmt: skip
        phase = np.where(ok & pd.Series(name).str.startswith("Optimizer.").to_numpy(), "optimizer", phase)  # fmt: skip
    return op, phase, leaf_end


def _user_line(python: pd.DataFrame, moments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each moment, where in the learner's code it came: the ``file:line`` of the innermost
    call open at it made from the learner's code into torch or a library, or, where the
    innermost such call is to a function of the learner's own (whose body allocated, no call
    seen), that function as the profiler names it (``job.py(40): main``); None elsewhere. A
    trace without call sites (``CallFrom``: torch 2.11 writes none) gives the learner's
    innermost function. And whether the learner's own statement made it: the innermost call
    open at it is the learner's function (``batch = x + 0.0``), not a call into torch."""
    line = np.full(len(moments), None, dtype=object)
    if python.empty:
        return line, np.zeros(len(moments), dtype=bool)
    frame, levels = _chains(python, moments)
    sites = frame["call_from"].astype(object).where(frame["call_from"].notna(), "").astype(str)
    names = frame["name"].astype(str)
    own = (
        names.str.extract(r"^(.*)\(\d+\): ")[0].fillna("").map(lambda f: in_learners_code(f + ":0"))
    )
    own, called = own.to_numpy(), sites.map(in_learners_code).to_numpy()
    answer = np.where(own, names.to_numpy(), sites.to_numpy())
    for level in reversed(levels):  # outermost first: the innermost call wins
        at = np.maximum(level, 0)
        line = np.where((level >= 0) & (own[at] | called[at]), answer[at], line)
    innermost = levels[0] if levels else np.full(len(moments), -1)
    return line, (innermost >= 0) & own[np.maximum(innermost, 0)]


def _inferred(lives: pd.DataFrame, events: pd.DataFrame) -> np.ndarray:
    """Each allocation's category inferred from its phase and life (the module says how)."""
    steps = events[(events["kind"] == "step").to_numpy()]
    ends = steps.assign(step=steps["step"].astype(float)).groupby(["rank", "step"])["end_us"].max()
    backward = events[events["name"].astype(str).str.startswith(_BACKWARD).to_numpy()]
    first_backward = (
        backward.assign(step=backward["step"].astype(float)).groupby(["rank", "step"])["start_us"].min()
    )  # fmt: skip
    key = pd.MultiIndex.from_arrays([lives["rank"], lives["step"].astype(float)])
    step_end = ends.reindex(key).to_numpy()
    next_end = ends.reindex(
        pd.MultiIndex.from_arrays([lives["rank"], lives["step"] + 1])
    ).to_numpy()
    backward_at = first_backward.reindex(key).to_numpy()
    free, phase = lives["free_us"].to_numpy(), lives["phase"].to_numpy()
    own = lives["_own"].to_numpy(dtype=bool)
    in_step, in_next = free <= step_end, (free > step_end) & (free <= next_end)
    kept = (phase == "forward") & np.isnan(free)
    past_the_trace = kept & np.isnan(next_end)  # made in the last step: freed in the next?
    return np.select(
        [
            (phase == "forward") & (free < backward_at),
            (phase == "forward") & in_step,
            (phase == "forward") & (in_next | kept) & own,
            (phase == "forward") & (in_next | past_the_trace),
            kept & _kept_step_after_step(lives, kept & ~past_the_trace),
            (phase == "optimizer") & in_step & (free > lives["_leaf_end"].to_numpy()),
            (phase != "outside steps") & in_step,
            (phase == "backward") & ~in_step,
            (phase == "optimizer") & ~in_step,
        ],
        [
            "temporary",
            "activation",
            "input",
            "activation",
            "activation",
            None,
            "temporary",
            "gradient",
            "optimizer state",
        ],
        None,
    )


def _kept_step_after_step(lives: pd.DataFrame, kept: np.ndarray) -> np.ndarray:
    """Whether each allocation's rank and line kept forward memory (never freed) in two steps or
    more: what a line keeps of the forward step after step, the profiler's activations (a
    buffer made once, such as DDP's buckets, is not)."""
    mine = lives[kept]
    steps = mine.groupby([mine["rank"], mine["line"].astype(str)])["step"].nunique()
    keys = pd.MultiIndex.from_arrays([lives["rank"], lives["line"].astype(str)])
    return steps.reindex(keys).fillna(0).to_numpy() >= 2
