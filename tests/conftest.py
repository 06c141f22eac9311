"""Fixtures shared by the unit tests: real traces from other people's jobs, and factories of
small traces in today's Kineto format."""

from __future__ import annotations

import gzip
import json
import subprocess
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from helpers.jobs import LaunchError
from helpers.jobs.recorded import RECORDINGS_ROOT, replay
from helpers.jobs.runs import RunRecord

REPO = Path(__file__).resolve().parents[1]
REAL_TRACES = REPO.parent / "shared" / "real-traces"
HTA = "hta"
BASE_NS = 1_700_000_000_000_000_000


@pytest.fixture
def real_traces() -> Iterator[Path]:
    """Folder of real traces from other people's jobs, used in place; skips when ../shared is
    absent. A test that leaves a cache folder in it fails: the traces are shared, read only."""
    if not REAL_TRACES.is_dir():
        pytest.skip("../shared/real-traces is not here")
    yield REAL_TRACES
    left = sorted(str(p.relative_to(REAL_TRACES)) for p in REAL_TRACES.rglob(".cache"))
    assert not left, f"a test wrote into ../shared/real-traces: {left} (load with cache=False)"


def complete_event(
    name: str, ts: float, dur: float, *, cat: str = "cpu_op", pid=1, tid=1, **args
) -> dict:
    """One complete event (``"ph": "X"``) of a Kineto trace; keyword ``args`` become its
    ``args``."""
    event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    return {**event, "args": args} if args else event


def trace_doc(events: list[dict], rank: int = 0, world: int = 1, **info) -> dict:
    """A Kineto trace of ``events`` from ``rank`` of a job of ``world`` ranks (``info``: more
    of ``distributedInfo``, such as ``backend``)."""
    return {
        "distributedInfo": {"rank": rank, "world_size": world, **info},
        "baseTimeNanoseconds": BASE_NS,
        "traceEvents": events,
    }


def kineto_doc(
    rank: int,
    world: int = 2,
    base_ns: int = BASE_NS,
    pid: int = 100,
    offset_us: float = 0.0,
    steps: int = 2,
    backend: str = "gloo",
    run_id=None,
) -> dict:
    """A small trace in today's Kineto format: steps with an op and an all_reduce each."""
    events = []
    for i in range(steps):
        t = offset_us + i * 1000.0
        events += [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{i + 1}",
                "pid": pid,
                "tid": pid,
                "ts": t,
                "dur": 900.0,
            },
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": pid,
                "tid": pid,
                "ts": t + 10,
                "dur": 300.0,
                "args": {"Input Dims": [[8, 8], [8, 8]]},
            },
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "gloo:all_reduce",
                "pid": pid,
                "tid": pid + 1,
                "ts": t + 400,
                "dur": 200.0 + 50 * rank,
            },
        ]
    events.append(
        {
            "ph": "M",
            "name": "thread_name",
            "pid": pid,
            "tid": pid + 1,
            "args": {"name": f"thread {pid + 1} (pt_gloo_runloop)"},
        }
    )
    doc = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": backend, "rank": rank, "world_size": world},
        "baseTimeNanoseconds": base_ns,
        "traceEvents": events,
    }
    if run_id:
        doc["run_id"] = run_id
    return doc


def write_doc(path: Path, doc, compact: bool = False) -> Path:
    """Write a trace document as JSON (gzip-compressed when the name ends in .gz)."""
    text = json.dumps(doc, separators=(",", ":")) if compact else json.dumps(doc, indent=1)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


@pytest.fixture
def kineto():
    """The factory of small Kineto traces (a dict you can change before writing)."""
    return kineto_doc


@pytest.fixture
def write():
    """Writes a trace document to a path: ``write(path, doc, compact=False)``."""
    return write_doc


@pytest.fixture
def two_ranks(tmp_path):
    """The events of a two-rank run, three steps each."""
    from helpers.traces import load_run

    write_doc(tmp_path / "rank0.json", kineto_doc(0, steps=3))
    write_doc(tmp_path / "rank1.json", kineto_doc(1, steps=3, pid=200, offset_us=20))
    return load_run(tmp_path, cache=False).events


def x_events(path: Path) -> list[dict]:
    """The complete events of a gzip-compressed trace, read with plain json."""
    with gzip.open(path) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


@pytest.fixture
def complete_events():
    return x_events


