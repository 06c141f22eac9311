"""Safe by default: what a run opens to the network, and paths that stay inside their folders.

The listener tests launch real jobs and sample the socket table of their processes while they
run (:class:`helpers.ListenerWatch`)."""

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import psutil
import pytest

from conftest import RANKS_SCRIPT, REPO
from helpers.jobs import (
    INTERFACE_VARIABLES,
    ListenerWatch,
    launch,
    loopback_interface,
    recorded,
    runs,
)
from helpers.jobs.runs import new_run_dir

DDP_SCRIPT = """
import json, os, time
import torch
import torch.distributed as dist

dist.init_process_group(os.environ["DIST_BACKEND"])
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
model(torch.ones(2, 4)).sum().backward()
seen = {k: os.environ.get(k) for k in ("MASTER_ADDR", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME",
                                       "NCCL_SOCKET_IFNAME")}
with open(os.path.join(os.environ["RUN_DIR"], f"env{dist.get_rank()}.json"), "w") as f:
    json.dump(seen, f)
time.sleep(1.5)  # listening, while the test samples
dist.barrier()
dist.destroy_process_group()
"""

RPC_SCRIPT = """
import os, time
import torch
import torch.distributed.rpc as rpc

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world)
if rank == 0:
    assert rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 1)).tolist() == [2.0, 2.0]
time.sleep(1.5)  # listening, while the test samples
rpc.shutdown()
"""


def run_and_watch(script: Path, tmp_path: Path, **kwargs) -> tuple:
    """Launch ``script`` on 2 ranks; return its record and every socket its processes listened
    on while it ran."""
    traces = tmp_path / "traces"
    with ListenerWatch(traces) as watch:
        run = launch(script, 2, traces_root=traces, echo=False, timeout=120, **kwargs)
    return run, watch.seen


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ddp")
    (folder / "ddp.py").write_text(DDP_SCRIPT)
    return run_and_watch(folder / "ddp.py", folder)


def describe(listeners) -> str:
    return ", ".join(f"{s.process} {s.address}:{s.port}" for s in sorted(listeners, key=str))


def test_a_single_machine_ddp_run_listens_on_loopback_only(ddp_run):
    run, seen = ddp_run

    assert run.ok
    assert {s.process for s in seen} == {"torchrun agent", "rank"}, describe(seen)
    stores = [s for s in seen if s.process == "torchrun agent"]
    assert len(stores) == 2, f"the rendezvous store and the ranks' store: {describe(stores)}"
    exposed = [s for s in seen if not s.loopback]
    assert not exposed, f"listening beyond loopback: {describe(exposed)}"


def test_the_ranks_are_told_to_use_the_loopback_interface(ddp_run):
    run, _ = ddp_run
    lo = loopback_interface()

    for rank in (0, 1):
        seen = json.loads((run.run_dir / f"env{rank}.json").read_text())
        assert seen["MASTER_ADDR"] == "127.0.0.1"
        assert all(seen[name] == lo for name in INTERFACE_VARIABLES), seen


def test_a_single_machine_rpc_run_listens_on_loopback_only(write_script, tmp_path):
    run, seen = run_and_watch(write_script("rpc.py", RPC_SCRIPT), tmp_path)

    assert run.ok
    ranks = [s for s in seen if s.process == "rank"]
    assert {s.pid for s in ranks} and len(ranks) >= 2, f"TensorPipe listens: {describe(seen)}"
    exposed = [s for s in seen if not s.loopback]
    assert not exposed, f"listening beyond loopback: {describe(exposed)}"


def other_interface() -> tuple[str, str]:
    """A network interface other than loopback, with its IPv4 address; skips if none."""
    for name, addresses in psutil.net_if_addrs().items():
        for a in addresses:
            if a.family.name == "AF_INET" and not a.address.startswith("127."):
                return name, a.address
    pytest.skip("this machine has no network interface but loopback")


