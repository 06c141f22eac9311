"""Timelines (rows, colours, zoom) and the summaries later lessons reuse."""

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_hex

from conftest import complete_event, trace_doc, write_doc
from helpers.analysis import (
    busy_ms,
    clock_offsets,
    collective_waits,
    enclosure,
    find_straggler,
    max_parallel_lanes,
    shift_ranks,
    step_times,
    time_per_kind,
    top_ops,
    waiting_per_step,
)
from helpers.analysis.intervals import busy_ms_per_group, uncovered_parts
from helpers.drawing import COLLAPSED_COMMUNICATION, plot_rank_timeline
from helpers.traces import load_run, load_trace
from helpers.traces.kinds import KIND_COLORS


def collections_by_colour(fig):
    ax = fig.axes[0]
    return {
        to_hex(c.get_facecolor()[0]): c for c in ax.collections if isinstance(c, PolyCollection)
    }


def test_timeline_has_one_row_per_rank_and_colours_by_kind(two_ranks, tmp_path):
    fig = plot_rank_timeline(two_ranks)
    fig.savefig(tmp_path / "timeline.png", dpi=60)

    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]
    colours = collections_by_colour(fig)
    assert set(colours) == {KIND_COLORS[k] for k in ("step", "compute", "communication")}
    assert len(colours[KIND_COLORS["communication"]].get_paths()) == 6
    assert (tmp_path / "timeline.png").stat().st_size > 1000
    assert ax.get_xlabel().endswith("(ms)")


def test_timeline_lanes_split_each_rank_by_thread(two_ranks):
    fig = plot_rank_timeline(two_ranks, lanes=True)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == [
        "rank 0 · thread 100",
        "rank 0 · thread 101 (pt_gloo_runloop)",
        "rank 1 · thread 200",
        "rank 1 · thread 201 (pt_gloo_runloop)",
    ]


def test_timeline_zooms_to_one_step(two_ranks):
    fig = plot_rank_timeline(two_ranks, step=2)
    lo, hi = fig.axes[0].get_xlim()
    assert lo == pytest.approx(1.0) and hi == pytest.approx(1.92)
    comm = collections_by_colour(fig)[KIND_COLORS["communication"]]
    assert len(comm.get_paths()) == 2  # one all_reduce per rank in step 2


def test_timeline_of_an_unknown_step_says_which_exist(two_ranks):
    with pytest.raises(ValueError, match=r"step=9.*\[1, 2, 3\]"):
        plot_rank_timeline(two_ranks, step=9)


def test_timeline_draws_a_real_gpu_trace_with_stream_lanes(real_traces, tmp_path):
    events = load_run(sorted((real_traces / "hta" / "trace_filter").glob("*.json.gz"))).events
    fig = plot_rank_timeline(events, lanes=True, window=(0, 2000))
    fig.savefig(tmp_path / "gpu.png", dpi=50)

    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert sum("GPU 0 stream" in s for s in labels) == 5
    assert KIND_COLORS["gpu kernel"] in collections_by_colour(fig)


def test_busy_time_counts_overlaps_once():
    assert busy_ms([0, 500, 2000], [1000, 1500, 2500]) == pytest.approx(2.0)
    assert busy_ms([], []) == 0.0


@pytest.mark.parametrize(
    "holes, parts",
    [
        ([], [(0, 10)]),
        ([(2, 4)], [(0, 2), (4, 10)]),
        ([(3, 6), (2, 4)], [(0, 2), (6, 10)]),
        ([(-5, 1), (9, 20)], [(1, 9)]),
        ([(0, 10)], []),
        ([(20, 30)], [(0, 10)]),
    ],
    ids=["no hole", "one hole", "overlapping holes", "holes past both ends", "all", "outside"],
)
def test_uncovered_parts_are_the_interval_minus_its_holes(holes, parts):
    assert uncovered_parts(0, 10, holes) == parts


def test_busy_time_per_group_is_busy_time_of_each_group():
    rng = np.random.default_rng(0)
    n = 400
    frame = pd.DataFrame(
        {
            "rank": pd.array(rng.integers(0, 3, n), dtype="Int64"),
            "kind": pd.Categorical(rng.choice(["compute", "communication"], n)),
            "start_us": rng.uniform(0, 1000, n).round(),
        }
    )
    frame["end_us"] = frame["start_us"] + rng.uniform(0, 50, n).round()
    frame.loc[:4, "rank"] = pd.NA  # a row with a missing key is in no group
    per_group = busy_ms_per_group(frame, ["rank", "kind"])
    expected = frame.groupby(["rank", "kind"], observed=True).apply(
        lambda g: busy_ms(g["start_us"], g["end_us"])
    )
    pd.testing.assert_series_equal(per_group, expected, check_names=False)
    assert busy_ms_per_group(frame[frame["rank"].isna()], ["rank"]).empty


