"""Sharded training's phases (lesson 10), as a specification.

``fsdp_phases`` is checked against lesson 10's own sharded run, replayed from ``recordings/``:
its rows are FSDP's annotations as the raw JSON holds them, counted and timed here by hand, and
the compute phases it derives are the gaps between a unit's annotations. Small hand-written
traces pin down the CPU rule of ``communication_overlap`` that lesson 10 relies on.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from conftest import BASE_NS, write_doc
from helpers import (
    ROOT_UNIT,
    communication_overlap,
    fsdp_collectives,
    fsdp_phases,
    load_run,
    load_trace,
    plot_fsdp_phases,
    step_times,
)
from helpers.traces import run_files

BLOCKS = [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]


@pytest.fixture(scope="module")
def sharded(lesson_run):
    """Lesson 10's sharded run: its events, its phases and its raw trace files, by rank."""
    run = lesson_run("fsdp")
    events = load_run(run).events
    files = {
        int(re.match(r"rank(\d+)", path.name).group(1)): json.loads(path.read_text())
        for path, _ in run_files(run)[0]
    }
    assert sorted(files) == [0, 1]
    return events, fsdp_phases(events), files


def raw_steps(doc: dict) -> dict[int, tuple[float, float]]:
    """ProfilerStep#N -> (ts, ts + dur) in the file's own microseconds."""
    return {
        int(e["name"].split("#")[1]): (e["ts"], e["ts"] + e["dur"])
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")
    }


def raw_annotations(doc: dict, what: str, step: tuple[float, float]) -> list[dict]:
    """The events ``FSDP::<what>`` or ``FSDP::<what> (unit)`` that start inside ``step``."""
    pattern = re.compile(rf"^FSDP::{what}(?: \((.*)\))?$")
    return [
        e
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and pattern.match(e.get("name", "")) and step[0] <= e["ts"] < step[1]
    ]


def unit_of(event: dict) -> str:
    found = re.search(r" \((.*)\)$", event["name"])
    return found.group(1) if found else ROOT_UNIT


def test_every_all_gather_annotation_of_the_raw_json_is_one_all_gather_row_of_the_same_length(
    sharded,
):
    _, phases, files = sharded
    for rank, doc in files.items():
        for step, span in raw_steps(doc).items():
            raw = raw_annotations(doc, "all_gather", span)
            rows = phases[
                (phases["rank"] == rank)
                & (phases["step"] == step)
                & (phases["phase"] == "all-gather")
            ]
            assert Counter(map(unit_of, raw)) == Counter(rows["unit"])
            assert sorted(rows["ms"] * 1e3) == pytest.approx(sorted(e["dur"] for e in raw), abs=0.5)


def test_a_sharded_step_gathers_every_unit_in_forward_and_all_but_the_root_again_in_backward(
    sharded,
):
    _, phases, _ = sharded
    gathers = phases[phases["phase"] == "all-gather"].groupby(["rank", "step"])["unit"]
    for _, units in gathers:
        assert Counter(units) == Counter({ROOT_UNIT: 1, **{b: 2 for b in BLOCKS}})


def test_every_unit_reduce_scatters_its_gradients_once_per_step(sharded):
    _, phases, _ = sharded
    reduces = phases[phases["phase"] == "reduce-scatter"].groupby(["rank", "step"])["unit"]
    for _, units in reduces:
        assert sorted(units) == sorted([ROOT_UNIT, *BLOCKS])


def test_a_blocks_forward_runs_from_the_end_of_its_pre_forward_to_the_start_of_its_post_forward(
    sharded,
):
    _, phases, files = sharded
    doc = files[0]
    for step, span in raw_steps(doc).items():
        (pre,) = [e for e in raw_annotations(doc, "pre_forward", span) if unit_of(e) == "layer1.0"]
        (post,) = [
            e for e in raw_annotations(doc, "post_forward", span) if unit_of(e) == "layer1.0"
        ]
        by_hand_ms = (post["ts"] - (pre["ts"] + pre["dur"])) / 1e3
        mine = phases[(phases["rank"] == 0) & (phases["step"] == step)]
        (row,) = mine.query("unit == 'layer1.0' and phase == 'forward'")["ms"]
        assert row == pytest.approx(by_hand_ms, abs=1e-3)


def test_the_roots_compute_leaves_out_the_time_of_the_units_nested_in_it(sharded):
    _, phases, _ = sharded
    for (rank, step), mine in phases.groupby(["rank", "step"]):
        root = mine[(mine["unit"] == ROOT_UNIT) & mine["phase"].isin(["forward", "backward"])]
        blocks = mine[mine["unit"] != ROOT_UNIT]
        for _, part in root.iterrows():
            inside = blocks[
                (blocks["start_us"] < part["end_us"]) & (blocks["end_us"] > part["start_us"])
            ]
            assert inside.empty, f"rank {rank} step {step}: root computes during {inside}"


