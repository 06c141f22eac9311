"""Checks for the exercises at the end of each lesson.

After trying an exercise, run its check in the next cell::

    check("04.1", answer, run=my_run)

It says whether the answer is right and, when it is not, why (a hint, not the solution).
Every check first makes sure that the evidence is the one the exercise asks for (the run's
script and arguments, read from its manifest), then compares the answer with what *your own*
run produced (its files, its traces, its measured times, with tolerances), never with numbers
stored here. An exercise not yet tried is a normal state: leave ``answer = ...`` and the check
says so.

Each check is a function registered under the exercise's number; it returns ``(True,
message)`` or ``(False, hint)``, and answers a malformed answer with a hint, never an
exception. :func:`evaluate` runs one and returns that pair (the tests use it); :func:`check`
prints the verdict for the learner. With the environment variable ``PDP_CHECKS_MUST_PASS=1``
(CI sets it) :func:`check` also raises :class:`ExerciseNotSolved` on a wrong answer, so that a
worked solution that stops passing its check fails its notebook; an exercise not answered yet
never raises.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["check", "evaluate", "CHECKS", "ExerciseNotSolved", "MUST_PASS_ENV"]

#: The checks, by exercise number (``"04.1"``): each takes the answer and the evidence.
CHECKS: dict[str, Callable[..., tuple[bool, str]]] = {}

#: Set to 1 to make :func:`check` raise on a wrong answer (CI runs the solutions so).
MUST_PASS_ENV = "PDP_CHECKS_MUST_PASS"


class ExerciseNotSolved(AssertionError):
    """A check said "not yet" while ``PDP_CHECKS_MUST_PASS`` was set."""


def _exercise(number: str) -> Callable:
    def register(fn: Callable[..., tuple[bool, str]]) -> Callable[..., tuple[bool, str]]:
        CHECKS[number] = fn
        return fn

    return register


def evaluate(exercise: str, answer: Any = ..., **evidence: Any) -> tuple[bool | None, str]:
    """``(True, why)`` for a right answer, ``(False, hint)`` for a wrong one, ``(None, ...)``
    when the exercise has not been answered yet (``answer`` or evidence still ``...``)."""
    if exercise not in CHECKS:
        raise KeyError(f"no exercise {exercise!r}; exercises: {', '.join(sorted(CHECKS))}")
    if answer is ... or any(value is ... for value in evidence.values()):
        return None, "not answered yet: replace the ... above with your answer and run both cells"
    return CHECKS[exercise](answer, **evidence)


def _must_pass() -> bool:
    return os.environ.get(MUST_PASS_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def check(exercise: str, answer: Any = ..., **evidence: Any) -> None:
    """Print whether the answer to an exercise is right, and a hint when it is not."""
    ok, message = evaluate(exercise, answer, **evidence)
    verdict = {True: "right", False: "not yet", None: ""}[ok]
    line = f"Exercise {exercise}: " + (f"{verdict}. {message}" if verdict else message)
    print(line)
    if ok is False and _must_pass():
        raise ExerciseNotSolved(f"{line} ({MUST_PASS_ENV} is set)")


# --------------------------------------------------------------------------- helpers


def _is_run(value: Any) -> bool:
    return hasattr(value, "run_dir") and hasattr(value, "exit_codes")


def _arguments(run: Any) -> dict[str, str | None]:
    """A run's script arguments as ``{"--option": "value"}`` (``None`` for a bare flag)."""
    args = [str(a) for a in getattr(run, "args", None) or []]
    found: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if token.startswith("--"):
            if "=" in token:
                option, value = token.split("=", 1)
                found[option] = value
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                found[token] = args[i + 1]
                i += 1
            else:
                found[token] = None
        i += 1
    return found


def _same_value(given: str | None, wanted: str | None) -> bool:
    """Whether an argument's value is the one wanted: numbers compare as numbers ("50.0" is
    "50"), lists such as "0,2" as sets, bare flags (``None``) only with bare flags."""
    if given is None or wanted is None:
        return given is wanted
    try:
        return math.isclose(float(given), float(wanted))
    except ValueError:
        pass
    if "," in given or "," in wanted:
        return {v.strip() for v in given.split(",")} == {v.strip() for v in wanted.split(",")}
    return given == wanted


def _spelled(arguments: Mapping[str, str | None]) -> str:
    return " ".join(
        option if value is None else f"{option} {value}" for option, value in arguments.items()
    )


