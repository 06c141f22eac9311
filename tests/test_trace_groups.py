"""Traces of a job of many process groups, each collective matched within its own group: a real
run of lesson 13's mesh_job.py (4 ranks, a 2x2 mesh of tp and dp groups on gloo) where rank 3 is
40 ms late before its tp all-reduce in every step, made with ``RUN_DIR=tests/data/mesh-straggler
torchrun --standalone --nproc-per-node 4 mesh_job.py --slow-rank 3 --delay-ms 40 --profile
--steps 6`` (traces gzipped)."""

import gzip
import json
import warnings
from pathlib import Path

import pytest

from helpers import (
    collective_waits,
    find_straggler,
    load_flight_records,
    load_run,
    waiting_per_group,
    with_groups_from_flight_records,
)

RUN = Path(__file__).parent / "data" / "mesh-straggler"
MESH = {"1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}  # tp, tp, dp, dp


@pytest.fixture(scope="module")
def events():
    return load_run(RUN).events


@pytest.fixture(scope="module")
def labelled(events):
    return with_groups_from_flight_records(events, load_flight_records(RUN))


def test_a_gloo_trace_does_not_name_the_group_so_all_ranks_are_matched_together(events):
    with pytest.warns(UserWarning, match="matched by name and order across the groups"):
        waits = collective_waits(events)

    assert waits.groupby(["key", "index"])["rank"].nunique().eq(4).all()


def test_each_gloo_collective_gets_its_group_and_number_from_the_flight_recorder(labelled):
    gloo = labelled[labelled["name"].astype(str).str.startswith("gloo:")]

    assert gloo["process_group"].notna().all() and gloo["seq"].notna().all()
    for rank, mine in gloo.sort_values("start_us").groupby("rank"):
        groups = [g for g, members in MESH.items() if rank in members]
        assert list(mine["process_group"].astype(str)) == groups * (len(mine) // 2)
        assert (mine.groupby("process_group", observed=True)["seq"].diff().dropna() == 1).all()
    assert (gloo["group_size"] == 2).all()


def test_collectives_are_matched_within_their_group(labelled):
    waits = collective_waits(labelled)
    group = waits["key"].str.split("|").str[2]

    members = waits.groupby([group, waits["key"], waits["index"]])["rank"].agg(sorted)
    assert all(ranks == MESH[g] for (g, _, _), ranks in members.items())


def hand_computed_waits() -> dict[tuple[str, int, int], float]:
    """``{(group, seq, rank): µs waited}`` from the raw files: each gloo span is the rank's
    latest Flight Recorder entry of that op created before it started; the shortest of a
    collective's spans is the transfer, the rest of each is waiting."""
    spans: dict[tuple[str, int], dict[int, float]] = {}
    for rank in range(4):
        entries = json.loads((RUN / f"fr_{rank}").read_text())["entries"]
        doc = json.loads(gzip.open(RUN / f"rank{rank}_trace.json.gz").read())
        base_us = doc["baseTimeNanoseconds"] / 1e3
        for event in doc["traceEvents"]:
            if event.get("ph") != "X" or not event.get("name", "").startswith("gloo:"):
                continue
            start = base_us + event["ts"]
            mine = [
                e
                for e in entries
                if e["profiling_name"] == event["name"] and e["time_created_ns"] / 1e3 <= start
            ]
            entry = max(mine, key=lambda e: e["time_created_ns"])
            key = (entry["process_group"][0], entry["collective_seq_id"])
            spans.setdefault(key, {})[rank] = event["dur"]
    return {
        (group, seq, rank): dur - min(durs.values())
        for (group, seq), durs in spans.items()
        if len(durs) == 2
        for rank, dur in durs.items()
    }


def test_waits_per_group_are_those_computed_by_hand_from_the_raw_files(labelled):
    waits = collective_waits(labelled)
    parts = waits["key"].str.split("|")
    ours = {
        (g, int(s), int(r)): w
        for g, s, r, w in zip(parts.str[2], parts.str[3], waits["rank"], waits["wait_us"])
    }

    expected = hand_computed_waits()
    assert ours.keys() == expected.keys()
    assert ours == pytest.approx(expected, abs=0.01)


def test_the_straggler_is_found_in_each_group_and_for_the_job(labelled):
    table = waiting_per_group(labelled).set_index("process_group")

    # rank 3 is late in tp [2, 3]; then 2 and 3 are both late to their dp groups
    assert table.loc[["2", "3", "4"], "straggler"].tolist() == [3, 2, 3]
    assert (table.loc[["2", "3", "4"], "others_wait_ms"] > 30).all()
    assert table.loc["1", "others_wait_ms"] < 5, "tp [0, 1] has no straggler"
    assert find_straggler(labelled) == 3


def test_waiting_per_group_asks_for_the_groups_of_a_gloo_trace(events):
    with pytest.raises(ValueError, match="with_groups_from_flight_records"):
        waiting_per_group(events)


def test_a_collective_without_a_flight_recorder_entry_keeps_no_group_and_a_warning_says_so(
    events,
):
    records = load_flight_records(RUN)
    without_rank_0 = records[records["rank"] != 0]

    with pytest.warns(UserWarning, match="no Flight Recorder entry"):
        labelled = with_groups_from_flight_records(events, without_rank_0)

    gloo = labelled[labelled["name"].astype(str).str.startswith("gloo:")]
    assert gloo.loc[gloo["rank"] == 0, "process_group"].isna().all()
    assert gloo.loc[gloo["rank"] != 0, "process_group"].notna().all()


REAL = Path(__file__).resolve().parents[2] / "shared" / "real-traces" / "hta"


@pytest.mark.skipif(not REAL.is_dir(), reason="../shared/real-traces is not beside the checkout")
def test_a_real_nccl_trace_of_one_rank_names_its_group_but_no_straggler():
    from helpers import load_trace

    events = load_trace(REAL / "nccl_parser_config" / "nccl_data.json.gz").events

    assert events["process_group"].notna().any()  # record_param_comms names the group
    assert waiting_per_group(events).empty  # one rank of the pair loaded: nobody waited


@pytest.mark.skipif(not REAL.is_dir(), reason="../shared/real-traces is not beside the checkout")
def test_real_nccl_traces_without_groups_are_told_why_there_is_no_table_per_group():
    events = load_run(
        REAL / "trace_filter", cache=False
    ).events  # two ranks of a 128-GPU job, older format

    with pytest.raises(ValueError, match="older ones do not"):
        waiting_per_group(events)


def test_collectives_given_their_group_are_matched_without_a_warning(labelled):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        collective_waits(labelled)


def test_the_ranks_groups_are_read_from_the_traces_headers(events):
    # each rank is in the default group, one tp group and one dp group (pg_config)
    assert events.attrs["process_groups"] == 3
