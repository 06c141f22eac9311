"""Flight Recorder dumps: real dumps of a job that hangs on purpose (lesson 8's script), and
damaged ones, each a clear error naming the file and the rank."""

import pickle

import pytest

from helpers.flight_recorder import (
    FlightRecorderError,
    analyse_with_pytorch,
    first_mismatch,
    load_flight_records,
)
from helpers.launch import RankFailed, launch, processes_of_run
from helpers.lessons import script_from_lesson


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
