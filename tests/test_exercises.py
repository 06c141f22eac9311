"""The exercises' checks: each rejects a typical wrong answer with a hint, accepts the right one,
and every exercise of every lesson has a check, a check cell and a solution."""

import json
import pickle
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import BASE_NS, REPO, write_doc
from helpers.exercises import CHECKS, evaluate
from helpers.launch import RankFailed
from helpers.runs import RunRecord


def fake_run(tmp_path: Path, script: str, args=(), nproc=2, nnodes=1, **extra) -> RunRecord:
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    return RunRecord(
        experiment="ex",
        run_id="r",
        run_dir=run_dir,
        command=[],
        script=script,
        args=list(args),
        nproc=nproc,
        nnodes=nnodes,
        world_size=nproc * nnodes,
        backend="gloo",
        device="cpu",
        started="",
        status="ok",
        **extra,
    )


def trace(rank, events, pid=100) -> dict:
    return {
        "distributedInfo": {"rank": rank, "world_size": 2, "backend": "gloo"},
        "baseTimeNanoseconds": BASE_NS,
        "traceEvents": [
            dict({"ph": "X", "pid": pid, "tid": pid, "cat": "cpu_op"}, **e) for e in events
        ],
    }


# ----------------------------------------------------------------- the checks in general


def test_an_exercise_not_answered_yet_says_so_and_is_not_wrong():
    assert evaluate("04.2", ..., run=..., baseline=...) == (
        None,
        "not answered yet: replace the ... above with your answer and run both cells",
    )


def test_an_unknown_exercise_is_named_in_the_error():
    with pytest.raises(KeyError, match="no exercise '09.9'"):
        evaluate("09.9", 1)


def test_every_lesson_has_at_least_two_exercises_each_with_a_check_cell_and_a_solution():
    for lesson in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(lesson.read_text())["cells"]
        sources = ["".join(c["source"]) for c in cells]
        checked = re.findall(r'check\("(\d\d\.\d)"', "\n".join(sources))
        number = lesson.name[:2]
        assert len(set(checked)) >= 2 and all(n.startswith(number) for n in checked), lesson.name
        for n in checked:
            assert n in CHECKS, f"{lesson.name}: no check for exercise {n}"
        solution = REPO / "solutions" / f"{number}_solutions.ipynb"
        solution_code = "\n".join(
            "".join(c["source"]) for c in json.loads(solution.read_text())["cells"]
        )
        solved = re.findall(r'evaluate\("(\d\d\.\d)"', solution_code)
        assert set(solved) == set(checked), (
            f"{solution.name} solves every exercise of {lesson.name}"
        )
    assert all(
        any(n.startswith(l.name[:2]) for l in (REPO / "notebooks").glob("*.ipynb")) for n in CHECKS
    ), "every check belongs to a lesson"


def test_no_lesson_code_cell_carries_an_nbval_comment_marker():
    for notebook in sorted((REPO / "notebooks").glob("*.ipynb")) + sorted(
        (REPO / "solutions").glob("*.ipynb")
    ):
        for cell in json.loads(notebook.read_text())["cells"]:
            assert "NBVAL_" not in "".join(cell["source"]), notebook.name


# --------------------------------------------------------------------------- lesson 1


def test_1_1_rejects_local_ranks_numbered_across_nodes(tmp_path):
    run = fake_run(tmp_path, "ranks.py", nproc=3, nnodes=2)
    for rank in range(6):
        (run.run_dir / f"rank{rank}.json").write_text(
            json.dumps(
                {
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank % 3),
                    "WORLD_SIZE": "6",
                    "MASTER_PORT": "29400",
                }
            )
        )
    ok, hint = evaluate(
        "01.1", {"WORLD_SIZE": 6, "LOCAL_RANKS": set(range(6)), "MASTER_PORTS": 1}, run=run
    )
    assert not ok and "starts again on each node" in hint
    assert evaluate(
        "01.1", {"WORLD_SIZE": 6, "LOCAL_RANKS": {0, 1, 2}, "MASTER_PORTS": 1}, run=run
    )[0]


