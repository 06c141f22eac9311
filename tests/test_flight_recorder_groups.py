"""Flight Recorder dumps of a job of many process groups, read group by group: real dumps of
lesson 13's mesh_job.py (4 ranks, a 2x2 mesh of tp and dp groups on gloo), one folder per bug
(rank 3 goes wrong at step 3), made with ``RUN_DIR=tests/data/mesh-hang/<bug> torchrun
--standalone --nproc-per-node 4 mesh_job.py --bug <bug>``."""

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.hangs import analyse_with_pytorch, first_mismatch, group_members, group_states
from helpers.hangs.flight_recorder import load_flight_records

DUMPS = Path(__file__).parent / "data" / "mesh-hang"
MESH = {"1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}  # tp, tp, dp, dp


def records_of(bug: str):
    return load_flight_records(DUMPS / bug)


@pytest.mark.parametrize(
    "bug, group, seq, kind, culprits, empty",
    [
        ("stall", "2", 3, "missing", [3], []),
        ("different", "2", 3, "different collective", [3], []),
        ("empty", "2", 1, "missing", [3], [3]),
    ],
    ids=["a rank stalls in its tp group", "a rank calls another collective", "an empty dump"],
)
def test_the_first_mismatch_names_the_group_the_collective_and_the_rank(
    bug, group, seq, kind, culprits, empty
):
    mismatch = first_mismatch(records_of(bug))

    assert (mismatch.group, mismatch.desc, mismatch.seq) == (group, "tp", seq)
    assert (mismatch.kind, mismatch.culprits, mismatch.empty_dumps) == (kind, culprits, empty)
    assert f"group {group} (tp), collective {seq}" in str(mismatch)


def test_a_job_whose_groups_all_agree_has_no_mismatch():
    assert first_mismatch(records_of("none")) is None
    assert set(group_states(records_of("none"))["state"]) == {"healthy"}


def test_sequence_numbers_count_per_group():
    records = records_of("none")

    per_group = records.groupby(["group", "rank"])["seq"].apply(list)
    assert all(seqs == [1, 2, 3, 4] for seqs in per_group)
    assert records.groupby("rank").size().to_dict() == {0: 8, 1: 8, 2: 8, 3: 8}


@pytest.mark.parametrize("bug", ["none", "stall", "different"])
def test_the_groups_members_are_found_from_the_entries(bug):
    # torch 2.14's gloo dumps list one wrong group in pg_config; the entries say who is where
    raw = json.loads((DUMPS / bug / "fr_0").read_text())
    assert set(raw["pg_config"]) == {""}

    assert group_members(records_of(bug)) == MESH


def test_a_rank_that_recorded_nothing_is_placed_in_the_one_group_short_of_a_member():
    members = group_members(records_of("empty"))

    assert members["2"] == [2, 3]
    assert group_states(records_of("empty")).set_index("group").loc[
        ["3", "4"], "state"
    ].tolist() == [
        "members unknown",
        "members unknown",
    ]


def test_an_empty_dump_is_read_as_a_rank_without_entries():
    assert "entries" not in json.loads((DUMPS / "empty" / "fr_3").read_text())

    records = records_of("empty")

    assert records.attrs["ranks"] == [0, 1, 2, 3]
    assert 3 not in set(records["rank"])


@pytest.mark.parametrize("bug", ["stall", "different"])
def test_a_rank_stuck_in_another_group_is_a_victim_not_the_cause(bug):
    states = group_states(records_of(bug)).set_index("group")

    dp = states.loc["3"]  # rank 0 waits in dp for rank 2, which waits in its tp group
    assert (dp["state"], dp["culprits"], dp["culprits_waiting_in"]) == ("missing", [2], {2: "2"})
    assert not dp["root"]
    assert states.loc["2", "root"]


def analyser_and_ours(bug: str):
    verdict = analyse_with_pytorch(DUMPS / bug)
    assert verdict.findings, verdict.output
    return verdict, group_states(records_of(bug)).set_index("group")


@pytest.mark.slow  # launches PyTorch's analyser: make test, not the quick loop
@pytest.mark.parametrize("bug", ["stall", "empty"])
def test_pytorchs_analyser_agrees_on_every_group_it_reports(bug):
    verdict, states = analyser_and_ours(bug)

    for finding in verdict.findings:
        ours = states.loc[finding.group]
        assert (finding.desc, finding.seq, finding.kind, finding.culprits) == (
            ours["desc"],
            ours["seq"],
            ours["state"],
            ours["culprits"],
        )
    mismatch = first_mismatch(records_of(bug))
    assert (verdict.seq, verdict.kind, verdict.culprits) == (
        mismatch.seq,
        mismatch.kind,
        mismatch.culprits,
    )


@pytest.mark.slow  # launches PyTorch's analyser: make test, not the quick loop
def test_in_a_pair_that_disagrees_the_groups_of_its_kind_say_which_rank_differs():
    # rank 3 calls broadcast where rank 2, and the other tp group, call all_reduce: a pair
    # has no majority, and PyTorch's analyser blames the rank it compared the other with
    verdict, states = analyser_and_ours("different")

    assert [(f.group, f.seq, f.kind) for f in verdict.findings] == [
        (g, states.loc[g, "seq"], states.loc[g, "state"]) for g in ["2", "3", "4"]
    ]
    assert verdict.findings[0].culprits == [2]
    assert states.loc["2", "culprits"] == [3]
    assert states.loc["2", "calls"] == {
        2: "gloo:all_reduce [[64, 8]]",
        3: "gloo:broadcast [[64, 8]]",
    }


@pytest.mark.slow  # launches a process: make test, not the quick loop
def test_pytorchs_analyser_fails_on_gloos_own_group_list(tmp_path):
    # why analyse_with_pytorch hands it each rank's groups as the entries show them
    for rank in range(4):
        dump = json.loads((DUMPS / "stall" / f"fr_{rank}").read_text())
        (tmp_path / f"fr_{rank}").write_bytes(pickle.dumps(dump))  # our own file: safe
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode != 0 and "KeyError" in done.stderr
