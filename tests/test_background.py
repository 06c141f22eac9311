"""A run started in the background: its handle, and every way such a run can end."""

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from helpers.jobs import (
    BackgroundRun,
    RankFailed,
    RunTimedOut,
    launch_in_background,
    processes_of_run,
)


def _start(script, tmp_path, *args, **options) -> BackgroundRun:
    return launch_in_background(
        script, 2, args=list(args), traces_root=tmp_path / "traces", **options
    )


def test_a_background_run_returns_at_once_and_wait_gives_its_record(script, tmp_path):
    job = _start(script, tmp_path)
    assert job.running, "it returned while the ranks were still starting"

    record = job.wait(timeout=120)
    assert record.ok and record.exit_codes == {0: 0, 1: 0} and not job.running
    assert json.loads((job.run_dir / "run.json").read_text())["status"] == "ok"
    assert job.output(1) == ["rank 1 of 2 says hello"]


def test_wait_for_output_returns_the_line_while_the_run_goes_on(script, tmp_path):
    with _start(script, tmp_path, "hang") as job:
        line = job.wait_for_output(r"rank 1 of 2", timeout=90)
        assert line == "[rank1] rank 1 of 2 says hello" and job.running
    assert not job.running and processes_of_run(job.record.run_id) == []


def test_a_failing_rank_is_raised_by_wait_naming_the_rank(script, tmp_path):
    job = launch_in_background(script, 3, args=["fail"], traces_root=tmp_path / "traces")

    with pytest.raises(RankFailed) as caught:
        job.wait(timeout=120)
    assert caught.value.rank == 2 and caught.value.exit_code == 7
    assert processes_of_run(job.record.run_id) == []


def test_stop_ends_every_process_and_is_not_an_error(script, tmp_path):
    job = _start(script, tmp_path, "hang")
    job.wait_for_output(r"rank 1 of 2", timeout=90)
    assert len(processes_of_run(job.record.run_id)) >= 3  # torchrun and both ranks

    record = job.stop()
    assert record.status == "stopped" and not job.running
    assert processes_of_run(record.run_id) == []
    assert json.loads((job.run_dir / "run.json").read_text())["status"] == "stopped"


def test_a_background_run_past_its_timeout_is_killed_and_wait_raises(script, tmp_path):
    job = _start(script, tmp_path, "hang", timeout=8)

    with pytest.raises(RunTimedOut):
        job.wait(timeout=120)
    assert processes_of_run(job.record.run_id) == []


def test_waiting_too_long_raises_and_leaves_the_run_going(script, tmp_path):
    with _start(script, tmp_path, "hang") as job:
        job.wait_for_output(r"rank 1 of 2", timeout=90)
        with pytest.raises(TimeoutError, match="still running"):
            job.wait(timeout=0.5)
        assert job.running and processes_of_run(job.record.run_id)


def test_output_that_never_comes_ends_in_a_timeout_error(script, tmp_path):
    with _start(script, tmp_path, "hang") as job:
        with pytest.raises(TimeoutError, match="no rank .* printed a line matching"):
            job.wait_for_output(r"never printed", timeout=3)


def test_a_background_run_does_not_outlive_the_process_that_started_it(script, tmp_path):
    caller = tmp_path / "caller.py"
    caller.write_text(
        textwrap.dedent(f"""
        from helpers.jobs import launch_in_background
        job = launch_in_background({str(script)!r}, 2, args=["hang"],
                                   traces_root={str(tmp_path / "traces")!r}, timeout=600)
        print(job.record.run_id, job.wait_for_output("rank 1 of 2", timeout=90), flush=True)
        job.wait()
    """)
    )
    proc = subprocess.Popen([sys.executable, str(caller)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    run_id = proc.stdout.readline().split()[0]
    assert len(processes_of_run(run_id)) >= 3

    proc.send_signal(signal.SIGKILL)  # a notebook kernel killed or restarted
    proc.wait(timeout=10)
    killed = time.monotonic()
    manifest = next((tmp_path / "traces").glob(f"*/{run_id}/run.json"))
    while time.monotonic() - killed < 15 and (
        processes_of_run(run_id) or json.loads(manifest.read_text())["status"] == "running"
    ):
        time.sleep(0.2)
    assert processes_of_run(run_id) == [], "no agent or rank outlives the kernel"
    assert json.loads(manifest.read_text())["status"] == "launcher died"
