"""Checks for the exercises at the end of each lesson.

After trying an exercise, run its check in the next cell::

    check("04.1", answer, run=my_run)

It says whether the answer is right and, when it is not, why (a hint, not the solution).
Every check compares the answer with what *your own* run produced (its files, its traces,
its measured times, with tolerances), never with numbers stored here. An exercise not yet
tried is a normal state: leave ``answer = ...`` and the check says so.

Each check is a function registered under the exercise's number; it returns ``(True,
message)`` or ``(False, hint)``. :func:`evaluate` runs one and returns that pair (the tests
use it); :func:`check` prints the verdict for the learner.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["check", "evaluate", "CHECKS"]

#: The checks, by exercise number (``"04.1"``): each takes the answer and the evidence.
CHECKS: dict[str, Callable[..., tuple[bool, str]]] = {}


def _exercise(number: str):
    def register(fn: Callable[..., tuple[bool, str]]):
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


def check(exercise: str, answer: Any = ..., **evidence: Any) -> None:
    """Print whether the answer to an exercise is right, and a hint when it is not."""
    ok, message = evaluate(exercise, answer, **evidence)
    verdict = {True: "right", False: "not yet", None: ""}[ok]
    print(f"Exercise {exercise}: " + (f"{verdict}. {message}" if verdict else message))


# --------------------------------------------------------------------------- helpers


def _is_run(value: Any) -> bool:
    return hasattr(value, "run_dir") and hasattr(value, "exit_codes")


def _args_of(run) -> dict[str, str]:
    """A run's script arguments as {"--option": "value"}."""
    return dict(zip(run.args[::2], run.args[1::2])) if _is_run(run) else {}


def _rank_files(run) -> list[dict]:
    import json

    return [json.loads(p.read_text()) for p in run.paths("rank*.json") if p.name[4:-5].isdigit()]


# -------------------------------------------------------------------------- lesson 1


@_exercise("01.1")
def _six_processes_on_two_nodes(prediction, run) -> tuple[bool, str]:
    if not _is_run(run) or (run.nproc, run.nnodes, run.script) != (3, 2, "ranks.py"):
        return False, "the run must be ranks.py launched with nproc=3 and nnodes=2"
    seen = _rank_files(run)
    truth = {
        "WORLD_SIZE": {int(r["WORLD_SIZE"]) for r in seen},
        "LOCAL_RANKS": {int(r["LOCAL_RANK"]) for r in seen},
        "MASTER_PORTS": len({r["MASTER_PORT"] for r in seen}),
    }
    if not isinstance(prediction, dict) or set(prediction) != set(truth):
        return False, 'predict a dict with keys "WORLD_SIZE", "LOCAL_RANKS" and "MASTER_PORTS"'
    if {prediction["WORLD_SIZE"]} != truth["WORLD_SIZE"]:
        return False, "WORLD_SIZE counts every process of the job, on all nodes together"
    if set(prediction["LOCAL_RANKS"]) != truth["LOCAL_RANKS"]:
        return False, "LOCAL_RANK numbers the processes of one node; it starts again on each node"
    if prediction["MASTER_PORTS"] != truth["MASTER_PORTS"]:
        return False, "how many meeting points does one job need, however many nodes it has?"
    return True, (
        f"{len(seen)} processes saw WORLD_SIZE {prediction['WORLD_SIZE']}, LOCAL_RANK "
        f"{sorted(truth['LOCAL_RANKS'])} on each node, and one meeting point"
    )


@_exercise("01.2")
def _a_rank_that_exits_with_a_code(failure) -> tuple[bool, str]:
    from .launch import RankFailed

    if not isinstance(failure, RankFailed):
        return False, "hand the check the RankFailed you caught (except RankFailed as err: ...)"
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


@_exercise("02.1")
def _what_a_schedule_records(prediction, files) -> tuple[bool, str]:
    from pathlib import Path

    from .traces import load_trace

    files = [Path(f) for f in files]
    if not files:
        return False, "no trace files: run the profiler and collect the files save_trace wrote"
    actual = {}
    for path in files:
        steps = load_trace(path).events["step"].dropna().unique()
        actual[path.name] = sorted(int(s) for s in steps)
    if not isinstance(prediction, dict):
        return False, "predict a dict: file name -> list of recorded step numbers"
    if set(prediction) != set(actual):
        return False, (
            "on_trace_ready runs when an active phase ends, and save_trace names the "
            "file after prof.step_num then: how many steps have run at that moment?"
        )
    wrong = [name for name in actual if sorted(prediction[name]) != actual[name]]
    if wrong:
        return False, (
            f"the steps in {wrong[0]} are not those: steps count from 0, and only the "
            f"active phase of each cycle (wait, warmup, active) is kept"
        )
    return True, f"{len(actual)} files, each with its cycle's active steps: {actual}"


