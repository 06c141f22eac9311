"""Flight Recorder dumps: real dumps of a job that hangs on purpose (lesson 8's script), and
damaged ones, each a clear error naming the file and the rank."""

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.hangs import analyse_with_pytorch, first_mismatch, flight_recorder
from helpers.hangs.analyser import pytorch_verdicts
from helpers.hangs.flight_recorder import FlightRecorderError, load_flight_records
from helpers.jobs import RankFailed, launch, processes_of_run, script_from_lesson


@pytest.fixture(scope="module")
def hung_run(tmp_path_factory):
    """A real 2-rank gloo job where rank 1 calls broadcast instead of all_reduce at step 4."""
    folder = tmp_path_factory.mktemp("hang")
    script_from_lesson("hang.py", "08_when_a_job_hangs.ipynb", dest=folder)
    script = folder / "hang.py"
    with pytest.raises(RankFailed) as caught:
        launch(
            script,
            2,
            args=["--bug", "different", "--bug-step", "4"],
            echo=False,
            traces_root=folder / "traces",
            timeout=90,
        )
    return caught.value.record


def test_a_hung_job_ends_with_a_dump_from_every_rank_and_no_process_left(hung_run):
    assert sorted(p.name for p in hung_run.paths("fr_*")) == ["fr_0", "fr_1"]
    assert processes_of_run(hung_run.run_id) == []


def test_real_dumps_load_as_one_row_per_collective_per_rank(hung_run):
    records = load_flight_records(hung_run.run_dir, expect_ranks=[0, 1])

    assert list(records.columns[:4]) == ["rank", "seq", "op", "collective"]
    assert records.groupby("rank")["seq"].apply(list).to_dict() == {
        0: list(range(1, 8)),
        1: list(range(1, 8)),
    }
    assert set(records["op"]) == {"gloo:all_reduce", "gloo:broadcast"}
    assert (records["input_sizes"] == "[[8]]").all()


def test_the_first_mismatch_is_found_and_pytorchs_analyser_agrees(hung_run):
    mismatch = first_mismatch(load_flight_records(hung_run.run_dir))
    verdict = analyse_with_pytorch(hung_run.run_dir)

    assert (mismatch.seq, mismatch.kind, mismatch.culprits) == (7, "different collective", [1])
    assert mismatch.calls == {0: "gloo:all_reduce [[8]]", 1: "gloo:broadcast [[8]]"}
    assert (verdict.seq, verdict.kind, verdict.culprits) == (7, "different collective", [1])


def copy_dumps(run, folder):
    folder.mkdir()
    for rank in (0, 1):
        (folder / f"fr_{rank}").write_bytes((run.run_dir / f"fr_{rank}").read_bytes())
    return folder


