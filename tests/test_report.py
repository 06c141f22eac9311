"""The report of a folder of traces (``python -m helpers.report``), as a specification.

It is built from the lessons' recorded runs, from the GPU excerpts that ship with the series and
from other people's traces in ``../shared/real-traces/``; bad input of every kind ends in the
report's own message and exit status 2, never a traceback.
"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import REAL_TRACES, REPO, kineto_doc, quick_sample, real_trace_family, write_doc
from helpers import RecordingMissing, find_straggler, load_run, merge_traces, recorded_traces
from helpers.jobs.runs import RunRecord
from helpers.report import ReportError, Section, build_report, report_html
from helpers.report.__main__ import main
from helpers.report.cautions import Facts, cautions, missing_ranks
from helpers.traces import run_files

GPU_EXCERPTS = REPO / "data" / "gpu-traces"
TWO_OF_128 = sorted(GPU_EXCERPTS.glob("nccl-128gpu-rank*.json.gz"))
HELD = "What held the steps, what to fix first"
ORDER = [HELD, "What the traces cannot tell", "Step time per rank", "Waiting and the straggler", "Time per kind", "Where the memory went"]  # fmt: skip


def files_of(run: RunRecord) -> list[Path]:
    return [path for path, _ in run_files(run)[0]]


@pytest.fixture(scope="module")
def straggler_run(lesson_run) -> RunRecord:
    """Lesson 4's run with rank 1 slowed."""
    return lesson_run("ddp-straggler")


@pytest.fixture(scope="module")
def straggler_report(straggler_run):
    return build_report(straggler_run.run_dir)


# ---------------------------------------------------------------- what a report says


def test_a_report_opens_with_what_held_the_steps_then_reads_in_order(straggler_report):
    assert [s.title for s in straggler_report.sections] == ORDER


def test_the_first_section_names_the_slowed_ranks_op_and_predicts_the_step_without_it(
    straggler_run, straggler_report
):
    held = straggler_report.section(HELD)
    assert held.text.startswith("Each step's critical path")
    assert "most of it is rank 1's `enumerate(DataLoader)" in held.text
    predicted = float(re.search(r"would take ([\d.]+) ms \(", held.text).group(1))
    measured = load_run(straggler_run).events.pipe(lambda e: e[e["kind"] == "step"])
    delay_ms = 150  # the lesson's --delay-ms
    saving = measured["dur_us"].median() / 1e3 - predicted
    assert saving == pytest.approx(delay_ms, rel=0.1), "the what-if takes out the delay"
    assert held.table.iloc[0][["rank", "kind"]].tolist() == [1, "data loading"]
    assert held.figure.startswith(b"\x89PNG") and "critical path" in held.alt


def test_a_hung_step_and_its_unmatched_collectives_are_flagged_never_an_all_clear():
    report = build_report(recorded_traces("hang"))  # lesson 8: all_reduce against broadcast
    held = report.section(HELD).text
    assert re.search(r"Step 3 took 30\d\d ms, \d+ times the median step", held)
    assert "rank 1's gloo:broadcast #3 (step 3) has no partner on rank 0" in held
    assert "rank 0's gloo:all_reduce #3 (step 3) has no partner on rank 1" in held
    assert "Nothing stands out" not in " ".join(s.text for s in report.sections)


def test_a_hung_step_is_left_out_of_what_held_the_usual_steps():
    held = build_report(recorded_traces("hang")).section(HELD)
    assert "Over the 2 steps of usual length (the long ones are below)" in held.text
    assert held.table["on the path (ms)"].sum() < 100, "not the 3 s the hung step waited"


def test_pointed_at_a_recording_the_report_skips_its_manifest_and_reads_the_traces(straggler_run):
    folder = recorded_traces("ddp-straggler").parent
    report = build_report(folder, critical=False)
    assert [Path(p).name for p, _ in report.skipped] == ["recording.json"]
    assert report.glance["ranks found"] == "2: 0-1"
    assert report.glance["trace files"].startswith("2 "), "the manifest is no trace file"
    assert "folders" not in report.section("What the traces cannot tell").text
    assert any(
        "is not a trace" in s
        for s in report.section("What the traces cannot tell").text.split("\n")
    )


