"""Sends and receives (helpers/analysis/point_to_point.py) and the critical path through them, as a
specification: pairs read from tiny traces built to the format gloo writes (``c10d::send`` /
``c10d::recv_`` with their peer and tag in ``Concrete Inputs``, each followed by its
``gloo:send`` / ``gloo:recv`` record on the same thread), and paths computed by hand."""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd
import pytest

from conftest import complete_event, trace_doc, write_doc
from helpers import (
    collective_waits,
    critical_path,
    launch,
    load_run,
    script_from_lesson,
    stage_waits,
    step_times,
    unmatched_collectives,
    what_if,
)
from helpers.analysis.point_to_point import sends_and_receives, waits_in_records
from helpers.report import build_report

MAIN = 1


def step(ts, dur, number=1):
    return complete_event(f"ProfilerStep#{number}", ts, dur, cat="user_annotation", pid=100, tid=MAIN)  # fmt: skip


def op(name, ts, dur, cat="cpu_op", **args):
    return complete_event(name, ts, dur, cat=cat, pid=100, tid=MAIN, **args)


def send(ts, peer, done, tag=0) -> list[dict]:
    """An ``isend`` to ``peer`` issued at ``ts`` (its op 10 µs), its record ending at ``done``
    (when a wait saw it done)."""
    concrete = {"Concrete Inputs": ["", "", str(peer), str(tag)]}
    return [op("c10d::send", ts, 10, **concrete), op("gloo:send", ts + 8, done - ts - 8, cat="user_annotation")]  # fmt: skip


def recv(ts, peer, arrived, tag=0, peers=True) -> list[dict]:
    """A blocking receive from ``peer`` posted at ``ts`` (its op 10 µs), its data seen at
    ``arrived``; ``peers=False``: recorded without ``record_shapes``, so no peer."""
    concrete = {"Concrete Inputs": ["", "", str(peer), str(tag)]} if peers else {}
    return [op("c10d::recv_", ts, 10, **concrete), op("gloo:recv", ts + 8, arrived - ts - 8, cat="user_annotation")]  # fmt: skip


def events_of(tmp_path, ranks: dict[int, list[dict]]) -> pd.DataFrame:
    for rank, events in ranks.items():
        write_doc(tmp_path / f"rank{rank}.json", trace_doc(events, rank=rank, world=len(ranks)))
    return load_run(tmp_path, cache=False).events


#: Two stages, one micro-batch: stage 0 computes 0-500 and sends; stage 1 has posted its receive
#: at 0, its data arrives at 530 (20 µs after the send was issued at 510), it computes 540-840.
#: A send's wait ends when its receive has the data (gloo's send waits for the receive).
TWO_STAGES = {
    0: [step(0, 540), op("forward", 0, 500), *send(500, 1, 535)],
    1: [step(0, 900), *recv(0, 0, 530), op("forward", 540, 300), op("aten::zero_", 840, 50)],
}  # fmt: skip


def slowed_middle(slow: int) -> dict[int, list[dict]]:
    """Three stages, one micro-batch: each stage receives (but the first), computes and sends
    (but the last); the middle stage's forward takes ``slow`` µs more, 100 µs without it."""
    mid = 100 + slow
    return {
        0: [step(0, 140), op("forward", 0, 100), *send(100, 1, 135)],
        1: [step(0, 170 + mid), *recv(0, 0, 130), op("forward", 130, mid), *send(130 + mid, 2, 165 + mid)],  # fmt: skip
        2: [step(0, 420 + mid), *recv(0, 1, 160 + mid), op("forward", 160 + mid, 100),
            op("aten::zero_", 260 + mid, 160)],
    }  # fmt: skip


