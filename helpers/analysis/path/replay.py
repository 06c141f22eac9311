"""What fixing it would buy: the run re-timed with some work made shorter, from the dependencies
that :mod:`.lanes` reads in the traces.

Every interval of every lane keeps what it measured, and its place among the others, as the
edges of the run's dependency graph (:mod:`.graph`) say:

- work (an op's own time, untraced time) lasts as long as it did, after the interval before it,
  but for what a what-if changes beside it on a shared machine (:mod:`.sharing`: an op re-timed
  by its share of the cores, a GPU queue or kernel given back the time the removed work held);
- a wait ends as long after the last of what it waited for as it did (a thread resumes µs after
  what woke it; a kernel starts µs after its launch or after the work of another stream it was
  made to wait for), and an issued event starts no sooner than its issue;
- a collective ends on every rank when its last rank has arrived, plus its transfer: its
  shortest duration across ranks (a rank that left it before another arrived, a broadcast's
  receiver, waited only for those there by then);
- a moment that waited for several things waits for the last of them, whichever that is once
  the work is re-timed.

:func:`replay_step_times` re-times the run as it was, and :func:`replay_error` says how far that
lands from the measured steps: a check of the model's *fit* to the run it came from, not of its
predictions (each edge carries the delay it measured, so a run replays close to itself whatever
the graph says; the per-rank jitter of a collective's end is most of what it misses).
:func:`what_if` re-times the run with one rank's chosen work taking a fraction of its time (none,
by default) and predicts the step times as measured less what the change saves in the replay.
How right such predictions are is measured against runs made without the change
(:func:`what_if_checks`), and by the answers worked out by hand in ``tests/test_known_answers.py``.

What the replay cannot know: an op that runs faster or slower for another reason once the rest
changes (in the series' benchmark, the same ops of a DDP job ran 13 % slower per step in runs with
a rank's batches late than in runs without: ``what_if_checks()``), and work the traces do not
hold. Lumos (MLSys 2025) replays a dependency graph built from traces the same way, with
GPU-specific rules, and reports 3.3 % replay error on average.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ...traces.kinds import name_matches
from .graph import replayed_times
from .lanes import Lanes, lanes_of
from .sharing import machine_cores, sharing_the_gpu, with_shared_cores

__all__ = ["replay_step_times", "replay_error", "what_if", "replayed_intervals", "what_if_checks"]


def replayed_intervals(
    lanes: Lanes, shrink: np.ndarray | None = None, sooner: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """New ``(starts, ends)`` of every interval of ``lanes`` (:func:`.lanes.lane_intervals`):
    the run re-timed over every edge of its graph (:func:`.graph.replayed_times`) with each interval's
    own time multiplied by ``shrink`` (one factor per interval; 1 keeps it, 0 removes it: a
    removed wait ends as it begins) and each wait ``sooner`` µs shorter (per interval)."""
    value = replayed_times(lanes.graph, shrink, sooner)
    n = lanes.graph.intervals
    return value[: 2 * n : 2], value[1 : 2 * n : 2]


def _step_durations(lanes: Lanes, start: np.ndarray, end: np.ndarray) -> pd.DataFrame:
    """Each rank's step durations (ms; rows: step, columns: rank) from re-timed intervals: a
    step begins where the interval that began it measured begins now, and ends likewise."""
    iv = lanes.intervals
    main = lanes.lanes.index[lanes.lanes["main"]]
    rows = []
    for rank_lane in main:
        mine = iv[iv["lane_id"] == rank_lane]
        rank = lanes.lanes.at[rank_lane, "rank"]
        steps = lanes.steps[lanes.steps["rank"] == rank]
        at_start = dict(zip(mine["start_us"], mine.index))
        at_end = dict(zip(mine["end_us"], mine.index))
        for step, s, e in zip(steps["step"], steps["start_us"], steps["end_us"]):
            if s in at_start and e in at_end:
                rows.append((int(step), rank, (end[at_end[e]] - start[at_start[s]]) / 1e3))
    table = pd.DataFrame(rows, columns=["step", "rank", "ms"])
    return table.pivot(index="step", columns="rank", values="ms").rename_axis(columns="rank")


def replay_step_times(
    events: pd.DataFrame, lanes: Lanes | None = None, window: str | None = None
) -> pd.DataFrame:
    """The step times (ms; rows: step, columns: rank, as :func:`helpers.step_times`) of the run
    re-timed with everything as measured: how well the model reproduces the run (``window``:
    the windows that are the steps, as :func:`helpers.critical_path` takes them)."""
    lanes = lanes_of(events, lanes, window)
    return _step_durations(lanes, *replayed_intervals(lanes))


def replay_error(
    events: pd.DataFrame, lanes: Lanes | None = None, window: str | None = None
) -> pd.Series:
    """Per step, how far the replayed step time is from the measured one, as a fraction of the
    measured (both the median over ranks): 0.01 is 1 %."""
    lanes = lanes_of(events, lanes, window)
    return _error(replay_step_times(events, lanes, window), _measured_per_rank(lanes))


def _error(replayed: pd.DataFrame, measured: pd.DataFrame) -> pd.Series:
    replayed, measured = replayed.median(axis=1), measured.median(axis=1)
    return ((replayed - measured).abs() / measured).rename("replay error")


def _measured_per_rank(lanes: Lanes) -> pd.DataFrame:
    """The measured step times (ms; rows: step, columns: rank)."""
    steps = lanes.steps.assign(ms=(lanes.steps["end_us"] - lanes.steps["start_us"]) / 1e3)
    return steps.pivot_table(index="step", columns="rank", values="ms", aggfunc="sum")


def what_if(
    events: pd.DataFrame,
    rank: int,
    name: str,
    factor: float = 0.0,
    lanes: Lanes | None = None,
    window: str | None = None,
    cores: int | None = None,
) -> pd.Series:
    """The step times predicted if some of one rank's events took a share of their time.

    Each rank's prediction is its measured step time less what the change saves in the replay
    (the replay with the change against the replay without it), so that what the model misses
    (:func:`replay_error`) is not counted as a saving. What the changed events enclosed goes
    with them, and so does the GPU work launched inside them (an op's kernels, copies and
    NCCL's kernels: the CPU part of an op gone, its GPU part would not run either).

    Args:
        events: a run's events (``load_run(...).events``).
        rank: the rank whose events change.
        name: a regular expression on event names (as ``re.search``; ``"^aten::mm$"`` for one
            op): the events of ``rank`` that change.
        factor: the share of their time they take: 0, by default, is no time.
        lanes: :func:`helpers.analysis.path.lanes.lane_intervals` of ``events``, when already
            made (with the same ``window``; lanes of other events are an error).
        window: the windows that are the steps, as :func:`helpers.critical_path` takes them
            (default: the profiler's steps).
        cores: the cores of the one machine the ranks shared: each op is then re-timed by how
            many ran beside it (:mod:`.sharing`). Default: what the launcher recorded in the
            run's manifest, else this machine's for a run without GPU work; 0: none (every op
            as long as it was).

    Returns:
        The predicted step times in ms (the median over ranks), a Series indexed by step; its
        ``attrs`` hold its range (``"range"``: the lowest and the highest step predicted, the
        spread the run's own steps give it), the measured step times (``"measured"``), the
        replay error per step
        (``"replay_error"``) and what changed (``"changed"``: ``cpu_ms`` and ``gpu_ms``, the
        time of the changed intervals on CPU threads and on GPU streams before the change,
        and ``gpu_work``, how many GPU events launched inside the matched events changed).

    Raises:
        ValueError: no event of ``rank`` matches ``name`` within its profiler steps.
    """
    lanes = lanes_of(events, lanes, window)
    mine = events[(events["rank"] == rank).to_numpy() & name_matches(events, name)]
    changed, gpu_work = _changed_intervals(lanes, events, mine)
    if not changed.any():
        raise ValueError(
            f"no event of rank {rank} matches {name!r} within its steps: name an event "
            "of that rank (a regular expression on event names, e.g. 'DataLoader' or "
            "'^aten::convolution_backward$')"
        )
    replayed, after = _replayed_both_ways(lanes, events, np.where(changed, factor, 1.0), cores)
    measured = _measured_per_rank(lanes)
    predicted = (measured + after - replayed).median(axis=1).rename("predicted step (ms)")
    predicted.attrs.update(range=(float(predicted.min()), float(predicted.max())), measured=measured.median(axis=1))  # fmt: skip
    predicted.attrs.update(replay_error=_error(replayed, measured), changed=_what_changed(lanes, changed, gpu_work))  # fmt: skip
    return predicted


def _replayed_both_ways(lanes: Lanes, events: pd.DataFrame, shrink: np.ndarray, cores: int | None) -> tuple[pd.DataFrame, pd.DataFrame]:  # fmt: skip
    """The step durations of the run replayed as it was, and with each interval's own time
    multiplied by ``shrink``: a GPU's sharing given back, and, where the machine's ``cores``
    are known (:func:`.sharing.machine_cores`), each op re-timed by its share of them in both."""
    shrink, sooner = sharing_the_gpu(lanes, shrink)
    same = np.ones(len(shrink))
    cores = machine_cores(events, cores)
    if cores:
        runnable = _runnable(lanes, events)
        same = with_shared_cores(lanes, runnable, same, cores, lambda f: replayed_intervals(lanes, f))  # fmt: skip
        shrink = with_shared_cores(lanes, runnable, shrink, cores, lambda f: replayed_intervals(lanes, f, sooner))  # fmt: skip
    replayed = _step_durations(lanes, *replayed_intervals(lanes, same))
    return replayed, _step_durations(lanes, *replayed_intervals(lanes, shrink, sooner))


def _runnable(lanes: Lanes, events: pd.DataFrame) -> np.ndarray:
    """Per interval, whether it is an op's own time on a CPU thread (a ``compute`` event's):
    what takes a core while it runs (:func:`.sharing.with_shared_cores`)."""
    iv = lanes.intervals
    cpu = ~lanes.lanes["gpu"].to_numpy()[iv["lane_id"].to_numpy()]
    kind = events["kind"].astype(str).reindex(iv["event"].to_numpy()).to_numpy()
    return cpu & (kind == "compute")


def _what_changed(lanes: Lanes, changed: np.ndarray, gpu_work: int) -> dict:
    """The time of the ``changed`` intervals on CPU threads and on GPU streams (ms), and how
    many GPU events changed with them."""
    iv = lanes.intervals
    on_gpu = lanes.lanes["gpu"].to_numpy()[iv["lane_id"].to_numpy()]
    took = (iv["end_us"] - iv["start_us"]).to_numpy()
    return {
        "cpu_ms": float(took[changed & ~on_gpu].sum() / 1e3),
        "gpu_ms": float(took[changed & on_gpu].sum() / 1e3),
        "gpu_work": gpu_work,
    }


def _changed_intervals(lanes: Lanes, events: pd.DataFrame, mine: pd.DataFrame) -> tuple[np.ndarray, int]:  # fmt: skip
    """Per interval of ``lanes``, whether a what-if on the events ``mine`` changes it: it lies
    within one of them on its lane, or belongs to GPU work launched within one (a launch call on
    that lane in its time); and how many GPU events so."""
    iv = lanes.intervals
    changed = np.zeros(len(iv) + 1, dtype=np.int64)
    lane_ids = dict(zip(zip(lanes.lanes["rank"], lanes.lanes["lane"].astype(str)), lanes.lanes.index))  # fmt: skip
    lane_of = iv["lane_id"].to_numpy()
    first = np.searchsorted(lane_of, np.arange(len(lanes.lanes) + 1))
    starts, ends = iv["start_us"].to_numpy(), iv["end_us"].to_numpy()
    calls = events[(events["kind"] == "cuda runtime").to_numpy()]
    launches = []
    for (rank, lane), theirs in mine.groupby(["rank", "lane"], observed=True):
        lane_id = lane_ids.get((rank, str(lane)))
        if lane_id is None:
            continue
        lo, hi = first[lane_id], first[lane_id + 1]
        s, e = theirs["start_us"].to_numpy(), theirs["end_us"].to_numpy()
        np.add.at(changed, lo + np.searchsorted(starts[lo:hi], s, side="left"), 1)
        np.add.at(changed, lo + np.searchsorted(ends[lo:hi], e, side="right"), -1)
        here = calls[(calls["rank"] == rank).to_numpy() & (calls["lane"].astype(str) == str(lane)).to_numpy()]  # fmt: skip
        at = here["start_us"].to_numpy()
        inside = (np.searchsorted(s, at, side="right") - np.searchsorted(e, at, side="right")) > 0  # fmt: skip
        launches += [(rank, t) for t in at[inside].tolist()]
    changed = np.cumsum(changed)[:-1] > 0
    work = events[events["launch_us"].notna().to_numpy()]
    launched = pd.MultiIndex.from_arrays([work["rank"], work["launch_us"]]).isin(launches)
    labels = work.index[launched]
    changed |= np.isin(iv["event"].to_numpy(), labels) & lanes.lanes["gpu"].to_numpy()[lane_of]
    return changed, int(len(labels))


#: The what-if's predictions checked against runs made without the change (what_if_checks).
CHECKS = Path(__file__).with_name("what_if_checks.csv")


def what_if_checks() -> pd.DataFrame:
    """How right :func:`what_if` has been: its predictions held to runs made without the change,
    as ``benchmarks/what_if_pairs.py`` measured them (``make benchmark``): pairs of fresh runs of
    the lessons' jobs (DDP, FSDP2, a 2x2 mesh, pipelines; 2 to 4 ranks on 2 cores) and of the
    series' H200 job, one row per pair: ``case``, ``shape``, ``ranks``, ``what_if_ms`` (the
    median of its runs' predictions), ``subtraction_ms`` (the step less the work's time: the
    obvious sum, for comparison), ``measured_ms`` (the median step of the runs made without
    the change), ``runs`` (the pair's repeats), ``measured_on``, ``error_pct`` (signed),
    ``runs_without`` (how many runs without the change that median pools: pairs of one job
    share them) and ``runs_differ_pct`` (how far those runs' medians spread, over their
    median: the noise any prediction is held to; empty where there was one run). This, not the replay error (how well the
    model reproduces the run it came from), says how far to trust a prediction."""
    return pd.read_csv(CHECKS)
