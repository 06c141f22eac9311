"""The launcher: real torchrun runs, their manifests, and every way a run can end."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from helpers.jobs import (
    RankFailed,
    RendezvousTimedOut,
    RunTimedOut,
    choose_device,
    launch,
    processes_of_run,
    usable_cores,
)
from helpers.jobs._liverun import _CtrlC
from helpers.jobs._ranklogs import MAX_LINE, TAIL_LINES, RankLogs
from helpers.jobs.runs import RunRecord


def test_four_rank_launch_succeeds_and_writes_a_manifest(script, tmp_path):
    run = launch(script, 4, experiment="ranks", traces_root=tmp_path / "traces", echo=False)

    assert run.ok and run.world_size == 4 and run.backend == "gloo"
    assert run.exit_codes == {0: 0, 1: 0, 2: 0, 3: 0}
    manifest = json.loads((run.run_dir / "run.json").read_text())
    assert manifest["status"] == "ok"
    assert manifest["world_size"] == 4
    assert manifest["exit_codes"] == {"0": 0, "1": 0, "2": 0, "3": 0}
    assert "torch.distributed.run" in " ".join(manifest["command"])
    assert manifest["started"] <= manifest["ended"]
    assert manifest["cores"] == usable_cores()  # what the ranks shared (helpers.what_if)
    for rank in range(4):
        assert (
            manifest["files"][f"rank{rank}.json"]
            == (run.run_dir / f"rank{rank}.json").stat().st_size
        )
        assert json.loads((run.run_dir / f"rank{rank}.json").read_text())["RANK"] == str(rank)


def test_each_rank_output_is_kept_and_echoed_with_its_rank(script, tmp_path, capsys):
    run = launch(script, 2, traces_root=tmp_path, echo=True)

    echoed = capsys.readouterr().out
    assert "[rank0] rank 0 of 2 says hello" in echoed
    assert "[rank1] rank 1 of 2 says hello" in echoed
    assert run.output[1] == ["rank 1 of 2 says hello"]


TALKATIVE = """
import os
if os.environ["RANK"] == "0":
    for i in range(5000):
        print(f"line {i}")
    print("x" * 50_000)
    print("the end")
"""


def test_only_a_bounded_tail_of_each_rank_output_is_kept_and_the_log_keeps_all(
    write_script, tmp_path
):
    run = launch(write_script("talk.py", TALKATIVE), 2, traces_root=tmp_path, echo=False)

    kept = run.output[0]
    assert len(kept) == TAIL_LINES
    assert kept[0] == f"line {5000 - TAIL_LINES + 2}" and kept[-1] == "the end"
    assert kept[-2] == "x" * MAX_LINE + " [line cut]"
    (log,) = run.run_dir.glob("logs/*/attempt_0/0/stdout.log")
    assert len(log.read_text().splitlines()) == 5002


def rank_log(tmp_path: Path) -> Path:
    """Where torchrun writes local rank 0's output under ``tmp_path`` (an empty file)."""
    path = tmp_path / "logs" / "run_x" / "attempt_0" / "0" / "stdout.log"
    path.parent.mkdir(parents=True)
    path.touch()
    return path


def test_a_line_too_long_to_keep_is_cut_and_the_rest_of_it_dropped(tmp_path):
    path = rank_log(tmp_path)
    logs = RankLogs(tmp_path / "logs")

    path.write_bytes(b"y" * (3 * MAX_LINE))  # no end of line yet
    first = logs.poll()
    with path.open("ab") as f:
        f.write(b"y" * 1000 + b"\nnext\n")
    second = logs.poll()

    assert first == [(0, "y" * MAX_LINE + " [line cut]")]
    assert second == [(0, "next")]


def test_the_end_of_a_huge_log_is_read_without_its_middle(tmp_path):
    path = rank_log(tmp_path)
    path.write_bytes(b"".join(b"line %d\n" % i for i in range(2_000_000)))  # 25 MB
    logs = RankLogs(tmp_path / "logs")

    lines = [text for _, text in logs.poll(final=True)]

    assert re.fullmatch(r"\[[\d,]+ bytes not shown: see .*stdout.log\]", lines[0])
    assert lines[-1] == "line 1999999" and len(lines) < 500_000


def test_a_failing_rank_raises_naming_the_rank_its_code_and_last_lines(script, tmp_path):
    with pytest.raises(RankFailed) as caught:
        launch(script, 4, args=["fail"], traces_root=tmp_path, echo=False, timeout=120)
    raised_at = time.time()
    err = caught.value

    assert err.rank == 2 and err.exit_code == 7
    assert "rank 2 exited with code 7" in str(err)
    assert "about to fail on purpose" in str(err)
    assert err.record.status == "failed" and err.record.exit_codes[2] == 7
    assert json.loads((err.record.run_dir / "run.json").read_text())["status"] == "failed"
    assert processes_of_run(err.record.run_id) == []
    failed_at = float((err.record.run_dir / "failed_at").read_text())
    assert raised_at - failed_at < 15