#: A middle stage that sends to and receives from two peers in one step: forward from 0, to 2,
#: then the gradient back from 2 and to 0. Rank 2's backward (300 µs) holds the step.
TWO_PEERS = {
    0: [step(0, 900), op("forward", 0, 100), *send(100, 1, 132), *recv(132, 1, 800, tag=1),
        op("backward", 800, 100)],
    1: [step(0, 810), *recv(0, 0, 130), op("forward", 130, 100), *send(230, 2, 262),
        *recv(262, 2, 730, tag=1), op("backward", 730, 50), *send(780, 0, 800, tag=1)],
    2: [step(0, 860), *recv(0, 1, 260), op("forward", 260, 100), op("backward", 360, 300),
        *send(660, 1, 730, tag=1), op("aten::zero_", 730, 120)],
}  # fmt: skip


def test_each_receive_is_paired_with_the_send_of_the_same_ranks_tag_and_order(tmp_path):
    pairs = sends_and_receives(events_of(tmp_path, TWO_PEERS))
    assert pairs[["sender", "receiver", "tag", "index"]].values.tolist() == [
        [0, 1, 0, 0], [1, 2, 0, 0], [1, 0, 1, 0], [2, 1, 1, 0]
    ]  # fmt: skip
    assert pairs["received_us"].sub(pairs["posted_us"]).tolist() == [130, 260, 668, 468]


def test_a_trace_without_peers_pairs_nothing_and_says_what_to_record(tmp_path):
    events = events_of(tmp_path, {0: TWO_STAGES[0], 1: [step(0, 900), *recv(0, 0, 530, peers=False)]})  # fmt: skip
    with pytest.warns(UserWarning, match="record_shapes=True"):
        assert sends_and_receives(events).empty


def test_a_transfer_record_is_cut_to_the_wait_at_its_end(tmp_path):
    events = events_of(tmp_path, {0: [step(0, 900), *send(0, 1, 890), op("aten::mm", 20, 860)]})
    cut = waits_in_records(events)
    record = cut[(cut["name"] == "gloo:send").to_numpy()].iloc[0]
    # the send was under way while aten::mm ran (20-880): the thread waited 880-890
    assert (record["start_us"] - events["start_us"].min(), record["dur_us"]) == (880, 10)


@pytest.mark.parametrize(
    "ranks, expected",
    [
        pytest.param(TWO_STAGES, [[0, "work", "forward"], [0, "work", "c10d::send"],
                                  [0, "receive", "gloo:recv"], [1, "work", "forward"],
                                  [1, "work", "aten::zero_"]], id="two stages, one micro-batch"),
        pytest.param(slowed_middle(400), [[0, "work", "forward"], [0, "work", "c10d::send"],
                                          [0, "receive", "gloo:recv"], [1, "work", "forward"],
                                          [1, "work", "c10d::send"], [1, "receive", "gloo:recv"],
                                          [2, "work", "forward"], [2, "work", "aten::zero_"]],
                     id="three stages, the middle one slowed"),
        pytest.param(TWO_PEERS, [[0, "work", "forward"], [0, "work", "c10d::send"],
                                 [0, "receive", "gloo:recv"], [1, "work", "forward"],
                                 [1, "work", "c10d::send"], [1, "receive", "gloo:recv"],
                                 [2, "work", "forward"], [2, "work", "backward"],
                                 [2, "work", "c10d::send"], [2, "receive", "gloo:recv"],
                                 [1, "work", "backward"], [1, "work", "c10d::send"],
                                 [1, "receive", "gloo:recv"], [0, "work", "backward"]],
                     id="a middle stage with two peers"),
    ],
)  # fmt: skip
def test_the_path_follows_each_receive_to_the_stage_that_sent_it(tmp_path, ranks, expected):
    path = critical_path(events_of(tmp_path, ranks))
    seen = path[(path["dur_us"] > 0).to_numpy() & (path["reason"] != "untraced").to_numpy()]
    assert seen[["rank", "reason", "name"]].values.tolist() == expected


