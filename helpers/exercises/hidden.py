"""Hidden answers: what an exercise chooses at random and keeps for its check, so that the
learner has to find it in the traces, not read it off the exercise's text, guess it from an
order, or set it themselves.

- :func:`anonymise_traces` (exercise 3.2): a run's trace files get names that say nothing; the
  old names are kept in the run folder (``renamed.json``).
- :func:`launch_with_a_hidden_straggler` (4.2, 10.2, 14.1, 16.1): a run with one rank slowed,
  the rank and its delay chosen at random (kept in the run's manifest, as its arguments).
- :func:`launch_with_a_hidden_leak` (15.1): a run of lesson 15's ``memory_job.py`` with one
  rank keeping memory every step, the rank, the MiB a step and the place chosen at random
  (kept in the run's manifest, as its arguments).
- :func:`launch_with_a_hidden_stall` (13.1): a hung run of a 2x2 mesh, one rank stalled at one
  step, both chosen at random (kept in the run's manifest, as its arguments).
- :func:`launch_with_a_hidden_slowdown` (11.1): a run with one rank's batches, backward or
  optimizer step slowed, the rank and the part chosen at random (kept likewise).
- :func:`skew_a_node` (7.2): a copy of a run's events with one node's clock moved by a random
  amount (kept in the frame's ``attrs``).
- :func:`slow_a_rank` (9.1): a rank of a running job, chosen at random, slowed down through its
  ``slow_down.json`` (kept there).

Each takes ``seed=`` for the tests; without it the choice is new every time. Looking at where
the answer is kept is possible, and beside the point.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis import shift_ranks
from ..jobs import BackgroundRun, LaunchError, RunRecord, launch
from .common import TRAIN_DDP_SCRIPT, arguments, is_run, number, one_hint, whole, within

__all__ = [
    "RENAMED_FILE",
    "HIDDEN_SKEW",
    "HIDDEN_STRAGGLER_EXPERIMENT",
    "STRAGGLER_DELAYS_MS",
    "DELAYS_BY_SCRIPT",
    "FEW_RANKS_DELAYS_MS",
    "DELAY_TOLERANCE",
    "SLOW_DOWN_FILE",
    "anonymise_traces",
    "launch_with_a_hidden_straggler",
    "launch_with_a_hidden_slowdown",
    "HIDDEN_SLOWDOWN_EXPERIMENT",
    "launch_with_a_hidden_stall",
    "launch_with_a_hidden_leak",
    "HIDDEN_LEAK_EXPERIMENT",
    "MEMORY_SCRIPT",
    "LEAK_MIB",
    "HIDDEN_STALL_EXPERIMENT",
    "MESH_SCRIPT",
    "SLOWED_PARTS",
    "judge_hidden_straggler",
    "skew_a_node",
    "slow_a_rank",
]

#: Where :func:`anonymise_traces` keeps the names it replaced, in the run folder: {new: old}.
RENAMED_FILE = "renamed.json"
#: The key of a skewed frame's ``attrs`` that holds ``{node: offset in µs}`` (7.2).
HIDDEN_SKEW = "hidden skew (µs)"
#: The experiment of every run of :func:`launch_with_a_hidden_straggler` (its folder's name).
HIDDEN_STRAGGLER_EXPERIMENT = "hidden-straggler"
#: The experiment of every run of :func:`launch_with_a_hidden_slowdown`.
HIDDEN_SLOWDOWN_EXPERIMENT = "hidden-slowdown"
#: The experiment of every run of :func:`launch_with_a_hidden_stall`.
HIDDEN_STALL_EXPERIMENT = "hidden-stall"
#: The experiment of every run of :func:`launch_with_a_hidden_leak`.
HIDDEN_LEAK_EXPERIMENT = "hidden-leak"
#: Lesson 15's job whose memory is known by construction.
MEMORY_SCRIPT = "memory_job.py"
#: The MiB a step a hidden leak keeps (one of them, at random): each more than 1.1 times the one
#: before, so that no answer within 5 % is right for two; with the rank (one of 2) and the place
#: (the forward or the loss), a blind guess passes one run in 32.
LEAK_MIB = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0)
#: Lesson 13's job of two dimensions: 4 ranks on a 2x2 mesh of tp and dp groups.
MESH_SCRIPT = "mesh_job.py"
#: What a hidden slowdown slows on its rank (train_ddp.py's ``--slow-part``).
SLOWED_PARTS = ("data", "backward", "optimizer")
#: The delays per batch a hidden straggler gets, in ms (one of them, at random). Each is more than
#: (1 + tolerance) / (1 - tolerance) times the one before (:data:`DELAY_TOLERANCE`), so that no
#: single guess is right for more than one of them: a constant answer passes one run in five.
STRAGGLER_DELAYS_MS = (60, 80, 110, 150, 200)
#: The delays a hidden straggler gets by script where an exercise asks for a rank among few and
#: its delay (each more than (1 + tolerance) / (1 - tolerance) times the one before, for the
#: exercise's tolerance): a blind guess then passes under one run in twenty. Lesson 4's DDP and
#: lesson 10's FSDP2 (4.2 and 10.2, a tenth: one rank of 2 and eleven delays, 1 in 22), pipeline
#: stages (14.1, a twentieth: one stage of 3 and seven delays, 1 in 21) and lesson 13's mesh (13.2,
#: a tenth: one straggler of 4, 1 in 28).
LATE_BATCHES_MS = (60, 80, 98, 120, 150, 184, 226, 277, 340, 417, 512)
DELAYS_BY_SCRIPT = {
    "train_ddp.py": LATE_BATCHES_MS,
    "train_fsdp.py": LATE_BATCHES_MS,
    "pipeline_job.py": (60, 70, 80, 90, 100, 112, 125),
    "mesh_job.py": (40, 52, 65, 81, 101, 126, 158),
}
#: Exercise 16.1's delays (3 ranks on 2 cores, 2 of them profiled: smaller ones drown in the
#: waiting that sharing makes), seven of them: with the straggler one of 3, a blind guess passes
#: one run in 21.
FEW_RANKS_DELAYS_MS = (250, 310, 385, 480, 600, 750, 930)
#: How close a delay read from the traces must be: a tenth of the delay, or 5 ms. Read within the
#: run (the straggler's data loading against the others', or the others' extra wait in the
#: step's first collective) it comes within a few ms.
DELAY_TOLERANCE = (0.10, 5.0)
#: The file in a live job's folder that slows a rank down: {"rank": R, "ms": D} (lesson 9).
SLOW_DOWN_FILE = "slow_down.json"


def _chooser(seed: int | None) -> random.Random:
    return random.Random(seed) if seed is not None else random.SystemRandom()


def anonymise_traces(
    run: RunRecord, pattern: str = "trace_*.json", seed: int | None = None
) -> list[str]:
    """Rename the run's files that match ``pattern`` to ``trace_<6 random hex digits>.json``,
    keeping their old names in ``renamed.json`` of the run folder; returns the new names,
    sorted. Run it once: the files it renamed no longer say who wrote them."""
    chooser = _chooser(seed)
    renamed = {}
    for path in sorted(run.run_dir.glob(pattern)):
        new = path.with_name(f"trace_{chooser.getrandbits(24):06x}.json")
        while new.exists() or new.name in renamed:
            new = path.with_name(f"trace_{chooser.getrandbits(24):06x}.json")
        path.rename(new)
        renamed[new.name] = path.name
    (run.run_dir / RENAMED_FILE).write_text(json.dumps(renamed, indent=1))
    return sorted(renamed)


def launch_with_a_hidden_straggler(
    nproc: int,
    args: Sequence[str] = (),
    seed: int | None = None,
    script: str = TRAIN_DDP_SCRIPT,
    delays_ms: Sequence[int] | None = None,
    **options: Any,
) -> RunRecord:
    """Launch a training script with one rank slowed down: its batches take longer to load.
    The rank and the delay are chosen at random (``--slow-rank`` and ``--delay-ms``, kept in the
    run's manifest for the check); the run's experiment is always ``hidden-straggler``.

    Args:
        nproc: ranks.
        args: the script's own arguments (the lesson's ``common``).
        seed: make the choice repeatable (the tests'); without it, new every time.
        script: lesson 3's ``train_ddp.py``, or lesson 10's ``train_fsdp.py`` (the same flags).
        delays_ms: the delays to choose from, ms per batch (default: the script's in
            :data:`DELAYS_BY_SCRIPT`, else :data:`STRAGGLER_DELAYS_MS`).
        **options: for :func:`helpers.launch` (``echo``, ``timeout``...).

    Returns:
        The run's :class:`helpers.RunRecord`.
    """
    chooser = _chooser(seed)
    delays_ms = delays_ms or DELAYS_BY_SCRIPT.get(Path(script).name, STRAGGLER_DELAYS_MS)
    hidden = [
        "--slow-rank",
        str(chooser.randrange(nproc)),
        "--delay-ms",
        str(chooser.choice(delays_ms)),
    ]
    options.setdefault("echo", False)
    options["experiment"] = HIDDEN_STRAGGLER_EXPERIMENT
    return launch(script, nproc=nproc, args=[*args, *hidden], **options)


def launch_with_a_hidden_slowdown(
    nproc: int,
    args: Sequence[str] = (),
    seed: int | None = None,
    delay_ms: float | None = None,
    **options: Any,
) -> RunRecord:
    """Launch lesson 3's ``train_ddp.py`` with one rank slowed in one part of its step: loading
    its batch, its backward through ``layer3`` or its optimizer step (``--slow-part``). The rank,
    the part and the delay (one of :data:`STRAGGLER_DELAYS_MS`) are chosen at random and kept in
    the run's manifest for the check; the run's experiment is always ``hidden-slowdown``.

    Args:
        nproc: ranks.
        args: the script's own arguments (the lesson's ``common``).
        seed: make the choice repeatable (the tests'); without it, new every time.
        delay_ms: how much longer the slowed part takes, ms per step (None: chosen at random).
        **options: for :func:`helpers.launch`.

    Returns:
        The run's :class:`helpers.RunRecord`.
    """
    chooser = _chooser(seed)
    rank, part = chooser.randrange(nproc), chooser.choice(SLOWED_PARTS)
    delay_ms = chooser.choice(STRAGGLER_DELAYS_MS) if delay_ms is None else delay_ms
    hidden = ["--slow-rank", str(rank), "--delay-ms", f"{delay_ms:g}", "--slow-part", part]
    options.setdefault("echo", False)
    options["experiment"] = HIDDEN_SLOWDOWN_EXPERIMENT
    return launch(TRAIN_DDP_SCRIPT, nproc=nproc, args=[*args, *hidden], **options)


def launch_with_a_hidden_stall(seed: int | None = None, **options: Any) -> RunRecord:
    """Launch lesson 13's ``mesh_job.py`` on 4 ranks with one rank stalled before its tp
    all-reduce at one step of 7 (``--bug stall --bug-rank R --bug-step S --steps 7``, R of 0 to
    3 and S of 2 to 7 chosen at random and kept in the run's manifest for the check: a blind
    guess of both passes one run in 24). The job hangs and
    fails after its 3 s timeout: the failed run's record is returned (not raised). The run's
    experiment is always ``hidden-stall``; ``options`` go to :func:`helpers.launch`."""
    chooser = _chooser(seed)
    hidden = ["--bug", "stall", "--bug-rank", str(chooser.randrange(4))]
    hidden += ["--bug-step", str(chooser.randrange(2, 8)), "--steps", "7"]
    options.setdefault("echo", False)
    options.setdefault("timeout", 60)
    options.update(experiment=HIDDEN_STALL_EXPERIMENT, cpu=True)
    try:
        return launch(MESH_SCRIPT, nproc=4, args=hidden, **options)
    except LaunchError as err:
        return err.record


def judge_hidden_straggler(
    answer: Any, run: Any, script: str, how_to_launch: str
) -> tuple[bool, str]:
    """The check of a hidden straggler (4.2 with ``train_ddp.py``, 10.2 with ``train_fsdp.py``);
    the delay is right to within :data:`DELAY_TOLERANCE`.

    Args:
        answer: ``{"straggler": rank, "delay_ms": ms}``, read from the traces of ``run``.
        run: a run of :func:`launch_with_a_hidden_straggler` (its manifest keeps what was
            chosen).
        script: the script it must have run.
        how_to_launch: the call the hint shows.

    Returns:
        (right, what to say).
    """
    given = arguments(run) if is_run(run) else {}
    slow_rank, delay_ms = whole(given.get("--slow-rank", -1)), number(given.get("--delay-ms", 0))
    hidden = is_run(run) and run.experiment == HIDDEN_STRAGGLER_EXPERIMENT and run.script == script
    if not hidden or slow_rank is None or slow_rank < 0 or not delay_ms:
        return False, (
            f"this is not a run with a hidden straggler: launch it with {how_to_launch} "
            "and hand the check that run"
        )
    if not isinstance(answer, dict) or {"straggler", "delay_ms"} - set(answer):
        return False, 'answer with a dict {"straggler": ..., "delay_ms": ...}'
    said = number(answer["delay_ms"])
    hint = one_hint(
        [whole(answer["straggler"]) == slow_rank, within(said, delay_ms, DELAY_TOLERANCE)],
        said,
        "not yet: the straggler is the rank that waits least in collectives: everyone is "
        "already there when it arrives (find_straggler); on a busy machine the waits later in "
        "a step swing either way, so count the step's first collectives (find_straggler's "
        "names=), where a late batch shows, or see whose data loading grew. Its delay: read it "
        "within this run, e.g. its data-loading time per step against the others', or how much "
        "longer the other ranks wait than it does in the collective it reaches late",
    )
    if hint:
        return False, hint
    return True, (
        f"rank {slow_rank} was slowed by {delay_ms:g} ms per batch; you read "
        f"{said:g} ms from its traces alone"
    )


def skew_a_node(
    events: pd.DataFrame, nodes: dict[int, list[int]], seed: int | None = None
) -> pd.DataFrame:
    """A copy of ``events`` in which the last node's clock runs ahead of or behind the first
    node's by a random 20 to 80 ms (its ranks' events moved that far, as
    :func:`helpers.shift_ranks` does), the offset kept in ``attrs[HIDDEN_SKEW]``."""
    chooser = _chooser(seed)
    node = max(nodes)
    offset_us = chooser.choice((-1, 1)) * chooser.randint(20, 80) * 1000.0
    skewed = shift_ranks(events, nodes[node], offset_us)
    skewed.attrs[HIDDEN_SKEW] = {node: offset_us}
    return skewed


def slow_a_rank(job: BackgroundRun, ms: float = 30.0, seed: int | None = None) -> None:
    """Slow one rank of a running job, chosen at random, by ``ms`` per step: writes
    ``slow_down.json`` in the job's folder, which the lesson's script reads every step."""
    rank = _chooser(seed).randrange(job.record.world_size)
    path: Path = job.run_dir / SLOW_DOWN_FILE
    path.write_text(json.dumps({"rank": rank, "ms": ms}))


def launch_with_a_hidden_leak(
    nproc: int, args: Sequence[str] = (), seed: int | None = None, **options: Any
) -> RunRecord:
    """Launch lesson 15's ``memory_job.py`` with one rank keeping memory every step
    (``--keep-rank``, ``--keep-mib`` of :data:`LEAK_MIB`, ``--keep-in forward`` or ``loss``), all
    three chosen at random and kept in the run's manifest for the check; the run's experiment is
    always ``hidden-leak``, on the CPU whatever the machine.

    Args:
        nproc: ranks.
        args: the script's own arguments (the lesson's ``common``).
        seed: make the choice repeatable (the tests'); without it, new every time.
        **options: for :func:`helpers.launch`.

    Returns:
        The run's :class:`helpers.RunRecord`.
    """
    chooser = _chooser(seed)
    hidden = ["--keep-rank", str(chooser.randrange(nproc))]
    hidden += ["--keep-mib", f"{chooser.choice(LEAK_MIB):g}"]
    hidden += ["--keep-in", chooser.choice(("forward", "loss"))]
    options.setdefault("echo", False)
    options.update(experiment=HIDDEN_LEAK_EXPERIMENT, cpu=True)
    return launch(MEMORY_SCRIPT, nproc=nproc, args=[*args, *hidden], **options)
