"""Two runs compared: did the change work, by how much, and where.

A learner finds what held the step, predicts what a fix would buy, changes the job and runs it
again. :func:`compare_runs` puts the two runs side by side:

- **the step**: how much the steps moved, with an interval from the steps of both runs
  (:func:`step_shift`), widened by what two runs of one job differ by as wholes, so that a
  change smaller than that noise reads as noise;
- **where**: both runs' critical paths (:func:`helpers.critical_path`), per rank, kind and op, in
  ms per step; their differences add up to the change in the mean step, since each run's path
  tiles its steps' wall time;
- **ops and kernels**: each op's calls and time per step on each rank, added, removed or changed;
- **the prediction**: a what-if made on the first run (:func:`helpers.what_if`) beside what the
  second run measured;
- **cautions** where the runs do not line up (other ranks, another world size, other step counts).

The interval is the Hodges-Lehmann one (the shift's estimate: the median of the differences of
every step after against every step before; its interval: the k-th smallest and k-th largest of
them, k from the Mann-Whitney distribution). It holds for steps that vary independently around
each run's level. It knows nothing of what makes a whole run slower than another (a busier
machine that afternoon, another placement of threads on cores), which one run a side cannot show:
the verdict widens it on each side by :data:`RUN_NOISE` of the first run's median step, what two
runs of one unchanged job differed by here (``benchmarks/compare_cases.py``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..traces import load_run
from ..traces.kinds import NOT_WORK_KINDS, event_names
from .memory import memory_of_runs, memory_verdict
from .path import critical_path, step_windows
from .path.walk import kind_said, named_for_fixing
from .shift import step_shift
from .steps import step_times

__all__ = ["RunComparison", "compare_runs", "step_shift", "within_noise", "RUN_NOISE"]

#: What two runs of one unchanged job differ by as wholes, as a share of the step. Set from lesson
#: 3's DDP job on the 2-core machine (benchmarks/compare_cases.py, 2026-11-29; steps of about 90
#: ms): in 20 pairs the steps' interval alone missed 0 three times, by 2.4, 3.0 and 12.1 ms (the
#: last with other work on the machine); 10 new pairs then all read no change with it.
RUN_NOISE = 0.05
#: Time per step an op must gain or lose to be called changed (ms), or a share of its time.
CHANGED_MS, CHANGED_SHARE = 0.05, 0.05


@dataclass
class RunComparison:
    """Two runs compared (:func:`compare_runs`).

    ``steps``: one row per run and one for the change: ``steps`` (how many), ``median_ms``,
    ``mean_ms``; the change's row also has ``shift_ms`` and its interval from the steps,
    ``low_ms`` and ``high_ms`` (:func:`step_shift`), and ``noise_ms``, what two runs of one job
    differ by (the interval of the verdict is ``low_ms - noise_ms`` to ``high_ms + noise_ms``). ``held``: per ``rank, kind, name`` on either run's
    critical path (GPU work named after the op that launched it, :func:`named_for_fixing`),
    ``before_ms``, ``after_ms`` (mean per step) and ``change_ms``, largest change first; the
    changes add up to the change in the mean step. ``ops``: per ``rank, kind, name``,
    ``calls_before``, ``calls_after`` (per step), ``before_ms``, ``after_ms`` (its events' time
    per step, nested ones included), ``change_ms`` and ``status`` (``added``, ``removed``,
    ``changed``, ``same``). ``prediction``: a what-if beside the second run: their medians,
    the prediction's ``miss_ms`` and ``miss_pct`` against the run, the run's own steps
    (``steps_low_ms`` to ``steps_high_ms``) and whether they cover the prediction
    (``covered``: within the noise of the run), with the interval of their difference and the
    same ``noise_ms`` (None without one). ``cautions``: what does not line up. ``verdict``: one sentence.
    ``memory``: where both runs were given as folders of traces with ``[memory]`` events,
    :func:`helpers.compare_memory`'s table (did the peak fall, did growth stop), and the verdict
    says it; None otherwise."""

    steps: pd.DataFrame
    held: pd.DataFrame
    ops: pd.DataFrame
    prediction: pd.DataFrame | None
    cautions: list[str] = field(default_factory=list)
    verdict: str = ""
    memory: pd.DataFrame | None = None


def compare_runs(
    before: pd.DataFrame | str | Path,
    after: pd.DataFrame | str | Path,
    prediction: pd.Series | None = None,
    window: str | None = None,
    run_noise: float = RUN_NOISE,
) -> RunComparison:
    """Two runs of a job side by side: how much the steps moved, with the interval of the
    steps' own spread, where on the critical path the change came from, which ops and kernels
    came, went or changed, and a what-if made on the first run against the second.

    Args:
        before: the first run's events (``load_run(...).events``) or its folder of traces.
        after: the second run's, the same way.
        prediction: :func:`helpers.what_if` made on ``before``, to set beside ``after``.
        window: the windows that are the steps, as :func:`helpers.critical_path` takes them
            (default: the profiler's steps).
        run_noise: what two runs of one unchanged job differ by as wholes, as a share of the
            first run's median step (0: the steps' spread alone, as with runs made side by
            side on a quiet machine); a change must pass it to be called one.

    Returns:
        A :class:`RunComparison`.

    Raises:
        ValueError: a run without steps, or too few steps for a 95 % interval (4 and 4 is the
            least; 3 and 5, or 2 and 8, will do).
    """
    runs = [_events_of(run, label) for run, label in ((before, "before"), (after, "after"))]
    paths = [critical_path(events, window=window) for events in runs]
    walls = [_step_walls(events, path) for events, path in zip(runs, paths)]
    noise_ms = run_noise * float(walls[0].median())
    steps = _steps_table(*walls, noise_ms)
    held = _held_table(paths, [len(w) for w in walls])
    ops = _ops_table(runs, [len(w) for w in walls])
    predicted = None
    if prediction is not None:  # the runs' noise, on the scale of the run it is set beside
        predicted = _prediction_table(prediction, runs[1], run_noise * float(walls[1].median()))
    memory = memory_of_runs((before, after), runs)
    verdict = _verdict(steps, held, predicted, memory)
    return RunComparison(steps, held, ops, predicted, _cautions(runs, walls), verdict, memory)


def _events_of(run: pd.DataFrame | str | Path, label: str) -> pd.DataFrame:
    """The events of ``run``, loaded from its folder when given one."""
    if isinstance(run, pd.DataFrame):
        return run
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        events = load_run(run, cache=False).events
    if not (events["kind"] == "step").any():
        raise ValueError(f"the {label} run ({run}) has no profiler steps to compare")
    return events


def _step_walls(events: pd.DataFrame, path: pd.DataFrame) -> pd.Series:
    """Each step's wall time (ms), as the path tiles it (:func:`helpers.step_windows`)."""
    steps = events[events["kind"] == "step"]
    windows = step_windows(steps[["rank", "step", "start_us", "end_us"]])
    kept = set(path["step"])
    return pd.Series({s: (hi - lo) / 1e3 for s, lo, hi in windows if s in kept}, dtype=float)