def test_a_rank_that_exits_with_a_code_is_named_though_its_peers_fail_after_it(
    write_script, tmp_path
):
    exits = write_script(
        "exits.py",
        """
        import os, sys
        import torch.distributed as dist
        dist.init_process_group(os.environ["DIST_BACKEND"])
        if dist.get_rank() == 1:
            sys.exit(3)
        dist.barrier()  # ranks 0 and 2 fail here once rank 1's connections close
        """,
    )
    with pytest.raises(RankFailed) as caught:
        launch(exits, 3, traces_root=tmp_path, echo=False, timeout=120)
    assert (caught.value.rank, caught.value.exit_code) == (1, 3)


def test_a_run_past_its_timeout_is_killed_whole(script, tmp_path):
    with pytest.raises(RunTimedOut) as caught:
        launch(script, 2, args=["hang"], traces_root=tmp_path, echo=False, timeout=20)

    run = caught.value.record
    assert run.status == "timeout"
    assert processes_of_run(run.run_id) == []
    assert json.loads((run.run_dir / "run.json").read_text())["status"] == "timeout"


def test_two_launches_at_once_do_not_clash(script, tmp_path):
    runs: list[RunRecord] = []
    errors: list[BaseException] = []

    def go():
        try:
            runs.append(launch(script, 2, experiment="same", traces_root=tmp_path, echo=False))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert len(runs) == 2 and all(r.ok for r in runs)
    assert runs[0].run_dir != runs[1].run_dir
    ports = {json.loads((r.run_dir / "rank0.json").read_text())["MASTER_PORT"] for r in runs}
    assert len(ports) == 2


def test_a_second_run_gets_a_new_folder_and_the_first_stays_intact(script, tmp_path):
    first = launch(script, 2, experiment="again", traces_root=tmp_path, echo=False)
    before = {p: p.read_bytes() for p in first.paths()}

    second = launch(script, 2, experiment="again", traces_root=tmp_path, echo=False)

    assert second.run_dir != first.run_dir
    assert second.run_dir.parent == first.run_dir.parent
    assert {p: p.read_bytes() for p in first.paths()} == before
    assert RunRecord.load(first.run_dir).run_id == first.run_id


def test_ctrl_c_while_watching_sets_a_flag_and_raises_nothing():
    before = signal.getsignal(signal.SIGINT)
    with _CtrlC() as ctrl_c:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs at the next bytecode; sleep is where the loop waits
        assert ctrl_c.pressed
    assert signal.getsignal(signal.SIGINT) is before


def test_interrupting_the_caller_stops_every_process_of_the_run(script, tmp_path):
    caller = tmp_path / "caller.py"
    caller.write_text(
        textwrap.dedent(f"""
        from helpers.jobs import launch, RunInterrupted
        try:
            launch({str(script)!r}, 2, args=["hang"], traces_root={str(tmp_path)!r}, timeout=300)
        except RunInterrupted as e:
            print("INTERRUPTED", e.record.run_id, flush=True)
    """)
    )
    proc = subprocess.Popen([sys.executable, str(caller)], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    for line in proc.stdout:  # wait until both ranks are running
        if "rank 1 of 2 says hello" in line or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)

    assert "INTERRUPTED" in out
    run_id = out.split("INTERRUPTED")[1].split()[0]
    assert processes_of_run(run_id) == []


def test_a_missing_script_is_named_in_the_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.py"):
        launch(tmp_path / "nope.py", 2, traces_root=tmp_path)


def test_a_bad_experiment_name_is_refused(script, tmp_path):
    with pytest.raises(ValueError, match="experiment"):
        launch(script, 2, experiment="a/b", traces_root=tmp_path)


def test_two_nodes_share_one_job_with_global_ranks_and_a_folder_each(script, tmp_path):
    run = launch(script, 2, nnodes=2, traces_root=tmp_path, echo=False)

    assert run.ok and run.world_size == 4
    assert sorted(r for ranks in run.nodes.values() for r in ranks) == [0, 1, 2, 3]
    for node, ranks in run.nodes.items():
        written = sorted(p.name for p in (run.run_dir / f"node{node}").glob("rank*.json"))
        assert written == [f"rank{r}.json" for r in ranks]
        local = {
            json.loads((run.run_dir / f"node{node}" / f"rank{r}.json").read_text())["LOCAL_RANK"]
            for r in ranks
        }
        assert local == {"0", "1"}
    assert set(run.output) == {0, 1, 2, 3}


