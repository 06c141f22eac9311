"""Hangs across process groups: the rank that hung the job is named, and the wait is followed
from group to group to it.

The cases are real: 24 runs of ``benchmarks/hang_job.py`` on gloo (4 or 8 ranks; tensor, expert
and data parallel groups side by side), each with one rank stalled or killed before a collective
drawn at random (``benchmarks/hang_cases.py --seed 49``), their Flight Recorder dumps kept in
``tests/data/hang-cases/<case>/`` with ``case.json`` (what was drawn). The chains' rules are also
checked on small dumps written here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import REPO, quick_sample
from helpers import (
    analyse_with_pytorch,
    first_mismatch,
    load_flight_records,
    verdicts_compared,
    wait_chains,
)
from helpers.hangs.analyser import pytorch_verdicts

CASES = sorted((REPO / "tests" / "data" / "hang-cases").glob("*/case.json"))


def _case_id(path: Path) -> str:
    c = json.loads(path.read_text())
    return f"{path.parent.name}: {c['world']} ranks, rank {c['rank']} {c['fault']}s before step {c['step']}'s {c['at']}"  # fmt: skip


def _fault_and_group(path: Path) -> str:
    """A case's family for the quick loop: how the rank failed, and in which group."""
    c = json.loads(path.read_text())
    return f"{c['fault']} in {c['at']}"


#: The quick loop reads one case of each fault in each group; ``make test`` reads them all.
QUICK_CASES = quick_sample(CASES, _fault_and_group)


def kept(path: Path) -> tuple[dict, object]:
    """What was drawn, and the dumps (a killed rank left none: the job's ranks say so)."""
    return json.loads(path.read_text()), load_flight_records(path.parent)


def test_the_cases_are_at_least_20_with_stalls_and_kills_in_every_kind_of_group():
    drawn = [json.loads(p.read_text()) for p in CASES]
    assert len(drawn) >= 20
    assert {c["fault"] for c in drawn} == {"stall", "kill"}
    assert {c["at"] for c in drawn} == {"tp", "ep", "dp"} and {c["world"] for c in drawn} == {4, 8}


@pytest.mark.parametrize("case", QUICK_CASES, ids=_case_id)
def test_the_first_mismatch_names_the_rank_that_hung_the_job_and_no_other(case):
    drawn, records = kept(case)
    mismatch = first_mismatch(records, ranks=list(range(drawn["world"])))
    assert mismatch.culprits == [drawn["rank"]], str(mismatch)
    assert (mismatch.desc, mismatch.seq) == (drawn["at"], drawn["step"]), str(mismatch)
    assert ("left no dump" in str(mismatch)) == (drawn["fault"] == "kill")


@pytest.mark.parametrize("case", [c for c in CASES if '"kill"' in c.read_text()], ids=_case_id)
def test_without_the_jobs_ranks_a_rank_that_left_no_dump_is_warned_of(case):
    _, records = kept(case)
    with pytest.warns(UserWarning, match="a rank may have left no dump"):
        first_mismatch(records)


@pytest.mark.parametrize("case", QUICK_CASES, ids=_case_id)
def test_every_chain_ends_at_the_rank_that_hung_the_job(case):
    drawn, records = kept(case)
    chains = wait_chains(records, ranks=list(range(drawn["world"])))
    # a rank stalled before its first collective left an empty dump; a killed one, none
    ends = {"stall": ("which never joined it", "whose dump is empty"), "kill": ("which left no dump",)}  # fmt: skip
    mine = ends[drawn["fault"]]
    assert any(f"rank {drawn['rank']}, {end}" in chains[0] for end in mine), chains
    every_end = [end for c in chains for end in (*ends["stall"], *ends["kill"]) if end in c]
    assert set(every_end) <= set(mine), chains
    assert all(f"rank {drawn['rank']}, " in c for c in chains if any(e in c for e in mine)), chains


@pytest.mark.slow
def test_pytorchs_analyser_beside_the_series_on_every_case():
    # the table of tests/data/hang-cases/README.md: its first finding names the rank alone in 10
    # of 24 (10 of the 16 stalls, none of the 8 kills); a stalled rank is in one of its findings
    # every time; a killed rank, in none (it left no dump, and gloo's groups do not list it)
    alone = 0
    for case, verdict in zip(CASES, pytorch_verdicts([case.parent for case in CASES])):
        drawn, records = kept(case)
        named = {r for finding in verdict.findings for r in finding.culprits}
        assert (drawn["rank"] in named) == (drawn["fault"] == "stall"), case.parent.name
        alone += verdict.culprits == [drawn["rank"]]
        assert first_mismatch(records, ranks=list(range(drawn["world"]))).culprits == [
            drawn["rank"]
        ]
    assert alone == 10