@pytest.mark.parametrize(
    "damage, problem",
    [
        (lambda data: data[: len(data) // 2], "not a complete Flight Recorder dump"),
        (lambda data: b"", "is empty"),
        (lambda data: pickle.dumps(["not", "a", "dump"]), "has no 'entries' list"),
        (lambda data: pickle.dumps({"entries": [{"collective_seq_id": 1}]}), "an entry lacks"),
        (lambda data: pickle.dumps({"entries": [], "x": pickle.loads}), "refusing to load"),
    ],
)
def test_a_damaged_dump_is_an_error_naming_the_file_and_the_rank(
    hung_run, tmp_path, damage, problem
):
    folder = copy_dumps(hung_run, tmp_path / "dumps")
    path = folder / "fr_1"
    path.write_bytes(damage(path.read_bytes()))

    with pytest.raises(FlightRecorderError, match=problem) as caught:
        load_flight_records(folder)
    assert caught.value.rank == 1 and caught.value.path == path
    assert "fr_1 (rank 1): " in str(caught.value)


def test_a_missing_dump_names_the_rank(hung_run, tmp_path):
    folder = copy_dumps(hung_run, tmp_path / "dumps")
    (folder / "fr_0").unlink()
    with pytest.raises(FlightRecorderError, match="no Flight Recorder dump from rank 0"):
        load_flight_records(folder, expect_ranks=[0, 1])


def test_ranks_that_agree_have_no_mismatch(hung_run):
    records = load_flight_records(hung_run.run_dir)
    assert first_mismatch(records[records["seq"] < 7]) is None


def test_dumps_named_as_pytorch_names_them_give_the_same_verdicts(hung_run, tmp_path):
    folder = tmp_path / "dumps"
    folder.mkdir()
    for rank in (0, 1):  # TORCH_FR_DUMP_TEMP_FILE=.../nccl_trace_rank_ and the rank
        dump = (hung_run.run_dir / f"fr_{rank}").read_bytes()
        (folder / f"nccl_trace_rank_{rank}").write_bytes(dump)

    mismatch = first_mismatch(load_flight_records(folder, expect_ranks=[0, 1]))
    verdict = analyse_with_pytorch(folder)

    assert (mismatch.seq, mismatch.culprits) == (7, [1])
    assert (verdict.seq, verdict.culprits) == (7, [1])


def write_dumps(folder: Path, names: list[str]) -> Path:
    folder.mkdir()
    for name in names:
        (folder / name).write_bytes(a_dump())
    return folder


@pytest.mark.parametrize(
    ("names", "prefix", "ranks"),
    [
        (["fr_0", "fr_1"], None, [0, 1]),
        (["nccl_trace_rank_0", "nccl_trace_rank_1"], None, [0, 1]),
        (["rank_0", "rank_1", "rank_10"], None, [0, 1, 10]),
        (["fr_0", "fr_1", "notes_2"], None, [0, 1]),
        (["job-a_0", "job-a_1", "job-b_0"], "job-a_", [0, 1]),
        (["rank_0", "rank_1", "rank_01.txt", "rank_1.json"], None, [0, 1]),
    ],
    ids=[
        "this series' fr_",
        "pytorch's tutorial",
        "torchtitan, rank 10",
        "fr_ beside other files",
        "prefix given",
        "other files ignored",
    ],
)
def test_dumps_are_read_by_the_prefix_their_names_share(tmp_path, names, prefix, ranks):
    folder = write_dumps(tmp_path / "dumps", names)
    records = load_flight_records(folder, prefix=prefix)
    assert sorted(records["rank"].unique()) == ranks


def test_names_of_several_prefixes_are_an_error_asking_for_one(tmp_path):
    folder = write_dumps(tmp_path / "dumps", ["job-a_0", "job-a_1", "job-b_0", "job-b_1"])
    with pytest.raises(FlightRecorderError, match="2 prefixes \\('job-a_', 'job-b_'\\).*prefix="):
        load_flight_records(folder)


# ------------------------------------------------- nothing in a dump runs, nothing unbounded


class Payload:
    """Pickled, this is a call of ``open(marker, "w")``: loading it creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.fixture
def malicious(tmp_path) -> tuple[bytes, Path]:
    """A dump that creates a marker file when it is unpickled, and that marker's path."""
    marker = tmp_path / "pwned"
    data = pickle.dumps({"entries": [], "version": "2.10", "pg_config": {}, "x": Payload(marker)})
    pickle.loads(data).pop("x").close()  # the payload works: a plain pickle.load runs it
    assert marker.exists()
    marker.unlink()
    return data, marker


HANG_CASES = sorted((Path(__file__).parent / "data" / "hang-cases").glob("*/case.json"))
PUBLIC_FUNCTIONS = {
    "load_flight_records": load_flight_records,
    "first_mismatch": lambda folder: first_mismatch(load_flight_records(folder)),
    "analyse_with_pytorch": analyse_with_pytorch,
    "pytorch_verdicts, the second of two folders": lambda folder: pytorch_verdicts(
        [HANG_CASES[0].parent, folder]
    ),
}


@pytest.mark.parametrize("function", PUBLIC_FUNCTIONS)
def test_a_malicious_dump_is_refused_and_never_run(hung_run, tmp_path, malicious, function):
    data, marker = malicious
    folder = copy_dumps(hung_run, tmp_path / "dumps")
    (folder / "fr_1").write_bytes(data)

    with pytest.raises(FlightRecorderError, match="refusing to load") as caught:
        PUBLIC_FUNCTIONS[function](folder)
    assert caught.value.path == folder / "fr_1" and caught.value.rank == 1
    assert not marker.exists()


@pytest.mark.parametrize("function", PUBLIC_FUNCTIONS)
@pytest.mark.parametrize("name", ["evil_fr_1", "sub/fr_1"])  # PyTorch's analyser reads both
def test_a_malicious_file_beside_the_dumps_is_never_run(
    hung_run, tmp_path, malicious, function, name
):
    data, marker = malicious
    folder = copy_dumps(hung_run, tmp_path / "dumps")
    (folder / name).parent.mkdir(exist_ok=True)
    (folder / name).write_bytes(data)

    PUBLIC_FUNCTIONS[function](folder)
    assert not marker.exists()


def shared_references(levels: int, width: int) -> list:
    """A list that holds ``width`` references to a list that holds ``width`` references ...:
    ``width ** levels`` values to whoever walks it, a few hundred bytes as a pickle."""
    value: list = ["lol"]
    for _ in range(levels):
        value = [value] * width
    return value


def a_dump(**entry_fields) -> bytes:
    entry = {
        "collective_seq_id": 1,
        "profiling_name": "gloo:all_reduce",
        "time_created_ns": 1,
        "input_sizes": [[8]],
        "process_group": ("0", "default_pg"),
        **entry_fields,
    }
    return pickle.dumps({"entries": [entry], "version": "2.10", "pg_config": {}})


def nested_lists(depth: int) -> bytes:
    """A pickle of a list in a list ... ``depth`` deep, built by the unpickler's stack."""
    return b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b"."


def a_dict_keyed_by_a_deep_tuple(depth: int) -> bytes:
    """A pickle whose unpickling hashes a tuple ``depth`` deep: that recursion in C crashes
    the interpreter (no RecursionError) when it is deep enough."""
    return b"\x80\x04}" + b")" + b"\x85" * depth + b"Ns."


HOSTILE = {
    "billions of shared references": (
        a_dump(input_sizes=shared_references(20, 3)),  # 3**20: 3.5e9 values, 500 bytes
        "holds more than 2,000,000 values once shared references are counted",
    ),
    "a list nested 200,000 deep": (nested_lists(200_000), "nests deeper than 32 levels"),
    "a list that holds itself": (b"\x80\x04]\x94h\x00a.", "nests deeper than 32 levels"),
    "a dict keyed by a tuple nested 200,000 deep": (
        a_dict_keyed_by_a_deep_tuple(200_000),
        "has a dictionary key that is not a string",
    ),
    "a number of 70 bits": (a_dump(collective_seq_id=2**70), "holds a number beyond 64 bits"),
    "a value stored at memo index 2**28 (the unpickler would allocate 4 GB)": (
        b"\x80\x04Nr" + (2**28).to_bytes(4, "little") + b".",
        "it stores a value at memo index 268,435,456",
    ),
    "250,001 empty dicts": (
        b"\x80\x04](" + b"}" * 250_001 + b"e.",
        "holds more than 250,000 lists, dicts and tuples",
    ),
    "JSON nested 100,000 deep": (b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "deeper"),
    "JSON with 1e400 as a time": (
        b'{"entries": [{"collective_seq_id": 1, "profiling_name": "gloo:all_reduce", '
        b'"time_created_ns": 1e400}]}',
        "an entry has a field of the wrong type",
    ),
    "a process group of one name": (
        a_dump(process_group=("0",)),
        "an entry has a field of the wrong type",
    ),
}


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_hostile_dump_is_an_error_naming_the_file_within_seconds(tmp_path, hostile):
    data, problem = HOSTILE[hostile]
    (tmp_path / "fr_0").write_bytes(data)

    started = time.monotonic()
    with pytest.raises(FlightRecorderError, match=problem) as caught:
        load_flight_records(tmp_path)
    assert time.monotonic() - started < 10
    assert caught.value.path == tmp_path / "fr_0" and caught.value.rank == 0


@pytest.mark.slow
def test_pytorchs_analyser_gives_each_folder_in_one_process_the_verdict_it_gives_it_alone():
    folders = [case.parent for case in HANG_CASES[:3]]
    together = pytorch_verdicts(folders)
    assert [v.output for v in together] == [pytorch_verdicts([f])[0].output for f in folders]
    assert sum(len(v.findings) for v in together) > 0  # not all of them empty


@pytest.mark.slow
def test_pytorchs_analyser_out_of_time_is_an_error_naming_the_folder():
    folder = HANG_CASES[0].parent
    with pytest.raises(
        FlightRecorderError, match="did not finish in 0.01 s; raise timeout="
    ) as caught:
        pytorch_verdicts([folder], timeout=0.01)
    assert caught.value.path == folder


def test_pytorchs_analyser_is_never_given_a_dump_the_reader_refuses(tmp_path):
    (tmp_path / "fr_0").write_bytes(a_dump(input_sizes=shared_references(20, 3)))
    with pytest.raises(FlightRecorderError, match="fr_0 \\(rank 0\\): holds more than"):
        analyse_with_pytorch(tmp_path)


def test_a_pickle_of_more_instructions_than_the_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(flight_recorder, "MAX_DUMP_ITEMS", 1000)
    (tmp_path / "fr_0").write_bytes(a_dump(input_sizes=list(range(2000))))
    with pytest.raises(FlightRecorderError, match="more than 1,000 pickle instructions"):
        load_flight_records(tmp_path)


def test_a_dump_larger_than_the_bound_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(flight_recorder, "MAX_DUMP_BYTES", 100)
    (tmp_path / "fr_0").write_bytes(a_dump(input_sizes=list(range(100))))
    with pytest.raises(FlightRecorderError, match="larger than 100 bytes.*MAX_DUMP_BYTES"):
        load_flight_records(tmp_path)


def test_a_json_dump_is_read_and_analysed_like_the_pickle_of_the_same_buffer(hung_run, tmp_path):
    # lesson 8's hang.py writes JSON dumps; the same data as pickles must read the same
    folder = tmp_path / "pickle"
    folder.mkdir()
    for rank in (0, 1):
        dump = json.loads((hung_run.run_dir / f"fr_{rank}").read_text())
        (folder / f"fr_{rank}").write_bytes(pickle.dumps(dump))

    as_pickle, as_json = load_flight_records(folder), load_flight_records(hung_run.run_dir)
    verdict = analyse_with_pytorch(hung_run.run_dir)

    assert as_json.equals(as_pickle)
    assert (verdict.seq, verdict.kind, verdict.culprits) == (7, "different collective", [1])


PYTORCH_JSON_DUMP = """
import os, sys, tempfile
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
dist.all_reduce(torch.ones(8))
dist.broadcast(torch.ones(8), 0)
open(os.path.join(sys.argv[1], "fr_0"), "wb").write(
    torch._C._distributed_c10d._dump_fr_trace_json())
dist.destroy_process_group()
"""


def test_a_dump_pytorch_writes_as_json_loads(tmp_path):
    subprocess.run(
        [sys.executable, "-c", PYTORCH_JSON_DUMP, str(tmp_path)],
        check=True,
        capture_output=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=120,
    )
    records = load_flight_records(tmp_path)
    assert list(records["op"]) == ["gloo:all_reduce", "gloo:broadcast"]
    assert list(records["input_sizes"]) == ["[[8]]", "[[8]]"]


SENDS_AND_AN_ALL_REDUCE = """
import os
os.environ["TORCH_FR_BUFFER_SIZE"] = "100"
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(4)
if rank == 0:
    dist.send(x, 1)
else:
    dist.recv(x, 0)
dist.all_reduce(x)
with open(os.path.join(os.environ["RUN_DIR"], f"fr_{rank}"), "wb") as f:
    f.write(torch._C._distributed_c10d._dump_fr_trace_json())
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_gloos_flight_recorder_records_no_send_or_receive(tmp_path, write_script):
    # lesson 13, section 6, says so of torch 2.14: a send, a receive and an all-reduce, dumped
    script = write_script("sends.py", SENDS_AND_AN_ALL_REDUCE)
    run = launch(script, 2, traces_root=tmp_path, echo=False, timeout=120)
    records = load_flight_records(run.run_dir)
    assert records.groupby("rank")["op"].agg(list).to_dict() == {
        0: ["gloo:all_reduce"],
        1: ["gloo:all_reduce"],
    }