@pytest.mark.parametrize(
    "name, content, said",
    [
        ("config.json", '{"lr": 0.1, "batch": 32}', "it has no traceEvents"),
        ("timings.json", "[0.231, 0.229, 0.244]", "a JSON list whose first entry is not an event"),
        ("note.json", '"step times in ms"', "a JSON value"),
    ],
    ids=["a-config", "a-list-of-timings", "a-string"],
)
def test_a_json_file_that_is_no_trace_beside_the_traces_is_left_out_and_named(
    tmp_path, name, content, said
):
    folder = shutil.copytree(recorded_traces("ddp-straggler"), tmp_path / "run")
    (folder / name).write_text(content)
    report = build_report(folder, critical=False)
    assert [(Path(p).name, said in why) for p, why in report.skipped] == [(name, True)]
    assert report.ranks == [0, 1]


def test_a_report_names_the_straggler_the_analysis_names(straggler_run, straggler_report):
    expected = find_straggler(load_run(straggler_run).events)
    text = straggler_report.section("Waiting and the straggler").text
    assert text.startswith(f"Rank {expected} waits least")
    assert expected == 1  # the lesson slowed rank 1


def test_the_job_at_a_glance_gives_ranks_world_size_backend_and_steps(straggler_report):
    glance = straggler_report.glance
    assert glance["ranks found"] == "2: 0-1"
    assert glance["world size"] == "2"
    assert glance["backend"] == "gloo"
    assert glance["device"].startswith("CPU")
    assert re.fullmatch(r"\d+: ProfilerStep#\d+-\d+", glance["steps"])


def test_the_step_table_holds_each_ranks_median_step(straggler_run, straggler_report):
    table = straggler_report.section("Step time per rank").table
    medians = load_run(straggler_run).events.pipe(lambda e: e[e["kind"] == "step"])
    expected = medians.groupby("rank")["dur_us"].median() / 1e3
    assert table["median (ms)"].to_numpy() == pytest.approx(expected.to_numpy(), abs=0.05)


def small_run(folder: Path, keep=lambda event: True) -> Path:
    """Two ranks of conftest's small trace, all-reduces of equal length, ``keep`` its events."""
    for rank in (0, 1):
        doc = kineto_doc(rank, steps=3)
        for event in doc["traceEvents"]:
            if event.get("name") == "gloo:all_reduce":
                event["dur"] = 200.0
        doc["traceEvents"] = [e for e in doc["traceEvents"] if keep(e)]
        write_doc(folder / f"rank{rank}.json", doc)
    return folder


def test_even_waiting_names_no_straggler(tmp_path):
    report = build_report(small_run(tmp_path))
    assert report.section("Waiting and the straggler").text.startswith("No rank stands out")


def test_two_ranks_of_a_128_rank_gpu_job_say_who_is_missing_and_that_neither_stands_out():
    report = build_report(TWO_OF_128)
    said = report.section("What the traces cannot tell").text
    assert "126 of the job's 128 ranks left no trace here" in said
    assert "probably one that was not profiled" not in said  # they wait a tenth of a step
    assert report.section("Waiting and the straggler").text.startswith("No rank stands out")
    assert report.glance["device"].startswith("GPU")
    gpu = report.section("The GPU").table
    assert list(gpu.index) == [0, 1]
    assert (gpu["launch to start (ms, median)"] > 0).all()


def test_a_path_led_by_an_annotation_through_few_ranks_says_what_it_cannot_tell():
    # the two ranks' path is led by rank 1's `## backward ##`, an annotation with nothing under it
    held = build_report(TWO_OF_128).section("What held the steps, what to fix first").text
    assert "`## backward ##` is an annotation, and nothing the profiler recorded ran" in held
    assert "the 2 ranks traced of the job's 128" in held


def test_a_path_of_every_rank_with_ops_on_top_adds_no_caveat(straggler_report):
    held = straggler_report.section("What held the steps, what to fix first").text
    assert "is an annotation" not in held and "ranks traced" not in held


STREAM_WAITS = {
    "several streams, no sync events: the waits the path cannot see are said": (TWO_OF_128, True),
    "sync events recorded: nothing to add": ("cuda_event_sync_multi_stream", False),
}