# ------------------------------------------------------------ small dumps written here


def write_dumps(
    folder: Path, groups: dict[str, tuple[str, list[int]]], calls: dict, status: dict | None = None
) -> Path:
    """One JSON dump per rank of ``calls`` (``{rank: [(group, seq), ...]}``, in the order issued,
    each made 1 ms after the one before, with a state as NCCL records it where a third item gives
    one and a time in ms where a fourth does; an empty list: an empty dump), every group listed
    with its ranks in ``pg_config``. ``status``: ``{rank: {group: (enqueued, completed)}}``, the
    ``pg_status`` NCCL writes (keyed by each group's number in the process)."""
    config = {g: {"name": g, "desc": d, "ranks": str(r)} for g, (d, r) in groups.items()}
    pg_id = {g: i for i, g in enumerate(groups)}
    for rank, issued in calls.items():
        entries = []
        for i, (group, seq, *more) in enumerate(issued):
            state, ms = (*more, i + 1)[:2] if more else ("scheduled", i + 1)
            op = "all_to_all" if groups[group][0] == "ep" else "all_reduce"
            entries.append({
                "collective_seq_id": seq, "profiling_name": f"nccl:{op}", "input_sizes": [[16]],
                "process_group": [group, groups[group][0]], "pg_id": pg_id[group],
                "is_p2p": False, "time_created_ns": int(1_000_000 * ms), "state": state,
                "record_id": i, "p2p_seq_id": 0, "output_sizes": [[16]],
                "input_dtypes": ["Float"], "output_dtypes": ["Float"], "frames": [],
            })  # fmt: skip
        dump = {"version": "2.10", "pg_config": config}  # as gloo writes them; no entries: empty
        dump.update({"entries": entries} if entries else {})
        if status and rank in status:
            dump["nccl_version"] = "2.27.3"
            dump["pg_status"] = {
                str(pg_id[g]): {"last_enqueued_collective": e, "last_started_collective": -1,
                                "last_completed_collective": c}
                for g, (e, c) in status[rank].items()
            }  # fmt: skip
        (folder / f"fr_{rank}").write_text(json.dumps(dump))
    return folder


CHAINS = {
    "a two-group chain": (
        {"1": ("ep", [0, 1]), "2": ("tp", [1, 2]), "3": ("dp", [0, 3])},
        {0: [("3", 1)], 1: [("2", 1), ("1", 1)], 2: [("2", 1), ("2", 2)], 3: [("3", 1)]},
        [
            "rank 1 waits in group 1 (ep)'s all_to_all #1 for rank 0, which never joined it",
            "rank 2 waits in group 2 (tp)'s all_reduce #2 for rank 1, which waits in group 1 "
            "(ep)'s all_to_all #1",
        ],
    ),
    "two independent roots": (
        {"1": ("tp", [0, 1]), "2": ("tp", [2, 3])},
        {0: [("1", 1), ("1", 2)], 1: [("1", 1)], 2: [("2", 1), ("2", 2)], 3: [("2", 1)]},
        [
            "rank 0 waits in group 1 (tp)'s all_reduce #2 for rank 1, which never joined it",
            "rank 2 waits in group 2 (tp)'s all_reduce #2 for rank 3, which never joined it",
        ],
    ),
    "a collective every member called that never completed (NCCL's states)": (
        {"1": ("ep", [0, 1]), "2": ("tp", [1, 2])},
        {
            0: [("1", 4, "completed"), ("1", 5, "started")],
            1: [("2", 6, "completed"), ("1", 4, "completed"), ("1", 5, "started")],
            2: [("2", 6, "completed"), ("2", 7, "scheduled")],
        },
        [
            "ranks 0 and 1 wait in group 1 (ep)'s all_to_all #5, which every member called and "
            "which never completed: a rank failed or hangs inside it (its stack, or the network, "
            "says which)",
            "rank 2 waits in group 2 (tp)'s all_reduce #7 for rank 1, which waits in group 1 "
            "(ep)'s all_to_all #5",
        ],
    ),
    "an empty dump in the chain": (
        {"1": ("tp", [0, 1]), "2": ("dp", [0, 2])},
        {0: [("1", 1)], 1: [], 2: [("2", 1)]},
        [
            "rank 0 waits in group 1 (tp)'s all_reduce #1 for rank 1, whose dump is empty "
            "(stuck before any collective)",
            "rank 2 waits in group 2 (dp)'s all_reduce #1 for rank 0, which waits in group 1 "
            "(tp)'s all_reduce #1",
        ],
    ),
}