def test_a_receive_posted_after_its_send_holds_only_its_own_rank(tmp_path):
    # stage 1 computes 0-700 before it posts its receive: the send issued at 110 waited for it,
    # and the receive's wait (710-730) is its transfer, the rank's own time
    ranks = {
        0: [step(0, 740), op("forward", 0, 100), *send(100, 1, 735)],
        1: [step(0, 900), op("aten::mm", 0, 700), *recv(700, 0, 730), op("forward", 730, 170)],
    }  # fmt: skip
    path = critical_path(events_of(tmp_path, ranks))
    assert path[["rank", "reason", "name"]].values.tolist() == [
        [1, "work", "aten::mm"], [1, "work", "c10d::recv_"], [1, "work", "gloo:recv"],
        [1, "work", "forward"],
    ]  # fmt: skip


def test_a_receive_waited_for_after_other_work_keeps_that_work_on_the_path(tmp_path):
    # an irecv posted at 0, waited for only after 690 µs of work: the data (sent at 110) was there
    irecv = [op("c10d::recv_", 0, 10, **{"Concrete Inputs": ["", "", "0", "0"]}),
             op("gloo:recv", 8, 697, cat="user_annotation"), op("aten::mm", 10, 690)]  # fmt: skip
    ranks = {
        0: [step(0, 140), op("forward", 0, 100), *send(100, 1, 135)],
        1: [step(0, 900), *irecv, op("forward", 705, 195)],
    }  # fmt: skip
    path = critical_path(events_of(tmp_path, ranks))
    assert set(path["rank"]) == {1}
    assert path.loc[path["name"] == "aten::mm", "dur_us"].sum() == 690


def test_a_pair_whose_data_came_before_its_send_is_left_out_and_said(tmp_path):
    # rank 0's trace begins after its first send: its second send is paired with the first receive
    ranks = {
        0: [step(0, 900), *send(500, 1, 535)],
        1: [step(0, 900), *recv(0, 0, 100), *recv(200, 0, 530)],
    }  # fmt: skip
    with pytest.warns(UserWarning, match="had their data before the send"):
        assert sends_and_receives(events_of(tmp_path, ranks)).empty


def test_a_pair_whose_data_came_a_clock_skew_before_its_send_is_kept(tmp_path):
    # the receive's record ends 70 µs before the send's op began by the traces' clocks (seen in
    # a run of PyTorch's pipelining on gloo): two processes' clocks, not a shifted pair
    ranks = {
        0: [step(0, 900), *send(500, 1, 535)],
        1: [step(0, 900), *recv(200, 0, 430)],
    }  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pairs = sends_and_receives(events_of(tmp_path, ranks))
    assert pairs[["sender", "receiver"]].values.tolist() == [[0, 1]]
    assert (pairs["sent_us"] - pairs["received_us"]).tolist() == [80]  # the send's op ended at 510


def test_the_what_if_of_a_slowed_stage_predicts_the_stage_without_its_delay(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (tmp_path / "slowed").mkdir(), (tmp_path / "fast").mkdir()
        slowed = events_of(tmp_path / "slowed", slowed_middle(400))
        fast = events_of(tmp_path / "fast", slowed_middle(0))
    predicted = what_if(slowed, rank=1, name="^forward$", factor=0.2).iat[0]
    assert predicted == pytest.approx(step_times(fast).median(axis=1).iat[0])


def test_a_send_waited_for_at_the_steps_end_ends_sooner_when_the_work_before_it_does(tmp_path):
    # the data arrived (105) while rank 0's c10d::send still ran (100-110); rank 0 then works
    # (110-700) and waits for its send at the step's end: that wait followed the work, not the
    # send call, so without the slow op it ends 100 us sooner (a busy machine's slow send calls)
    ranks = {
        0: [step(0, 710), op("forward", 0, 100), *send(100, 1, 705), op("aten::mm", 110, 490),
            op("slow", 600, 100)],
        1: [step(0, 200), *recv(0, 0, 105), op("aten::zero_", 110, 90)],
    }  # fmt: skip
    events = events_of(tmp_path, ranks)
    assert what_if(events, rank=0, name="^slow$").iat[0] == pytest.approx((610 + 200) / 2 / 1e3)


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory) -> Path:
    """The traces of a real three-stage 1F1B pipeline on gloo (lesson 14's ``pipeline_job.py``),
    stage 1 slowed 20 ms in each of its 4 forwards (in ``slow_layer``), the stages' own work
    none, 2 steps recorded."""
    folder = tmp_path_factory.mktemp("pipeline")
    script_from_lesson("pipeline_job.py", "14_pipelines.ipynb", dest=folder)
    args = ["--steps", "4", "--microbatches", "4", "--slow-rank", "1", "--delay-ms", "20",
            "--delay-name", "slow_layer", "--work-ms", "0"]  # fmt: skip
    run = launch(folder / "pipeline_job.py", 3, args=args, traces_root=folder, echo=False)
    return run.run_dir