def test_the_phases_cover_nearly_all_of_a_sharded_step(sharded):
    events, phases, _ = sharded
    covered = phases.groupby(["rank", "step"])["ms"].sum()
    steps = step_times(events).stack().swaplevel().sort_index()
    share = covered / steps.reindex(covered.index)
    assert (share > 0.9).all(), share


def test_every_collective_of_a_sharded_step_belongs_to_a_units_all_gather_or_reduce_scatter(
    sharded,
):
    events, phases, _ = sharded
    collectives = fsdp_collectives(events, phases)
    assert collectives["unit"].notna().all()
    carried = collectives.groupby("phase")["name"].unique().map(sorted).to_dict()
    assert carried == {"all-gather": ["gloo:all_gather"], "reduce-scatter": ["gloo:all_reduce"]}
    per_step = collectives.groupby(["rank", "step", "unit"]).size()
    assert (per_step.xs(ROOT_UNIT, level="unit") == 2).all()  # gathered once, reduced once
    assert (per_step.drop(ROOT_UNIT, level="unit") == 3).all()  # gathered twice, reduced once


def test_a_run_without_fsdp_has_no_phases(lesson_run):
    phases = fsdp_phases(load_run(lesson_run("fsdp-ddp")).events)
    assert phases.empty
    assert list(phases.columns) == ["rank", "step", "unit", "phase", "start_us", "end_us", "ms"]


def test_the_phase_plot_has_a_row_per_unit_of_each_rank_and_a_legend_of_the_phases(sharded):
    _, phases, _ = sharded
    step = int(phases["step"].max())
    ax = plot_fsdp_phases(phases, step).axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == 2 * 9
    assert labels[0] == f"rank 0 · {ROOT_UNIT}"
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {
        "all-gather",
        "copy-out",
        "forward",
        "backward",
        "reshard",
        "reduce-scatter",
    }


def test_the_phase_plot_names_the_steps_there_are_when_asked_for_another(sharded):
    _, phases, _ = sharded
    with pytest.raises(ValueError, match=r"no FSDP phases in step 99: steps here are \[2, 3\]"):
        plot_fsdp_phases(phases, 99)


# ------------------------------------------------- what counts as computation on a CPU trace

MAIN, GLOO = 100, 200


def cpu_trace(tmp_path: Path, events: list[tuple[int, str, str, float, float]]) -> pd.DataFrame:
    """One rank's trace of ``(tid, cat, name, ts, dur)`` events in a step from 0 to 1000 µs."""
    rows = [(MAIN, "user_annotation", "ProfilerStep#1", 0.0, 1000.0), *events]
    doc = {
        "distributedInfo": {"rank": 0, "world_size": 2, "backend": "gloo"},
        "baseTimeNanoseconds": BASE_NS,
        "traceEvents": [
            {"ph": "X", "pid": MAIN, "tid": tid, "cat": cat, "name": name, "ts": ts, "dur": dur}
            for tid, cat, name, ts, dur in rows
        ],
    }
    return load_trace(write_doc(tmp_path / "rank0.json", doc)).events


def hidden_share(events: pd.DataFrame) -> float:
    table = communication_overlap(events, r"^gloo:")
    return float(table["overlapped_ms"].sum() / table["comm_ms"].sum())


def test_an_op_of_the_main_thread_during_a_collective_hides_it(tmp_path):
    events = cpu_trace(
        tmp_path,
        [
            (GLOO, "user_annotation", "gloo:all_reduce", 100, 200),
            (MAIN, "cpu_op", "aten::mm", 200, 200),
        ],
    )
    assert hidden_share(events) == pytest.approx(0.5)


def test_the_ops_on_the_collectives_own_thread_are_not_computation(tmp_path):
    events = cpu_trace(
        tmp_path,
        [
            (GLOO, "user_annotation", "gloo:all_reduce", 100, 200),
            (GLOO, "cpu_op", "aten::add", 120, 60),
        ],
    )
    assert hidden_share(events) == 0.0


def test_an_op_that_encloses_an_annotation_is_not_computation(tmp_path):
    evaluate = "autograd::engine::evaluate_function: PostBackwardFunctionBackward"
    events = cpu_trace(
        tmp_path,
        [
            (MAIN, "cpu_op", evaluate, 500, 400),
            (MAIN, "user_annotation", "FSDP::all_gather (layer1)", 550, 300),
            (GLOO, "user_annotation", "gloo:all_gather", 600, 200),
        ],
    )
    assert hidden_share(events) == 0.0
