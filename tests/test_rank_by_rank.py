"""A run summarised one rank at a time gives the same tables as the whole run in memory: on the
lessons' recorded runs and on real GPU and CPU traces of other people's jobs."""

import json
import warnings
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO, quick_sample, real_trace_family, recording_family
from helpers import (
    collective_waits,
    find_straggler,
    step_times,
    time_per_kind,
    waiting_per_step,
)
from helpers.analysis.rank_by_rank import summarise_run
from helpers.jobs.recorded import RECORDINGS_ROOT, replay
from helpers.traces import TraceError, load_run


def _recording(experiment: str) -> Path:
    """The folder of the lesson's recorded run of ``experiment``."""
    (folder,) = [
        p.parent
        for p in RECORDINGS_ROOT.glob(f"{experiment}-*/recording.json")
        if json.loads(p.read_text())["key"]["experiment"] == experiment
    ]
    return folder


def _replayed(experiment: str, root: Path) -> Path:
    """The lesson's recorded run of ``experiment``, replayed into ``root``: its folder."""
    key = json.loads((_recording(experiment) / "recording.json").read_text())["key"]
    record = replay(Path(key["script"]), key["nproc"], experiment, key["args"], 1, 1, False, root)
    return record.run_dir


def _same_tables(files_or_folder, workers: int = 1, cache: bool = True) -> None:
    whole = load_run(files_or_folder, cache=False, same_run=False).events
    summary = summarise_run(files_or_folder, workers=workers, cache=cache, progress=False)
    pd.testing.assert_frame_equal(summary.time_per_kind(), time_per_kind(whole))
    if (whole["kind"] == "step").any():
        pd.testing.assert_frame_equal(summary.step_times(), step_times(whole))
    waits = summary.collective_waits()
    pd.testing.assert_frame_equal(waits, collective_waits(whole))
    if not waits.dropna(subset=["step"]).empty:
        pd.testing.assert_frame_equal(summary.waiting_per_step(), waiting_per_step(whole))
        assert summary.find_straggler() == find_straggler(whole)


@pytest.mark.parametrize("experiment", ["ddp-straggler", "ddp-normal", "ddp"])
def test_a_lessons_run_summarised_rank_by_rank_gives_the_same_tables(experiment, tmp_path):
    _same_tables(_replayed(experiment, tmp_path))


def test_two_workers_give_the_same_tables_as_one(tmp_path):
    _same_tables(_replayed("ddp", tmp_path), workers=2)


def test_real_gpu_traces_summarised_rank_by_rank_give_the_same_tables(real_traces):
    folder = real_traces / "hta" / "trace_filter"
    _same_tables(sorted(folder.glob("sampled_rank-*.json.gz")), cache=False)


def test_a_real_cpu_trace_summarised_gives_the_same_tables(real_traces):
    _same_tables(sorted((real_traces / "hta" / "cpu_only").glob("*.json.gz")), cache=False)


def test_a_folder_without_traces_is_named(tmp_path):
    with pytest.raises(TraceError, match="no trace files"):
        summarise_run(tmp_path)


def test_each_rank_is_kept_as_parquet_and_read_back_the_same(tmp_path):
    from helpers import load_trace
    from helpers.traces import rank_events

    folder = _replayed("ddp", tmp_path)
    summarise_run(folder, workers=1, progress=False)
    files = sorted(folder.glob("rank*.json"))
    caches = sorted((folder / ".cache").glob("rank-*-events.parquet"))
    assert len(caches) == len(files)
    for path in files:
        pd.testing.assert_frame_equal(rank_events(path), load_trace(path).events)


def test_each_ranks_header_is_kept_with_its_events_and_read_back_the_same(tmp_path):
    from helpers import load_trace
    from helpers.traces.rank_files import rank_trace

    path = sorted(_replayed("ddp", tmp_path).glob("rank*.json"))[0]
    decoded = rank_trace(path)
    cached = rank_trace(path)
    assert cached.header == decoded.header == load_trace(path).header
    assert cached.events.attrs == {}, "the header travels beside the events, not in them"