@pytest.mark.parametrize("groups, calls, said", CHAINS.values(), ids=CHAINS.keys())
def test_the_wait_is_followed_from_group_to_group_to_where_it_ends(tmp_path, groups, calls, said):
    records = load_flight_records(write_dumps(tmp_path, groups, calls))
    assert wait_chains(records) == said


def test_a_collective_everyone_called_that_never_completed_is_the_verdict_not_its_waiters(tmp_path):
    # the 16-GPU shape: the expert group is stuck inside an all_to_all every member called, and
    # the tensor-parallel peer waits for one of them: blaming that rank would blame a waiter
    groups, calls, _ = CHAINS["a collective every member called that never completed (NCCL's states)"]  # fmt: skip
    mismatch = first_mismatch(load_flight_records(write_dumps(tmp_path, groups, calls)))
    assert (mismatch.kind, mismatch.group, mismatch.seq, mismatch.culprits) == ("never completed", "1", 5, [])  # fmt: skip
    assert str(mismatch).endswith("every member called it: a rank failed or hangs inside it")


def test_a_rank_waits_at_its_first_unfinished_collective_not_one_queued_behind_it(tmp_path):
    # NCCL: rank 0's tp #3 started (rank 2 never called it), its dp #3 is queued behind it
    groups = {"1": ("dp", [0, 1]), "2": ("tp", [0, 2])}
    calls = {
        0: [
            ("2", 2, "completed"),
            ("1", 2, "completed"),
            ("2", 3, "started"),
            ("1", 3, "scheduled"),
        ],  # fmt: skip
        1: [("1", 2, "completed"), ("1", 3, "started")],
        2: [("2", 2, "completed")],
    }
    records = load_flight_records(write_dumps(tmp_path, groups, calls))
    assert wait_chains(records) == [
        "rank 0 waits in group 2 (tp)'s all_reduce #3 for rank 2, which never joined it",
        "rank 1 waits in group 1 (dp)'s all_reduce #3 for rank 0, which waits in group 2 (tp)'s "
        "all_reduce #3",
    ]
    assert first_mismatch(records).culprits == [2]


def test_ranks_that_called_different_collectives_each_wait_for_the_other_first():
    # lesson 13's mesh_job.py --bug different: rank 3 broadcasts where rank 2 all-reduces
    chains = wait_chains(load_flight_records(REPO / "tests" / "data" / "mesh-hang" / "different"))
    assert chains[:2] == [
        "rank 2 waits in group 2 (tp)'s all_reduce #3 for rank 3, which called gloo:broadcast "
        "[[64, 8]] there",
        "rank 3 waits in group 2 (tp)'s broadcast #3 for rank 2, which called gloo:all_reduce "
        "[[64, 8]] there",
    ]
    assert all("which waits in group 2 (tp)" in c for c in chains[2:])


def test_a_job_where_nobody_waits_has_no_chain(tmp_path):
    groups = {"1": ("tp", [0, 1])}
    records = load_flight_records(write_dumps(tmp_path, groups, {0: [("1", 1)], 1: [("1", 1)]}))
    assert wait_chains(records) == []


@pytest.mark.slow
def test_a_fresh_run_of_the_job_is_named_and_followed_as_the_kept_ones(tmp_path):
    sys.path.insert(0, str(REPO / "benchmarks"))
    from hang_cases import run_case

    drawn = {"world": 4, "fault": "stall", "rank": 1, "step": 2, "at": "ep"}
    run_case(drawn, tmp_path / "case", tmp_path / "runs")
    drawn_back, records = kept(tmp_path / "case" / "case.json")
    assert drawn_back == drawn
    assert first_mismatch(records).culprits == [1]
    assert "for rank 1, which never joined it" in wait_chains(records)[0]


# ------------------------------------------------ a dump is a ring buffer: behind, not absent