def test_a_named_interface_is_the_only_place_a_run_listens(write_script, tmp_path):
    name, address = other_interface()

    run, seen = run_and_watch(write_script("ddp.py", DDP_SCRIPT), tmp_path, interface=name)

    assert run.ok
    assert {s.address for s in seen} == {address}, describe(seen)
    assert json.loads((run.run_dir / "env0.json").read_text())["GLOO_SOCKET_IFNAME"] == name


def test_an_unknown_interface_is_an_error_naming_it(script, tmp_path):
    with pytest.raises(ValueError, match="interface='nosuch0': no such network interface"):
        launch(script, 2, traces_root=tmp_path, echo=False, interface="nosuch0")


# ------------------------------------------------------------------ the doctor says so


def test_the_doctor_measures_that_a_run_listens_on_loopback_only():
    from helpers.doctor import _network_exposure, _two_rank_job

    job, listeners = _two_rank_job()
    check = _network_exposure(listeners)

    assert job.status == "PASS"
    assert check.status == "PASS" and "listened on loopback only (2 torchrun stores" in check.detail


def test_the_watch_keeps_a_socket_once_when_a_forked_child_holds_it_too(tmp_path):
    from helpers.doctor import _network_exposure
    from helpers.jobs import Listener

    # the agent's two stores, seen again in a child it forked that has not yet run its program
    stores = [("127.0.0.1", 29500), ("127.0.0.1", 29501)]
    watch = ListenerWatch(tmp_path)
    for pid in (1, 3):
        watch.add([Listener("torchrun agent", pid, a, p) for a, p in stores])
    watch.add([Listener("rank", pid, "127.0.0.1", 4000 + pid) for pid in (5, 6)])
    check = _network_exposure(watch.seen)

    assert check.status == "PASS" and "(2 torchrun stores, 2 sockets of its ranks)" in check.detail


def test_the_doctor_warns_naming_a_listener_beyond_loopback():
    from helpers.doctor import _network_exposure
    from helpers.jobs import Listener

    seen = {Listener("torchrun agent", 1, "::", 29500), Listener("rank", 2, "127.0.0.1", 4000)}
    check = _network_exposure(seen)

    assert check.status == "WARN" and "torchrun agent :::29500" in check.detail


# ------------------------------------------------------------------ paths stay inside


@pytest.mark.parametrize("name", ["..", ".", "../x", "a/b", "/tmp/x", ".hidden", "", "a" * 101])
def test_an_experiment_that_is_not_a_plain_name_is_refused(name, tmp_path):
    with pytest.raises(ValueError, match="experiment=.*plain name"):
        new_run_dir(name, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def recorded_once(tmp_path_factory) -> Path:
    """A recordings folder holding the recording of one real 2-rank run of ``ranks.py``, run
    in a stand-in for the repository (``<repo>/traces/ranks/<run-id>``)."""
    repo = tmp_path_factory.mktemp("repo")
    (repo / "ranks.py").write_text(RANKS_SCRIPT)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runs, "REPO_ROOT", repo)
        patch.setattr(recorded, "RECORDINGS_ROOT", repo / "recordings")
        patch.setenv("PDP_RECORD", "1")
        launch(repo / "ranks.py", 2, traces_root=repo / "traces", echo=False)
    return repo / "recordings"


@pytest.fixture
def a_recording(recorded_once, tmp_path, monkeypatch) -> Path:
    """``recording.json`` of a copy of that recording, in place of the repository's
    recordings: a test may change it."""
    recordings = tmp_path / "recordings"
    shutil.copytree(recorded_once, recordings)
    monkeypatch.setattr(recorded, "RECORDINGS_ROOT", recordings)
    (folder,) = recordings.iterdir()
    return folder / recorded.RECORDING_NAME


def edit(path: Path, change) -> None:
    saved = json.loads(path.read_text())
    change(saved)
    path.write_text(json.dumps(saved))