def _wrong_run(
    run: Any,
    script: str | None,
    wanted: Mapping[str, str | None],
    *,
    defaults: Mapping[str, str] | None = None,
    nproc: int | None = None,
    nnodes: int | None = None,
    finished: bool = True,
    shown: str | None = None,
) -> str | None:
    """``None`` when ``run`` is the run an exercise asks for, else a hint saying what differs.

    script: the script it must have run (``None``: any); wanted: arguments the run must have
    been given; defaults: arguments that may be left out (the script's default is the one
    asked for) but, if given, must have that value; finished: it must have ended well;
    shown: the script's name in the hint when ``script`` is ``None``.
    """
    shape = ", ".join(f"{k}={v}" for k, v in (("nproc", nproc), ("nnodes", nnodes)) if v)
    asked = f"launch {script or shown or 'the script'}"
    if shape:
        asked += f" with {shape}"
    if wanted:
        asked += f" {'and' if shape else 'with'} the arguments {_spelled(wanted)}"
    if not _is_run(run):
        return f"hand the check the RunRecord that launch(...) returned: {asked}"
    given = _arguments(run)
    problems = []
    if script is not None and run.script != script:
        problems.append(f"it ran {run.script}")
    if nproc is not None and run.nproc != nproc:
        problems.append(f"nproc was {run.nproc}")
    if nnodes is not None and run.nnodes != nnodes:
        problems.append(f"nnodes was {run.nnodes}")
    for option, value in wanted.items():
        if option not in given:
            problems.append(f"{option} is missing")
        elif not _same_value(given[option], value):
            problems.append(f"{option} was {given[option]}")
    for option, value in (defaults or {}).items():
        if option in given and not _same_value(given[option], value):
            problems.append(f"{option} was {given[option]}, not {value}")
    if finished and run.status != "ok":
        problems.append(f"it ended with status '{run.status}'")
    if problems:
        return f"this is not the run the exercise asks for ({'; '.join(problems)}): {asked}"
    return None


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or ``None`` when it is not a number (bools are not)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _whole(value: Any) -> int | None:
    """``value`` as an int when it is a whole number, else ``None``."""
    number = _number(value)
    return int(number) if number is not None and number == int(number) else None


def _whole_numbers(values: Any) -> list[int] | None:
    """A collection of whole numbers as a sorted list, or ``None`` when it is not one."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        return None
    numbers = [_whole(v) for v in values]
    return None if any(n is None for n in numbers) else sorted(numbers)


def _names(values: Any) -> list[str] | None:
    """A collection of file names as a sorted list, or ``None`` when it is not one."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        return None
    values = list(values)
    return sorted(values) if all(isinstance(v, str) for v in values) else None


def _close(value: float, truth: float, relative: float, absolute: float) -> bool:
    return abs(value - truth) <= max(absolute, relative * abs(truth))


def _rank_files(run: Any) -> list[dict]:
    import json

    return [json.loads(p.read_text()) for p in run.paths("rank*.json") if p.name[4:-5].isdigit()]


# -------------------------------------------------------------------------- lesson 1


@_exercise("01.1")
def _six_processes_on_two_nodes(prediction: Any, run: Any) -> tuple[bool, str]:
    """1.1: what 6 processes on 2 nodes see, against the rank files of the learner's run."""
    wrong = _wrong_run(run, "ranks.py", {}, nproc=3, nnodes=2)
    if wrong:
        return False, wrong
    seen = _rank_files(run)
    if len(seen) != run.world_size:
        return False, f"{len(seen)} rank files for {run.world_size} processes: launch it again"
    truth = {
        "WORLD_SIZE": {int(r["WORLD_SIZE"]) for r in seen},
        "LOCAL_RANKS": {int(r["LOCAL_RANK"]) for r in seen},
        "MASTER_PORTS": len({r["MASTER_PORT"] for r in seen}),
    }
    if not isinstance(prediction, dict) or set(prediction) != set(truth):
        return False, 'predict a dict with keys "WORLD_SIZE", "LOCAL_RANKS" and "MASTER_PORTS"'
    if {_whole(prediction["WORLD_SIZE"])} != truth["WORLD_SIZE"]:
        return False, "WORLD_SIZE counts every process of the job, on all nodes together"
    local_ranks = _whole_numbers(prediction["LOCAL_RANKS"])
    if local_ranks is None:
        return False, "LOCAL_RANKS is the set of values LOCAL_RANK takes, such as {0, 1}"
    if set(local_ranks) != truth["LOCAL_RANKS"]:
        return False, "LOCAL_RANK numbers the processes of one node; it starts again on each node"
    if _whole(prediction["MASTER_PORTS"]) != truth["MASTER_PORTS"]:
        return False, "how many meeting points does one job need, however many nodes it has?"
    return True, (
        f"{len(seen)} processes saw WORLD_SIZE {run.world_size}, LOCAL_RANK "
        f"{sorted(truth['LOCAL_RANKS'])} on each node, and one meeting point"
    )


