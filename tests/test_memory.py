"""Memory over time: the ``[memory]`` events of a trace read into a frame, counted from a
starting point, and drawn."""

import matplotlib

matplotlib.use("Agg")

import gzip
import json

import pandas as pd
import pytest

from helpers import (
    TraceError,
    allocation_lives,
    build_report,
    compare_memory,
    freed_before_trace,
    load_memory,
    load_memory_categories,
    load_trace,
    memory_growth,
    memory_over_time,
    memory_peaks,
    merge_traces,
    plot_memory,
)

MIB = 2**20


def memory_event(ts, nbytes, allocated, device_type=0, device_id=-1, reserved=0):
    return {
        "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 100,
        "tid": 100, "ts": ts,
        "args": {"Total Reserved": reserved, "Total Allocated": allocated, "Bytes": nbytes,
                 "Device Id": device_id, "Device Type": device_type, "Addr": 1},
    }  # fmt: skip


@pytest.fixture
def with_memory(kineto):
    """A trace of rank 0 whose step allocates 3 MiB on the CPU (1 MiB was in use before) and
    frees 2, and allocates 4 MiB on GPU 0."""
    doc = kineto(0, steps=1)
    doc["traceEvents"] += [
        memory_event(100.0, 2 * MIB, 3 * MIB),
        memory_event(200.0, 1 * MIB, 4 * MIB),
        memory_event(300.0, -2 * MIB, 2 * MIB),
        memory_event(150.0, 4 * MIB, 4 * MIB, device_type=1, device_id=0),
    ]
    return doc


def test_memory_events_are_read_with_their_device_bytes_and_totals(with_memory, write, tmp_path):
    memory = load_memory(write(tmp_path / "rank0.json", with_memory))
    cpu = memory[memory["device"] == "cpu"]
    assert list(cpu["bytes"]) == [2 * MIB, MIB, -2 * MIB]
    assert list(cpu["allocated"]) == [3 * MIB, 4 * MIB, 2 * MIB]
    assert set(memory["device"]) == {"cpu", "cuda:0"}
    assert (memory["rank"] == 0).all()


def test_memory_times_share_the_clock_of_the_loaders_events(with_memory, write, tmp_path):
    path = write(tmp_path / "rank0.json", with_memory)
    events = load_trace(path).events
    step = events[events["kind"] == "step"].iloc[0]
    memory = load_memory(path, device="cpu")
    assert memory["time_us"].iloc[0] - step["start_us"] == pytest.approx(100.0)


def test_a_device_is_chosen_by_kind_or_by_number(with_memory, write, tmp_path):
    path = write(tmp_path / "rank0.json", with_memory)
    assert set(load_memory(path, device="cuda")["device"]) == {"cuda:0"}
    assert set(load_memory(path, device="cuda:0")["device"]) == {"cuda:0"}
    with pytest.raises(TraceError, match="no memory events of device 'cuda:1'"):
        load_memory(path, device="cuda:1")


def test_each_rank_of_a_run_has_its_own_rows(with_memory, kineto, write, tmp_path):
    write(tmp_path / "rank0.json", with_memory)
    other = kineto(1, steps=1)
    other["traceEvents"].append(memory_event(50.0, MIB, MIB))
    write(tmp_path / "rank1.json", other)
    memory = load_memory(tmp_path, device="cpu")
    assert memory.groupby("rank").size().to_dict() == {0: 3, 1: 1}


def test_a_trace_without_memory_events_says_to_profile_memory(kineto, write, tmp_path):
    path = write(tmp_path / "rank0.json", kineto(0))
    with pytest.raises(TraceError, match="profile_memory=True") as err:
        load_memory(path)
    assert "rank0.json" in str(err.value)


def test_a_merged_file_is_refused_with_what_to_read_instead(with_memory, kineto, write, tmp_path):
    write(tmp_path / "rank0.json", with_memory)
    write(tmp_path / "rank1.json", kineto(1))
    merged = merge_traces(tmp_path, tmp_path / "merged.json")
    with pytest.raises(TraceError, match="each rank's own file"):
        load_memory(merged)


def test_memory_events_with_values_that_are_not_numbers_are_left_out(kineto, write, tmp_path):
    doc = kineto(0)
    bad = memory_event(10.0, "many", MIB)
    huge = memory_event(20.0, 1e300, MIB)
    doc["traceEvents"] += [bad, huge, memory_event(30.0, MIB, MIB), {"name": "[memory]", "ts": 1}]
    memory = load_memory(write(tmp_path / "rank0.json", doc))
    assert list(memory["bytes"]) == [MIB]