@pytest.mark.parametrize("traces, said", STREAM_WAITS.values(), ids=STREAM_WAITS.keys())
def test_a_gpu_trace_recorded_without_sync_events_says_how_to_record_them(real_traces, traces, said):  # fmt: skip
    if traces == "cuda_event_sync_multi_stream":
        traces = real_traces / "hta/critical_path" / traces
    text = build_report(traces).section("What the traces cannot tell").text
    assert ("enable_cuda_sync_events=True" in text) == said


def test_stream_waits_the_profiler_left_unmatched_are_followed_not_left_as_a_queue():
    # a real H200 trace whose stream waits the profiler left unmatched (tests/test_graph.py)
    report = build_report(REPO / "tests" / "data" / "h200-streams")
    held = report.section("What held the steps, what to fix first").text
    assert "`side_stream_work` (its GPU kernels)" in held and "queue" not in held
    assert "could not be matched" not in report.section("What the traces cannot tell").text


@pytest.mark.slow  # launches PyTorch's analyser: make test, not the quick loop
def test_a_hang_in_the_dumps_beside_the_traces_comes_first_with_its_rank_and_its_chain():
    # rank 1 stalled before step 2's expert-parallel all_to_all (tests/data/hang-with-traces)
    report = build_report(REPO / "tests" / "data" / "hang-with-traces")
    assert report.sections[0].title == "The hang, from the Flight Recorder"
    hang = report.sections[0].text
    assert "group 4 (ep), collective 2: missing" in hang and "differs on rank(s) [1]" in hang
    assert (
        "- rank 2 waits in group 4 (ep)'s all_to_all #2 for rank 1, which never joined it." in hang
    )
    assert "for rank 2, which waits in group 4 (ep)'s all_to_all #2." in hang
    assert "PyTorch's analyser's first finding is group 6 (dp), collective 2" in hang


def test_dumps_of_a_job_that_did_not_hang_add_no_hang_section():
    titles = [s.title for s in build_report(REPO / "tests" / "data" / "mesh-straggler").sections]
    assert "The hang, from the Flight Recorder" not in titles


def test_a_gpu_report_decides_once_which_events_are_the_collectives(monkeypatch):
    import helpers.analysis.collectives as collectives
    import helpers.report.build as build

    decided = []

    def counted(events):
        decided.append(len(events))
        return collectives.CollectiveSource(collectives.NCCL_KERNELS, "counted")

    monkeypatch.setattr(collectives, "collective_source", counted)  # what the sections call
    monkeypatch.setattr(build, "collective_source", counted)

    report = build_report(TWO_OF_128)

    assert "The GPU" in [s.title for s in report.sections]
    assert len(decided) == 1


MESH_STRAGGLER = REPO / "tests" / "data" / "mesh-straggler"  # 2x2 tp x dp, rank 3 late in tp
PER_GROUP = "Waiting per process group"


def test_flight_recorder_dumps_beside_gloo_traces_give_each_groups_straggler(tmp_path):
    folder = shutil.copytree(MESH_STRAGGLER, tmp_path / "run", ignore=shutil.ignore_patterns(".*"))

    table = build_report(folder).section(PER_GROUP).table

    assert table["straggler"].to_dict() == {"1": None, "2": 3, "3": 2, "4": 3}


