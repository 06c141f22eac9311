"""The trace layer: real traces from other people's jobs, synthetic ones, and every bad input."""

import gzip
import json

import pandas as pd
import pytest

from conftest import complete_event, trace_doc, write_doc
from helpers.analysis import shift_ranks
from helpers.traces import (
    DifferentRuns,
    TraceError,
    TraceWarning,
    distributed_info,
    gather_traces,
    load_run,
    load_trace,
    merge_traces,
)

# ---------------------------------------------------------------- real traces


def test_gpu_traces_of_two_ranks_load_with_kernels_streams_and_one_time_axis(
    real_traces, complete_events
):
    files = sorted((real_traces / "hta" / "trace_filter").glob("*.json.gz"))
    run = load_run(files)

    ev = run.events
    assert run.ranks == [0, 1]
    for rank, path in enumerate(files):
        assert (ev["rank"] == rank).sum() == len(complete_events(path))
    kernels = ev[ev["kind"] == "gpu kernel"]
    assert len(kernels) > 1000 and kernels["lane"].astype(str).str.startswith("GPU").all()
    assert kernels["stream"].notna().all()
    assert ev["start_us"].is_monotonic_increasing
    assert ev["rel_us"].min() == 0.0
    assert ev["start_us"].min() == pytest.approx(1682725897226747, abs=1)  # old format: epoch µs
    assert run.headers[0].backend == "nccl" and run.headers[0].world_size == 128


def test_nanosecond_trace_keeps_fractional_microseconds_and_every_event(
    real_traces, complete_events
):
    path = next((real_traces / "hta" / "ns_resolution_trace").glob("*.json.gz"))
    trace = load_trace(path)

    assert len(trace.events) == len(complete_events(path)) == 45420
    assert (trace.events["start_us"] % 1 != 0).any()
    assert set(trace.events["step"].dropna().unique()) == {101, 102, 103, 104, 105}
    assert {"broadcast", "allreduce"} <= set(trace.events["collective"].dropna().astype(str))
    assert (trace.events["end_us"] >= trace.events["start_us"]).all()


def test_gloo_cpu_trace_of_rank_34_uses_base_time_and_finds_collectives(real_traces):
    path = next((real_traces / "hta" / "cpu_only").glob("*.json.gz"))
    trace = load_trace(path)

    assert trace.header.rank == 34 and trace.header.world_size == 300
    assert trace.header.backend == "gloo" and trace.header.base_time_ns == 1719853884000000000
    comm = trace.events[trace.events["kind"] == "communication"]
    assert len(comm) == 10 and set(comm["name"].astype(str)) == {"gloo:all_reduce"}
    assert comm["lane"].nunique() == 2  # two gloo threads
    first = trace.events["start_us"].min()
    assert first == pytest.approx(1719853884000000 + 1212075525586.016, abs=0.01)


def test_trace_with_minimal_header_gets_its_rank_from_distributed_info(real_traces):
    trace = load_trace(real_traces / "hta" / "rank_non_gpu" / "rank_non_gpu.json.gz")

    assert trace.header.rank == 0 and trace.header.rank_source == "distributedInfo"
    assert len(trace.events) == 2467 and trace.header.base_time_ns is None


def test_a_single_trace_that_does_not_say_its_rank_loads_as_rank_0_and_says_it_was_assumed(
    real_traces,
):
    path = (
        real_traces / "hta" / "distributed_info_unavailable" / "distributed_info_not_found.json.gz"
    )
    trace = load_trace(path)

    assert trace.header.rank == 0 and trace.header.rank_source == "assumed"
    assert load_trace(path, rank=5).header.rank == 5


def test_several_traces_that_do_not_say_their_rank_need_their_ranks_given(real_traces, tmp_path):
    path = (
        real_traces / "hta" / "distributed_info_unavailable" / "distributed_info_not_found.json.gz"
    )
    copy = tmp_path / "second.json.gz"
    copy.write_bytes(path.read_bytes())

    with pytest.raises(TraceError, match="distributed_info_not_found.json.gz.*load_run\\(\\{rank"):
        load_run([path, copy])
    run = load_run({3: path, 4: copy}, same_run=False)
    assert run.ranks == [3, 4] and len(run.events.query("rank == 3")) == 2467


# ------------------------------------------------------------ synthetic traces