@_exercise("01.2")
def _a_rank_that_exits_with_a_code(failure: Any) -> tuple[bool, str]:
    """1.2: rank 1 of the learner's fails_exit.py stops with exit code 3."""
    from .launch import RankFailed

    if failure is None:
        return False, (
            "no RankFailed was caught: the run finished without a failing rank. Launch "
            "your fails_exit.py, in which rank 1 stops with an exit code"
        )
    if not isinstance(failure, RankFailed):
        return False, "hand the check the RankFailed you caught (except RankFailed as err: ...)"
    if getattr(failure.record, "script", None) == "fails.py":
        return False, (
            "that is the failure of the lesson's fails.py: write fails_exit.py, launch it "
            "and hand the check its RankFailed"
        )
    if failure.exit_code == 1:
        return False, (
            f"rank {failure.rank} exited with 1, which is what an uncaught exception "
            f"gives; stop rank 1 with sys.exit(3) instead"
        )
    if failure.rank != 1:
        return False, f"rank {failure.rank} failed; make rank 1 the one that exits"
    if failure.exit_code != 3:
        return False, f"rank 1 exited with {failure.exit_code}; use sys.exit(3)"
    return True, (
        "rank 1 exited with code 3 and the launcher named it; an uncaught exception "
        "gives exit code 1"
    )


# -------------------------------------------------------------------------- lesson 2

#: Exercise 2.1's schedule and number of steps (the exercise's statement).
SCHEDULE_2_1 = {"wait": 2, "warmup": 1, "active": 2, "repeat": 2}
STEPS_2_1 = 10


def _recorded_windows(
    steps: int, wait: int, warmup: int, active: int, repeat: int
) -> list[list[int]]:
    """The steps of each trace that ``torch.profiler.schedule(wait=, warmup=, active=,
    repeat=)`` saves over ``steps`` steps, one list per window, in order: each cycle waits,
    warms up, then records ``active`` steps and saves them when the last one ends (torch's
    ``schedule_fn``, without ``skip_first``; the tests compare the two)."""
    cycle = wait + warmup + active
    windows = []
    for start in range(0, steps, cycle):
        if repeat and len(windows) == repeat:
            break
        if start + cycle <= steps:
            windows.append(list(range(start + wait + warmup, start + cycle)))
    return windows


@_exercise("02.1")
def _what_a_schedule_records(prediction: Any, files: Any) -> tuple[bool, str]:
    """2.1: the files a two-cycle schedule writes, and the steps each holds."""
    from .traces import TraceError, load_trace

    if isinstance(files, (str, Path)) or not isinstance(files, Iterable):
        return False, "hand the check the list of paths save_trace wrote (exported)"
    paths = sorted({Path(f) for f in files})
    if not paths:
        return False, "no trace files: run the profiler and collect the files save_trace wrote"
    actual = {}
    for path in paths:
        try:
            steps = load_trace(path).events["step"].dropna().unique()
        except (OSError, TraceError) as err:
            return False, f"{path.name} is not a trace the profiler wrote ({err})"
        actual[path.name] = sorted(int(s) for s in steps)
    cycle = ", ".join(f"{k}={v}" for k, v in SCHEDULE_2_1.items())
    if sorted(actual.values()) != _recorded_windows(STEPS_2_1, **SCHEDULE_2_1):
        return False, (
            f"these files are not what schedule({cycle}) records over {STEPS_2_1} steps: start "
            f"from exported = [], profile {STEPS_2_1} steps with that schedule and "
            f"on_trace_ready=save_trace, and hand the check exported"
        )
    if not isinstance(prediction, dict):
        return False, "predict a dict: file name -> list of recorded step numbers"
    if set(prediction) != set(actual):
        return False, (
            "on_trace_ready runs when an active phase ends, and save_trace names the "
            "file after prof.step_num then: how many steps have run at that moment?"
        )
    wrong = [name for name in actual if _whole_numbers(prediction[name]) != actual[name]]
    if wrong:
        return False, (
            f"the steps in {wrong[0]} are not those: steps count from 0, and only the "
            f"active phase of each cycle (wait, warmup, active) is kept"
        )
    return True, f"{len(actual)} files, each with its cycle's active steps: {actual}"