def test_step_times_are_per_step_and_rank(two_ranks):
    table = step_times(two_ranks)
    assert list(table.index) == [1, 2, 3] and list(table.columns) == [0, 1]
    assert (table == 0.9).all().all()


def test_time_per_kind_is_wall_time_per_rank(two_ranks):
    table = time_per_kind(two_ranks)
    assert table.loc[0, "communication"] == pytest.approx(0.6)  # 3 x 200 µs
    assert table.loc[1, "communication"] == pytest.approx(0.75)  # 3 x 250 µs
    assert table.loc[0, "compute"] == pytest.approx(0.9)


def test_top_ops_lists_the_heaviest_ops_per_rank(two_ranks):
    table = top_ops(two_ranks, n=5)
    assert list(table["rank"]) == [0, 1]
    assert list(table["name"]) == ["aten::mm", "aten::mm"]
    assert list(table["calls"]) == [3, 3]


def _straggler_events(tmp_path, slow_rank: int = 1, delay_us: float = 300.0):
    """Two ranks, three steps; the slow rank reaches each all_reduce ``delay_us`` late."""
    for rank in (0, 1):
        pid, events = 100 + rank, []
        for step in range(3):
            t = step * 2000.0
            arrive = t + 500 + (delay_us if rank == slow_rank else 0)
            end = t + 500 + delay_us + 100  # everyone leaves together
            annotation = {"cat": "user_annotation", "pid": pid}
            events += [
                complete_event(f"ProfilerStep#{step + 1}", t, 1900.0, tid=pid, **annotation),
                # two overlapping collectives on two gloo threads: waiting counts once
                complete_event("gloo:all_reduce", arrive, end - arrive, tid=pid + 10, **annotation),
                complete_event("gloo:broadcast", arrive, end - arrive, tid=pid + 11, **annotation),
            ]
        write_doc(tmp_path / f"rank{rank}.json", trace_doc(events, rank, 2, backend="gloo"))
    return load_run(tmp_path, cache=False).events


def test_collective_waits_take_the_shortest_duration_as_the_transfer(tmp_path):
    waits = collective_waits(_straggler_events(tmp_path))
    assert set(waits["transfer_us"]) == {100.0}
    assert set(waits.loc[waits["rank"] == 0, "wait_us"]) == {300.0}
    assert set(waits.loc[waits["rank"] == 1, "wait_us"]) == {0.0}


def test_waiting_per_step_counts_overlapping_collectives_once(tmp_path):
    table = waiting_per_step(_straggler_events(tmp_path))
    assert list(table.index) == [1, 2, 3]
    assert list(table[0]) == pytest.approx([0.3, 0.3, 0.3])  # 300 µs each, not 600 µs
    assert (table[1] == 0).all()


def test_the_straggler_is_the_rank_that_waits_least(tmp_path):
    assert find_straggler(_straggler_events(tmp_path, slow_rank=0)) == 0


def test_a_run_without_steps_cannot_name_a_straggler(two_ranks):
    no_steps = two_ranks.assign(step=pd.array([pd.NA] * len(two_ranks), dtype="Int32"))
    with pytest.raises(ValueError, match="straggler"):
        find_straggler(no_steps)


def test_max_parallel_lanes_counts_lanes_busy_at_once():
    events = pd.DataFrame(
        {
            "rank": [1] * 5,
            "lane": ["a", "a", "b", "c", "d"],
            "start_us": [
                0.0,
                10.0,
                5.0,
                50.0,
                100.0,
            ],  # a: 0-30 (nested), b: 5-20, c: 50-60, d: 100-110
            "end_us": [30.0, 20.0, 20.0, 60.0, 110.0],
        }
    )
    assert max_parallel_lanes(events) == 2
    touching = pd.DataFrame(
        {"rank": [0, 0], "lane": ["a", "b"], "start_us": [0.0, 10.0], "end_us": [10.0, 20.0]}
    )
    assert max_parallel_lanes(touching) == 1
    assert max_parallel_lanes(touching.iloc[:0]) == 0