def test_rank_comes_from_the_file_name_when_the_trace_does_not_say(tmp_path, kineto, write):
    doc = kineto(0)
    del doc["distributedInfo"]
    trace = load_trace(write(tmp_path / "rank3_iter4_6.json", doc))
    assert trace.header.rank == 3 and trace.header.rank_source == "file name"


def test_compact_json_rank_is_read(tmp_path, kineto, write):
    trace = load_trace(write(tmp_path / "trace.json", kineto(7, world=8), compact=True))
    assert trace.header.rank == 7


def test_events_get_kinds_steps_shapes_and_thread_lanes(tmp_path, kineto, write):
    ev = load_trace(write(tmp_path / "t.json.gz", kineto(0))).events

    mm = ev[ev["name"] == "aten::mm"]
    assert list(mm["step"]) == [1, 2]
    assert set(mm["shapes"].astype(str)) == {"[[8,8],[8,8]]"}
    assert set(ev["kind"].astype(str)) == {"step", "compute", "communication"}
    assert set(ev.loc[ev["kind"] == "communication", "lane"].astype(str)) == {
        "thread 101 (pt_gloo_runloop)"
    }
    assert (ev["dur_us"] == ev["end_us"] - ev["start_us"]).all()


@pytest.mark.parametrize("inherited_first", [True, False])
def test_a_thread_named_twice_keeps_its_own_name_not_the_one_it_inherited(
    tmp_path, kineto, write, inherited_first
):
    doc = kineto(0)
    names = [
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": 100, "args": {"name": "thread 100 (python)"}},
        {"ph": "M", "name": "thread_name", "pid": 100, "tid": 101, "args": {"name": "thread 101 (python)"}},
    ]  # fmt: skip
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    own = {"ph": "M", "name": "thread_name", "pid": 100, "tid": 101,
           "args": {"name": "thread 101 (pt_gloo_runloop)"}}  # fmt: skip
    doc["traceEvents"] += names + [own] if inherited_first else [own] + names
    ev = load_trace(write(tmp_path / "t.json", doc)).events
    lanes = set(ev["lane"].astype(str))
    assert lanes == {"thread 100 (python)", "thread 101 (pt_gloo_runloop)"}


def test_a_run_folder_gives_one_frame_with_a_rank_column_on_one_axis(tmp_path, kineto, write):
    write(tmp_path / "rank0.json", kineto(0, offset_us=0))
    write(tmp_path / "rank1.json.gz", kineto(1, offset_us=250))
    (tmp_path / "run.json").write_text("{}")  # the manifest is not a trace

    run = load_run(tmp_path)

    assert run.ranks == [0, 1]
    ev = run.events
    firsts = ev.groupby("rank")["rel_us"].min()
    assert firsts[0] == 0 and firsts[1] == pytest.approx(250)


def test_a_run_keeps_each_files_kinds_and_lanes_in_the_order_its_rows_show_them(
    tmp_path, kineto, write
):
    for rank in (0, 1):
        write(tmp_path / f"rank{rank}.json", kineto(rank, offset_us=100 * rank))
    ev = load_run(tmp_path).events
    lanes = ev["lane"].astype(str)
    assert list(ev["lane"].cat.categories) == list(dict.fromkeys(lanes))
    assert set(ev.loc[ev["kind"] == "communication", "lane"].astype(str)) == {
        "thread 101 (pt_gloo_runloop)"
    }
    for rank in (0, 1):
        alone = load_trace(tmp_path / f"rank{rank}.json").events
        mine = ev[ev["rank"] == rank]
        assert list(mine["kind"].astype(str)) == list(alone["kind"].astype(str))
        assert list(mine["lane"].astype(str)) == list(alone["lane"].astype(str))


def test_two_windows_of_one_rank_load_together(tmp_path, kineto, write):
    write(tmp_path / "rank0_a.json", kineto(0, offset_us=0))
    write(tmp_path / "rank0_b.json", kineto(0, offset_us=50_000))
    write(tmp_path / "rank1_a.json", kineto(1, offset_us=0, pid=200))
    write(tmp_path / "rank1_b.json", kineto(1, offset_us=50_000, pid=200))

    run = load_run(tmp_path)
    assert len(run.headers) == 4 and run.ranks == [0, 1]


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "name, content, problem",
    [
        ("empty.json", b"", "empty"),
        ("blank.json", b"  \n", "empty"),
        ("text.json", b"hello, this is not a trace", "not valid JSON"),
        ("noevents.json", b'{"schemaVersion": 1}', "traceEvents"),
        ("notgz.json.gz", b'{"traceEvents": []}', "not gzip"),
    ],
)
def test_bad_files_raise_a_trace_error_naming_the_file(tmp_path, name, content, problem):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(TraceError, match=problem) as caught:
        load_trace(path)
    assert name in str(caught.value) and caught.value.path == path