def test_a_truncated_file_is_the_loaders_error(with_memory, tmp_path):
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(with_memory)[:-40])
    with pytest.raises(TraceError, match="truncated"):
        load_memory(path)


def test_memory_is_counted_from_what_was_in_use_before_the_first_event(
    with_memory, write, tmp_path
):
    memory = memory_over_time(load_memory(write(tmp_path / "rank0.json", with_memory), "cpu"))
    # 1 MiB was in use before: the curve starts at 0 and reads 2, 3, then 1 MiB
    assert list(memory["mib"]) == [2.0, 3.0, 1.0]
    assert list(memory["ms"]) == pytest.approx([0.0, 0.1, 0.2])


def test_peaks_give_the_most_in_use_when_it_was_reached_and_the_end(with_memory, write, tmp_path):
    memory = memory_over_time(load_memory(write(tmp_path / "rank0.json", with_memory)))
    peaks = memory_peaks(memory).set_index("device")
    assert peaks.loc["cpu", "peak_mib"] == 3.0
    assert peaks.loc["cpu", "at_ms"] == pytest.approx(0.1)
    assert peaks.loc["cpu", "end_mib"] == 1.0
    assert peaks.loc["cuda:0", "peak_mib"] == 4.0


def test_the_memory_plot_draws_one_line_per_rank_and_the_marks(with_memory, write, tmp_path):
    memory = memory_over_time(load_memory(write(tmp_path / "rank0.json", with_memory), "cpu"))
    two = pd.concat([memory, memory.assign(rank=1)])
    fig = plot_memory(two, marks={"backward starts": 0.15})
    ax = fig.axes[0]
    assert len(ax.get_lines()) == 3  # two ranks and one mark
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["rank 0", "rank 1", "backward starts"]


def test_the_memory_plot_draws_a_line_per_label_when_the_frame_names_them(
    with_memory, write, tmp_path
):
    memory = memory_over_time(load_memory(write(tmp_path / "rank0.json", with_memory), "cpu"))
    two = pd.concat([memory.assign(label="replicated"), memory.assign(label="sharded")])
    legend = plot_memory(two).axes[0].get_legend().get_texts()
    assert [t.get_text() for t in legend] == ["replicated", "sharded"]


def test_the_memory_plot_names_each_shaded_span_in_the_legend_in_a_colour_of_its_own(
    with_memory, write, tmp_path
):
    memory = memory_over_time(load_memory(write(tmp_path / "rank0.json", with_memory), "cpu"))
    fig = plot_memory(memory, spans={"first": (0.0, 0.05), "second": (0.06, 0.1)})
    ax = fig.axes[0]
    assert len(ax.patches) == 2 and not ax.texts, "no label drawn over the curve"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["first", "second"]
    assert ax.patches[0].get_facecolor() != ax.patches[1].get_facecolor()


def at(ts, nbytes, address, total=0):
    """A [memory] event of ``nbytes`` at ``address`` (its totals are not read here)."""
    event = memory_event(ts, nbytes, total)
    event["args"]["Addr"] = address
    return event


@pytest.fixture
def four_steps(kineto, write, tmp_path):
    """Rank 0 over 4 steps (each 900 µs, 1000 µs apart): every step allocates a block it frees
    within the step (address 10+i) and one it keeps (address 20+i, 64 KiB); a block allocated
    before the trace (address 5) is freed in step 1; address 7 is allocated twice, freed between."""
    doc = kineto(0, steps=4)
    for i in range(4):
        t = i * 1000.0
        doc["traceEvents"] += [at(t + 10, 4096, 10 + i), at(t + 50, -4096, 10 + i),
                               at(t + 60, 65536, 20 + i)]  # fmt: skip
    doc["traceEvents"] += [at(100.0, -MIB, 5), at(200, 512, 7), at(300, -512, 7),
                           at(1200, 512, 7), at(1300, -512, 7)]  # fmt: skip
    path = write(tmp_path / "rank0.json", doc)
    return load_memory(path), load_trace(path).events


def test_each_allocation_is_paired_with_the_next_free_at_its_address(four_steps):
    lives = allocation_lives(*four_steps)
    reused = lives[lives["address"] == 7]
    assert list(reused["free_us"] - reused["alloc_us"]) == pytest.approx([100.0, 100.0])
    assert lives[lives["address"] >= 20]["free_us"].isna().all()
    assert list(lives[lives["address"] >= 20]["step"]) == [1, 2, 3, 4]


def test_a_block_allocated_before_the_trace_is_counted_as_freed_before_it(four_steps):
    freed = freed_before_trace(four_steps[0])
    assert freed.to_dict("records") == [{"rank": 0, "device": "cpu", "bytes": MIB}]
    assert not (allocation_lives(*four_steps)["address"] == 5).any()