@_exercise("02.2")
def _the_slowest_convolution_by_shape(shapes: Any, prof: Any) -> tuple[bool, str]:
    """2.2: the input shapes of the backward convolution with the most self time."""
    if not hasattr(prof, "key_averages"):
        return False, "hand the check the profile(...) object you profiled the step with"
    groups = [
        e
        for e in prof.key_averages(group_by_input_shape=True)
        if e.key == "aten::convolution_backward"
    ]
    if not groups:
        return False, (
            "this profile has no aten::convolution_backward: profile a whole training "
            "step, backward pass included"
        )
    if not any(e.input_shapes for e in groups):
        return False, (
            "no input shapes in this profile of aten::convolution_backward: profile the "
            "step with record_shapes=True"
        )
    slowest = max(groups, key=lambda e: e.self_cpu_time_total)
    by_total = max(groups, key=lambda e: e.cpu_time_total)
    if shapes == slowest.input_shapes:
        return True, (
            f"{slowest.count} call(s) with these shapes spent "
            f"{slowest.self_cpu_time_total / 1e3:.1f} ms in themselves"
        )
    if shapes == by_total.input_shapes:
        return (
            False,
            "that group has the most total time (with children); the question is self time",
        )
    if not any(shapes == e.input_shapes for e in groups):
        return False, (
            "these are not the input shapes of any aten::convolution_backward group: "
            "take them from key_averages(group_by_input_shape=True)"
        )
    return False, "another shape spends more self CPU time: sort by self_cpu_time_total"


# -------------------------------------------------------------------------- lesson 3


@_exercise("03.1")
def _files_of_a_two_cycle_schedule(prediction: Any, run: Any) -> tuple[bool, str]:
    """3.1: the trace files of a two-cycle schedule on rank 0, against the run's files."""
    asked = {
        "--steps": "8",
        "--wait": "1",
        "--warmup": "1",
        "--active": "2",
        "--repeat": "2",
        "--profile-ranks": "0",
    }
    wrong = _wrong_run(run, "train_ddp.py", asked)
    if wrong:
        return False, wrong
    actual = sorted(p.name for p in run.paths("rank*_iter*.json"))
    predicted = _names(prediction)
    if predicted is None:
        return False, "predict a list of file names"
    if predicted == actual:
        return True, f"exactly these files: {actual}"
    if any(not name.startswith("rank0_") for name in predicted):
        return False, "only the ranks named in --profile-ranks write traces"
    if len(predicted) != len(actual):
        return False, "each cycle of the schedule (repeat) ends with its own active window and file"
    return False, (
        "the names hold the window's first and last step: write_trace computes them "
        "from prof.step_num when the window ends (steps count from 0)"
    )


@_exercise("03.2")
def _which_rank_wrote_each_file(which_rank: Any, run: Any) -> tuple[bool, str]:
    """3.2: which rank wrote each trace_<pid>.json, read from the files themselves."""
    from .traces import TraceError, load_trace

    asked = {
        "--steps": "3",
        "--wait": "1",
        "--warmup": "1",
        "--active": "1",
        "--shared-trace-name": None,
    }
    wrong = _wrong_run(run, None, asked, shown="your train_ddp_pid.py")
    if wrong:
        return False, wrong
    files = run.paths("trace_*.json")
    if len(files) != run.world_size:
        return False, (
            f"{len(files)} trace_<pid>.json files for {run.world_size} ranks: change the "
            f"--shared-trace-name branch of write_trace so that every process writes a file "
            f"of its own name (os.getpid())"
        )
    actual = {}
    for path in files:
        try:
            trace = load_trace(path)
        except (OSError, TraceError) as err:
            return False, f"{path.name} is not a trace the profiler wrote ({err})"
        if path.stem.split("_", 1)[1] not in set(trace.events["pid"].astype(str)):
            return False, (
                f"{path.name} is not named after the process that wrote it: name each file "
                f"with os.getpid(), the process id"
            )
        actual[path.name] = trace.header.rank
    if not isinstance(which_rank, dict) or set(which_rank) != set(actual):
        return False, f"answer with a dict of every file name to its rank: {sorted(actual)}"
    if {name: _whole(rank) for name, rank in which_rank.items()} != actual:
        return False, (
            "process ids say nothing about ranks; load each file and read "
            "load_trace(path).header.rank (from the trace's distributedInfo)"
        )
    return True, f"every rank kept its own trace, and each file says which rank wrote it: {actual}"


# -------------------------------------------------------------------------- lesson 4