def test_files_of_two_runs_are_refused_rank_by_rank_as_load_run_refuses_them(
    tmp_path, kineto, write
):
    from helpers.traces import DifferentRuns

    write(tmp_path / "rank0.json", kineto(0, world=2))
    write(tmp_path / "rank1.json", kineto(1, world=4))
    with pytest.raises(DifferentRuns, match="rank1.json.*different run.*world_size"):
        summarise_run(tmp_path, workers=1, progress=False, cache=False)


def test_a_changed_file_is_decoded_again_and_its_old_cache_goes(tmp_path):
    from helpers.traces import rank_events

    folder = _replayed("ddp", tmp_path)
    path = sorted(folder.glob("rank*.json"))[0]
    rank_events(path)
    (before,) = (folder / ".cache").glob(f"rank-{path.name}-*-events.parquet")
    path.write_text(path.read_text() + " ")  # same events, another size
    rank_events(path)
    (after,) = (folder / ".cache").glob(f"rank-{path.name}-*-events.parquet")
    assert after != before


def test_a_damaged_cache_is_no_cache(tmp_path):
    from helpers import load_trace
    from helpers.traces import rank_events

    folder = _replayed("ddp", tmp_path)
    path = sorted(folder.glob("rank*.json"))[0]
    rank_events(path)
    (cache,) = (folder / ".cache").glob("rank-*-events.parquet")
    cache.write_bytes(b"not parquet")
    pd.testing.assert_frame_equal(rank_events(path), load_trace(path).events)