def test_clock_offsets_recover_a_shifted_node_from_the_ends_of_collectives(tmp_path):
    events = _straggler_events(tmp_path)  # both ranks leave each collective together
    nodes = {0: [0], 1: [1]}
    assert clock_offsets(events, nodes) == {0: 0.0, 1: 0.0}
    assert clock_offsets(shift_ranks(events, [1], 7000.0), nodes)[1] == pytest.approx(7000.0)


# ------------------------------------------------------------ what the figures show


def _bars_at(fig, colour: str) -> list[tuple[float, float, float, float]]:
    """``(x0, x1, y0, y1)`` of every bar of one colour."""
    bars = []
    for c in fig.axes[0].collections:
        if isinstance(c, PolyCollection) and to_hex(c.get_facecolor()[0]) == colour:
            for path in c.get_paths():
                xs, ys = path.vertices[:, 0], path.vertices[:, 1]
                bars.append((xs.min(), xs.max(), ys.min(), ys.max()))
    return bars


def _row_top(fig, label: str) -> float:
    ax = fig.axes[0]
    ticks = dict(zip([t.get_text() for t in ax.get_yticklabels()], ax.get_yticks()))
    return ticks[label] - 0.4


def legacy_rpc_trace(path):
    """A trace as torch.autograd.profiler_legacy exports it for an RPC: a bare list, no
    categories, remote events on lanes named ``node_id:1, thread_id:N``."""
    import json

    caller = {"pid": "CPU functions", "tid": 1, "cat": None, "ph": "X"}
    remote = {"pid": "CPU functions", "tid": " node_id:1, thread_id:4 ", "cat": None, "ph": "X"}
    events = [
        dict(caller, name="rpc_async#udf(worker0 -> worker1)", ts=0.0, dur=1000.0),
        dict(
            remote,
            name="rpc_async#udf(worker0 -> worker1)#remote_op: server: call 0",
            ts=100.0,
            dur=700.0,
        ),
        dict(
            remote,
            name="rpc_async#udf(worker0 -> worker1)#remote_op: aten::mul",
            ts=750.0,
            dur=40.0,
        ),
    ]
    path.write_text(json.dumps(events))
    return path


def test_the_legacy_rpc_timeline_draws_the_remote_ops_on_a_node_1_row(tmp_path):
    from helpers.analysis import by_rpc_node

    events = by_rpc_node(load_trace(legacy_rpc_trace(tmp_path / "legacy.json")).events)
    fig = plot_rank_timeline(events, row_label="node", lanes=True)

    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["node 0 · thread 1", "node 1 · thread 4"]
    node1 = _row_top(fig, labels[1])
    remote_compute = [b for b in _bars_at(fig, KIND_COLORS["compute"]) if b[2] >= node1 - 1e-9]
    remote_annotation = [
        b for b in _bars_at(fig, KIND_COLORS["annotation"]) if b[2] >= node1 - 1e-9
    ]
    assert len(remote_compute) == 1 and len(remote_annotation) == 1
    assert _bars_at(fig, KIND_COLORS["communication"])[0][3] <= node1  # the call: node 0's row


def test_a_collapsed_row_draws_communication_low_so_overlapping_compute_shows(tmp_path, write):
    doc = trace_doc(
        [
            complete_event("aten::convolution_backward", 0, 1000),
            complete_event("gloo:all_reduce", 200, 600, cat="user_annotation", tid=2),
        ]
    )
    fig = plot_rank_timeline(load_trace(write(tmp_path / "r.json", doc)).events)

    ((cx0, cx1, cy0, cy1),) = _bars_at(fig, KIND_COLORS["compute"])
    ((mx0, mx1, my0, my1),) = _bars_at(fig, KIND_COLORS["communication"])
    assert my1 == pytest.approx(cy1) and (my1 - my0) == pytest.approx(0.8 * COLLAPSED_COMMUNICATION)
    assert cy0 < my0  # the compute underneath still shows above it


def test_rows_are_grouped_and_labelled_by_node(two_ranks):
    fig = plot_rank_timeline(two_ranks, nodes={0: [1], 1: [0]})
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["node 0 · rank 1", "node 1 · rank 0"]


def test_steps_are_drawn_with_a_tick_where_each_one_begins(two_ranks):
    from matplotlib.collections import LineCollection

    from helpers.drawing import STEP_TICK

    fig = plot_rank_timeline(two_ranks)
    steps = next(
        c
        for c in fig.axes[0].collections
        if isinstance(c, PolyCollection) and to_hex(c.get_facecolor()[0]) == KIND_COLORS["step"]
    )
    assert len(steps.get_paths()) == 6  # three steps on each rank, none joined
    ticks = next(
        c
        for c in fig.axes[0].collections
        if isinstance(c, LineCollection) and to_hex(c.get_color()[0]) == STEP_TICK
    )
    starts = sorted(round(seg[0][0], 3) for seg in ticks.get_segments())
    assert starts == sorted(
        round(x, 3) for x in two_ranks.loc[two_ranks["kind"] == "step", "rel_us"] / 1e3
    )