def _broadcast_ms_per_rank(events: Any) -> Any:
    """Median over steps of the wall time each rank spends in broadcasts (two broadcasts at
    once on two threads count once), in ms: a Series indexed by rank."""
    import pandas as pd

    from .analysis import busy_ms, collective_waits

    waits = collective_waits(events)
    broadcasts = waits[waits["name"].str.contains("broadcast", case=False)].dropna(subset=["step"])
    per_step = {
        key: busy_ms(group["start_us"], group["start_us"] + group["dur_us"])
        for key, group in broadcasts.groupby(["rank", "step"])
    }
    if not per_step:
        return pd.Series(dtype=float)
    index = pd.MultiIndex.from_tuples(list(per_step), names=["rank", "step"])
    return pd.Series(list(per_step.values()), index=index).groupby(level="rank").median()


@_exercise("04.1")
def _where_the_fast_rank_waits(
    prediction: Any, run: Any = None, events: Any = None
) -> tuple[bool, str]:
    """4.1: the rank that waits in broadcasts, and how long per step, in the straggler
    run. ``events`` is accepted only to say that the check needs the run itself."""
    from .traces import load_run

    if not _is_run(run):
        return False, 'hand the check the straggler run itself: check("04.1", prediction, run=slow)'
    given = _arguments(run)
    slow_rank = _whole(given.get("--slow-rank", -1))
    delay_ms = _number(given.get("--delay-ms", 0))
    if run.script != "train_ddp.py" or slow_rank is None or slow_rank < 0 or not delay_ms:
        return False, (
            "this is not a straggler run: use the lesson's run of train_ddp.py with "
            "--slow-rank and --delay-ms (slow)"
        )
    per_rank = _broadcast_ms_per_rank(load_run(run).events)
    if per_rank.empty:
        return False, "this run's traces have no broadcasts inside profiler steps"
    if not isinstance(prediction, dict) or {"rank", "ms"} - set(prediction):
        return False, 'predict a dict {"rank": ..., "ms": ...}'
    rank, ms = _whole(prediction["rank"]), _number(prediction["ms"])
    if rank not in per_rank.index or ms is None:
        return False, f"the rank is one of {sorted(int(r) for r in per_rank.index)}, ms a number"
    longest = float(per_rank.max())
    if rank == slow_rank or not _close(float(per_rank[rank]), longest, 0.3, 10):
        return False, (
            "the rank that waits is the one that is early: the slow rank joins the "
            "broadcast last and hardly waits in it"
        )
    measured = float(per_rank[rank])
    if not _close(ms, measured, 0.3, 10):
        return False, (
            f"rank {rank} is right; the time is off by more than 30 %: the wait is about "
            f"the delay the other rank adds to its batches, counted once per step"
        )
    return True, (
        f"rank {rank} spends {measured:.0f} ms per step in broadcasts, waiting for the slow rank"
    )


_SLOW = ("--slow-rank", "--delay-ms")


@_exercise("04.2")
def _rank_0_as_the_straggler(answer: Any, run: Any, baseline: Any) -> tuple[bool, str]:
    """4.2: the straggler and the others' extra waiting, from the learner's two runs."""
    from .analysis import find_straggler, waiting_per_step
    from .traces import load_run

    wrong = _wrong_run(run, "train_ddp.py", {"--slow-rank": "0", "--delay-ms": "100"})
    if wrong:
        return False, wrong
    if not _is_run(baseline) or baseline.script != "train_ddp.py" or baseline.status != "ok":
        return False, "hand the check the lesson's normal run (normal) as baseline"
    base_args = _arguments(baseline)
    base_slow = _whole(base_args.get("--slow-rank", -1))
    if (base_slow is None or base_slow >= 0) and (_number(base_args.get("--delay-ms", 0)) or 0) > 0:
        return False, "the baseline is the normal run, the one without a slow rank (normal)"
    run_args = {k: v for k, v in _arguments(run).items() if k not in _SLOW}
    base_args = {k: v for k, v in base_args.items() if k not in _SLOW}
    same = set(run_args) == set(base_args) and all(
        _same_value(v, base_args[k]) for k, v in run_args.items()
    )
    if not same or run.world_size != baseline.world_size:
        return False, (
            f"launch it with the normal run's arguments ({_spelled(base_args)}, "
            f"{baseline.world_size} ranks) plus --slow-rank 0 --delay-ms 100, so that only "
            f"the straggler differs"
        )
    events = load_run(run).events
    straggler = find_straggler(events)
    others = [r for r in sorted(events["rank"].unique()) if r != straggler]
    extra = (
        waiting_per_step(events).median() - waiting_per_step(load_run(baseline).events).median()
    )[others].median()
    if not isinstance(answer, dict) or {"straggler", "extra_wait_ms"} - set(answer):
        return False, 'answer with a dict {"straggler": ..., "extra_wait_ms": ...}'
    if _whole(answer["straggler"]) != straggler:
        return False, (
            "the straggler is the rank that waits least in collectives: everyone is "
            "already there when it arrives (find_straggler)"
        )
    extra_ms = _number(answer["extra_wait_ms"])
    if extra_ms is None or not _close(extra_ms, extra, 0.2, 10):
        return False, (
            "the straggler is right; the extra waiting is off: compare the median "
            "waiting_per_step of the other ranks with the normal run's"
        )
    return True, (
        f"rank {straggler} is the straggler, found from the traces alone; the others "
        f"wait {extra:.0f} ms more per step (injected: 100 ms)"
    )


