"""The kinds of trace event, defined once: how each is recognised, its colour, its drawing layer.

Every event of a trace gets one kind. The loader classifies with :func:`event_kind`, the
analysis sums time per kind, and the plots colour and stack bars by kind, all from the
table :data:`KINDS` below, so a colour or a rule changed here changes everywhere.

How an event is recognised: the first kind in the table whose ``names`` pattern matches
the event's name (and whose ``not_categories`` do not hold the event's category) wins; if none
does, the first kind whose ``categories`` contain the event's category (``cat``, compared in
lower case); otherwise ``other``. So a GPU-side copy of ``ProfilerStep#N`` (Kineto draws on the
GPU the ranges of the CPU annotations that launched GPU work, ``cat: gpu_user_annotation``) is
an annotation on its stream, never a step of its own: the step is the CPU's.

The colours come from the Okabe-Ito palette (distinguishable with the common forms of
colour blindness), with greys for steps and unclassified events.

Event names as text are read here too, once: the loader keeps ``name`` as a categorical (each
distinct name stored once), :func:`name_matches` tests a pattern on each distinct name, and
:func:`event_names` is the one place that turns the column into strings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ._steps import GPU_CATEGORIES

__all__ = [
    "Kind",
    "KINDS",
    "KIND_NAMES",
    "KIND_COLORS",
    "GPU_WORK_KINDS",
    "GPU_WORK_CATEGORIES",
    "GPU_COPY_CATEGORIES",
    "GPU_CATEGORIES",
    "NOT_WORK_KINDS",
    "event_kind",
    "event_names",
    "name_matches",
]


@dataclass(frozen=True)
class Kind:
    """One kind of event.

    name: the kind's name (a column in summaries, an entry in legends).
    colour: its colour in every figure (hex).
    layer: drawing order, back (0) to front: containers behind, communication on top.
    categories: trace categories (``cat``) that make an event this kind.
    names: a regular expression on the event name that makes an event this kind
        (checked before any category).
    recognised_by: the rule in words, for readers of the table.
    not_categories: categories in which ``names`` does not make an event this kind.
    """

    name: str
    colour: str
    layer: int
    categories: frozenset[str] = frozenset()
    names: str | None = None
    recognised_by: str = ""
    not_categories: frozenset[str] = frozenset()


#: The categories of the copies Kineto draws on a GPU stream of the CPU annotations that launched
#: GPU work (``ProfilerStep#N``, ``## backward ##``, ``nccl:all_reduce``): ranges on the stream,
#: not work of their own.
GPU_COPY_CATEGORIES: frozenset[str] = frozenset({"gpu_user_annotation"})

# collectives (gloo:, nccl:, c10d::), NCCL kernels, and RPC calls (not the remote ops they cause)
_COMMUNICATION = (
    r"(?i)^_?(?:nccl|gloo|c10d|mpi)[:_]|^record_param_comms$|nccl(?:Dev)?Kernel"
    r"|^ProcessGroup|^rpc_(?:async|sync|remote)#(?!.*#remote_op)"
)

#: The table of kinds, in the order they appear in legends and summaries.
KINDS: tuple[Kind, ...] = (
    Kind(
        "step",
        "#bbbbbb",
        0,
        names=r"^ProfilerStep#\d+$",
        recognised_by="name ProfilerStep#N (only with a profiler schedule), on the CPU: its "
        "copy on a GPU stream (category gpu_user_annotation) is an annotation",
        not_categories=GPU_COPY_CATEGORIES,
    ),
    Kind(
        "compute",
        "#0072b2",
        3,
        frozenset({"cpu_op", "operator"}),
        names=r"^(?:aten|prim|quantized)::|#remote_op: (?:aten|prim|quantized)::",
        recognised_by="category cpu_op / operator; ops named aten::, prim::, quantized:: "
        "where the category is missing (legacy profiler), also when run on a "
        "remote worker for an RPC (...#remote_op: aten::add)",
    ),
    Kind(
        "communication",
        "#d55e00",
        10,
        names=_COMMUNICATION,
        recognised_by="collectives (gloo:, nccl:, c10d::, NCCL kernels), functional ones and their "
        "waits (_c10d_functional::, as DTensor issues them) and RPC calls",
    ),
    Kind(
        "optimizer",
        "#009e73",
        5,
        names=r"^Optimizer\.",
        recognised_by="name Optimizer.* (step, zero_grad)",
    ),
    Kind(
        "data loading",
        "#cc79a7",
        6,
        names=r"DataLoader|^dataloader",
        recognised_by="name containing DataLoader",
    ),
    Kind(
        "annotation",
        "#f0e442",
        1,
        frozenset({"user_annotation", "gpu_user_annotation"}),
        names=r"#remote_op: ",
        recognised_by="category user_annotation (record_function, module names); "
        "other remote events of an RPC (legacy profiler)",
    ),
    Kind("gpu kernel", "#56b4e9", 7, frozenset({"kernel"}), recognised_by="category kernel"),
    Kind(
        "gpu memory",
        "#882255",
        8,
        frozenset({"gpu_memcpy", "gpu_memset"}),
        recognised_by="category gpu_memcpy / gpu_memset",
    ),
    Kind(
        "cuda runtime",
        "#999933",
        4,
        frozenset({"cuda_runtime", "cuda_driver"}),
        recognised_by="category cuda_runtime / cuda_driver",
    ),
    Kind(
        "python",
        "#e69f00",
        2,
        frozenset({"python_function"}),
        recognised_by="category python_function (with_stack=True)",
    ),
    Kind("other", "#777777", 9, recognised_by="anything else"),
)

#: The kinds that are no work of their own, which the analyses of time leave out: a profiler
#: step marks time, and ``other`` is what no rule recognised (the profiler's own span among it).
NOT_WORK_KINDS: tuple[str, ...] = ("step", "other")
#: Kind names in table order (the categories of the ``kind`` column).
KIND_NAMES: list[str] = [k.name for k in KINDS]
#: Colour of each kind, for plots made outside :mod:`helpers.drawing` (pandas bar charts).
KIND_COLORS: dict[str, str] = {k.name: k.colour for k in KINDS}

#: The kinds of work done on a GPU stream: kernels, and memory copies and sets.
GPU_WORK_KINDS: tuple[str, ...] = ("gpu kernel", "gpu memory")
#: The trace categories (``cat``) of those kinds.
GPU_WORK_CATEGORIES: tuple[str, ...] = tuple(
    sorted(c for k in KINDS if k.name in GPU_WORK_KINDS for c in k.categories)
)
#: The spans of collectives that a backend's own thread runs (gloo's, MPI's).
COLLECTIVE_SPANS = r"^(?:gloo|mpi):"

_NAME_RULES = [(re.compile(k.names), k.name, k.not_categories) for k in KINDS if k.names]
_CATEGORY_RULES = {cat: k.name for k in reversed(KINDS) for cat in k.categories}


def event_kind(name: str, cat: str) -> str:
    """The kind of one event, from its name and category (see the module's rules)."""
    cat = cat.lower()
    for pattern, kind, not_in in _NAME_RULES:
        if cat not in not_in and pattern.search(name):
            return kind
    return _CATEGORY_RULES.get(cat, "other")


def event_names(events: pd.DataFrame) -> pd.Series:
    """The events' names as text: a Series of ``str`` on the index of ``events``, whatever
    dtype its ``name`` column has (the loader's is a categorical)."""
    return events["name"].astype(str)


def name_matches(events: pd.DataFrame, pattern: str) -> np.ndarray:
    """Which events' names contain a match of the regular expression ``pattern`` (as
    ``re.search``; anchor it, ``^...$``, to match whole names): one bool per row of ``events``.

    Each distinct name is tested once, on the categories of the loader's categorical ``name``
    column (a column of another dtype is made categorical first); a missing name never matches.
    """
    names = events["name"]
    if not isinstance(names.dtype, pd.CategoricalDtype):
        names = names.astype("category")
    search = re.compile(pattern).search
    hits = [search(str(name)) is not None for name in names.cat.categories]
    return np.append(np.array(hits, dtype=bool), False)[names.cat.codes.to_numpy()]