def test_memory_kept_in_every_step_grows_and_memory_freed_does_not(four_steps):
    growth = memory_growth(allocation_lives(*four_steps))
    row = growth.iloc[0]
    assert len(growth) == 1 and (row["rank"], row["steps"], row["of_steps"]) == (0, 3, 3)
    assert row["mib_per_step"] == pytest.approx(65536 / MIB)


def test_memory_kept_in_one_step_only_is_no_growth(kineto, write, tmp_path):
    doc = kineto(0, steps=4)
    doc["traceEvents"] += [at(60.0, 65536, 20), at(1060.0, 4096, 21), at(1070.0, -4096, 21)]
    path = write(tmp_path / "rank0.json", doc)
    assert memory_growth(allocation_lives(load_memory(path), load_trace(path).events)).empty


def test_a_report_of_traces_without_memory_events_says_how_to_record_them(kineto, write, tmp_path):
    for rank in (0, 1):
        write(tmp_path / f"rank{rank}.json", kineto(rank))
    report = build_report([tmp_path])
    (section,) = [s for s in report.sections if s.title == "Where the memory went"]
    assert "profile_memory=True" in section.text and section.table is None


def test_a_memory_timeline_that_is_not_one_is_refused_by_name(tmp_path):
    folder = tmp_path / "memory-timeline"
    folder.mkdir()
    (folder / "rank0.raw.json.gz").write_bytes(gzip.compress(b'{"not": "a timeline"}'))
    with pytest.raises(TraceError, match="not a memory timeline") as err:
        load_memory_categories(tmp_path)
    assert "rank0.raw.json.gz" in str(err.value)


def test_the_report_says_what_a_gpus_caching_allocator_held_beyond_what_was_allocated(
    kineto, write, tmp_path
):
    doc = kineto(0, steps=1)
    doc["traceEvents"] += [memory_event(100.0, 4 * MIB, 4 * MIB, 1, 0, reserved=20 * MIB),
                           memory_event(200.0, -4 * MIB, 0, 1, 0, reserved=20 * MIB)]  # fmt: skip
    report = build_report([write(tmp_path / "rank0.json", doc)])
    (section,) = [s for s in report.sections if s.title == "Where the memory went"]
    assert "Rank 0 peaked highest: 4.0 MiB" in section.text
    assert (
        "not allocated at each GPU peak (its cache, and fragmentation): rank 0 16.0 MiB"
        in section.text
    )


def test_memory_in_a_trace_without_profiler_steps_is_read_outside_steps(kineto, write, tmp_path):
    doc = kineto(0, steps=1)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not e["name"].startswith("ProfilerStep")]
    doc["traceEvents"] += [at(100.0, 65536, 20), at(200.0, 4096, 21), at(300.0, -4096, 21)]
    path = write(tmp_path / "rank0.json", doc)
    lives = allocation_lives(load_memory(path), load_trace(path).events)
    assert set(lives["phase"]) == {"outside steps"} and lives["step"].isna().all()
    report = build_report([path])
    (section,) = [s for s in report.sections if s.title == "Where the memory went"]
    assert "Rank 0 peaked highest: 0.1 MiB" in section.text and not report.failed


def run_with_extra(kineto, write, folder, extra_bytes):
    """Rank 0 over 4 steps, each allocating 1 MiB and ``extra_bytes`` more beside it, freed."""
    doc = kineto(0, steps=4)
    for i in range(4):
        t = i * 1000.0
        doc["traceEvents"] += [at(t + 10, MIB, 10 + i, MIB), at(t + 50, -MIB, 10 + i, 0)]
        if extra_bytes:
            doc["traceEvents"] += [at(t + 20, extra_bytes, 30 + i, MIB + extra_bytes),
                                   at(t + 40, -extra_bytes, 30 + i, MIB)]  # fmt: skip
    path = write(folder / "rank0.json", doc)
    return load_memory(path), load_trace(path).events


@pytest.mark.parametrize(
    "extra_bytes, verdict",
    [(0, "same"), (8, "same"), (MIB // 2, "higher")],
    ids=["unchanged", "a-few-bytes-more-is-noise", "half-a-MiB-more-is-higher"],
)
def test_a_peak_is_called_changed_only_beyond_the_noise_between_runs(
    kineto, write, tmp_path, extra_bytes, verdict
):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    before = run_with_extra(kineto, write, tmp_path / "a", 0)
    after = run_with_extra(kineto, write, tmp_path / "b", extra_bytes)
    assert compare_memory(before, after).loc[0, "verdict"] == verdict