TP2, DP2 = ("tp", [0, 1]), ("dp", [0, 1])
RULES = {
    # gloo-like (no states): rank 0's entries before #5 are evicted, it never called #9
    "evicted entries are not missing ones": (
        {"1": TP2},
        {0: [("1", n) for n in range(5, 9)], 1: [("1", n) for n in range(3, 10)]},
        None,
        ("missing", "1", 9, [0]),
    ),
    # three ranks whose buffers start past #4 called it; the one behind, at #8, never called #9
    "three ranks ahead, one behind": (
        {"1": ("ep", [0, 1, 2, 3])},
        {
            0: [("1", n) for n in range(7, 10)],
            1: [("1", n) for n in range(7, 10)],
            2: [("1", n) for n in range(7, 10)],
            3: [("1", n) for n in range(4, 9)],
        },  # fmt: skip
        None,
        ("missing", "1", 9, [3]),
    ),
    # rank 0 waits in tp #2 for rank 1, which waits in dp #1 for rank 0: rank 0 stopped first
    "a cycle across two groups": (
        {"1": TP2, "2": DP2},
        {
            0: [("1", 1, "completed"), ("1", 2, "started")],
            1: [("1", 1, "completed"), ("2", 1, "started", 3)],
        },  # fmt: skip
        None,
        ("missing", "2", 1, [0]),
    ),
    # NCCL: rank 0's #5 started and never completed, while its peers completed it and went on
    "started but not completed, where the peers completed it": (
        {"1": ("ep", [0, 1, 2])},
        {
            0: [("1", 5, "started"), ("1", 6)],
            1: [("1", 5, "completed"), ("1", 6, "started")],
            2: [("1", 5, "completed"), ("1", 6, "started")],
        },  # fmt: skip
        None,
        ("failed", "1", 5, [0]),
    ),
    # NCCL dumps of the collectives still under way only, and pg_status: rank 0 completed tp
    # #2 and stopped inside #3, which rank 1 completed before it waited in #4 for rank 0
    "only the active entries, with pg_status": (
        {"1": TP2},
        {0: [("1", 3)], 1: [("1", 4)]},
        {0: {"1": (3, 2)}, 1: {"1": (4, 3)}},
        ("missing", "1", 4, [0]),
    ),
    # NCCL with timing on: every member is in #5, which never completed; ranks 1 and 2's started,
    # rank 0's never did (its GPU never got there)
    "every member in it, one never started": (
        {"1": ("ep", [0, 1, 2])},
        {0: [("1", 5)], 1: [("1", 5, "started")], 2: [("1", 5, "started")]},
        None,
        ("never completed", "1", 5, [0]),
    ),
    # NCCL dumps of the active entries only: rank 0 completed all it issued and stopped outside
    # the collectives (in its own code), so its dump is empty, and rank 1 waits in #4 for it
    "every collective completed, the rank stopped outside them": (
        {"1": TP2},
        {0: [], 1: [("1", 4)]},
        {0: {"1": (3, 3)}, 1: {"1": (4, 3)}},
        ("missing", "1", 4, [0]),
    ),
}


@pytest.mark.parametrize("groups, calls, status, verdict", RULES.values(), ids=RULES.keys())
def test_the_rank_behind_is_blamed_never_one_whose_entry_was_evicted(tmp_path, groups, calls, status, verdict):  # fmt: skip
    mismatch = first_mismatch(load_flight_records(write_dumps(tmp_path, groups, calls, status)))
    assert (mismatch.kind, mismatch.group, mismatch.seq, mismatch.culprits) == verdict, str(
        mismatch
    )


# what PyTorch's analyser blames first on each rule's dumps, and the reason said for the difference
ANALYSER = {
    "evicted entries are not missing ones": ([0], "rank 0 called it: the entry is gone"),
    "three ranks ahead, one behind": ([0, 1, 2], "ranks 0, 1 and 2 called it: the entry is gone"),
    "a cycle across two groups": ([1], "rank 1 waits in another group (rank 1 in group 2)"),
    "only the active entries, with pg_status": ([1], "rank 1 called it: the entry is gone"),
    "started but not completed, where the peers completed it": ([0], "PyTorch's analyser agrees"),
}


@pytest.mark.slow
@pytest.mark.parametrize("rule, blamed, reason", [(k, *v) for k, v in ANALYSER.items()], ids=ANALYSER.keys())  # fmt: skip
def test_pytorchs_analyser_is_set_beside_the_verdict_with_why_they_differ(tmp_path, rule, blamed, reason):  # fmt: skip
    groups, calls, status, _ = RULES[rule]
    records = load_flight_records(write_dumps(tmp_path, groups, calls, status))
    verdict = analyse_with_pytorch(tmp_path)
    said = verdicts_compared(records, first_mismatch(records), verdict)
    assert verdict.culprits == blamed, verdict.output
    assert reason in said, said


