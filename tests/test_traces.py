"""The trace layer: real traces from other people's jobs, synthetic ones, and every bad input."""

import gzip
import json
from pathlib import Path

import pandas as pd
import pytest

from helpers.traces import TraceError, load_run, load_trace, merge_traces

HTA = "hta"


def kineto(rank: int, world: int = 2, base_ns: int = 1_700_000_000_000_000_000, pid: int = 100,
           offset_us: float = 0.0, steps: int = 2, backend: str = "gloo", run_id=None) -> dict:
    """A small trace in today's Kineto format: steps with an op and an all_reduce each."""
    events = []
    for i in range(steps):
        t = offset_us + i * 1000.0
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i + 1}", "pid": pid,
             "tid": pid, "ts": t, "dur": 900.0},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": pid, "ts": t + 10,
             "dur": 300.0, "args": {"Input Dims": [[8, 8], [8, 8]]}},
            {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": pid,
             "tid": pid + 1, "ts": t + 400, "dur": 200.0 + 50 * rank},
        ]
    events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": pid + 1,
                   "args": {"name": f"thread {pid + 1} (pt_gloo_runloop)"}})
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": backend, "rank": rank,
                                                   "world_size": world},
           "baseTimeNanoseconds": base_ns, "traceEvents": events}
    if run_id:
        doc["run_id"] = run_id
    return doc