# -------------------------------------------------------------------------- lesson 5


def _per_worker_events(run: Any) -> Any:
    from .traces import load_run

    return load_run(
        {0: run.run_dir / "worker0_trace.json", 1: run.run_dir / "worker1_trace.json"}, cache=False
    ).events


def _per_worker_files(run: Any) -> str | None:
    """A hint when the run lacks the two per-worker traces, else ``None``."""
    missing = [
        n for n in ("worker0_trace.json", "worker1_trace.json") if not (run.run_dir / n).is_file()
    ]
    return f"this run has no {missing[0]}: launch it again" if missing else None


@_exercise("05.1")
def _how_long_a_profiled_call_lasts(prediction_ms: Any, run: Any) -> tuple[bool, str]:
    """5.1: the shortest marked call of 3 concurrent 50 ms calls, in ms."""
    asked = {"--part": "per-worker", "--sleep-ms": "50", "--concurrent": "3"}
    wrong = _wrong_run(
        run, "rpc_profiling.py", asked, defaults={"--num-worker-threads": "4"}, nproc=2
    ) or _per_worker_files(run)
    if wrong:
        return False, wrong
    events = _per_worker_events(run)
    marks = events[(events["rank"] == 0) & events["name"].astype(str).str.contains("#udf_with_ops")]
    if marks.empty:
        return False, "the caller's trace has no rpc_async#udf_with_ops marks: launch it again"
    shortest = float(marks["dur_us"].min()) / 1e3
    prediction = _number(prediction_ms)
    if prediction is None:
        return False, "predict a number of milliseconds"
    if prediction <= 50:
        return False, (
            "the caller's mark lasts from sending the request until the reply arrives: "
            "longer than the server's 50 ms sleep alone"
        )
    if not _close(prediction, shortest, 0.2, 5):
        return False, (
            "the mark runs from sending the request until the reply arrives: the "
            "server's work plus the time the messages take, and waiting for a free thread "
            "(the server has 4)"
        )
    return True, f"the shortest call lasted {shortest:.1f} ms: the 50 ms sleep plus a little"


@_exercise("05.2")
def _six_concurrent_calls(counts: Any, legacy_run: Any, per_worker_run: Any) -> tuple[bool, str]:
    """5.2: how many of 6 concurrent calls each way of profiling recorded."""
    import json

    wrong = _wrong_run(
        legacy_run, "rpc_profiling.py", {"--part": "legacy", "--concurrent": "6"}
    ) or _wrong_run(
        per_worker_run, "rpc_profiling.py", {"--part": "per-worker", "--concurrent": "6"}
    )
    if wrong:
        return False, wrong
    summary_path = legacy_run.run_dir / "legacy_summary.json"
    wrong = _per_worker_files(per_worker_run)
    if wrong or not summary_path.is_file():
        return False, wrong or "the legacy run has no legacy_summary.json: launch it again"
    summary = json.loads(summary_path.read_text())
    events = _per_worker_events(per_worker_run)
    served = events[
        (events["rank"] == 1) & events["name"].astype(str).str.fullmatch(r"server: udf call \d+")
    ]
    truth = {"legacy": summary["udf_calls_recorded"], "per_worker": len(served)}
    if not isinstance(counts, dict) or set(counts) != set(truth):
        return False, 'answer with {"legacy": ..., "per_worker": ...}'
    if _whole(counts["legacy"]) != truth["legacy"]:
        return False, "count the legacy run's rpc_async#udf_with_ops events (udf_calls_recorded)"
    if _whole(counts["per_worker"]) != truth["per_worker"]:
        return False, "count the 'server: udf call N' events in the server's trace (worker1)"
    return True, (
        f"the legacy profiler recorded {truth['legacy']} of 6 calls, every worker "
        f"profiling itself {truth['per_worker']} of 6"
    )


# -------------------------------------------------------------------------- lesson 6