@pytest.fixture(scope="module")
def pipeline(pipeline_run) -> pd.DataFrame:
    return load_run(pipeline_run, cache=False).events


@pytest.mark.slow
def test_every_send_of_a_real_pipeline_is_paired_with_its_receive(pipeline):
    pairs = sends_and_receives(pipeline)
    # per step, each of 4 micro-batches crosses 2 stage boundaries forward and 2 backward
    assert len(pairs) == 2 * 4 * 4
    assert (pairs["receive_record"] >= 0).all() and (pairs["send_record"] >= 0).all()


@pytest.mark.slow
def test_the_path_of_a_real_pipeline_puts_the_delay_on_the_slowed_stage(pipeline):
    path = critical_path(pipeline)
    slow = pipeline[(pipeline["rank"] == 1).to_numpy() & (pipeline["name"] == "slow_layer").to_numpy()]  # fmt: skip
    on_path = path[(path["rank"] == 1).to_numpy() & (path["name"] == "slow_layer").to_numpy()]
    # the slowed forwards hold every stage after them and every stage waits for them: all of
    # it lies on the path (100 % in every run measured; 80 % leaves room for a descheduled rank)
    assert on_path["dur_us"].sum() >= 0.8 * slow["dur_us"].sum()


def test_sends_and_receives_are_no_collective_that_some_rank_never_joined(tmp_path):
    assert unmatched_collectives(events_of(tmp_path, TWO_PEERS)).empty


def test_each_stage_waits_for_the_others_in_its_sends_and_receives_waits(tmp_path):
    waits = stage_waits(events_of(tmp_path, TWO_PEERS)).set_index("rank")
    # rank 0: its send 110-132, its receive 142-800; rank 1: 10-130, 240-262, 272-730, 790-800;
    # rank 2: 10-260, 670-730
    assert waits["waiting_ms"].round(3).to_dict() == {0: 0.680, 1: 0.610, 2: 0.310}
    assert waits[["sends", "receives"]].values.tolist() == [[1, 1], [2, 2], [1, 1]]


def test_sends_and_receives_are_no_collective_whose_waits_are_measured(tmp_path):
    assert collective_waits(events_of(tmp_path, TWO_PEERS)).empty


@pytest.mark.slow
def test_the_report_names_the_slowed_stage_as_the_one_the_others_wait_for(pipeline_run):
    section = build_report(pipeline_run).section("A pipeline's stages")
    assert "Rank 1 waits least" in section.text
    assert section.table["sends per step"].tolist() == [4, 8, 4]


@pytest.mark.slow
def test_a_pipeline_read_rank_by_rank_has_the_path_of_the_pipeline_read_whole(pipeline_run):
    by_rank = build_report(pipeline_run, whole_limit_mb=0)
    assert by_rank.read == "rank by rank"
    held = "What held the steps, what to fix first"
    whole = build_report(pipeline_run).section(held).table
    pd.testing.assert_frame_equal(by_rank.section(held).table, whole)