def replay_of(script: Path, tmp_path: Path):
    recorded.use_recorded_runs(True)
    try:
        return launch(script, 2, traces_root=tmp_path / "replayed", echo=False)
    finally:
        recorded.use_recorded_runs(None)


def test_a_recording_replays_the_files_it_holds(a_recording, script, tmp_path):
    run = replay_of(script, tmp_path)
    assert sorted(run.files) == ["rank0.json", "rank1.json"]


@pytest.mark.parametrize("bad", ["../escaped.json", "../../escaped.json", "absolute"])
def test_a_recorded_file_outside_the_run_folder_is_refused(a_recording, script, tmp_path, bad):
    bad = str(tmp_path / "escaped.json") if bad == "absolute" else bad
    copy = a_recording.parent / "files" / f"{bad}.gz"  # where replay reads the file from
    copy.write_bytes((a_recording.parent / "files" / "rank0.json.gz").read_bytes())
    edit(a_recording, lambda saved: saved["files"].append(bad))

    with pytest.raises(recorded.RecordingDamaged, match="is not a path inside the run folder"):
        replay_of(script, tmp_path)
    assert not list(tmp_path.rglob("escaped.json")), "nothing was written outside"


def test_an_unknown_error_type_in_a_recording_is_a_clear_error(a_recording, script, tmp_path):
    edit(a_recording, lambda saved: saved.update(error={"type": "SystemExit", "message": "x"}))

    with pytest.raises(recorded.RecordingDamaged, match="error type 'SystemExit' is not one"):
        replay_of(script, tmp_path)


def test_a_recording_holds_its_paths_relative_to_the_repository(recorded_once):
    repo = recorded_once.parent
    (recording,) = recorded_once.glob(f"*/{recorded.RECORDING_NAME}")

    text = recording.read_text()

    assert "--log-dir=traces/ranks/" in text
    assert str(repo) not in text


def test_a_recording_writes_no_path_of_a_machine(tmp_path):
    run_dir = REPO / "traces" / "x" / "r1"
    record = runs.RunRecord("x", "r1", run_dir, [], "x.py", [], 1, 1, 1, "gloo", "cpu", "")
    text = (
        f"{run_dir}/logs; {REPO}/notebooks/x.py; {Path.home()}/.pyenv/os.py; "
        f"/home/" + "alice/venv/torch.py; C:" + "\\Users\\bob\\x.py"
    )

    assert recorded._portable({"a": [text]}, record) == {
        "a": ["traces/x/r1/logs; notebooks/x.py; ~/.pyenv/os.py; .../venv/torch.py; .../bob\\x.py"]
    }


#: What every match of :data:`helpers.jobs.recorded.MACHINE_PATH` holds one of (made, so that
#: this file holds none of them).
MACHINE_PATH_PARTS = (*(f"/{top}/".encode() for top in ("home", "Users", "root", "work")), b":\\")


def test_every_path_of_a_machine_holds_one_of_the_parts_searched_first():
    paths = [f"/{top}/{rest}" for top, rest in [("home", "alice/x"), ("Users", "bob/x"), ("root", "x"), ("work", "main/x")]]  # fmt: skip
    paths += ["C:" + "\\Users\\bob", "C:" + "\\\\Users\\\\x"]
    for text in paths:
        assert recorded.MACHINE_PATH.search(text), text
        assert any(part in text.encode() for part in MACHINE_PATH_PARTS), text


def test_no_committed_file_holds_an_absolute_path_of_a_machine():
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    found = []
    for name in filter(None, tracked):
        path = REPO / name.decode()
        if not path.is_file():
            continue  # deleted in the working tree
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        if not any(part in data for part in MACHINE_PATH_PARTS):
            continue  # the search below, on hundreds of MB of traces, takes a minute
        if m := recorded.MACHINE_PATH.search(data.decode(errors="replace")):
            found.append(f"{name.decode()}: {m.group()!r}")
    assert not found, "absolute paths of a machine in committed files:\n" + "\n".join(found)
