"""What a run's traces cannot tell, each said as a sentence a learner can act on."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ..analysis import collectives_outside_windows, matched_collectives, straggler_of
from ..analysis.kernel_ends import CHECKED_BY_TIME
from ..traces.kinds import GPU_WORK_CATEGORIES

__all__ = [
    "Facts",
    "cautions",
    "missing_ranks",
    "waiting_points_outside",
    "stream_waits_unseen",
    "shared_gpus",
    "collectives_said",
    "facts_of_events",
    "listed",
]

#: Every profiled rank waiting at least this share of a step, and the one that waits least at
#: least this share of what the others wait, points outside them.
WAITING_SHARE = 0.2
ALIKE = 0.5


@dataclass
class Facts:
    """What the cautions are drawn from: the ``ranks`` found and the ``world_size`` the traces
    record, whether they have steps, how many ``folders`` they came from, GPU events without a
    launch, files ``skipped`` and loader ``notes``, each rank's median ``waiting`` per step (ms)
    and the median step (``step_ms``), whether the run was read ``rank_by_rank``, and the
    sections that ``failed`` (title, what went wrong), whether GPU streams may have waited
    for each other where the traces cannot show it (``stream_waits_unseen``), the GPUs that
    several ranks ran work on (``shared``: device -> ranks) and what the matching of the
    collectives could not do (``collectives``: sentences)."""

    ranks: list[int]
    world_size: int | None
    has_steps: bool
    folders: int = 1
    gpu_without_launch: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    waiting: pd.Series | None = None
    step_ms: float | None = None
    rank_by_rank: bool = False
    failed: list[tuple[str, str]] = field(default_factory=list)
    stream_waits_unseen: bool = False
    shared: dict[int, list[int]] = field(default_factory=dict)
    collectives: list[str] = field(default_factory=list)


def missing_ranks(ranks: list[int], world_size: int | None) -> list[int]:
    """The ranks of ``range(world_size)`` that have no trace."""
    return sorted(set(range(world_size)) - set(ranks)) if world_size else []


def waiting_points_outside(waiting: pd.Series | None, step_ms: float | None) -> bool:
    """Whether the ranks profiled all wait, a large part of each step and alike: then the rank
    they wait for is probably one that was not profiled (``waiting``: median ms per step and
    rank). A straggler among them would wait least, far less than the others."""
    if waiting is None or not step_ms or len(waiting) < 2:
        return False
    straggler = straggler_of(waiting)
    least, others = float(waiting[straggler]), float(waiting.drop(straggler).median())
    return least > WAITING_SHARE * step_ms and least > ALIKE * others


def stream_waits_unseen(events: pd.DataFrame) -> bool:
    """Whether some rank ran GPU work on two streams or more while the traces hold no
    ``cuda_sync`` event (recorded with ``enable_cuda_sync_events``)."""
    if (events["cat"] == "cuda_sync").any():
        return False
    work = events[events["cat"].isin(GPU_WORK_CATEGORIES).to_numpy()]
    return bool((work.groupby("rank")["stream"].nunique() > 1).any())


def shared_gpus(events: pd.DataFrame) -> dict[int, list[int]]:
    """Per GPU (its device number, from the lanes ``GPU n stream m``) that two ranks or more ran
    work on, those ranks."""
    work = events[events["cat"].isin(GPU_WORK_CATEGORIES).to_numpy()]
    device = work["lane"].astype(str).str.extract(r"^GPU (\d+) ", expand=False)
    ranks = work.assign(device=device).dropna(subset=["device"]).groupby("device")["rank"].unique()
    return {int(d): sorted(int(r) for r in rs) for d, rs in ranks.items() if len(rs) > 1}


def collectives_said(events: pd.DataFrame, names: str | None) -> list[str]:
    """What the matching of the collectives across ranks says of NCCL kernels without sequence
    numbers (matched by order, checked against their times) and of the collectives missing on
    ranks whose traces were not recording yet (their profiling began later)."""
    said = []
    matched = matched_collectives(events, names)
    checked = matched[(matched["matched_by"].astype(str) == CHECKED_BY_TIME).to_numpy()]
    if len(checked):
        counts = ", ".join(f"rank {r}: {n}" for r, n in checked.groupby("rank").size().items())
        said.append(
            "The NCCL kernels carry no sequence numbers (PyTorch before about 2.4): they were "
            "matched across the ranks by their order, lined up where the ranks' profiling began "
            f"a collective or more apart, and checked against their times ({counts} kernels)."
        )
    outside = collectives_outside_windows(events, names)
    if len(outside):
        late = sorted({r for rs in outside["not_recording"] for r in rs})
        said.append(
            f"{len(outside)} collective kernels or spans ran while rank"
            f"{'s' if len(late) > 1 else ''} {listed(late)} "
            f"{'were' if len(late) > 1 else 'was'} not recording yet (profiling began later there "
            "than on the others): they have no partner there, are no sign of a hang, and hold "
            "each rank that ran them for their own time."
        )
    return said


def facts_of_events(events: pd.DataFrame, names: str | None, gpu: bool, whole: bool) -> dict:
    """The :class:`Facts` read from a run's events: unseen stream waits, shared GPUs, what the
    matching of the collectives said.

    Args:
        events: the run's events (read rank by rank: its steps and collectives).
        names: the collectives' names (:func:`helpers.collective_source`'s choice).
        gpu: whether the run has GPU kernels.
        whole: whether it was read whole (not rank by rank).
    """
    return {
        "stream_waits_unseen": gpu and whole and stream_waits_unseen(events),
        "shared": shared_gpus(events) if gpu else {},
        "collectives": collectives_said(events, names),
    }


def listed(ranks) -> str:
    """Ranks as words: ``0``, ``0 and 3``, ``0, 1 and 3``, or the first five and how many more."""
    ranks = [str(r) for r in ranks]
    if len(ranks) > 5:
        return f"{', '.join(ranks[:5])} and {len(ranks) - 5} more"
    return ranks[0] if len(ranks) == 1 else f"{', '.join(ranks[:-1])} and {ranks[-1]}"


def _missing_said(facts: Facts) -> list[str]:
    """The sentences on the ranks that left no trace, and where the waiting then points."""
    missing = missing_ranks(facts.ranks, facts.world_size)
    if not missing:
        return []
    said = [
        f"{len(missing)} of the job's {facts.world_size} ranks left no trace here "
        f"(profiled {len(facts.ranks)}). Waiting below compares the ranks profiled only; "
        "the job's straggler may be one of the others. Profile a few ranks of every node, "
        "rank 0 among them, and the rank a previous run named."
    ]
    if waiting_points_outside(facts.waiting, facts.step_ms):
        least = float(facts.waiting.min())
        said.append(
            f"Every rank profiled waits at least {least:.1f} ms per step in collectives "
            f"({least / facts.step_ms:.0%} of a median step), none far less than the "
            "others: the rank they all wait for is probably one that was not profiled."
        )
    return said


def _gpu_said(facts: Facts) -> list[str]:
    """The sentences on the GPU: stream waits the traces do not say, GPUs shared by ranks."""
    said = []
    if facts.stream_waits_unseen:
        said.append(
            "A rank ran GPU work on several streams, and the traces were recorded without CUDA "
            "synchronisation events: where a stream waited for another stream's event "
            "(`cudaStreamWaitEvent`) or the CPU for a stream (`cudaStreamSynchronize`), the "
            "critical path matched the wait to the work it waited for from the CUDA calls "
            "around it on its thread (its `waited_for` says `inferred`) or from the GPU's own "
            "timing, the other stream's work that ended just before the waiting one went on "
            "(`inferred from timing`). Record them with "
            "`experimental_config=torch.profiler._ExperimentalConfig("
            "enable_cuda_sync_events=True)` to name each synchronised stream."
        )
    for device, ranks in facts.shared.items():
        said.append(
            f"Ranks {listed(ranks)} ran their GPU work on device {device}. On one "
            "machine that is one GPU shared by several processes: their kernels take turns on "
            "its SMs and slow each other with no wait that a trace records, so the critical "
            "path reads no wait across processes, and what one rank's kernels cost another is "
            "not on it. (On several machines each has its own device "
            f"{device}, and this does not apply.)"
        )
    return said


def cautions(facts: Facts) -> list[str]:
    """The sentences, most important first; one that says so when there is nothing to add."""
    said = [
        f"The section “{title}” could not be written ({why}); the rest of the report does not "
        "depend on it. These traces have a shape the report does not handle yet: please report "
        "it with this sentence and the traces' first lines. The lessons' functions "
        "(`load_run`, `step_times`, `critical_path`, ...) answer the same question step by step."
        for title, why in facts.failed
    ]
    said += _missing_said(facts)
    if facts.world_size is None:
        said.append(
            "The traces do not record the job's size (no `distributedInfo`): ranks that were "
            "not profiled cannot be named, and waiting compares these ranks only."
        )
    if not facts.has_steps:
        said.append(
            "No `ProfilerStep#N` markers: nothing per step (step times, waiting, the "
            "straggler). Profile with a schedule and call `prof.step()` after every step."
        )
    if facts.folders > 1:
        said.append(
            f"The traces come from {facts.folders} folders. If those are several hosts', each "
            "host has its own clock, so moments on different hosts compare only after their "
            "offset is measured (`clock_offsets`, lesson 7); durations and waiting hold as "
            "they are."
        )
    if facts.gpu_without_launch:
        said.append(
            f"{facts.gpu_without_launch} GPU events have no launch in the traces (launched "
            "before the profiler's window): they have no step, and are left out of per-step "
            "tables."
        )
    said += _gpu_said(facts)
    said += facts.collectives
    if facts.rank_by_rank:
        said.append(
            "Too large to load whole, so read one rank at a time: the GPU details and a "
            "sharded job's phases need every event and are left out. Run the report on a few "
            "ranks' files for them."
        )
    said += [
        f"Skipped {path}: {why.split('; re-run')[0].rstrip('.')}." for path, why in facts.skipped
    ]
    said += [f"Noted while reading: {note.rstrip('.')}." for note in facts.notes]
    return said or ["Every rank of the job left a trace with steps, and every file was read."]