def write(path: Path, doc, compact: bool = False) -> Path:
    text = json.dumps(doc, separators=(",", ":")) if compact else json.dumps(doc, indent=1)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def x_events(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


# ---------------------------------------------------------------- real traces

def test_gpu_traces_of_two_ranks_load_with_kernels_streams_and_one_time_axis(real_traces):
    files = sorted((real_traces / HTA / "trace_filter").glob("*.json.gz"))
    run = load_run(files)

    ev = run.events
    assert run.ranks == [0, 1]
    for rank, path in enumerate(files):
        assert (ev["rank"] == rank).sum() == len(x_events(path))
    kernels = ev[ev["kind"] == "gpu kernel"]
    assert len(kernels) > 1000 and kernels["lane"].astype(str).str.startswith("GPU").all()
    assert kernels["stream"].notna().all()
    assert ev["start_us"].is_monotonic_increasing
    assert ev["rel_us"].min() == 0.0
    assert ev["start_us"].min() == pytest.approx(1682725897226747, abs=1)  # old format: epoch µs
    assert run.headers[0].backend == "nccl" and run.headers[0].world_size == 128


def test_nanosecond_trace_keeps_fractional_microseconds_and_every_event(real_traces):
    path = next((real_traces / HTA / "ns_resolution_trace").glob("*.json.gz"))
    trace = load_trace(path)

    assert len(trace.events) == len(x_events(path)) == 45420
    assert (trace.events["start_us"] % 1 != 0).any()
    assert set(trace.events["step"].dropna().unique()) == {101, 102, 103, 104, 105}
    assert {"broadcast", "allreduce"} <= set(trace.events["collective"].dropna().astype(str))
    assert (trace.events["end_us"] >= trace.events["start_us"]).all()


def test_gloo_cpu_trace_of_rank_34_uses_base_time_and_finds_collectives(real_traces):
    path = next((real_traces / HTA / "cpu_only").glob("*.json.gz"))
    trace = load_trace(path)

    assert trace.header.rank == 34 and trace.header.world_size == 300
    assert trace.header.backend == "gloo" and trace.header.base_time_ns == 1719853884000000000
    comm = trace.events[trace.events["kind"] == "communication"]
    assert len(comm) == 10 and set(comm["name"].astype(str)) == {"gloo:all_reduce"}
    assert comm["lane"].nunique() == 2  # two gloo threads
    first = trace.events["start_us"].min()
    assert first == pytest.approx(1719853884000000 + 1212075525586.016, abs=0.01)


def test_trace_with_minimal_header_gets_its_rank_from_distributed_info(real_traces):
    trace = load_trace(real_traces / HTA / "rank_non_gpu" / "rank_non_gpu.json.gz")

    assert trace.header.rank == 0 and trace.header.rank_source == "distributedInfo"
    assert len(trace.events) == 2467 and trace.header.base_time_ns is None


def test_trace_without_distributed_info_asks_for_the_rank_then_takes_it(real_traces):
    path = real_traces / HTA / "distributed_info_unavailable" / "distributed_info_not_found.json.gz"
    with pytest.raises(TraceError, match="distributed_info_not_found.json.gz.*rank=N"):
        load_trace(path)

    trace = load_trace(path, rank=5)
    assert trace.header.rank == 5 and (trace.events["rank"] == 5).all()
    assert len(load_run({3: path}).events.query("rank == 3")) == 2467


# ------------------------------------------------------------ synthetic traces

def test_rank_comes_from_the_file_name_when_the_trace_does_not_say(tmp_path):
    doc = kineto(0)
    del doc["distributedInfo"]
    trace = load_trace(write(tmp_path / "rank3_iter4_6.json", doc))
    assert trace.header.rank == 3 and trace.header.rank_source == "file name"


def test_compact_json_rank_is_read(tmp_path):
    trace = load_trace(write(tmp_path / "trace.json", kineto(7, world=8), compact=True))
    assert trace.header.rank == 7


def test_events_get_kinds_steps_shapes_and_thread_lanes(tmp_path):
    ev = load_trace(write(tmp_path / "t.json.gz", kineto(0))).events

    mm = ev[ev["name"] == "aten::mm"]
    assert list(mm["step"]) == [1, 2]
    assert set(mm["shapes"].astype(str)) == {"[[8,8],[8,8]]"}
    assert set(ev["kind"].astype(str)) == {"step", "compute", "communication"}
    assert set(ev.loc[ev["kind"] == "communication", "lane"].astype(str)) == {
        "thread 101 (pt_gloo_runloop)"}
    assert (ev["dur_us"] == ev["end_us"] - ev["start_us"]).all()


def test_a_run_folder_gives_one_frame_with_a_rank_column_on_one_axis(tmp_path):
    write(tmp_path / "rank0.json", kineto(0, offset_us=0))
    write(tmp_path / "rank1.json.gz", kineto(1, offset_us=250))
    (tmp_path / "run.json").write_text("{}")  # the manifest is not a trace

    run = load_run(tmp_path)

    assert run.ranks == [0, 1]
    ev = run.events
    firsts = ev.groupby("rank")["rel_us"].min()
    assert firsts[0] == 0 and firsts[1] == pytest.approx(250)


def test_two_windows_of_one_rank_load_together(tmp_path):
    write(tmp_path / "rank0_a.json", kineto(0, offset_us=0))
    write(tmp_path / "rank0_b.json", kineto(0, offset_us=50_000))
    write(tmp_path / "rank1_a.json", kineto(1, offset_us=0, pid=200))
    write(tmp_path / "rank1_b.json", kineto(1, offset_us=50_000, pid=200))

    run = load_run(tmp_path)
    assert len(run.headers) == 4 and run.ranks == [0, 1]


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("name, content, problem", [
    ("empty.json", b"", "empty"),
    ("blank.json", b"  \n", "empty"),
    ("text.json", b"hello, this is not a trace", "not valid JSON"),
    ("noevents.json", b'{"schemaVersion": 1}', "traceEvents"),
    ("notgz.json.gz", b'{"traceEvents": []}', "not gzip"),
])
def test_bad_files_raise_a_trace_error_naming_the_file(tmp_path, name, content, problem):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(TraceError, match=problem) as caught:
        load_trace(path)
    assert name in str(caught.value) and caught.value.path == path


def test_a_truncated_trace_is_reported_as_truncated(tmp_path):
    text = json.dumps(kineto(0))
    path = tmp_path / "rank0.json"
    path.write_text(text[: len(text) * 2 // 3])
    with pytest.raises(TraceError, match="rank0.json.*truncated"):
        load_trace(path)


def test_a_truncated_gzip_is_reported_as_truncated(tmp_path):
    data = gzip.compress(json.dumps(kineto(0)).encode())
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="rank0.json.gz.*truncated"):
        load_trace(path)


def test_broken_gzip_data_is_reported(tmp_path):
    data = bytearray(gzip.compress(json.dumps(kineto(0)).encode()))
    data[20:40] = b"\x00" * 20
    path = tmp_path / "rank0.json.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError, match="rank0.json.gz.*gzip"):
        load_trace(path)


def test_events_without_a_start_time_fail_strict_and_are_skipped_lenient(tmp_path):
    doc = kineto(0)
    del doc["traceEvents"][1]["ts"]
    path = write(tmp_path / "rank0.json", doc)

    with pytest.raises(TraceError, match="rank0.json.*no start time"):
        load_trace(path)
    trace = load_trace(path, strict=False)
    assert trace.skipped_events == 1 and len(trace.events) == 5


def test_two_files_claiming_the_same_rank_are_refused(tmp_path):
    write(tmp_path / "a.json", kineto(1))
    write(tmp_path / "b.json", kineto(1))
    with pytest.raises(TraceError, match="claims rank 1") as caught:
        load_run(tmp_path)
    assert caught.value.path.name in {"a.json", "b.json"}


def test_files_of_different_runs_are_refused(tmp_path):
    write(tmp_path / "rank0.json", kineto(0, offset_us=0))
    write(tmp_path / "rank1.json", kineto(1, offset_us=30e6, pid=300))  # 30 s later
    with pytest.raises(TraceError, match="rank1.json.*different runs"):
        load_run(tmp_path)
    assert load_run(tmp_path, same_run=False).ranks == [0, 1]


def test_files_with_different_world_sizes_or_run_ids_are_refused(tmp_path):
    write(tmp_path / "rank0.json", kineto(0, world=2))
    write(tmp_path / "rank1.json", kineto(1, world=4))
    with pytest.raises(TraceError, match="rank1.json.*different run.*world_size"):
        load_run(tmp_path)
    write(tmp_path / "rank1.json", kineto(1, run_id="b"))
    write(tmp_path / "rank0.json", kineto(0, run_id="a"))
    with pytest.raises(TraceError, match="different run.*run_id"):
        load_run(tmp_path)


def test_lenient_mode_loads_the_good_files_and_lists_the_bad(tmp_path):
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
def test_merged_trace_round_trips_to_the_same_events(tmp_path, out_name):
    parts = tmp_path / "parts"
    parts.mkdir()
    write(parts / "rank0.json", kineto(0))
    write(parts / "rank1.json.gz", kineto(1, offset_us=100, pid=200))
    run = load_run(parts)

    merged = merge_traces(run, tmp_path / out_name)
    back = load_trace(merged).events

    pd.testing.assert_frame_equal(_comparable(back), _comparable(run.events))
    with (gzip.open(merged) if out_name.endswith(".gz") else open(merged)) as f:
        doc = json.load(f)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    sort = {e["pid"]: e["args"]["sort_index"] for e in doc["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_sort_index"}
    assert sort == {0: 0, 1: 1}


def test_merging_real_gpu_traces_keeps_every_event(real_traces, tmp_path):
    files = sorted((real_traces / HTA / "trace_filter").glob("*.json.gz"))
    run = load_run(files)
    merged = merge_traces(run, tmp_path / "all.json.gz")

    with gzip.open(merged) as f:
        doc = json.load(f)
    originals = sum(sum(1 for e in json.load(gzip.open(p))["traceEvents"] if e.get("ph") != "M")
                    for p in files)
    assert sum(1 for e in doc["traceEvents"] if e.get("ph") != "M") == originals
    assert len(load_trace(merged).events) == len(run.events)


def test_a_merged_file_in_a_run_folder_is_not_loaded_as_a_rank(tmp_path):
    write(tmp_path / "rank0.json", kineto(0))
    write(tmp_path / "rank1.json", kineto(1))
    merge_traces(load_run(tmp_path), tmp_path / "merged.json")

    run = load_run(tmp_path)
    assert run.ranks == [0, 1] and len(run.headers) == 2
    assert [p.name for p, _ in run.skipped] == ["merged.json"]


def test_rpc_calls_are_communication_and_their_remote_ops_are_not():
    from helpers.traces import event_kind

    assert event_kind("rpc_async#udf(worker0 -> worker1)", "user_annotation") == "communication"
    assert event_kind("rpc_async#udf(worker0 -> worker1)#remote_op: aten::mul", "cpu_op") == "compute"
    assert event_kind("gloo:all_reduce", "user_annotation") == "communication"
    assert event_kind("Optimizer.step#SGD.step", "user_annotation") == "optimizer"


def test_gathering_node_folders_finds_every_rank_and_names_a_missing_one(tmp_path):
    from helpers.traces import gather_traces

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


def test_gathering_refuses_two_files_of_the_same_name(tmp_path):
    from helpers.traces import gather_traces

    for node in (0, 1):
        (tmp_path / f"node{node}").mkdir()
        write(tmp_path / f"node{node}" / "trace.json", kineto(node))
    with pytest.raises(TraceError, match="same name"):
        gather_traces([tmp_path / "node0", tmp_path / "node1"], tmp_path / "all")


def test_shifting_ranks_moves_only_their_times(tmp_path):
    from helpers.traces import shift_ranks

    write(tmp_path / "rank0.json", kineto(0))
    write(tmp_path / "rank1.json", kineto(1, pid=200))
    events = load_run(tmp_path).events
    shifted = shift_ranks(events, [1], 5000.0)

    assert (shifted.loc[shifted["rank"] == 0, "start_us"] == events.loc[events["rank"] == 0, "start_us"]).all()
    assert (shifted.loc[shifted["rank"] == 1, "end_us"] - events.loc[events["rank"] == 1, "end_us"] == 5000).all()
    assert shifted["rel_us"].min() == 0


def test_merging_two_windows_of_a_rank_names_each_lane_once(tmp_path):
    write(tmp_path / "rank0_a.json", kineto(0, offset_us=0))
    write(tmp_path / "rank0_b.json", kineto(0, offset_us=50_000))
    write(tmp_path / "rank1_a.json", kineto(1, pid=200))
    merged = merge_traces(load_run(tmp_path), tmp_path / "out" / "merged.json")

    names = [(e["pid"], e["tid"]) for e in json.loads(merged.read_text())["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"]
    assert len(names) == len(set(names)) == 4  # two threads on each rank
    assert len(load_trace(merged).events) == len(load_run(tmp_path).events)