@pytest.mark.slow
def test_a_dask_cluster_gives_the_same_tables_from_the_same_cached_files(tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from distributed import Client
    from rank_by_rank_on_dask import local_cluster, summarise_on_dask

    folder = _replayed("ddp", tmp_path)
    here = summarise_run(folder, workers=1, progress=False)  # writes the Parquet caches
    files = sorted(folder.glob("rank*.json"))
    with local_cluster(2) as cluster, Client(cluster) as client:
        there = summarise_on_dask(files, client)
    pd.testing.assert_frame_equal(there.step_times(), here.step_times())
    pd.testing.assert_frame_equal(there.waiting_per_step(), here.waiting_per_step())
    assert there.find_straggler() == here.find_straggler()
    pd.testing.assert_frame_equal(there.path_summary(), here.path_summary())


def test_a_merged_file_in_the_run_folder_is_left_out_as_load_run_does(tmp_path):
    from helpers import merge_traces

    folder = _replayed("ddp", tmp_path)
    merge_traces(load_run(folder), folder / "merged" / "all_ranks.json.gz")
    summary = summarise_run(folder, workers=1, progress=False)
    assert len(summary.files) == len(load_run(folder).headers)
    _same_tables(folder)


def test_a_merged_file_even_of_one_rank_is_no_ranks_part_as_load_run_has_it(tmp_path):
    from helpers import merge_traces
    from helpers.analysis.rank_by_rank import kept_of_file

    folder = _replayed("ddp", tmp_path)
    rank0, rank1 = sorted(folder.glob("rank*.json"))[:2]
    merged = merge_traces(load_run([rank0]), tmp_path / "rank0_merged.json")

    assert kept_of_file(merged, cache=False) is None
    assert [h.path for h in load_run([merged, rank1], cache=False).headers] == [rank1]


def test_a_file_that_merge_traces_wrote_is_not_read_nor_counted(tmp_path, monkeypatch):
    from helpers import merge_traces
    from helpers.analysis import rank_by_rank
    from helpers.traces.export import written_by_merge

    folder = _replayed("ddp", tmp_path)
    merged = merge_traces(load_run(folder), folder / "merged" / "all_ranks.json.gz")
    plain = merge_traces(load_run(folder), folder / "merged" / "all_ranks.json")
    assert written_by_merge(merged) and written_by_merge(plain)
    assert not any(written_by_merge(p) for p in folder.glob("rank*.json"))
    counted = []
    real = rank_by_rank.each_in_processes
    monkeypatch.setattr(
        rank_by_rank,
        "each_in_processes",
        lambda fn, jobs, *rest: counted.append(len(jobs)) or real(fn, jobs, *rest),
    )
    summarise_run(folder, workers=1, progress=False, cache=False)
    assert counted == [len(list(folder.glob("rank*.json")))]  # the progress bar's count


def test_a_second_pass_reads_the_kept_parts_and_gives_the_same_tables(tmp_path):
    folder = _replayed("ddp", tmp_path)
    first = summarise_run(folder, workers=1, progress=False)
    assert len(list((folder / ".cache").glob("rank-*-kept.parquet"))) == len(first.files)
    for events in (folder / ".cache").glob("rank-*-events.parquet"):
        events.unlink()  # a second pass that needed the events would decode the JSON again
    again = summarise_run(folder, workers=1, progress=False)
    assert not list((folder / ".cache").glob("rank-*-events.parquet")), "the parts sufficed"
    pd.testing.assert_frame_equal(again.time_per_kind(), first.time_per_kind())
    pd.testing.assert_frame_equal(again.step_times(), first.step_times())
    pd.testing.assert_frame_equal(again.collective_waits(), first.collective_waits())
    pd.testing.assert_frame_equal(again.waiting_per_step(), first.waiting_per_step())


def test_a_pass_without_the_path_keeps_no_chains_and_the_same_tables(tmp_path):
    folder = _replayed("ddp", tmp_path)
    fast = summarise_run(folder, workers=1, progress=False, cache=False, critical=False)
    full = summarise_run(folder, workers=1, progress=False, cache=False)
    assert not fast.pieces and fast.path_summary().empty and full.pieces
    pd.testing.assert_frame_equal(fast.step_times(), full.step_times())
    pd.testing.assert_frame_equal(fast.waiting_per_step(), full.waiting_per_step())


def test_a_cached_pass_without_the_path_is_followed_by_one_that_finds_it(tmp_path):
    folder = _replayed("ddp", tmp_path)
    summarise_run(folder, workers=1, progress=False, critical=False)
    assert summarise_run(folder, workers=1, progress=False).pieces


def _runs_with_steps() -> list:
    """Every recording of the series with profiler steps, and the runs kept in tests/data."""
    found = []
    for folder in sorted([*RECORDINGS_ROOT.glob("*/files"), *RECORDINGS_ROOT.glob("gpu/*/files")]):  # fmt: skip
        if [p for p in folder.rglob("*.json.gz") if "rank" in p.name or "trace" in p.name]:
            found.append(pytest.param(folder, id=folder.parent.name))
    found = quick_sample(found, recording_family)  # the quick loop: one recording of each job
    # pipeline-send-in-its-call: a live run of lesson 14's 1F1B job whose send's record ended
    # in the c10d::send that issued it (the path strung rank by rank lost 120 ms there)
    for name in ("h200-streams", "hang-with-traces", "mesh-straggler", "pipeline-gpipe-3", "pipeline-send-in-its-call"):  # fmt: skip
        found.append(pytest.param(REPO / "tests" / "data" / name, id=name))
    return found


#: Real traces of other people's jobs and of ours (../shared/real-traces), with steps.
REAL_RUNS = {
    "h200 DDP over gloo with CUDA tensors": "h200/base-1",
    "the same, one rank's GPU slowed": "h200/gpuslow-1",
    "ns-resolution GPU rank": "hta/ns_resolution_trace",
    "2-GPU NCCL rank 0": "hta/nccl_parser_config",
    "two ranks of a 128-GPU job": "hta/trace_filter",
    "event syncs": "hta/critical_path/cuda_event_sync",
    "a gloo CPU rank": "hta/cpu_only",
    "the H200 job's side stream": "h200/side-1",
    "Megatron TP=2 on NCCL, a late rank": "nccl-jobs/megatron-tp2",
    "TorchRec on 4 GPUs, windows begun apart": "nccl-jobs/torchrec-a2a-optimizer-2a",
    "TorchRec on 4 GPUs, a rank asleep each step": "nccl-jobs/torchrec-a2a-optimizer",
    "TorchRec on 4 GPUs, quantised comms": "nccl-jobs/torchrec-a2a-optimizer-qcomm-trace",
    "TorchRec on 2 GPUs, CPU-bound": "nccl-jobs/torchrec-resnet18",
}


def _same_path(source) -> None:
    """The path strung from each rank's part is the whole run's: the same summary, and stretch
    for stretch (:func:`_stretches`) the same ranks in turn, each with the same time per kind
    and name (a rank's part keeps sums per piece, not its segments)."""
    from helpers import critical_path, path_summary

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            whole = load_run(source, cache=False, same_run=False).events
        except TraceError:  # recordings of runs without traces of steps (RPC, debug servers)
            pytest.skip("no trace of steps here")
        if not (whole["kind"] == "step").any():
            pytest.skip("no profiler steps")
        trail: list[tuple] = []
        by_rank = summarise_run(source, workers=1, cache=False, progress=False).path_summary(trail=trail)  # fmt: skip
        path = critical_path(whole)
        expected = path_summary(path, ["kind", "name"])
    pd.testing.assert_frame_equal(by_rank, expected, check_dtype=False)
    # the whole run's segments as the walk met them: each step from its end back
    back = pd.concat([rows.iloc[::-1] for _, rows in path.groupby("step", sort=False)])
    walked = zip(back["step"], back["rank"], back["kind"].astype(str), back["name"].astype(str), back["dur_us"])  # fmt: skip
    strung, walked = _stretches(trail), _stretches(walked)
    assert [s[:2] for s in strung] == [s[:2] for s in walked]  # the same ranks, in turn
    for (step, rank, mine), (_, _, theirs) in zip(strung, walked):
        assert mine == pytest.approx(theirs, rel=1e-6, abs=1e-3), f"step {step}, rank {rank}"


def _stretches(trail) -> list[tuple[int, int, dict]]:
    """A path's time (``(step, rank, kind, name, µs)``, each step from its end back) as its
    stretches on one rank: ``(step, rank, {(kind, name): µs})``, a stretch ending where the
    path goes to another rank or step. Summed first, then what adds up to under a ns left out
    (one side sums a piece's segments, the other has them one by one)."""
    found: list[tuple[int, int, dict]] = []
    for step, rank, kind, name, us in trail:
        if not found or found[-1][:2] != (step, rank):
            found.append((int(step), int(rank), {}))
        held = found[-1][2]
        held[(kind, name)] = held.get((kind, name), 0.0) + us
    kept: list[tuple[int, int, dict]] = []
    for step, rank, held in found:
        held = {k: us for k, us in held.items() if us >= 1e-3}
        if held and kept and kept[-1][:2] == (step, rank):  # a stretch of no time between
            for k, us in held.items():
                kept[-1][2][k] = kept[-1][2].get(k, 0.0) + us
        elif held:
            kept.append((step, rank, held))
    return kept


@pytest.mark.parametrize("source", _runs_with_steps())
def test_the_path_strung_from_each_ranks_part_is_the_whole_runs_path(source):
    _same_path(source)


def test_a_rank_that_began_the_first_step_later_is_walked_through_what_came_before_it(tmp_path):
    from test_graph import op, step

    from conftest import trace_doc, write_doc

    # rank 1 begins the run's first step at 0; rank 0 begins its own at 300, inside a setup op
    # begun at 200, and ends last (1100): the path walks rank 0 back to 0, through the setup
    # op's 100 µs before its step (a rank's part that stopped at its step gave them to untraced)
    ranks = {
        0: [step(300, 800), op("setup", 200, 150), op("aten::mm", 350, 750)],
        1: [step(0, 1000), op("aten::mm", 0, 1000)],
    }
    for rank, events in ranks.items():
        write_doc(tmp_path / f"rank{rank}.json", trace_doc(events, rank=rank, world=2))
    _same_path(tmp_path)


def test_the_path_strung_rank_by_rank_begins_a_step_two_ranks_ended_together_as_the_whole_runs(tmp_path):  # fmt: skip
    from test_known_answers import KNOWN_STARTS

    from conftest import trace_doc, write_doc

    ranks, first, _ = KNOWN_STARTS["step end: of ranks that ended it together, the path begins on the lowest"]  # fmt: skip
    for rank, events in ranks.items():
        write_doc(tmp_path / f"rank{rank}.json", trace_doc(events, rank=rank, world=len(ranks)))
    _same_path(tmp_path)  # ranks 1 and 2 tie: the stretches of one are not the other's
    trail: list[tuple] = []
    summarise_run(tmp_path, workers=1, cache=False, progress=False).path_summary(trail=trail)
    assert trail[0][1] == first


@pytest.mark.parametrize("where", quick_sample([pytest.param(w, id=k) for k, w in REAL_RUNS.items()], real_trace_family))  # fmt: skip
def test_the_path_of_real_traces_strung_rank_by_rank_is_their_whole_path(real_traces, where):
    _same_path(real_traces / where)


def test_a_recordings_manifest_is_left_out_of_a_run_read_rank_by_rank():
    summary = summarise_run(_recording("ddp"), workers=1, cache=False, progress=False)
    assert summary.files and "recording.json" not in {p.name for p in summary.files}


@pytest.mark.parametrize(
    "experiment, skew_ms",
    [("ddp-straggler", 5), ("ddp-straggler", 20), ("fsdp-straggler", -5), ("fsdp-straggler", 20)],
    ids=["ddp, rank 1 5 ms ahead", "ddp, 20 ms ahead", "fsdp, 5 ms behind", "fsdp, 20 ms ahead"],
)
def test_the_path_strung_rank_by_rank_covers_every_step_when_the_clocks_disagree(
    experiment, skew_ms
):
    """A rank's arrival read on another clock can come after the moment the walk reached the
    collective: the path must not go back up in time (it counted some time twice, or looped)."""
    from helpers import step_windows
    from helpers.analysis.rank_by_rank import kept_of_rank, summary_of

    events = load_run(_recording(experiment), cache=False).events
    parts = []
    for rank, mine in events.groupby("rank"):
        shift = skew_ms * 1e3 if rank == 1 else 0.0  # as two machines' clocks could disagree
        parts.append(kept_of_rank(mine.assign(start_us=mine["start_us"] + shift, end_us=mine["end_us"] + shift)))  # fmt: skip
    summary = summary_of(parts)
    walls_ms = sum(hi - lo for _, lo, hi in step_windows(summary.steps)) / 1e3
    assert summary.path_summary()["ms"].sum() == pytest.approx(walls_ms, rel=1e-6)


def test_a_builder_across_ranks_added_to_the_list_builds_both_graphs(tmp_path, monkeypatch):
    from helpers.analysis.path import builders
    from helpers.analysis.path.dependencies import TRANSFER
    from helpers.analysis.path.from_rank_parts import ports_graph
    from helpers.analysis.path.graph import Edges
    from helpers.analysis.path.lanes import lane_intervals

    folder = _replayed("ddp", tmp_path)
    events = load_run(folder, cache=False).events
    summary = summarise_run(folder, workers=1, cache=False, progress=False)

    def both_graphs() -> list:
        whole = lane_intervals(events).graph
        return [whole, ports_graph(summary.ports, summary.collectives, summary.steps).graph]

    before, made = both_graphs(), []

    def from_each_collectives_start(run):  # a new dependency across ranks, in name only
        rows = run.rows("collective")
        made.append(len(rows))
        return [Edges.of(2 * rows, 2 * rows + 1, TRANSFER, 0.0)]

    added = builders.Builder(from_each_collectives_start, (TRANSFER,))
    monkeypatch.setattr(builders, "BUILDERS", (*builders.BUILDERS, added))  # one row, no other edit
    after = both_graphs()
    assert len(made) == 2 and min(made) > 0
    assert [len(a.source) - len(b.source) for a, b in zip(after, before)] == made


def test_only_the_builders_whose_dependencies_join_ranks_build_the_graph_across_ranks():
    from helpers.analysis.path.builders import BUILDERS, receive_edges, transfer_edges
    from helpers.analysis.path.step_ends import step_end_edges

    assert [b.build for b in BUILDERS if b.across] == [transfer_edges, receive_edges, step_end_edges]  # fmt: skip