def test_a_rank_stopped_inside_a_collective_its_peers_completed_is_named_a_failure(tmp_path):
    groups, calls, status, _ = RULES["only the active entries, with pg_status"]
    records = load_flight_records(write_dumps(tmp_path, groups, calls, status))
    mismatch = first_mismatch(records)
    assert mismatch.failed == {0: "group 1 (tp)'s all_reduce #3"}
    assert "rank 0 stopped in group 1 (tp)'s all_reduce #3, which its peers completed" in str(mismatch)  # fmt: skip
    assert wait_chains(records) == [
        "rank 0 stopped in group 1 (tp)'s all_reduce #3, which rank 1 completed: a failure on "
        "rank 0 (a GPU error, a dead link)",
        "rank 1 waits in group 1 (tp)'s all_reduce #4 for rank 0, which stopped in group 1 "
        "(tp)'s all_reduce #3",
    ]


def test_a_cycle_of_waits_names_the_rank_that_stopped_first_and_why(tmp_path):
    groups, calls, status, _ = RULES["a cycle across two groups"]
    records = load_flight_records(write_dumps(tmp_path, groups, calls, status))
    why = (
        "the waits form a cycle (ranks 0 and 1): rank 0 stopped first, in group 1 (tp)'s "
        "all_reduce #2, issued 1.0 ms before rank 1 stopped; rank 1 waits for it"
    )
    assert first_mismatch(records).why == why
    assert why in wait_chains(records)


def test_an_all_to_all_whose_sizes_differ_by_rank_is_one_collective(tmp_path):
    # an expert-parallel all_to_all sends what each rank routes: the sizes differ by design
    write_dumps(tmp_path, {"1": ("ep", [0, 1])}, {0: [("1", 1)], 1: [("1", 1)]})
    dump = json.loads((tmp_path / "fr_1").read_text())
    dump["entries"][0]["input_sizes"] = [[4027, 5120]]
    (tmp_path / "fr_1").write_text(json.dumps(dump))
    assert first_mismatch(load_flight_records(tmp_path)) is None


NVRX = REPO.parent / "shared" / "real-traces" / "nvrx-fr" / "gpu_error_1st"


@pytest.mark.skipif(not NVRX.is_dir(), reason="needs ../shared/real-traces/nvrx-fr")
def test_a_real_16_gpu_hang_names_the_rank_the_reference_names():
    # NVIDIA's and PyTorch's analysers: group 74 (expert parallel), all_to_all, missing rank 12;
    # the fault log: a GPU error on ranks 12 and 14
    records = load_flight_records(NVRX, prefix="_dump_")
    mismatch = first_mismatch(records)
    assert (mismatch.group, mismatch.desc, mismatch.seq) == ("74", "EXPERT_MODEL_PARALLEL_GROUP", 20537)  # fmt: skip
    assert (mismatch.kind, mismatch.culprits) == ("missing", [12])
    assert mismatch.calls[13] == "nccl:all_to_all [[4027, 5120]]"
    assert sorted(mismatch.failed) == [12, 14]
    assert not any("cycle" in c for c in wait_chains(records))


@pytest.mark.skipif(not NVRX.is_dir(), reason="needs ../shared/real-traces/nvrx-fr")
def test_a_rank_killed_before_its_dump_is_named_from_nccls_group_lists(tmp_path):
    # NCCL's dumps list every member of their groups: the job's ranks need not be given
    for dump in NVRX.glob("_dump_*"):
        if dump.name != "_dump_12":
            (tmp_path / dump.name).write_bytes(dump.read_bytes())
    mismatch = first_mismatch(load_flight_records(tmp_path, prefix="_dump_"))
    assert (mismatch.group, mismatch.seq, mismatch.culprits) == ("74", 20537, [12])
    assert mismatch.no_dumps == [12]


def test_a_rank_with_no_collective_under_way_is_said_to_have_stopped_outside_them(tmp_path):
    groups, calls, status, _ = RULES["every collective completed, the rank stopped outside them"]
    records = load_flight_records(write_dumps(tmp_path, groups, calls, status))
    assert first_mismatch(records).idle == [0]
    assert "stopped outside them" in str(first_mismatch(records))
    assert wait_chains(records) == [
        "rank 1 waits in group 1 (tp)'s all_reduce #4 for rank 0, whose dump holds no collective "
        "under way (every one it issued completed: it stopped outside them)"
    ]