def test_a_truncated_trace_is_reported_as_truncated(tmp_path, kineto):
    text = json.dumps(kineto(0))
    path = tmp_path / "rank0.json"
    path.write_text(text[: len(text) * 2 // 3])
    with pytest.raises(TraceError, match="rank0.json.*truncated"):
        load_trace(path)


def test_a_truncated_gzip_is_reported_as_truncated(tmp_path, kineto):
    data = gzip.compress(json.dumps(kineto(0)).encode())
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="rank0.json.gz.*truncated"):
        load_trace(path)


def test_broken_gzip_data_is_reported(tmp_path, kineto):
    data = bytearray(gzip.compress(json.dumps(kineto(0)).encode()))
    data[20:40] = b"\x00" * 20
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError, match="rank0.json.gz.*gzip"):
        load_trace(path)


def test_events_without_a_start_time_fail_strict_and_are_skipped_lenient(tmp_path, kineto, write):
    doc = kineto(0)
    del doc["traceEvents"][1]["ts"]
    path = write(tmp_path / "rank0.json", doc)

    with pytest.raises(TraceError, match="rank0.json.*no start time"):
        load_trace(path)
    with pytest.warns(TraceWarning, match="rank0.json.*1 events that have no start time"):
        trace = load_trace(path, strict=False)
    assert trace.skipped_events == 1 and len(trace.events) == 5


def test_two_files_claiming_the_same_rank_are_refused(tmp_path, kineto, write):
    write(tmp_path / "a.json", kineto(1))
    write(tmp_path / "b.json", kineto(1))
    with pytest.raises(DifferentRuns, match="claims rank 1") as caught:
        load_run(tmp_path)
    assert caught.value.path.name in {"a.json", "b.json"}


def test_files_of_different_runs_are_refused(tmp_path, kineto, write):
    write(tmp_path / "rank0.json", kineto(0, offset_us=0))
    write(tmp_path / "rank1.json", kineto(1, offset_us=30e6, pid=300))  # 30 s later
    with pytest.raises(DifferentRuns, match="rank1.json.*different runs"):
        load_run(tmp_path)
    assert load_run(tmp_path, same_run=False).ranks == [0, 1]


def test_files_with_different_world_sizes_or_run_ids_are_refused(tmp_path, kineto, write):
    write(tmp_path / "rank0.json", kineto(0, world=2))
    write(tmp_path / "rank1.json", kineto(1, world=4))
    with pytest.raises(DifferentRuns, match="rank1.json.*different run.*world_size"):
        load_run(tmp_path)
    write(tmp_path / "rank1.json", kineto(1, run_id="b"))
    write(tmp_path / "rank0.json", kineto(0, run_id="a"))
    with pytest.raises(DifferentRuns, match="different run.*run_id"):
        load_run(tmp_path)


def test_lenient_mode_loads_the_good_files_and_lists_the_bad(tmp_path, kineto, write):
    write(tmp_path / "rank0.json", kineto(0))
    (tmp_path / "rank1.json").write_text('{"traceEvents": [{"ph": "X", "ts"')

    run = load_run(tmp_path, strict=False)

    assert run.ranks == [0]
    assert [(p.name, "truncated" in why) for p, why in run.skipped] == [("rank1.json", True)]


def test_an_empty_folder_is_a_clear_error(tmp_path):
    with pytest.raises(TraceError, match="no trace files"):
        load_run(tmp_path)


# ---------------------------------------------------------------------- merge


def _comparable(ev: pd.DataFrame) -> pd.DataFrame:
    cols = ["rank", "name", "cat", "kind", "dur_us", "start_us"]
    out = ev[cols].copy()
    for c in ("name", "cat", "kind"):
        out[c] = out[c].astype(str)
    out["start_us"] = out["start_us"].round(0)
    return out.sort_values(cols, ignore_index=True)