def _steps_table(before: pd.Series, after: pd.Series, noise_ms: float) -> pd.DataFrame:
    """The steps of both runs and the change between them."""
    shift, low, high = step_shift(before.to_numpy(), after.to_numpy())
    table = pd.DataFrame(
        {
            "steps": [len(before), len(after), np.nan],
            "median_ms": [before.median(), after.median(), after.median() - before.median()],
            "mean_ms": [before.mean(), after.mean(), after.mean() - before.mean()],
            "shift_ms": [np.nan, np.nan, shift],
            "low_ms": [np.nan, np.nan, low],
            "high_ms": [np.nan, np.nan, high],
            "noise_ms": [np.nan, np.nan, noise_ms],
        },
        index=pd.Index(["before", "after", "change"], name="run"),
    )
    return table


def _held_table(paths: list[pd.DataFrame], steps: list[int]) -> pd.DataFrame:
    """Each (rank, kind, name)'s time on each run's path, in ms per step, and the change."""
    per_step = [
        named_for_fixing(path).groupby(["rank", "kind", "name"], observed=True)["dur_us"].sum()
        / 1e3
        / n
        for path, n in zip(paths, steps)
    ]
    table = pd.concat(per_step, axis=1, keys=["before_ms", "after_ms"]).fillna(0.0)
    table["change_ms"] = table["after_ms"] - table["before_ms"]
    order = np.argsort(-table["change_ms"].abs().to_numpy(), kind="stable")
    return table.iloc[order].reset_index()


def _ops_table(runs: list[pd.DataFrame], steps: list[int]) -> pd.DataFrame:
    """Each op's and kernel's calls and time per step on each rank, in both runs."""
    counted = []
    for events, n in zip(runs, steps):
        inside = events[(events["step"] >= 0).to_numpy() & ~events["kind"].isin(NOT_WORK_KINDS)]
        inside = inside.assign(name=event_names(inside), kind=inside["kind"].astype(str))
        grouped = inside.groupby(["rank", "kind", "name"])["dur_us"]
        counted.append(pd.DataFrame({"calls": grouped.size() / n, "ms": grouped.sum() / 1e3 / n}))
    table = pd.concat(counted, axis=1, keys=["before", "after"])
    table.columns = ["calls_before", "before_ms", "calls_after", "after_ms"]
    table = table[["calls_before", "calls_after", "before_ms", "after_ms"]]
    gone, new = table["calls_after"].isna(), table["calls_before"].isna()
    table = table.fillna(0.0)
    table["change_ms"] = table["after_ms"] - table["before_ms"]
    moved = (table["calls_after"] != table["calls_before"]) | (
        table["change_ms"].abs() > np.maximum(CHANGED_MS, CHANGED_SHARE * table["before_ms"])
    )
    table["status"] = np.select([new, gone, moved], ["added", "removed", "changed"], "same")
    order = np.argsort(-table["change_ms"].abs().to_numpy(), kind="stable")
    return table.iloc[order].reset_index()