def test_a_minimum_width_makes_short_events_visible_and_the_axis_says_so(tmp_path):
    from helpers.analysis import by_rpc_node

    events = by_rpc_node(load_trace(legacy_rpc_trace(tmp_path / "legacy.json")).events)
    true_width = plot_rank_timeline(events, row_label="node", lanes=True)
    ((x0, x1, _, _),) = _bars_at(true_width, KIND_COLORS["compute"])
    assert x1 - x0 == pytest.approx(0.04)  # the remote aten::mul: 40 µs
    assert true_width.axes[0].get_xlabel() == "time since the run's first event (ms)"

    widened = plot_rank_timeline(events, row_label="node", lanes=True, min_width_ms=0.2)
    ((w0, w1, _, _),) = _bars_at(widened, KIND_COLORS["compute"])
    assert (w0, w1) == pytest.approx((x0, x0 + 0.2))  # starts where it starts, 0.2 ms wide
    ((c0, c1, _, _),) = _bars_at(widened, KIND_COLORS["communication"])
    assert (c0, c1) == pytest.approx((0.0, 1.0))  # bars wider than the minimum keep their width
    assert "shorter than 0.2 ms are drawn 0.2 ms wide" in widened.axes[0].get_xlabel()


def test_a_widened_bar_at_the_end_stays_inside_the_axis(tmp_path, write):
    doc = trace_doc([complete_event("aten::mm", 0, 900), complete_event("aten::add", 990, 10)])
    fig = plot_rank_timeline(load_trace(write(tmp_path / "r.json", doc)).events, min_width_ms=0.1)
    assert fig.axes[0].get_xlim()[1] == pytest.approx(1.09)


def test_names_are_matched_on_the_categorical_and_on_text_alike(two_ranks):
    import re

    from helpers.traces.kinds import event_names, name_matches

    assert isinstance(two_ranks["name"].dtype, pd.CategoricalDtype)  # what the loader gives
    names = event_names(two_ranks)
    assert names.index.equals(two_ranks.index) and all(isinstance(n, str) for n in names)
    as_text = two_ranks.assign(name=names.astype(object))
    for pattern in (r"^ProfilerStep#\d+$", "gloo:", "no event has this name"):
        expected = [re.search(pattern, n) is not None for n in names]
        assert name_matches(two_ranks, pattern).tolist() == expected
        assert name_matches(as_text, pattern).tolist() == expected
    missing = pd.DataFrame({"name": pd.Categorical([None, "gloo:all_reduce"])})
    assert name_matches(missing, ".*").tolist() == [False, True]


def test_the_summaries_give_names_as_text(two_ranks):
    for table in (top_ops(two_ranks, kind=None), collective_waits(two_ranks)):
        assert len(table) and table["name"].map(type).eq(str).all()


def test_profiling_cost_gives_a_slowdown_per_workload_and_setting():
    from torch.profiler import ProfilerActivity

    from helpers.analysis import profiling_cost

    settings = {"no profiler": None, "profiler": {}}
    cost = profiling_cost(
        {"a": (lambda: None, 3), "b": (lambda: None, 3)},
        settings,
        [ProfilerActivity.CPU],
        "cpu",
        rounds=2,
    )
    assert list(cost.columns) == ["workload", "setting", "slowdown"]
    assert list(zip(cost["workload"], cost["setting"])) == [(w, s) for w in "ab" for s in settings]
    assert (cost.loc[cost["setting"] == "no profiler", "slowdown"] == 1.0).all()
    assert (cost["slowdown"] > 0).all()


def test_profiling_cost_runs_on_one_thread_and_gives_torchs_threads_back():
    import torch
    from torch.profiler import ProfilerActivity

    from helpers.analysis import profiling_cost

    seen, before = [], torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        profiling_cost(
            {"a": (lambda: seen.append(torch.get_num_threads()), 2)},
            {"no profiler": None, "profiler": {}},
            [ProfilerActivity.CPU],
            "cpu",
            rounds=1,
        )
        assert set(seen) == {1} and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------ RPC calls and their work