@pytest.mark.parametrize("out_name", ["merged.json", "merged.json.gz"])
def test_merged_trace_round_trips_to_the_same_events(tmp_path, out_name, kineto, write):
    parts = tmp_path / "parts"
    parts.mkdir()
    write(parts / "rank0.json", kineto(0))
    write(parts / "rank1.json.gz", kineto(1, offset_us=100, pid=200))
    run = load_run(parts)

    merged = merge_traces(run, tmp_path / out_name)
    back = load_trace(merged).events

    pd.testing.assert_frame_equal(_comparable(back), _comparable(run.events))
    with gzip.open(merged) if out_name.endswith(".gz") else open(merged) as f:
        doc = json.load(f)
    names = {
        e["pid"]: e["args"]["name"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert names == {0: "rank 0", 1: "rank 1"}
    sort = {
        e["pid"]: e["args"]["sort_index"]
        for e in doc["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_sort_index"
    }
    assert sort == {0: 0, 1: 1}


def test_merging_a_file_truncated_since_it_was_loaded_says_it_is_truncated(tmp_path, kineto, write):
    write(tmp_path / "rank0.json", kineto(0))
    write(tmp_path / "rank1.json", kineto(1))
    run = load_run(tmp_path, cache=False)
    text = (tmp_path / "rank1.json").read_text()
    (tmp_path / "rank1.json").write_text(text[: len(text) // 2])

    with pytest.raises(TraceError, match="rank1.json.*the file is truncated"):
        merge_traces(run, tmp_path / "merged.json")


def test_merging_real_gpu_traces_keeps_every_event(real_traces, tmp_path):
    files = sorted((real_traces / "hta" / "trace_filter").glob("*.json.gz"))
    run = load_run(files)
    merged = merge_traces(run, tmp_path / "all.json.gz")

    with gzip.open(merged) as f:
        doc = json.load(f)
    originals = sum(
        sum(1 for e in json.load(gzip.open(p))["traceEvents"] if e.get("ph") != "M") for p in files
    )
    assert sum(1 for e in doc["traceEvents"] if e.get("ph") != "M") == originals
    assert len(load_trace(merged).events) == len(run.events)


def test_a_merged_file_in_a_run_folder_is_not_loaded_as_a_rank(tmp_path, kineto, write):
    write(tmp_path / "rank0.json", kineto(0))
    write(tmp_path / "rank1.json", kineto(1))
    merge_traces(load_run(tmp_path), tmp_path / "merged.json")

    run = load_run(tmp_path)
    assert run.ranks == [0, 1] and len(run.headers) == 2
    assert [p.name for p, _ in run.skipped] == ["merged.json"]


def test_gathering_node_folders_finds_every_rank_and_names_a_missing_one(tmp_path, kineto, write):
    for node, ranks in {0: (0, 1), 1: (2, 3)}.items():
        folder = tmp_path / f"node{node}"
        folder.mkdir()
        for rank in ranks:
            write(folder / f"rank{rank}_iter3_5.json", kineto(rank, world=4, pid=100 + rank))

    copies = gather_traces([tmp_path / "node0", tmp_path / "node1"], tmp_path / "all")
    assert len(copies) == 4
    assert load_run(tmp_path / "all", expect_ranks=range(4)).ranks == [0, 1, 2, 3]

    gather_traces([tmp_path / "node0"], tmp_path / "half")
    with pytest.raises(TraceError, match="half.*no trace from ranks 2, 3"):
        load_run(tmp_path / "half", expect_ranks=range(4))


def test_gathering_refuses_two_files_of_the_same_name(tmp_path, kineto, write):
    for node in (0, 1):
        (tmp_path / f"node{node}").mkdir()
        write(tmp_path / f"node{node}" / "trace.json", kineto(node))
    with pytest.raises(TraceError, match="same name"):
        gather_traces([tmp_path / "node0", tmp_path / "node1"], tmp_path / "all")


def test_shifting_ranks_moves_only_their_times(tmp_path, kineto, write):
    write(tmp_path / "rank0.json", kineto(0))
    write(tmp_path / "rank1.json", kineto(1, pid=200))
    events = load_run(tmp_path).events
    shifted = shift_ranks(events, [1], 5000.0)

    assert (
        shifted.loc[shifted["rank"] == 0, "start_us"] == events.loc[events["rank"] == 0, "start_us"]
    ).all()
    assert (
        shifted.loc[shifted["rank"] == 1, "end_us"] - events.loc[events["rank"] == 1, "end_us"]
        == 5000
    ).all()
    assert shifted["rel_us"].min() == 0


def test_merging_two_windows_of_a_rank_names_each_lane_once(tmp_path, kineto, write):
    write(tmp_path / "rank0_a.json", kineto(0, offset_us=0))
    write(tmp_path / "rank0_b.json", kineto(0, offset_us=50_000))
    write(tmp_path / "rank1_a.json", kineto(1, pid=200))
    merged = merge_traces(load_run(tmp_path), tmp_path / "out" / "merged.json")

    names = [
        (e["pid"], e["tid"])
        for e in json.loads(merged.read_text())["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    ]
    assert len(names) == len(set(names)) == 4  # two threads on each rank
    assert len(load_trace(merged).events) == len(load_run(tmp_path).events)


# ------------------------------------------------- foreign and damaged traces (issue 9)


def rocm_doc() -> dict:
    """A trace shaped like a real ROCm one: hex stream ids on GPU and runtime events, no
    distributedInfo, no base time."""
    return {
        "traceEvents": [
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 7,
                "tid": 7,
                "ts": 100.0,
                "dur": 50.0,
            },
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "hipLaunchKernel",
                "pid": 7,
                "tid": 7,
                "ts": 110.0,
                "dur": 5.0,
                "args": {"stream": "0x0", "correlation": 12},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "Cijk_Ailk_Bljk",
                "pid": 2,
                "tid": "stream 0x1a",
                "ts": 120.0,
                "dur": 30.0,
                "args": {"stream": "0x1a", "device": 2},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": "odd",
                "pid": 2,
                "tid": 1,
                "ts": 160.0,
                "dur": 1.0,
                "args": {"stream": "default"},
            },
        ]
    }


def test_a_rocm_style_trace_with_hex_stream_ids_and_no_rank_loads(tmp_path, write):
    trace = load_trace(write(tmp_path / "rocm.json", rocm_doc()))

    ev = trace.events.set_index("name")
    assert trace.header.rank == 0 and trace.header.rank_source == "assumed"
    assert ev.loc["hipLaunchKernel", "stream"] == 0
    assert ev.loc["Cijk_Ailk_Bljk", "stream"] == 26  # "0x1a"
    assert pd.isna(ev.loc["odd", "stream"])  # text that is not a number is left empty
    assert ev.loc["Cijk_Ailk_Bljk", "lane"] == "GPU 2 stream stream 0x1a"


def test_names_with_invalid_utf8_bytes_load_with_the_bytes_replaced_and_a_warning(tmp_path, kineto):
    text = json.dumps(kineto(0)).replace("aten::mm", "aten::m\udcffm")
    path = tmp_path / "rank0.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))  # a raw 0xff byte in a name

    with pytest.warns(TraceWarning, match="rank0.json.*not valid UTF-8"):
        trace = load_trace(path)
    assert "aten::m\ufffdm" in set(trace.events["name"].astype(str))
    assert len(trace.events) == 6


def test_begin_and_end_events_are_paired_into_complete_events(tmp_path, write):
    doc = {
        "traceEvents": [
            {"ph": "B", "name": "outer", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 0},
            {"ph": "B", "name": "inner", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 10},
            {"ph": "E", "pid": 1, "tid": 1, "ts": 30},
            {"ph": "E", "pid": 1, "tid": 1, "ts": 100},
            {"ph": "B", "name": "never ends", "pid": 1, "tid": 2, "ts": 5},
        ]
    }
    with pytest.warns(TraceWarning, match="2 B/E pairs joined.*1 begins or ends without"):
        ev = load_trace(write(tmp_path / "be.json", doc)).events

    assert list(ev["name"].astype(str)) == ["outer", "inner"]
    assert list(ev["dur_us"]) == [100.0, 20.0]


@pytest.mark.parametrize(
    "events", [[], [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "x"}}]]
)
def test_a_trace_with_no_events_to_load_says_so(tmp_path, write, events):
    path = write(tmp_path / "rank0.json", {"traceEvents": events})
    with pytest.raises(TraceError, match="rank0.json: holds no events with a duration"):
        load_trace(path)


def test_negative_durations_fail_strict_and_are_left_out_lenient(tmp_path, kineto, write):
    doc = kineto(0)
    doc["traceEvents"][1]["dur"] = -5
    path = write(tmp_path / "rank0.json", doc)

    with pytest.raises(TraceError, match="rank0.json: 1 events have a negative duration"):
        load_trace(path)
    with pytest.warns(TraceWarning, match="negative duration were left out"):
        assert len(load_trace(path, strict=False).events) == 5


def test_fields_of_unexpected_types_are_read_leniently(tmp_path, kineto, write):
    doc = kineto(0)
    doc["traceEvents"][1]["name"] = 42  # a number where a name should be
    doc["traceEvents"][2]["ts"] = "410.5"  # a start time written as text
    with pytest.warns(TraceWarning, match="unexpected types"):
        ev = load_trace(write(tmp_path / "rank0.json", doc)).events

    assert "42" in set(ev["name"].astype(str))
    assert 410.5 in set(ev["start_us"] - 1_700_000_000_000_000)


# --------------------------------------------------------- big runs (issue 14)


@pytest.fixture
def eight_ranks(tmp_path, kineto, write):
    folder = tmp_path / "run"
    folder.mkdir()
    for rank in range(8):
        write(
            folder / f"rank{rank}.json",
            kineto(rank, world=8, pid=100 + rank, steps=6, offset_us=rank * 7.0),
        )
    return folder


def test_parallel_and_serial_loads_give_identical_frames(eight_ranks):
    serial = load_run(eight_ranks, workers=1, cache=False)
    parallel = load_run(eight_ranks, workers=2, cache=False)

    pd.testing.assert_frame_equal(serial.events, parallel.events)
    assert [h.path for h in serial.headers] == [h.path for h in parallel.headers]


def test_a_bad_file_in_a_parallel_load_raises_the_same_trace_error_naming_it(eight_ranks):
    (eight_ranks / "rank5.json").write_text('{"traceEvents": [{"ph": "X"')
    with pytest.raises(TraceError, match="rank5.json.*truncated") as serial:
        load_run(eight_ranks, workers=1, cache=False)
    with pytest.raises(TraceError, match="rank5.json.*truncated") as parallel:
        load_run(eight_ranks, workers=2, cache=False)
    assert (
        parallel.value.path == serial.value.path and parallel.value.problem == serial.value.problem
    )


def test_the_cache_is_used_while_nothing_changed(eight_ranks, monkeypatch):
    first = load_run(eight_ranks)
    assert list((eight_ranks / ".cache").glob("events-*.npz"))

    import helpers.traces.load as traces

    monkeypatch.setattr(traces, "_load_files", lambda *a, **k: pytest.fail("files were read again"))
    again = load_run(eight_ranks)
    pd.testing.assert_frame_equal(first.events, again.events)
    assert [h.rank for h in again.headers] == [h.rank for h in first.headers]


def test_the_cache_is_not_used_when_a_trace_file_changed(eight_ranks, kineto, write):
    load_run(eight_ranks)
    write(eight_ranks / "rank3.json", kineto(3, world=8, pid=103, steps=7, offset_us=21.0))

    again = load_run(eight_ranks)
    assert (again.events["rank"] == 3).sum() == 7 * 3  # the new file's events, not the cached ones
    assert again.events.equals(load_run(eight_ranks, cache=False).events)


def test_a_window_of_steps_loads_only_the_events_inside_those_steps(eight_ranks):
    window = load_run(eight_ranks, steps=(2, 3), cache=False).events

    assert set(window["step"].dropna()) == {2, 3}
    assert window["step"].notna().all()
    assert len(window) == 8 * 2 * 3


def test_a_window_of_steps_that_a_file_lacks_names_the_steps_it_has(eight_ranks):
    with pytest.raises(TraceError, match=r"steps=\(9, 12\).*present: \[1, 2, 3, 4, 5, 6\]"):
        load_run(eight_ranks, steps=(9, 12), cache=False)


def test_asking_for_some_ranks_does_not_read_the_files_of_the_others(eight_ranks):
    (eight_ranks / "rank7.json").write_text("not even JSON")
    assert load_run(eight_ranks, ranks=[0, 2], cache=False).ranks == [0, 2]


def test_ranks_may_be_given_as_an_iterator(eight_ranks):
    assert load_run(eight_ranks, ranks=iter([2, 0]), cache=False).ranks == [0, 2]
    assert load_run(eight_ranks, ranks=(r for r in [5])).ranks == [5]


def test_a_short_load_prints_no_progress_bar(eight_ranks, capsys, monkeypatch):
    import helpers.traces._progress as progress

    monkeypatch.setattr(progress, "watched", lambda: True)  # as in a terminal or a notebook
    load_run(eight_ranks, cache=False)
    load_run(eight_ranks, cache=False, progress=None)
    assert capsys.readouterr().err == ""


def test_a_load_with_progress_shows_a_tqdm_bar_and_false_silences_it(eight_ranks, capsys):
    load_run(eight_ranks, cache=False, progress=True)
    err = capsys.readouterr().err
    assert "loading traces: 100%" in err and "| 8/8 [" in err and "file/s]" in err  # tqdm's

    load_run(eight_ranks, cache=False, progress=False)
    assert capsys.readouterr().err == ""


def test_a_slow_load_shows_its_bar_where_someone_watches(eight_ranks, capsys, monkeypatch):
    import helpers.traces._progress as progress

    monkeypatch.setattr(progress, "SHOW_AFTER_S", 0.0)  # every load is slow now
    monkeypatch.setattr(progress, "watched", lambda: True)
    load_run(eight_ranks, cache=False)
    assert "| 8/8 [" in capsys.readouterr().err

    monkeypatch.setattr(progress, "watched", lambda: False)  # stderr is a file or a pipe
    load_run(eight_ranks, cache=False)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("variable", "tty", "kernel", "shown"),
    [
        ("", True, False, True),
        ("", False, True, True),
        ("", False, False, False),
        ("1", True, True, False),
        ("0", True, False, True),
    ],
)
def test_a_default_bar_is_watched_in_a_terminal_or_a_kernel_unless_pdp_no_progress(
    monkeypatch, variable, tty, kernel, shown
):
    import io
    import sys

    import helpers.traces._progress as progress

    class Stderr(io.StringIO):
        def isatty(self) -> bool:
            return tty

    monkeypatch.setenv("PDP_NO_PROGRESS", variable)
    monkeypatch.setattr(sys, "stderr", Stderr())
    if kernel:
        monkeypatch.setitem(sys.modules, "ipykernel", sys)
    else:
        monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    assert progress.watched() is shown


# ---------------------------------------------------------------- a file's start only


def test_distributed_info_reads_world_size_and_backend_from_a_gzip_traces_start(
    tmp_path, kineto, write
):
    path = write(tmp_path / "rank3.json.gz", kineto(3, world=8, backend="nccl"))
    assert distributed_info(path) == {"world_size": 8, "backend": "nccl"}


def test_distributed_info_beyond_the_bytes_it_reads_is_none(tmp_path, kineto, write):
    doc = kineto(0, world=8)
    info = doc.pop("distributedInfo")
    path = write(tmp_path / "rank0.json", {**doc, "distributedInfo": info})  # after the events
    assert distributed_info(path, limit=200) == {"world_size": None, "backend": None}
    assert distributed_info(path)["world_size"] == 8


def test_distributed_info_of_a_damaged_file_is_none(tmp_path):
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(b"\x1f\x8b" + b"not gzip at all")
    assert distributed_info(path) == {"world_size": None, "backend": None}


def test_distributed_info_keeps_no_field_of_another_shape(tmp_path, kineto, write):
    doc = kineto(0)
    doc["distributedInfo"] = {"world_size": "8", "backend": ["gloo"]}
    path = write(tmp_path / "rank0.json", doc)
    assert distributed_info(path) == {"world_size": None, "backend": None}


def test_distributed_info_of_a_header_nested_a_million_deep_is_none(tmp_path):
    path = tmp_path / "rank0.json"
    path.write_text('{"distributedInfo": ' + "[" * 1_000_000 + "]" * 1_000_000 + "}")
    assert distributed_info(path, limit=4 << 20) == {"world_size": None, "backend": None}


def test_a_run_folders_manifest_gives_the_machines_cores_to_the_analysis(tmp_path):
    # helpers.what_if re-times ops by their shares of the cores the ranks shared
    write_doc(tmp_path / "rank0.json", trace_doc([complete_event("aten::mm", 0, 10)]))
    (tmp_path / "run.json").write_text(json.dumps({"cores": 2}))
    assert load_run(tmp_path, cache=False).events.attrs["cores"] == 2
    (tmp_path / "run.json").write_text(json.dumps({"status": "ok"}))  # written before cores
    assert "cores" not in load_run(tmp_path, cache=False).events.attrs