RANKS_SCRIPT = """
import json, os, sys, time
import torch.distributed as dist

dist.init_process_group(os.environ["DIST_BACKEND"])
rank = dist.get_rank()
info = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
with open(os.path.join(os.environ["RUN_DIR"], f"rank{rank}.json"), "w") as f:
    json.dump(info, f)
print(f"rank {rank} of {dist.get_world_size()} says hello", flush=True)
mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
if mode == "fail" and rank == 2:
    with open(os.path.join(os.environ["RUN_DIR"], "failed_at"), "w") as f:
        f.write(str(time.time()))
    print("about to fail on purpose", flush=True)
    os._exit(7)
if mode == "hang":
    time.sleep(600)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.fixture
def write_script(tmp_path: Path) -> Callable[[str, str], Path]:
    """``write_script(name, source)`` writes ``source`` (dedented) to ``tmp_path / name`` and
    returns the path: a script for a test to launch."""

    def write(name: str, source: str) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    return write


@pytest.fixture
def script(write_script) -> Path:
    """A script that reports its rank in RUN_DIR; ``fail`` makes rank 2 exit 7, ``hang`` sleeps."""
    return write_script("ranks.py", RANKS_SCRIPT)


#: Test modules that launch real processes (torchrun, RPC, the doctor's job) or fuzz for a
#: minute: marked ``slow``, so that ``pytest -m "not slow" tests`` is a quick loop of the rest.
SLOW_MODULES = {
    "test_launch",
    "test_background",
    "test_live",
    "test_security",
    "test_flight_recorder",
    "test_rpc_failures",
    "test_rpc_transport",
    "test_doctor",
    "test_fuzz_traces",
    "test_fuzz_flight_recorder",
    "test_site",
    "test_allocations",
    "test_run_series",
}


def quick_sample(cases: list, family: Callable[[object], str]) -> list:
    """A sweep's ``cases`` (values or ``pytest.param``s), each kept, and each but the first of
    its family (``family`` of its value) marked ``slow``: the quick loop (``-m "not slow"``)
    runs one case of each family, ``make test`` every case. A sweep over every recording or
    folder of real traces grows with them; the quick loop does not."""
    seen: set[str] = set()
    sampled = []
    for case in cases:
        case = case if isinstance(case, type(pytest.param())) else pytest.param(case)
        key = family(case.values[0])
        marks = [*case.marks, pytest.mark.slow] if key in seen else case.marks
        sampled.append(pytest.param(*case.values, id=case.id, marks=marks))
        seen.add(key)
    return sampled


def recording_family(folder: Path) -> str:
    """The job of a recording's ``files`` folder: its experiment's first word (``ddp``,
    ``pipeline``), under ``gpu/`` for the GPU rehearsal's."""
    name = folder.parent.name.split("-")[0]
    return f"gpu/{name}" if folder.parent.parent.name == "gpu" else name


def real_trace_family(where: str) -> str:
    """Where a folder of ``../shared/real-traces`` (``where``, relative to it) came from: its
    top folder (``hta``, ``h200``), and under ``nccl-jobs`` the job's first word
    (``nccl-jobs/megatron``, ``nccl-jobs/torchrec``)."""
    top, *rest = Path(where).parts
    return f"{top}/{rest[0].split('-')[0]}" if top == "nccl-jobs" and rest else top


@pytest.fixture(scope="module")
def lesson_run(tmp_path_factory) -> Callable[[str], RunRecord | LaunchError]:
    """``lesson_run("ddp-straggler")``: the lesson's own run of that experiment replayed from
    ``recordings/`` into a folder of this module (real files, no launch); a run that failed
    comes back as its error. Each experiment is replayed once."""
    replayed: dict[str, RunRecord | LaunchError] = {}

    def get(experiment: str) -> RunRecord | LaunchError:
        if experiment not in replayed:
            keys = [
                json.loads(p.read_text())["key"]
                for p in RECORDINGS_ROOT.glob(f"{experiment}-*/recording.json")
            ]
            (key,) = [k for k in keys if k["experiment"] == experiment]
            root = tmp_path_factory.mktemp(experiment)
            try:
                replayed[experiment] = replay(
                    Path(key["script"]),
                    key["nproc"],
                    experiment,
                    key["args"],
                    key["nnodes"],
                    key["start_nodes"],
                    False,
                    root,
                )
            except LaunchError as err:
                replayed[experiment] = err
        return replayed[experiment]

    return get


def pytest_collection_modifyitems(items):
    for item in items:
        module = getattr(item, "module", None)  # notebooks (nbval) have none
        if module is not None and module.__name__ in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def no_process_in_the_quick_loop(request, monkeypatch) -> None:
    """A test of the quick loop (not marked ``slow``) that starts a process fails, naming it:
    processes were what made the loop grow past its 3 minutes. Mark such a test ``slow``."""
    if request.node.get_closest_marker("slow") is not None:
        return
    # the first import of torch in a process runs ldconfig (ctypes' find_library, from CUDA's
    # library finder): not a process of the test's, so torch is imported before the guard
    import torch  # noqa: F401

    def refuse(self, args, *_, **__):
        raise AssertionError(f"a test of the quick loop started {args!r}: mark it slow")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


#: Lesson 15's memory_job.py keeps its copies in one of two places, each a line of its own.
KEPT_IN = {"forward": "KEPT.append(x.", "loss": "KEPT.append(output."}


@pytest.fixture(scope="module")
def memory_job(tmp_path_factory) -> Path:
    """Lesson 15's job, written from its notebook into a folder of the tests' own."""
    from helpers.jobs import script_from_lesson

    folder = tmp_path_factory.mktemp("memory-job")
    script_from_lesson("memory_job.py", "15_where_the_memory_went.ipynb", dest=folder)
    return folder / "memory_job.py"


def kept_line(script: Path, place: str) -> str:
    """``memory_job.py:N``: the line of lesson 15's job (``script``) that keeps a copy in
    ``place`` (``forward`` or ``loss``), as the traces name it."""
    lines = script.read_text().splitlines()
    (number,) = [i + 1 for i, line in enumerate(lines) if KEPT_IN[place] in line]
    return f"{script.name}:{number}"