def test_a_node_that_never_joins_ends_in_a_rendezvous_timeout(script, tmp_path):
    start = time.monotonic()
    with pytest.raises(RendezvousTimedOut, match="1 of 2 nodes joined") as caught:
        launch(script, 2, nnodes=2, start_nodes=1, rdzv_timeout=5, traces_root=tmp_path, echo=False)
    assert time.monotonic() - start < 40
    assert caught.value.record.status == "rendezvous timeout"
    assert processes_of_run(caught.value.record.run_id) == []


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair: two hosts with their own addresses.
    Skips where namespaces cannot be made (not root, no iproute2)."""
    import secrets
    import shutil

    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = secrets.token_hex(3)
    spaces = [f"pdp{tag}a", f"pdp{tag}b"]
    addresses = ["10.213.7.1", "10.213.7.2"]
    steps = [
        ["ip", "netns", "add", spaces[0]],
        ["ip", "netns", "add", spaces[1]],
        ["ip", "link", "add", f"v{tag}a", "type", "veth", "peer", "name", f"v{tag}b"],
    ]
    for end, space, address in zip("ab", spaces, addresses):
        steps += [
            ["ip", "link", "set", f"v{tag}{end}", "netns", space],
            ["ip", "-n", space, "link", "set", f"v{tag}{end}", "name", "pdpveth"],
            ["ip", "-n", space, "addr", "add", f"{address}/24", "dev", "pdpveth"],
            ["ip", "-n", space, "link", "set", "pdpveth", "up"],
            ["ip", "-n", space, "link", "set", "lo", "up"],
        ]
    try:
        for step in steps:
            result = subprocess.run(step, capture_output=True, text=True)
            if result.returncode != 0:
                pytest.skip(
                    f"cannot make network namespaces here: {' '.join(step)}: "
                    f"{result.stderr.strip()}"
                )
        yield list(zip(spaces, addresses))
    finally:
        for space in spaces:
            subprocess.run(["ip", "netns", "del", space], capture_output=True)


def interface_bytes(space: str) -> int:
    stats = "/sys/class/net/pdpveth/statistics/tx_bytes"
    out = subprocess.run(
        ["ip", "netns", "exec", space, "cat", stats], capture_output=True, text=True, check=True
    )
    return int(out.stdout)


def test_two_nodes_in_their_own_network_namespaces_talk_over_an_interface(
    script, tmp_path, two_hosts
):
    before = [interface_bytes(space) for space, _ in two_hosts]
    run = launch(
        script,
        2,
        nnodes=2,
        netns=two_hosts,
        traces_root=tmp_path,
        echo=False,
        interface="pdpveth",
        rdzv_timeout=30,
        timeout=120,
    )

    assert run.ok and sorted(r for ranks in run.nodes.values() for r in ranks) == [0, 1, 2, 3]
    sent = [interface_bytes(space) - b for (space, _), b in zip(two_hosts, before)]
    print(f"bytes sent over the interface by each host: {sent}")
    assert all(n > 10_000 for n in sent), f"traffic crossed the interface both ways: {sent} bytes"


# ---------------------------------------------- a run dies with the process that launched it


def _launcher_of_a_hanging_run(script: Path, tmp_path: Path) -> tuple[subprocess.Popen, str]:
    """A Python process running launch() of a hanging script; returns it once both ranks run,
    with the run's id."""
    caller = tmp_path / "caller.py"
    caller.write_text(
        textwrap.dedent(f"""
        from helpers.jobs import launch
        launch({str(script)!r}, 2, args=["hang"], traces_root={str(tmp_path / "traces")!r},
               timeout=600)
    """)
    )
    proc = subprocess.Popen([sys.executable, str(caller)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 90
    for line in proc.stdout:  # wait until both ranks are running
        if "rank 1 of 2 says hello" in line or time.monotonic() > deadline:
            break
    run_dir = next((tmp_path / "traces" / "ranks").iterdir())
    return proc, run_dir.name


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM"])
def test_a_run_does_not_outlive_the_process_that_launched_it(script, tmp_path, signal_name):
    proc, run_id = _launcher_of_a_hanging_run(script, tmp_path)
    assert len(processes_of_run(run_id)) >= 3  # torchrun and both ranks

    manifest = tmp_path / "traces" / "ranks" / run_id / "run.json"
    proc.send_signal(getattr(signal, signal_name))
    proc.wait(timeout=10)
    killed = time.monotonic()
    while time.monotonic() - killed < 15 and (
        processes_of_run(run_id) or json.loads(manifest.read_text())["status"] == "running"
    ):
        time.sleep(0.2)

    assert processes_of_run(run_id) == [], "no agent or rank outlives its launcher"
    assert time.monotonic() - killed < 10, "within a few seconds"
    assert json.loads(manifest.read_text())["status"] == "launcher died"


# ----------------------------------------------------------------------- the device


@pytest.mark.parametrize(
    "gpus, kind, backend",
    [(0, "cpu", "gloo"), (1, "cpu", "gloo"), (2, "cuda", "nccl"), (8, "cuda", "nccl")],
)
def test_gpus_are_used_only_when_there_are_two_or_more(gpus, kind, backend):
    device = choose_device(gpus=gpus)
    assert (device.kind, device.backend) == (kind, backend)
    assert device.nproc(cpu=4) == (gpus if kind == "cuda" else 4)


def test_one_gpu_runs_the_lessons_on_the_cpu_and_says_why():
    device = choose_device(gpus=1)
    assert "1 GPU visible but 2 needed" in device.reason and "CPU" in device.reason


def test_a_single_process_lesson_uses_one_gpu():
    assert choose_device(gpus=1, min_gpus=1).kind == "cuda"
    assert choose_device(gpus=4, cpu=True).kind == "cpu"


# ------------------------------------------------------------------- recorded mode


@pytest.fixture
def recordings(tmp_path, monkeypatch):
    from helpers.jobs import recorded

    monkeypatch.setattr(recorded, "RECORDINGS_ROOT", tmp_path / "recordings")
    monkeypatch.delenv("PDP_RECORDED", raising=False)
    yield recorded
    recorded.use_recorded_runs(None)


def test_a_recorded_run_replays_its_files_output_and_manifest(
    script, tmp_path, recordings, monkeypatch, capsys
):
    monkeypatch.setenv("PDP_RECORD", "1")
    live = launch(script, 2, traces_root=tmp_path / "live", echo=False)
    monkeypatch.delenv("PDP_RECORD")

    recordings.use_recorded_runs(True)
    replayed = launch(script, 2, traces_root=tmp_path / "replayed")

    assert replayed.run_dir != live.run_dir and replayed.replayed_from
    assert replayed.ok and replayed.exit_codes == live.exit_codes
    assert {p.name: p.read_bytes() for p in replayed.paths("rank*.json")} == {
        p.name: p.read_bytes() for p in live.paths("rank*.json")
    }
    assert replayed.output == live.output
    out = capsys.readouterr().out
    assert "replaying a recorded run of ranks.py with 2 ranks" in out
    assert "[rank1] rank 1 of 2 says hello" in out


def test_a_recorded_failure_raises_the_same_error(script, tmp_path, recordings, monkeypatch):
    monkeypatch.setenv("PDP_RECORD", "1")
    with pytest.raises(RankFailed) as live:
        launch(script, 4, args=["fail"], traces_root=tmp_path / "live", echo=False)
    monkeypatch.delenv("PDP_RECORD")

    recordings.use_recorded_runs(True)
    with pytest.raises(RankFailed) as replayed:
        launch(script, 4, args=["fail"], traces_root=tmp_path / "replayed", echo=False)
    assert (replayed.value.rank, replayed.value.exit_code) == (2, 7)
    assert replayed.value.last_lines == live.value.last_lines
    assert str(replayed.value) == str(live.value)


def test_a_run_that_was_never_recorded_says_which_runs_were(script, tmp_path, recordings):
    recordings.use_recorded_runs(True)
    with pytest.raises(recordings.RecordingMissing, match="no recording of ranks.py.*'hang'"):
        launch(script, 2, args=["hang"], traces_root=tmp_path)


# ------------------------------------------------------------ which rank failed first

GONE = "RuntimeError: [gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:10159."


def test_a_root_cause_that_only_lost_its_peer_gives_way_to_the_rank_that_failed():
    from helpers.jobs._liverun import _first_failure

    failed = {0: 1, 1: 3, 2: -15}  # torchrun: all in one second, root cause the lowest
    lines = {0: ["Traceback", GONE], 1: ["SystemExit: 3"], 2: []}
    assert _first_failure(0, failed, lines) == 1


def test_torchruns_root_cause_stands_when_its_log_says_nothing_of_a_peer():
    from helpers.jobs._liverun import _first_failure

    lines = {0: ["Traceback", GONE], 2: ["ValueError: rank 2 found a bad batch"]}
    assert _first_failure(2, {0: 1, 2: 1}, lines) == 2


def test_ranks_stopped_by_torchrun_are_not_taken_for_the_first_failure():
    from helpers.jobs._liverun import _first_failure

    lines = {0: [GONE], 1: [], 3: []}  # 1 and 3 were stopped with SIGTERM, silent
    assert _first_failure(0, {0: 1, 1: -15, 3: -15}, lines) == 0


def test_when_every_failed_rank_lost_a_peer_torchruns_choice_stands():
    from collections import deque

    from helpers.jobs._liverun import _first_failure

    lines = {0: deque([GONE]), 1: deque(["x", GONE])}
    assert _first_failure(1, {0: 1, 1: 1}, lines) == 1