@_exercise("02.2")
def _the_slowest_convolution_by_shape(shapes, prof) -> tuple[bool, str]:
    groups = [
        e
        for e in prof.key_averages(group_by_input_shape=True)
        if e.key == "aten::convolution_backward"
    ]
    if not groups or not any(e.input_shapes for e in groups):
        return False, (
            "no input shapes in this profile of aten::convolution_backward: profile a "
            "training step with record_shapes=True"
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
def _files_of_a_two_cycle_schedule(prediction, run) -> tuple[bool, str]:
    if not _is_run(run) or "--profile-ranks" not in run.args:
        return (
            False,
            "launch train_ddp.py with the arguments of the exercise (--profile-ranks 0 ...)",
        )
    actual = sorted(p.name for p in run.paths("rank*_iter*.json"))
    if not isinstance(prediction, (list, tuple, set)):
        return False, "predict a list of file names"
    predicted = sorted(prediction)
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
def _which_rank_wrote_each_file(which_rank, run) -> tuple[bool, str]:
    from .traces import load_trace

    if not _is_run(run):
        return False, "hand the check the run of your train_ddp_pid.py"
    files = run.paths("trace_*.json")
    if len(files) != run.world_size:
        return False, (
            f"{len(files)} trace_<pid>.json files for {run.world_size} ranks: every "
            f"process must write a file of its own name (os.getpid())"
        )
    actual = {p.name: load_trace(p).header.rank for p in files}
    if not isinstance(which_rank, dict) or set(which_rank) != set(actual):
        return False, f"answer with a dict of every file name to its rank: {sorted(actual)}"
    if which_rank != actual:
        return False, (
            "process ids say nothing about ranks; load each file and read "
            "load_trace(path).header.rank (from the trace's distributedInfo)"
        )
    return True, f"every rank kept its own trace, and each file says which rank wrote it: {actual}"


# -------------------------------------------------------------------------- lesson 4


def _close(value: float, truth: float, relative: float, absolute: float) -> bool:
    return abs(value - truth) <= max(absolute, relative * abs(truth))


@_exercise("04.1")
def _where_the_fast_rank_waits(prediction, events) -> tuple[bool, str]:
    from .analysis import _wall_ms, collective_waits

    waits = collective_waits(events)
    broadcasts = waits[waits["name"].str.endswith("broadcast")].dropna(subset=["step"])
    if broadcasts.empty:
        return False, "these events have no broadcasts inside profiler steps: pass slow_events"
    # wall time per step: broadcasts on two gloo threads at once count once
    per_step = _wall_ms(
        broadcasts.assign(end_us=broadcasts["start_us"] + broadcasts["dur_us"]), ["rank", "step"]
    )
    per_rank = per_step.groupby("rank").median()
    rank, ms = int(per_rank.idxmax()), float(per_rank.max())
    if not isinstance(prediction, dict) or {"rank", "ms"} - set(prediction):
        return False, 'predict a dict {"rank": ..., "ms": ...}'
    if prediction["rank"] != rank:
        return False, (
            "the rank that waits is the one that is early: the slow rank joins the "
            "broadcast last and hardly waits in it"
        )
    if not _close(prediction["ms"], ms, 0.3, 10):
        return False, (
            f"rank {rank} is right; the time is off by more than 30 %: the wait is about "
            f"the delay the other rank adds to its batches"
        )
    return True, f"rank {rank} spends {ms:.0f} ms per step in broadcasts, waiting for the slow rank"


@_exercise("04.2")
def _rank_0_as_the_straggler(answer, run, baseline) -> tuple[bool, str]:
    from .analysis import find_straggler, waiting_per_step
    from .traces import load_run

    args = _args_of(run)
    if args.get("--slow-rank") != "0" or float(args.get("--delay-ms", 0)) != 100:
        return False, "launch train_ddp.py with --slow-rank 0 --delay-ms 100"
    events = load_run(run).events
    straggler = find_straggler(events)
    others = [r for r in sorted(events["rank"].unique()) if r != straggler]
    extra = (
        waiting_per_step(events).median() - waiting_per_step(load_run(baseline).events).median()
    )[others].median()
    if not isinstance(answer, dict) or {"straggler", "extra_wait_ms"} - set(answer):
        return False, 'answer with a dict {"straggler": ..., "extra_wait_ms": ...}'
    if answer["straggler"] != straggler:
        return False, (
            "the straggler is the rank that waits least in collectives: everyone is "
            "already there when it arrives (find_straggler)"
        )
    if not _close(answer["extra_wait_ms"], extra, 0.2, 10):
        return False, (
            f"the straggler is right; the extra waiting is off: compare the median "
            f"waiting_per_step of the other ranks with the normal run's"
        )
    return True, (
        f"rank {straggler} is the straggler, found from the traces alone; the others "
        f"wait {extra:.0f} ms more per step (injected: 100 ms)"
    )


# -------------------------------------------------------------------------- lesson 5


def _per_worker_events(run):
    from .traces import load_run

    return load_run(
        {0: run.run_dir / "worker0_trace.json", 1: run.run_dir / "worker1_trace.json"}, cache=False
    ).events


@_exercise("05.1")
def _how_long_a_profiled_call_lasts(prediction_ms, run) -> tuple[bool, str]:
    args = _args_of(run)
    if (args.get("--part"), args.get("--sleep-ms"), args.get("--concurrent")) != (
        "per-worker",
        "50",
        "3",
    ):
        return False, "launch rpc_profiling.py with --part per-worker --sleep-ms 50 --concurrent 3"
    events = _per_worker_events(run)
    marks = events[(events["rank"] == 0) & events["name"].astype(str).str.contains("#udf_with_ops")]
    shortest = float(marks["dur_us"].min()) / 1e3
    if prediction_ms < 50:
        return False, "the caller's mark lasts at least as long as the server's 50 ms sleep"
    if not _close(prediction_ms, shortest, 0.2, 5):
        return False, (
            "the mark runs from sending the request until the reply arrives: the "
            "server's work plus the time the messages take, and waiting for a free thread"
        )
    return True, f"the shortest call lasted {shortest:.1f} ms: the 50 ms sleep plus a little"


@_exercise("05.2")
def _six_concurrent_calls(counts, legacy_run, per_worker_run) -> tuple[bool, str]:
    import json

    if (
        _args_of(legacy_run).get("--concurrent") != "6"
        or _args_of(per_worker_run).get("--concurrent") != "6"
    ):
        return False, "launch both parts with --concurrent 6"
    summary = json.loads((legacy_run.run_dir / "legacy_summary.json").read_text())
    events = _per_worker_events(per_worker_run)
    served = events[
        (events["rank"] == 1) & events["name"].astype(str).str.fullmatch(r"server: udf call \d+")
    ]
    truth = {"legacy": summary["udf_calls_recorded"], "per_worker": len(served)}
    if not isinstance(counts, dict) or set(counts) != set(truth):
        return False, 'answer with {"legacy": ..., "per_worker": ...}'
    if counts["legacy"] != truth["legacy"]:
        return False, "count the legacy run's rpc_async#udf_with_ops events (udf_calls_recorded)"
    if counts["per_worker"] != truth["per_worker"]:
        return False, "count the 'server: udf call N' events in the server's trace (worker1)"
    return True, (
        f"the legacy profiler recorded {truth['legacy']} of 6 calls, every worker "
        f"profiling itself {truth['per_worker']} of 6"
    )


# -------------------------------------------------------------------------- lesson 6


def _wait_latency(run) -> dict[int, float] | None:
    import json

    path = run.run_dir / "latency.json" if _is_run(run) else None
    if path is None or not path.is_file():
        return None
    data = json.loads(path.read_text())
    if data.get("calls") != 8:
        return None
    return {int(t): r["wait"]["median_ms"] for t, r in data["by_threads"].items()}


@_exercise("06.1")
def _eight_calls_on_four_threads(prediction_ms, run) -> tuple[bool, str]:
    latency = _wait_latency(run)
    if latency is None or 4 not in latency:
        return False, "launch rpc_threads.py with --calls 8 and a pool of 4 threads among --threads"
    measured = latency[4]
    if not _close(prediction_ms, measured, 0.2, 15):
        return False, (
            "4 threads run 4 of the calls at a time; each call sleeps 50 ms: how many "
            "rounds do 8 calls need?"
        )
    return True, f"measured {measured:.0f} ms: two rounds of 4 calls, 50 ms each"


@_exercise("06.2")
def _enough_threads_for_eight_calls(threads, run) -> tuple[bool, str]:
    latency = _wait_latency(run)
    if latency is None or len(latency) < 3:
        return False, "use the run of exercise 6.1 (--calls 8, several pool sizes)"
    best = min(latency.values())
    enough = min(t for t, ms in latency.items() if ms <= 1.1 * best)
    if threads == enough:
        return True, (
            f"from {enough} threads on, 8 waiting calls take about {best:.0f} ms: one "
            f"call's time. More threads than calls in flight add nothing"
        )
    if threads in latency and latency[threads] > 1.1 * best:
        return (
            False,
            f"at {threads} threads the batch still takes {latency[threads]:.0f} ms, more than 10 % above the best",
        )
    return (
        False,
        "a smaller pool already comes within 10 % of the best latency: compare the run's latencies",
    )


# -------------------------------------------------------------------------- lesson 7


@_exercise("07.1")
def _which_node_holds_which_trace(prediction, run) -> tuple[bool, str]:
    if not _is_run(run) or run.nnodes != 2 or _args_of(run).get("--profile-ranks") != "0,2":
        return False, "launch train_ddp.py with nnodes=2 and --profile-ranks 0,2"
    actual = {
        f"node{n}": sorted(p.name for p in (run.run_dir / f"node{n}").glob("rank*_iter*.json"))
        for n in range(run.nnodes)
    }
    if not isinstance(prediction, dict) or set(prediction) != set(actual):
        return False, 'predict {"node0": [...], "node1": [...]}'
    if all(sorted(prediction[n]) == files for n, files in actual.items()):
        return True, f"each node's folder holds the traces of its own ranks: {actual}"
    return False, (
        "each node writes into its own folder, and run.nodes says which global ranks "
        "each node got; the file names are rank<N>_iter<first>_<last>.json"
    )


@_exercise("07.2")
def _recover_your_own_skew(estimate_us, events, nodes, injected_us) -> tuple[bool, str]:
    from .analysis import clock_offsets

    if abs(injected_us) < 1000:
        return False, "inject a skew of at least a millisecond (the exercise asks for -30 ms)"
    recovered = clock_offsets(events, nodes)[max(nodes)]
    if not _close(estimate_us, recovered, 0.0, 1000):
        return (
            False,
            "your estimate is not what clock_offsets finds in these events: call it on them",
        )
    if not _close(recovered, injected_us, 0.0, 10_000):  # lesson 7's tolerance
        return False, (
            f"these events give {recovered / 1e3:+.1f} ms, not the {injected_us / 1e3:+.1f} ms "
            f"you say you injected: shift the ranks of node 1 only, once"
        )
    return True, (
        f"recovered {recovered / 1e3:+.2f} ms for an injected {injected_us / 1e3:+.1f} ms, "
        f"from the ends of the collectives alone"
    )


# -------------------------------------------------------------------------- lesson 8


def _mismatch_of(error, bug: str):
    from .flight_recorder import first_mismatch, load_flight_records
    from .launch import LaunchError

    if not isinstance(error, LaunchError) or _args_of(error.record).get("--bug") != bug:
        return None
    return first_mismatch(load_flight_records(error.record.run_dir))


@_exercise("08.1")
def _where_the_mismatch_lands(predicted_seq, error) -> tuple[bool, str]:
    third_step = _args_of(getattr(error, "record", None)).get("--bug-step") == "3"
    mismatch = _mismatch_of(error, "different") if third_step else None
    if mismatch is None:
        return False, "launch hang.py with --bug different --bug-step 3 and catch the RankFailed"
    if predicted_seq != mismatch.seq:
        return False, (
            "every step makes two collectives (an all_reduce, then a broadcast), and "
            "the sequence numbers count from 1: where does step 3's all_reduce fall?"
        )
    return True, str(mismatch)


@_exercise("08.2")
def _a_skipped_collective(answer, error) -> tuple[bool, str]:
    mismatch = _mismatch_of(error, "skip")
    if mismatch is None:
        return False, "launch hang.py with --bug skip and catch the RankFailed"
    if not isinstance(answer, dict) or {"seq", "rank"} - set(answer):
        return False, 'answer with {"seq": ..., "rank": ...}'
    if answer["seq"] != mismatch.seq:
        return False, (
            "load_flight_records(...) and first_mismatch(...): the first sequence "
            "number that not every rank reached"
        )
    if answer["rank"] not in mismatch.culprits:
        return False, "which rank has nothing at that sequence number?"
    return True, f"{mismatch}; PyTorch's analyser reports it as 'Not all ranks joining collective'"