def test_gloo_traces_without_dumps_get_no_section_per_group(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    for trace in MESH_STRAGGLER.glob("rank*_trace.json.gz"):
        shutil.copy(trace, folder)

    assert PER_GROUP not in [s.title for s in build_report(folder).sections]


def test_a_sharded_run_gets_its_phases(lesson_run):
    report = build_report(lesson_run("fsdp").run_dir)
    phases = report.section("A sharded job's phases")
    assert "layer4.1" in phases.table.index
    assert phases.figure.startswith(b"\x89PNG")


def test_a_run_without_steps_says_so_and_what_to_do(tmp_path):
    folder = small_run(tmp_path, keep=lambda e: not e.get("name", "").startswith("ProfilerStep"))
    report = build_report(folder)
    said = report.section("What the traces cannot tell").text
    assert "No `ProfilerStep#N` markers" in said and "prof.step()" in said
    assert report.section("Step time per rank").text.startswith("No `ProfilerStep#N`")


def _real_trace_folders() -> list[str]:
    """Each folder of ``../shared/real-traces`` that holds trace files of its own: one run."""
    folders = {p.parent for p in REAL_TRACES.rglob("*.json.gz")} if REAL_TRACES.is_dir() else ()
    return sorted(str(f.relative_to(REAL_TRACES)) for f in folders)


@pytest.mark.parametrize("folder", quick_sample(_real_trace_folders(), real_trace_family))
def test_every_folder_of_real_traces_gets_a_report_and_nothing_is_written_beside_them(
    real_traces, folder
):
    report = build_report(real_traces / folder)
    titles = [s.title for s in report.sections]
    assert report.failed == []
    assert titles[0] in (HELD, "What the traces cannot tell")
    assert "What the traces cannot tell" in titles[:2]


def test_a_warning_of_the_analysis_becomes_a_sentence_of_the_report(real_traces, recwarn):
    report = build_report(real_traces / "hta" / "ns_resolution_trace")
    assert "no NCCL kernels" in report.section("What the traces cannot tell").text
    assert not [w for w in recwarn if "NCCL" in str(w.message)]


def test_traces_from_several_folders_say_their_clocks_differ(straggler_run, tmp_path):
    for node, path in enumerate(files_of(straggler_run)):
        (tmp_path / f"node{node}").mkdir()
        shutil.copy(path, tmp_path / f"node{node}" / path.name)
    said = build_report(tmp_path, critical=False).section("What the traces cannot tell").text
    assert "come from 2 folders" in said and "clock_offsets" in said


def test_one_merged_file_reports_every_rank_in_it(straggler_run, tmp_path):
    merged = merge_traces(load_run(straggler_run), tmp_path / "merged.json")
    assert build_report(merged, critical=False).glance["ranks found"] == "2: 0-1"


def test_read_rank_by_rank_the_report_gives_the_same_step_table_and_straggler(
    straggler_run, straggler_report
):
    by_rank = build_report(straggler_run.run_dir, whole_limit_mb=0)
    assert by_rank.read == "rank by rank"
    pd.testing.assert_frame_equal(
        by_rank.section("Step time per rank").table,
        straggler_report.section("Step time per rank").table,
    )
    waiting = "Waiting and the straggler"
    assert by_rank.section(waiting).text == straggler_report.section(waiting).text
    assert "Too large to load whole" in by_rank.section("What the traces cannot tell").text


def test_read_rank_by_rank_the_report_names_what_held_the_steps_as_the_whole_read_does(
    straggler_run, straggler_report
):
    held = build_report(straggler_run.run_dir, whole_limit_mb=0).section(HELD)
    whole = straggler_report.section(HELD)
    assert held.table.iloc[0][["rank", "kind", "op"]].tolist() == whole.table.iloc[0][["rank", "kind", "op"]].tolist()  # fmt: skip
    assert held.figure is None and "strung together from each rank's part" in held.text


@pytest.mark.parametrize("whole_limit_mb", [1024, 0], ids=["read whole", "rank by rank"])
def test_without_the_path_the_report_leaves_out_what_held_the_steps_and_keeps_the_rest(
    straggler_run, straggler_report, whole_limit_mb
):
    report = build_report(straggler_run.run_dir, whole_limit_mb=whole_limit_mb, critical=False)
    titles = [s.title for s in report.sections]
    assert HELD not in titles and titles[:2] == ORDER[1:3]
    pd.testing.assert_frame_equal(
        report.section("Step time per rank").table,
        straggler_report.section("Step time per rank").table,
    )


def test_the_command_leaves_out_the_path_when_asked(straggler_run, tmp_path):
    out = tmp_path / "report.html"
    assert main([str(straggler_run.run_dir), "--out", str(out), "--no-path"]) == 0
    assert HELD not in out.read_text()


def test_read_rank_by_rank_the_report_flags_a_hang():
    held = build_report(recorded_traces("hang"), whole_limit_mb=0).section(HELD).text
    assert "a stall or a hang" in held and "has no partner on rank" in held


def test_a_section_shows_itself_in_a_notebook(straggler_report):
    section = straggler_report.section("Step time per rank")
    shown = section._repr_html_()
    assert shown.startswith("<h2>Step time per rank</h2>") and "<table" in shown


def test_asking_for_a_section_that_is_not_there_lists_those_that_are(straggler_report):
    with pytest.raises(KeyError, match="this report has"):
        straggler_report.section("The GPU")


# ---------------------------------------------------------------- the page


def test_the_page_is_self_contained_with_figures_embedded_and_described(straggler_report):
    page = report_html(straggler_report)
    assert not re.search(r"""(src|href)=["']?(https?:|//|file:)""", page)
    assert "<script" not in page
    images = re.findall(r'<img src="data:image/png;base64,[^"]+" alt="([^"]+)">', page)
    assert len(images) == 3 and all(images)


def test_text_from_a_trace_is_escaped_in_the_page():
    section = Section("Odd <names>", "a `<script>` in a kernel's name")
    page = report_html(build_report_stub(section))
    assert "<script>" not in page and "&lt;script&gt;" in page


def build_report_stub(section: Section):
    from helpers.report import Report

    return Report("x", {"ranks found": "1: 0"}, [section])


# ---------------------------------------------------------------- the command and bad input


def test_the_command_writes_the_page_and_says_where(straggler_run, tmp_path, capsys):
    out = tmp_path / "r" / "report.html"
    assert main([str(straggler_run.run_dir), "--out", str(out), "--no-path"]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert "report written to" in capsys.readouterr().out


def test_the_command_writes_the_merged_trace_beside_it_when_asked(straggler_run, tmp_path):
    merged = tmp_path / "merged.json.gz"
    assert main([str(straggler_run.run_dir), "--out", str(tmp_path / "r.html"), "--merged", str(merged), "--no-path"]) == 0  # fmt: skip
    assert gzip.decompress(merged.read_bytes()).startswith(b"{")


@pytest.mark.slow  # launches a process: make test, not the quick loop
def test_the_command_runs_as_a_module(straggler_run, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "helpers.report", str(straggler_run.run_dir), "--out", str(tmp_path / "r.html")],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def refused(argv: list[str], capsys) -> str:
    """The command's message on stderr, after it exited with status 2."""
    assert main(argv) == 2
    return capsys.readouterr().err


def test_an_empty_folder_is_named_with_what_to_do(tmp_path, capsys):
    said = refused([str(tmp_path), "--out", str(tmp_path / "r.html")], capsys)
    assert str(tmp_path.name) in said and "no trace files" in said and "on_trace_ready" in said
    assert not (tmp_path / "r.html").exists()


def test_a_path_that_does_not_exist_is_named(tmp_path, capsys):
    said = refused([str(tmp_path / "nowhere")], capsys)
    assert "nowhere: no such file or folder" in said


def test_a_folder_of_json_files_none_a_trace_is_refused_naming_each(tmp_path, capsys):
    (tmp_path / "config.json").write_text('{"lr": 0.1}')  # no traceEvents
    (tmp_path / "list.json").write_text("[1, 2, 3]")  # a list, but not of events
    said = refused([str(tmp_path), "--out", str(tmp_path / "r.html")], capsys)
    assert "no usable trace among" in said
    assert re.search(r"config\.json \(is not a trace", said)
    assert re.search(r"list\.json \(is not a trace: a JSON list whose first entry", said)


def test_a_trace_damaged_past_its_first_event_is_named_with_skip_bad_offered(tmp_path, capsys):
    (tmp_path / "rank0.json").write_text('{"traceEvents": [{"ph": "X"}, 2, 3]}')
    said = refused([str(tmp_path), "--out", str(tmp_path / "r.html")], capsys)
    assert re.search(r"rank0\.json: traceEvents\[1\] is not an event", said)
    assert "--skip-bad" in said


def test_a_folder_of_manifests_and_no_trace_is_refused_naming_them(tmp_path, capsys):
    (tmp_path / "recording.json").write_text('{"key": {"script": "x.py"}}')
    said = refused([str(tmp_path), "--out", str(tmp_path / "r.html")], capsys)
    assert "recording.json: is not a trace" in said and "--skip-bad" not in said


def test_two_jobs_mixed_in_one_folder_are_named_as_such(tmp_path, capsys):
    for path in [*TWO_OF_128, GPU_EXCERPTS / "nccl-2gpu-rank0.json.gz"]:
        shutil.copy(path, tmp_path / path.name)
    said = refused([str(tmp_path), "--out", str(tmp_path / "r.html")], capsys)
    assert "two runs in one folder" in said


def test_a_truncated_file_is_named_and_skip_bad_reports_on_the_rest(
    straggler_run, tmp_path, capsys
):
    first, second = files_of(straggler_run)
    shutil.copy(first, tmp_path / first.name)
    (tmp_path / second.name).write_bytes(second.read_bytes()[:20000])
    said = refused([str(tmp_path), "--out", str(tmp_path / "r.html")], capsys)
    assert second.name in said and "truncated" in said and "--skip-bad" in said
    assert main([str(tmp_path), "--skip-bad", "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert f"Skipped {tmp_path.name}" in page or f"{second.name}: the JSON stops" in page


def test_build_report_raises_report_error_not_a_traceback_from_pandas(tmp_path):
    (tmp_path / "rank0.json").write_text('{"traceEvents": [')
    with pytest.raises(ReportError, match=r"rank0\.json"):
        build_report(tmp_path)


# ---------------------------------------------------------------- the cautions alone


def test_missing_ranks_are_those_of_the_world_without_a_trace():
    assert missing_ranks([0, 3], 4) == [1, 2]
    assert missing_ranks([0, 1], None) == []


def test_a_job_that_does_not_record_its_size_says_missing_ranks_cannot_be_named():
    said = cautions(Facts(ranks=[0], world_size=None, has_steps=True))
    assert any("do not record the job's size" in s for s in said)


def test_a_complete_job_with_steps_says_every_rank_left_a_trace():
    said = cautions(Facts(ranks=[0, 1], world_size=2, has_steps=True))
    assert said == ["Every rank of the job left a trace with steps, and every file was read."]


def test_profiled_ranks_that_all_wait_a_fifth_of_a_step_point_outside_them():
    waiting = pd.Series({0: 30.0, 1: 35.0})
    said = cautions(Facts(ranks=[0, 1], world_size=8, has_steps=True, waiting=waiting, step_ms=100))
    assert any("probably one that was not profiled" in s for s in said)


def test_profiled_ranks_of_which_one_waits_far_less_do_not_point_outside_them():
    waiting = pd.Series({0: 25.0, 1: 60.0})
    said = cautions(Facts(ranks=[0, 1], world_size=8, has_steps=True, waiting=waiting, step_ms=100))
    assert not any("probably one that was not profiled" in s for s in said)


def test_profiled_ranks_that_hardly_wait_do_not_point_outside_them():
    waiting = pd.Series({0: 1.0, 1: 30.0})
    said = cautions(Facts(ranks=[0, 1], world_size=8, has_steps=True, waiting=waiting, step_ms=100))
    assert not any("probably one that was not profiled" in s for s in said)


# ---------------------------------------------------------------- finding traces


def test_a_pattern_the_shell_did_not_expand_names_the_files_it_matches():
    pattern = str(GPU_EXCERPTS / "nccl-128gpu-rank*.json.gz")
    assert build_report(pattern).glance["ranks found"] == "2: 0-1"


def test_a_pattern_that_matches_nothing_says_so(tmp_path):
    with pytest.raises(ReportError, match="this pattern matches no file"):
        build_report(str(tmp_path / "rank*.json"))


def test_a_recorded_run_of_the_series_is_found_by_its_experiment():
    folder = recorded_traces("ddp-straggler")
    assert len(list(folder.glob("rank*.json.gz"))) == 2


def test_an_experiment_never_recorded_is_refused_with_those_that_were():
    with pytest.raises(
        RecordingMissing, match=r"no recorded run of 'nope'; recorded: \[.*'ddp-straggler'"
    ):
        recorded_traces("nope")


# ---------------------------------------------------------------- read rank by rank


def test_read_rank_by_rank_skip_bad_leaves_out_a_truncated_file(straggler_run, tmp_path):
    first, second = files_of(straggler_run)
    shutil.copy(first, tmp_path / first.name)
    (tmp_path / second.name).write_bytes(second.read_bytes()[:20000])
    report = build_report(tmp_path, whole_limit_mb=0, skip_bad=True)
    assert report.read == "rank by rank"
    assert [Path(path).name for path, _ in report.skipped] == [second.name]
    assert report.glance["ranks found"].startswith("1:")


def test_read_rank_by_rank_two_runs_in_one_folder_are_refused(tmp_path):
    for path in [*TWO_OF_128, GPU_EXCERPTS / "nccl-2gpu-rank0.json.gz"]:
        shutil.copy(path, tmp_path / path.name)
    with pytest.raises(ReportError, match="two runs in one folder"):
        build_report(tmp_path, whole_limit_mb=0)


def test_read_rank_by_rank_two_runs_of_different_world_sizes_are_refused(tmp_path):
    write_doc(tmp_path / "rank0.json", kineto_doc(0, world=2))
    write_doc(tmp_path / "rank1.json", kineto_doc(1, world=4))
    with pytest.raises(
        ReportError,
        match=r"(?s)rank1.json: comes from a different run than .*rank0.json "
        r"\(world_size 4 vs 2\).*two runs in one folder",
    ):
        build_report(tmp_path, whole_limit_mb=0)


def test_read_rank_by_rank_the_world_size_comes_from_every_files_header(tmp_path):
    for path in TWO_OF_128:
        shutil.copy(path, tmp_path / path.name)
    report = build_report(tmp_path, whole_limit_mb=0)
    assert report.glance["world size"] == "128"
    assert (
        "126 of the job's 128 ranks left no trace"
        in report.section("What the traces cannot tell").text
    )


def test_one_merged_file_too_large_to_read_whole_asks_for_the_ranks_files(straggler_run, tmp_path):
    merged = merge_traces(load_run(straggler_run), tmp_path / "merged.json")
    with pytest.raises(ReportError, match="give the report the ranks' own files"):
        build_report(merged, whole_limit_mb=0)


def test_the_merged_trace_is_written_from_the_reports_own_read(
    straggler_run, tmp_path, monkeypatch
):
    from helpers.report import build

    loads, real = [], build.load_run
    monkeypatch.setattr(build, "load_run", lambda *a, **k: loads.append(a) or real(*a, **k))
    merged = tmp_path / "m.json"
    assert main([str(straggler_run.run_dir), "--out", str(tmp_path / "r.html"), "--merged", str(merged), "--no-path"]) == 0  # fmt: skip
    assert len(loads) == 1 and merged.read_bytes().startswith(b"{")


def test_merged_is_written_from_a_pattern_of_files_too(tmp_path):
    merged = tmp_path / "m.json"
    pattern = str(GPU_EXCERPTS / "nccl-128gpu-rank*.json.gz")
    assert (
        main([pattern, "--out", str(tmp_path / "r.html"), "--merged", str(merged), "--no-path"])
        == 0
    )
    assert merged.read_bytes().startswith(b"{")


def test_a_cycle_in_the_graph_of_a_run_reaches_the_report_as_a_caution(tmp_path, monkeypatch):
    from helpers.analysis.path import builders
    from helpers.analysis.path.dependencies import WAKE_UP
    from helpers.analysis.path.graph import Edges

    def a_cycle(run):  # the ends of the first two intervals, each waiting for the other
        return [Edges.of([1, 3], [3, 1], WAKE_UP)]

    cycle = builders.Builder(a_cycle, (WAKE_UP,))
    monkeypatch.setattr(builders, "BUILDERS", (*builders.BUILDERS, cycle))
    said = build_report(small_run(tmp_path)).section("What the traces cannot tell").text
    assert "holds 1 cycle(s) of moments that wait, through their edges, for themselves" in said
    assert "(wake-up; the first among" in said and "keep their measured times" in said
    assert "A wake-up edge is a thread's wait, until what it waited for on another lane ended." in said  # fmt: skip


def test_a_report_cuts_a_runs_lanes_once(tmp_path, monkeypatch):
    from helpers.analysis.path import lanes
    from helpers.report import held

    cut, real = [], lanes.lane_intervals
    counted = lambda *a, **k: cut.append(a) or real(*a, **k)  # noqa: E731
    monkeypatch.setattr(lanes, "lane_intervals", counted)
    monkeypatch.setattr(held, "lane_intervals", counted)
    report = build_report(small_run(tmp_path))
    assert "If rank" in report.section("What held the steps, what to fix first").text  # a what-if
    assert len(cut) == 1


def test_kernels_that_began_before_their_launch_reach_the_report_with_how_far(real_traces):
    # the TorchRec job's traces: 276 launch edges whose kernel began before its launch call by
    # the trace's clocks, up to 40 µs (helpers.analysis.path.graph.validate)
    report = build_report(real_traces / "nccl-jobs" / "torchrec-a2a-optimizer")
    said = report.section("What the traces cannot tell").text
    assert "276 launch edge(s) by up to 40 µs have their target before their source" in said
    assert "A launch edge is a worker lane's gap, until its next event was issued." in said