def _prediction_table(prediction: pd.Series, after: pd.DataFrame, noise_ms: float) -> pd.DataFrame:
    """A what-if's predicted steps beside the steps the second run measured (each the median
    over ranks of a rank's step, as :func:`helpers.what_if` predicts them)."""
    measured = step_times(after).median(axis=1).dropna()
    predicted = prediction.dropna()
    try:
        shift, low, high = step_shift(predicted.to_numpy(), measured.to_numpy())
    except ValueError as err:
        raise ValueError(f"the prediction against the second run: {err}") from None
    miss = float(predicted.median()) - float(measured.median())
    return pd.DataFrame(
        {
            "predicted_ms": [float(predicted.median())],
            "measured_ms": [float(measured.median())],
            "miss_ms": [miss],
            "miss_pct": [100 * miss / float(measured.median())],
            "steps_low_ms": [float(measured.min())],
            "steps_high_ms": [float(measured.max())],
            "covered": [bool(measured.min() <= predicted.median() <= measured.max())],
            "shift_ms": [shift],
            "low_ms": [low],
            "high_ms": [high],
            "noise_ms": [noise_ms],
        }
    )


def _cautions(runs: list[pd.DataFrame], walls: list[pd.Series]) -> list[str]:
    """What does not line up between the runs: ranks, world size, step counts."""
    said = []
    ranks = [set(events["rank"].unique().tolist()) for events in runs]
    if len(ranks[0]) != len(ranks[1]):
        said.append(
            f"The runs have different world sizes as traced: {len(ranks[0])} ranks before, "
            f"{len(ranks[1])} after. Their steps compare, their ranks only where both have them."
        )
    elif ranks[0] != ranks[1]:
        only = sorted(ranks[0] ^ ranks[1])
        said.append(
            f"Rank(s) {', '.join(map(str, only))} are in one run only: their rows have no "
            "counterpart."
        )
    if len(walls[0]) != len(walls[1]):
        said.append(
            f"The runs profiled different numbers of steps ({len(walls[0])} before, "
            f"{len(walls[1])} after): times are per step, calls per step may differ by a "
            "fraction."
        )
    return said


def _verdict(
    steps: pd.DataFrame,
    held: pd.DataFrame,
    prediction: pd.DataFrame | None,
    memory: pd.DataFrame | None = None,
) -> str:
    """One sentence: the change in the step and its interval, where it came from, how the
    prediction did, and what became of each rank's memory (:func:`memory_verdict`)."""
    change = steps.loc["change"]
    before, after = steps.loc["before", "median_ms"], steps.loc["after", "median_ms"]
    interval = (
        f"{change['low_ms']:+.1f} to {change['high_ms']:+.1f} ms from the steps, "
        f"±{change['noise_ms']:.1f} ms between runs"
    )
    if within_noise(change):
        said = (
            "No change beyond the noise: the median step (wall time, from the last rank's end of "
            f"the step before) went from {before:.1f} to {after:.1f} ms, a shift of "
            f"{change['shift_ms']:+.1f} ms whose interval ({interval}) holds 0."
        )
    else:
        word = "fell" if change["shift_ms"] < 0 else "rose"
        top = held.iloc[0]
        share = top["change_ms"] / change["mean_ms"] if change["mean_ms"] else np.nan
        most = "most of it" if share > 0.5 else "part of it"
        said = (
            f"The steps {word} by {abs(change['shift_ms']):.1f} ms (their shift; interval "
            f"{interval}): the median step (wall time, from the last rank's end of the step "
            f"before) went from {before:.1f} to {after:.1f} ms. The largest change on the "
            f"critical path is rank {top['rank']}'s {top['name']} ({kind_said(top['kind'])}): "
            f"{top['before_ms']:.1f} to {top['after_ms']:.1f} ms a step, "
            f"{share:.0%} of the change in the mean step ({most})."
        )
    if prediction is not None:
        row = prediction.iloc[0]
        side = "above" if row["miss_ms"] > 0 else "below"
        steps = f"its steps {row['steps_low_ms']:.1f} to {row['steps_high_ms']:.1f} ms"
        said += (
            f" The what-if predicted {row['predicted_ms']:.1f} ms; the run measured "
            f"{row['measured_ms']:.1f} ms (per step, the median of the ranks' own step times, "
            "which the what-if predicts, not the wall time above): the prediction is "
            f"{abs(row['miss_ms']):.1f} ms ({abs(row['miss_pct']):.0f} %) {side} it, "
            + (
                f"within the noise of the run ({steps})."
                if row["covered"]
                else f"beyond the noise of the run ({steps})."
            )
        )
    return said if memory is None else f"{said} {memory_verdict(memory)}"


def within_noise(row: pd.Series) -> bool:
    """Whether a shift's interval (``low_ms``, ``high_ms``), widened by ``noise_ms`` on each
    side, holds 0: no change beyond the noise."""
    return bool(row["low_ms"] - row["noise_ms"] <= 0 <= row["high_ms"] + row["noise_ms"])