def test_rpc_calls_name_each_call_and_what_it_caused_remotely(tmp_path):
    from helpers import by_rpc_node, rpc_calls

    events = rpc_calls(by_rpc_node(load_trace(legacy_rpc_trace(tmp_path / "legacy.json")).events))
    by_name = events.set_index(events["name"].astype(str))
    call = by_name.loc["rpc_async#udf(worker0 -> worker1)"]
    assert (call["call"], call["rank"], call["lane"]) == ("udf", 0, "call udf")
    assert pd.isna(call["remote_op"])
    ran = by_name.loc["rpc_async#udf(worker0 -> worker1)#remote_op: aten::mul"]
    assert (ran["call"], ran["remote_op"], ran["rank"]) == ("udf", "aten::mul", 1)
    assert ran["lane"] == "thread 4"


def test_calls_of_one_function_get_a_numbered_lane_each_and_other_events_keep_theirs():
    from helpers import rpc_calls

    events = pd.DataFrame(
        {
            "rank": [0, 0, 0, 0],
            "name": [
                "rpc_async#f(a -> b)",
                "rpc_async#f(a -> b)",
                "rpc_remote#g(a -> b)",
                "to_here",
            ],
            "lane": ["main"] * 4,
            "start_us": [10.0, 0.0, 20.0, 30.0],
        }
    )
    lanes = list(rpc_calls(events)["lane"].astype(str))
    assert lanes == ["call f (2)", "call f (1)", "call g", "main"]


def test_enclosure_pairs_each_call_with_its_work_and_says_whether_it_lies_inside():
    calls = pd.DataFrame({"key": ["a", "b", "c"], "rel_us": [0.0, 0.0, 0.0], "dur_us": [1e3] * 3})
    work = pd.DataFrame(
        {"key": ["a", "b", "b", "d"], "rel_us": [100.0, 900.0, 950.0, 0.0], "dur_us": [50.0] * 4}
    )
    table = enclosure(calls, work, on="key")
    assert list(table["key"]) == ["a"]  # b ran twice (no single pair), c and d have no partner
    assert table.loc[0, "inside"]
    late = enclosure(calls, work.assign(rel_us=[980.0, 0, 0, 0]), on="key")
    assert not late.loc[0, "inside"]  # the work ends at 1.03 ms, after its call's 1.0 ms


# ------------------------------------------------------------------ figures of later lessons


def test_the_launch_lag_figure_shades_each_steps_gpu_work_like_the_step(write, kineto, tmp_path):
    from helpers import plot_launch_lag

    doc = kineto(0, backend="nccl")  # steps at 0 and 1000 µs
    doc["traceEvents"] += [
        complete_event("cudaLaunchKernel", 20.0, 5, cat="cuda_runtime", pid=100, tid=100, correlation=7),
        complete_event("gemm", 1100.0, 300, cat="kernel", pid=0, tid=7, correlation=7, stream=7),
    ]  # fmt: skip
    fig = plot_launch_lag(load_trace(write(tmp_path / "rank0.json", doc)).events)
    ax = fig.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [f"step {s} and the GPU work it launched" for s in (1, 2)]
    gpu_bars = [c for c in ax.collections if c.get_paths()[0].get_extents().y0 < 1]
    assert gpu_bars, "the kernel is drawn on the GPU row"
    assert any("not in this trace" in t.get_text() for t in ax.texts), "the blank is explained"


def test_the_launch_lag_figure_wants_one_rank(two_ranks):
    from helpers import plot_launch_lag

    with pytest.raises(ValueError, match="one rank"):
        plot_launch_lag(two_ranks)


def test_stacked_timelines_span_the_same_time_so_widths_compare(two_ranks):
    from helpers import plot_timelines

    short = two_ranks[two_ranks["step"] == 1]
    fig = plot_timelines({"one step": short, "three steps": two_ranks}, pad_ms=1.0)
    spans = [ax.get_xlim()[1] - ax.get_xlim()[0] for ax in fig.axes if ax.get_title()]
    assert len(spans) == 2 and spans[0] == pytest.approx(spans[1])
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["one step", "three steps"]


def test_a_figure_is_shown_with_its_alternative_text_and_closed(monkeypatch, two_ranks):
    import matplotlib.pyplot as plt

    import helpers.drawing.show as show

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, metadata: shown.append(metadata))
    fig = plot_rank_timeline(two_ranks)
    show.show_figure(fig, "Two ranks,\n three steps each.")
    assert shown == [{"image/png": {"alt": "Two ranks, three steps each."}}]
    assert not plt.fignum_exists(fig.number)
    with pytest.raises(ValueError, match="what the figure shows"):
        show.show_figure(fig, "  ")