#: The pool sizes exercise 6.1 sweeps (its statement).
POOLS_6 = {1, 2, 4, 8, 16}


def _sweep_of_eight_calls(run: Any) -> tuple[dict[int, float] | None, str]:
    """The median latency of 8 waiting calls per pool size of exercise 6.1's sweep, or
    ``(None, hint)`` when ``run`` is not that sweep."""
    import json

    asked = {"--threads": ",".join(map(str, sorted(POOLS_6))), "--calls": "8"}
    wrong = _wrong_run(run, "rpc_threads.py", {"--calls": "8"}, defaults={"--wait-ms": "50"})
    pools = {_whole(t) for t in (_arguments(run).get("--threads") or "").split(",")}
    if wrong or not POOLS_6 <= pools:
        return None, wrong or (
            f"this sweep does not have every pool size the exercise asks for: launch "
            f"rpc_threads.py with {_spelled(asked)}"
        )
    path = run.run_dir / "latency.json"
    if not path.is_file():
        return None, "this run has no latency.json: launch it again"
    data = json.loads(path.read_text())
    return {int(t): r["wait"]["median_ms"] for t, r in data["by_threads"].items()}, ""


@_exercise("06.1")
def _eight_calls_on_four_threads(prediction_ms: Any, run: Any) -> tuple[bool, str]:
    """6.1: the latency of 8 waiting calls on 4 threads, against the sweep."""
    latency, wrong = _sweep_of_eight_calls(run)
    if latency is None:
        return False, wrong
    measured = latency[4]
    prediction = _number(prediction_ms)
    if prediction is None or not _close(prediction, measured, 0.2, 15):
        return False, (
            "4 threads run 4 of the calls at a time; each call sleeps 50 ms: how many "
            "rounds do 8 calls need?"
        )
    return True, f"measured {measured:.0f} ms: two rounds of 4 calls, 50 ms each"


@_exercise("06.2")
def _enough_threads_for_eight_calls(threads: Any, run: Any) -> tuple[bool, str]:
    """6.2: the smallest pool within 10 % of the sweep's best latency."""
    latency, wrong = _sweep_of_eight_calls(run)
    if latency is None:
        return False, wrong
    best = min(latency.values())
    enough = min(t for t, ms in latency.items() if ms <= 1.1 * best)
    pool = _whole(threads)
    if pool == enough:
        return True, (
            f"from {enough} threads on, 8 waiting calls take about {best:.0f} ms: one "
            f"call's time. More threads than calls in flight add nothing"
        )
    if pool not in latency:
        return False, f"answer with one of the sweep's pool sizes: {sorted(latency)}"
    if latency[pool] > 1.1 * best:
        return False, (
            f"at {pool} threads the batch still takes {latency[pool]:.0f} ms, more than "
            f"10 % above the best"
        )
    return False, (
        "a smaller pool already comes within 10 % of the best latency: compare the run's latencies"
    )


# -------------------------------------------------------------------------- lesson 7


@_exercise("07.1")
def _which_node_holds_which_trace(prediction: Any, run: Any) -> tuple[bool, str]:
    """7.1: which node's folder holds the traces of ranks 0 and 2."""
    asked = {
        "--steps": "7",
        "--wait": "2",
        "--warmup": "1",
        "--active": "4",
        "--profile-ranks": "0,2",
    }
    wrong = _wrong_run(run, "train_ddp.py", asked, nproc=2, nnodes=2)
    if wrong:
        return False, wrong
    actual = {
        f"node{n}": sorted(p.name for p in (run.run_dir / f"node{n}").glob("rank*_iter*.json"))
        for n in range(run.nnodes)
    }
    if not isinstance(prediction, dict) or set(prediction) != set(actual):
        return False, 'predict {"node0": [...], "node1": [...]}'
    predicted = {node: _names(names) for node, names in prediction.items()}
    if predicted == actual:
        return True, f"each node's folder holds the traces of its own ranks: {actual}"
    every_predicted = sorted(name for names in predicted.values() for name in names or [])
    if every_predicted == sorted(name for names in actual.values() for name in names):
        return False, (
            "the right files, in the wrong folders: each node writes into its own folder, "
            "and run.nodes says which global ranks each node got"
        )
    return False, (
        "only ranks 0 and 2 write traces, one file each, named rank<N>_iter<first>_<last>.json "
        "after the window's first and last step (steps count from 0)"
    )


#: The skew exercise 7.2 asks for: node 1's clock 30 ms behind node 0's, in µs.
SKEW_7_2_US = -30_000