def test_1_2_rejects_a_rank_that_raised_instead_of_exiting_with_3(tmp_path):
    raised = RankFailed("", fake_run(tmp_path, "fails_exit.py"), rank=1, exit_code=1, last_lines=[])
    ok, hint = evaluate("01.2", raised)
    assert not ok and "uncaught exception" in hint
    assert evaluate("01.2", RankFailed("", raised.record, 1, 3, []))[0]


# --------------------------------------------------------------------------- lesson 2


def test_2_1_rejects_step_numbers_counted_from_1(tmp_path):
    files = []
    for name, steps in {"primer_step5.json": [3, 4], "primer_step10.json": [8, 9]}.items():
        doc = trace(
            0,
            [
                {"cat": "user_annotation", "name": f"ProfilerStep#{s}", "ts": s * 1000, "dur": 900}
                for s in steps
            ],
        )
        files.append(write_doc(tmp_path / name, doc))
    ok, hint = evaluate(
        "02.1", {"primer_step5.json": [4, 5], "primer_step10.json": [9, 10]}, files=files
    )
    assert not ok and "steps count from 0" in hint
    assert evaluate(
        "02.1", {"primer_step5.json": [3, 4], "primer_step10.json": [8, 9]}, files=files
    )[0]


def test_2_2_rejects_the_shapes_with_the_most_total_time_instead_of_self_time():
    def group(shapes, self_us, total_us):
        return SimpleNamespace(
            key="aten::convolution_backward",
            input_shapes=shapes,
            count=1,
            self_cpu_time_total=self_us,
            cpu_time_total=total_us,
        )

    groups = [group([[8, 64]], 900, 1000), group([[8, 512]], 500, 3000)]
    prof = SimpleNamespace(key_averages=lambda group_by_input_shape: groups)
    ok, hint = evaluate("02.2", [[8, 512]], prof=prof)
    assert not ok and "self time" in hint
    assert evaluate("02.2", [[8, 64]], prof=prof)[0]


# --------------------------------------------------------------------------- lesson 3


def test_3_1_rejects_files_of_ranks_that_do_not_profile(tmp_path):
    run = fake_run(tmp_path, "train_ddp.py", args=["--profile-ranks", "0"])
    for name in ("rank0_iter2_3.json", "rank0_iter6_7.json"):
        (run.run_dir / name).write_text("{}")
    ok, hint = evaluate("03.1", ["rank0_iter2_3.json", "rank1_iter2_3.json"], run=run)
    assert not ok and "only the ranks named in --profile-ranks" in hint
    assert evaluate("03.1", ["rank0_iter6_7.json", "rank0_iter2_3.json"], run=run)[0]


def test_3_2_rejects_ranks_guessed_from_process_ids(tmp_path):
    run = fake_run(tmp_path, "train_ddp_pid.py")
    write_doc(run.run_dir / "trace_200.json", trace(0, [{"name": "aten::mm", "ts": 0, "dur": 1}]))
    write_doc(run.run_dir / "trace_100.json", trace(1, [{"name": "aten::mm", "ts": 0, "dur": 1}]))
    ok, hint = evaluate("03.2", {"trace_100.json": 0, "trace_200.json": 1}, run=run)
    assert not ok and "header.rank" in hint
    assert evaluate("03.2", {"trace_100.json": 1, "trace_200.json": 0}, run=run)[0]


# --------------------------------------------------------------------------- lesson 4


