"""Asking a running job's ranks: lesson 9's script under a real background run, and every way a
question can go unanswered."""

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from helpers import first_mismatch, script_from_lesson, step_times
from helpers.jobs import launch_in_background
from helpers.live import (
    LiveRunError,
    debug_servers,
    flight_records_now,
    listening_sockets,
    profile_ranks,
    rank_stacks,
    saved_answers,
    wait_counters,
    where_ranks_are,
)

LESSON = "09_look_inside_a_running_job.ipynb"


@pytest.fixture
def live_script(tmp_path) -> Path:
    """The lesson's script, written from the lesson next to the test's run folders."""
    script_from_lesson("live_train.py", LESSON, dest=tmp_path)
    return tmp_path / "live_train.py"


@pytest.fixture
def running_job(live_script, tmp_path):
    """Lesson 9's job, running for up to a minute, hung at step 40 (so that its lines are
    known), stopped at the end of the test."""
    args = ["--seconds", "60", "--hang-at", "40"]
    with launch_in_background(
        live_script, 2, args=args, traces_root=tmp_path / "traces", timeout=120
    ) as job:
        job.wait_for_output(r"step 20:", timeout=90)
        yield job


def test_nothing_of_a_live_job_listens_beyond_loopback(running_job):
    sockets = listening_sockets(running_job)
    servers = debug_servers(running_job)

    assert set(sockets["process"]) == {"rank", "torchrun agent"}
    assert sockets["loopback"].all(), sockets.to_string()
    ports = {int(address.rsplit(":", 1)[1]) for address in servers["address"]}
    assert ports <= set(sockets["port"]), "the debug servers are among them"


def test_a_live_job_answers_stacks_profile_flight_records_and_counters(running_job):
    stacks = rank_stacks(running_job)
    assert set(stacks["rank"]) == {0, 1} and (stacks["depth"] == 0).any()

    profile = profile_ranks(running_job, seconds=1)
    assert profile.ranks == [0, 1] and len(step_times(profile.events)) >= 5
    assert len(saved_answers(running_job, "profile")) == 1

    records = flight_records_now(running_job)
    assert set(records["rank"]) == {0, 1} and (records["op"] == "gloo:all_reduce").any()
    counters = wait_counters(running_job)
    assert set(counters["rank"]) == {0, 1} and (counters["calls"] > 0).all()


def test_a_hung_job_names_each_rank_line_and_the_missing_collective(running_job):
    running_job.wait_for_output(r"skips step 40", timeout=90)
    time.sleep(1)

    where = where_ranks_are(running_job)
    assert "loss.backward()" in where.at[0, "code"]
    assert "time.sleep(3600)" in where.at[1, "code"]
    mismatch = first_mismatch(flight_records_now(running_job))
    assert mismatch.kind == "missing" and mismatch.culprits == [1]


def test_a_question_to_a_job_that_has_ended_says_so(running_job):
    running_job.stop()
    with pytest.raises(LiveRunError, match="has ended \\(stopped\\)"):
        where_ranks_are(running_job)


def test_a_script_without_a_debug_server_is_named(script, tmp_path):
    with launch_in_background(script, 2, args=["hang"], traces_root=tmp_path) as job:
        job.wait_for_output("rank 1 of 2", timeout=90)
        with pytest.raises(LiveRunError, match=r"rank\(s\) \[0, 1\].*serve_debug_requests"):
            debug_servers(job, wait=1)


def _silent_server() -> tuple[socket.socket, str]:
    """A listener on loopback that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    threading.Thread(target=lambda: [listener.accept() for _ in range(4)], daemon=True).start()
    return listener, f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_a_rank_that_does_not_answer_in_time_is_named(running_job):
    listener, address = _silent_server()
    servers = running_job.run_dir / "debug_server"
    entry = json.loads((servers / "rank1.json").read_text())
    (servers / "rank1.json").write_text(json.dumps(dict(entry, address=address)))

    with pytest.raises(LiveRunError, match=r"1 of 2 ranks gave no answer .*\n  rank 1 "):
        rank_stacks(running_job, timeout=1)
    listener.close()


def test_an_answer_over_the_size_bound_is_refused(running_job, monkeypatch):
    monkeypatch.setattr("helpers.live.questions.MAX_ANSWER_MB", 0.001)  # 1 kB
    with pytest.raises(LiveRunError, match="over 0.001 MB: refused"):
        flight_records_now(running_job)


def test_an_address_file_that_is_not_a_servers_is_named(tmp_path):
    from helpers.jobs import BackgroundRun
    from helpers.jobs.runs import RunRecord

    run_dir = tmp_path / "run"
    (run_dir / "debug_server").mkdir(parents=True)
    bad = {"rank": 0, "address": "file:///etc/passwd", "pid": 1}
    (run_dir / "debug_server" / "rank0.json").write_text(json.dumps(bad))
    record = RunRecord("ex", "r", run_dir, [], "live_train.py", [], 1, 1, 1, "gloo", "cpu", "")
    with pytest.raises(LiveRunError, match=r"rank0.json: not a debug server's address file"):
        debug_servers(BackgroundRun.from_recording(lambda: record))