@_exercise("07.2")
def _recover_your_own_skew(
    estimate_us: Any, events: Any, nodes: Any, injected_us: Any
) -> tuple[bool, str]:
    """7.2: node 1 shifted 30 ms behind, and the offset clock_offsets recovers."""
    from .analysis import clock_offsets

    injected = _number(injected_us)
    if injected is None or abs(injected - SKEW_7_2_US) > 1:
        if injected is not None and abs(injected + SKEW_7_2_US) <= 1:
            return False, (
                "that moves node 1 ahead of node 0: a clock that runs behind reads earlier "
                "times, so its events move the other way"
            )
        if injected is not None and abs(injected - SKEW_7_2_US / 1000) <= 0.001:
            return False, "shift_ranks takes microseconds, not milliseconds"
        return False, "shift node 1's ranks so that its clock runs 30 ms behind node 0's (in µs)"
    if not isinstance(nodes, dict) or len(nodes) < 2:
        return False, "hand the check the run's nodes (run.nodes)"
    try:
        recovered = clock_offsets(events, nodes)[max(nodes)]
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        return False, f"clock_offsets cannot read these events ({err}): pass the shifted events"
    estimate = _number(estimate_us)
    if estimate is None or not _close(estimate, recovered, 0.0, 1000):
        return (
            False,
            "your estimate is not what clock_offsets finds in these events: call it on them",
        )
    if not _close(recovered, injected, 0.0, 10_000):  # lesson 7's tolerance
        return False, (
            f"these events give {recovered / 1e3:+.1f} ms, not the {injected / 1e3:+.1f} ms "
            f"you say you injected: shift the ranks of node 1 only, once"
        )
    return True, (
        f"recovered {recovered / 1e3:+.2f} ms for an injected {injected / 1e3:+.1f} ms, "
        f"from the ends of the collectives alone"
    )


# -------------------------------------------------------------------------- lesson 8


def _mismatch_of(
    error: Any, asked: Mapping[str, str], defaults: Mapping[str, str]
) -> tuple[Any, str]:
    """The first mismatch in the Flight Recorder dumps of the failed run of ``hang.py`` that
    ``error`` carries, or ``(None, hint)`` when it is not that run or it has no dumps."""
    from .flight_recorder import FlightRecorderError, first_mismatch, load_flight_records
    from .launch import LaunchError

    if error is None:
        return None, (
            "no error was caught: the run finished. hang.py with a --bug never finishes: "
            "launch it inside try: ... except RankFailed as err: ... and hand the check err"
        )
    if not isinstance(error, LaunchError):
        return None, "hand the check the RankFailed you caught (except RankFailed as err: ...)"
    wrong = _wrong_run(error.record, "hang.py", asked, defaults=defaults, finished=False)
    if wrong:
        return None, wrong
    try:
        mismatch = first_mismatch(load_flight_records(error.record.run_dir))
    except FlightRecorderError as err:
        return None, f"no usable Flight Recorder dumps in this run ({err}): launch it again"
    if mismatch is None:
        return None, "the ranks' dumps agree everywhere: launch it again"
    return mismatch, ""


@_exercise("08.1")
def _where_the_mismatch_lands(predicted_seq: Any, error: Any) -> tuple[bool, str]:
    """8.1: the sequence number where rank 1's broadcast meets rank 0's all_reduce."""
    mismatch, wrong = _mismatch_of(error, {"--bug": "different", "--bug-step": "3"}, {})
    if mismatch is None:
        return False, wrong
    if _whole(predicted_seq) != mismatch.seq:
        return False, (
            "every step makes two collectives (an all_reduce, then a broadcast), and "
            "the sequence numbers count from 1: where does step 3's all_reduce fall?"
        )
    return True, str(mismatch)


@_exercise("08.2")
def _a_skipped_collective(answer: Any, error: Any) -> tuple[bool, str]:
    """8.2: the first collective that rank 1 skipped, and the rank that skipped it."""
    mismatch, wrong = _mismatch_of(error, {"--bug": "skip"}, {"--bug-step": "4"})
    if mismatch is None:
        return False, wrong
    if not isinstance(answer, dict) or {"seq", "rank"} - set(answer):
        return False, 'answer with {"seq": ..., "rank": ...}'
    if _whole(answer["seq"]) != mismatch.seq:
        return False, (
            "load_flight_records(...) and first_mismatch(...): the first sequence "
            "number that not every rank reached (two collectives per step, counted from 1)"
        )
    if _whole(answer["rank"]) not in mismatch.culprits:
        return False, "which rank has nothing at that sequence number?"
    return True, f"{mismatch}; PyTorch's analyser reports it as 'Not all ranks joining collective'"