def ddp_traces(folder: Path, slow_rank: int | None, delay_us: float) -> None:
    """Two ranks, three steps of a broadcast then an all_reduce; the slow rank arrives late."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in (0, 1):
        events = []
        for step in range(3):
            t = step * 10_000.0
            late = delay_us if rank == slow_rank else 0.0
            events.append(
                {"cat": "user_annotation", "name": f"ProfilerStep#{step + 1}", "ts": t, "dur": 9000}
            )
            for i, name in enumerate(("gloo:broadcast", "gloo:all_reduce")):
                arrive = t + 100 + i * 3000 + (late if i == 0 else 0)
                leave = t + 100 + i * 3000 + delay_us + 200
                events.append(
                    {
                        "cat": "user_annotation",
                        "name": name,
                        "ts": arrive,
                        "dur": leave - arrive,
                        "tid": 101,
                    }
                )
        write_doc(folder / f"rank{rank}.json", trace(rank, events, pid=100 + rank))


def test_4_1_rejects_the_slow_rank_as_the_one_that_waits(tmp_path):
    from helpers.traces import load_run

    ddp_traces(tmp_path, slow_rank=1, delay_us=150_000)
    events = load_run(tmp_path, cache=False).events
    ok, hint = evaluate("04.1", {"rank": 1, "ms": 150}, events=events)
    assert not ok and "the one that is early" in hint
    assert evaluate("04.1", {"rank": 0, "ms": 150}, events=events)[0]


def test_4_2_rejects_the_rank_that_waits_most_as_the_straggler(tmp_path):
    run = fake_run(tmp_path, "train_ddp.py", args=["--slow-rank", "0", "--delay-ms", "100"])
    ddp_traces(run.run_dir, slow_rank=0, delay_us=100_000)
    baseline = fake_run(tmp_path / "normal", "train_ddp.py")
    ddp_traces(baseline.run_dir, slow_rank=None, delay_us=0)
    ok, hint = evaluate("04.2", {"straggler": 1, "extra_wait_ms": 100}, run=run, baseline=baseline)
    assert not ok and "waits least" in hint
    assert evaluate("04.2", {"straggler": 0, "extra_wait_ms": 100}, run=run, baseline=baseline)[0]


# --------------------------------------------------------------------------- lesson 5


def rpc_traces(run_dir: Path, calls: int, call_us: float) -> None:
    marks = [
        {
            "cat": "user_annotation",
            "name": "rpc_async#udf_with_ops(worker0 -> worker1)",
            "ts": i * 10,
            "dur": call_us + i * 1000,
        }
        for i in range(calls)
    ]
    served = [
        {
            "cat": "user_annotation",
            "name": f"server: udf call {i}",
            "ts": 100 + i * 10,
            "dur": call_us - 500,
        }
        for i in range(calls)
    ]
    write_doc(
        run_dir / "worker0_trace.json",
        {"traceEvents": [dict(e, ph="X", pid=1, tid=1) for e in marks]},
    )
    write_doc(
        run_dir / "worker1_trace.json",
        {"traceEvents": [dict(e, ph="X", pid=2, tid=2 + i) for i, e in enumerate(served)]},
    )


def test_5_1_rejects_a_call_shorter_than_the_server_takes(tmp_path):
    run = fake_run(
        tmp_path,
        "rpc_profiling.py",
        args=["--part", "per-worker", "--sleep-ms", "50", "--concurrent", "3"],
    )
    rpc_traces(run.run_dir, calls=3, call_us=52_000)
    ok, hint = evaluate("05.1", 20, run=run)
    assert not ok and "at least as long as the server's 50 ms sleep" in hint
    assert evaluate("05.1", 53, run=run)[0]


def test_5_2_rejects_a_legacy_count_of_every_call_sent(tmp_path):
    legacy = fake_run(
        tmp_path / "legacy", "rpc_profiling.py", args=["--part", "legacy", "--concurrent", "6"]
    )
    (legacy.run_dir / "legacy_summary.json").write_text(json.dumps({"udf_calls_recorded": 1}))
    per_worker = fake_run(
        tmp_path / "pw", "rpc_profiling.py", args=["--part", "per-worker", "--concurrent", "6"]
    )
    rpc_traces(per_worker.run_dir, calls=6, call_us=30_000)
    ok, hint = evaluate(
        "05.2", {"legacy": 6, "per_worker": 6}, legacy_run=legacy, per_worker_run=per_worker
    )
    assert not ok and "udf_calls_recorded" in hint
    assert evaluate(
        "05.2", {"legacy": 1, "per_worker": 6}, legacy_run=legacy, per_worker_run=per_worker
    )[0]


# --------------------------------------------------------------------------- lesson 6


@pytest.fixture
def sweep(tmp_path):
    run = fake_run(tmp_path, "rpc_threads.py", args=["--threads", "1,2,4,8,16", "--calls", "8"])
    latency = {1: 402, 2: 201, 4: 101, 8: 52, 16: 51}
    (run.run_dir / "latency.json").write_text(
        json.dumps(
            {
                "calls": 8,
                "by_threads": {str(t): {"wait": {"median_ms": ms}} for t, ms in latency.items()},
            }
        )
    )
    return run


def test_6_1_rejects_one_call_time_for_eight_calls_on_four_threads(sweep):
    ok, hint = evaluate("06.1", 50, run=sweep)
    assert not ok and "how many rounds" in hint
    assert evaluate("06.1", 100, run=sweep)[0]


def test_6_2_rejects_the_largest_pool_as_the_one_that_is_enough(sweep):
    ok, hint = evaluate("06.2", 16, run=sweep)
    assert not ok and "smaller pool" in hint
    assert evaluate("06.2", 8, run=sweep)[0]


# --------------------------------------------------------------------------- lesson 7


def test_7_1_rejects_node_folders_guessed_without_run_nodes(tmp_path):
    run = fake_run(
        tmp_path,
        "train_ddp.py",
        args=["--profile-ranks", "0,2"],
        nnodes=2,
        nodes={0: [2, 3], 1: [0, 1]},
    )
    for node, name in ((0, "rank2_iter3_6.json"), (1, "rank0_iter3_6.json")):
        (run.run_dir / f"node{node}").mkdir()
        (run.run_dir / f"node{node}" / name).write_text("{}")
    ok, hint = evaluate(
        "07.1", {"node0": ["rank0_iter3_6.json"], "node1": ["rank2_iter3_6.json"]}, run=run
    )
    assert not ok and "run.nodes" in hint
    assert evaluate(
        "07.1", {"node0": ["rank2_iter3_6.json"], "node1": ["rank0_iter3_6.json"]}, run=run
    )[0]


def test_7_2_rejects_the_skew_of_the_lesson_instead_of_your_own(tmp_path):
    from helpers.analysis import shift_ranks
    from helpers.traces import load_run

    ddp_traces(tmp_path, slow_rank=None, delay_us=0)
    events = shift_ranks(load_run(tmp_path, cache=False).events, [1], -30_000)
    nodes = {0: [0], 1: [1]}
    ok, hint = evaluate("07.2", 50_000, events=events, nodes=nodes, injected_us=-30_000)
    assert not ok and "clock_offsets" in hint
    assert evaluate("07.2", -30_000, events=events, nodes=nodes, injected_us=-30_000)[0]


# --------------------------------------------------------------------------- lesson 8


def fr_dump(path: Path, ops: list[str]) -> None:
    entries = [
        {
            "collective_seq_id": i + 1,
            "profiling_name": f"gloo:{op}",
            "input_sizes": [[8]],
            "output_sizes": [[8]],
            "input_dtypes": ["Float"],
            "state": "scheduled",
            "retired": True,
            "process_group": ("0", "default_pg"),
            "is_p2p": False,
            "time_created_ns": 1_000 * i,
        }
        for i, op in enumerate(ops)
    ]
    path.write_bytes(pickle.dumps({"version": "2.10", "entries": entries}))


def hang_error(tmp_path: Path, args: list[str], rank0: list[str], rank1: list[str]) -> RankFailed:
    run = fake_run(tmp_path, "hang.py", args=args)
    fr_dump(run.run_dir / "fr_0", rank0)
    fr_dump(run.run_dir / "fr_1", rank1)
    return RankFailed("", run, 1, 1, [])


def test_8_1_rejects_the_step_number_given_as_the_sequence_number(tmp_path):
    error = hang_error(
        tmp_path,
        ["--bug", "different", "--bug-step", "3"],
        ["all_reduce", "broadcast"] * 2 + ["all_reduce"],
        ["all_reduce", "broadcast"] * 2 + ["broadcast"],
    )
    ok, hint = evaluate("08.1", 3, error=error)
    assert not ok and "two collectives" in hint
    assert evaluate("08.1", 5, error=error)[0]


def test_8_2_rejects_the_rank_that_did_call_the_collective(tmp_path):
    error = hang_error(
        tmp_path,
        ["--bug", "skip"],
        ["all_reduce", "broadcast"] * 3 + ["all_reduce"],
        ["all_reduce", "broadcast"] * 3,
    )
    ok, hint = evaluate("08.2", {"seq": 7, "rank": 0}, error=error)
    assert not ok and "which rank has nothing" in hint
    assert evaluate("08.2", {"seq": 7, "rank": 1}, error=error)[0]
