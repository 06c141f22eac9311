"""Where the memory went, on a real DDP job whose memory is known by construction
(lesson 15's ``memory_job.py``): one rank keeps a copy of an activation every step and never frees
it. The report must name the rank, the MiB a step and the line; the other rank must not grow."""

import re

import pytest

from conftest import kept_line
from helpers import (
    alive_at_peak,
    allocation_lives,
    compare_runs,
    load_memory,
    load_memory_categories,
    load_run,
    memory_growth,
    peak_difference,
    peak_moments,
)
from helpers.analysis.memory import allocations_at_peak
from helpers.jobs import launch
from helpers.report import build_comparison, build_report


@pytest.fixture(scope="module")
def kept_runs(memory_job, tmp_path_factory):
    """Three runs of 2 ranks: rank 1 keeps 1 MiB a step in the forward (with the profiler's
    memory timeline written beside the traces), rank 0 keeps 0.5 MiB a step in the loss, and
    the job keeps nothing (the fix)."""
    root = tmp_path_factory.mktemp("memory")
    cases = {
        "forward": ["--keep-rank", "1", "--keep-mib", "1", "--keep-in", "forward", "--timeline"],
        "loss": ["--keep-rank", "0", "--keep-mib", "0.5", "--keep-in", "loss"],
        "fixed": [],
    }
    return {
        name: launch(
            memory_job, 2, experiment=name, args=args, echo=False, traces_root=root, timeout=180
        )
        for name, args in cases.items()
    }


@pytest.mark.parametrize(
    "case, rank, mib, calm",
    [("forward", 1, 1.0, 0), ("loss", 0, 0.5, 1)],
    ids=["rank-1-keeps-1-MiB-in-its-forward", "rank-0-keeps-half-a-MiB-in-its-loss"],
)
def test_the_growing_rank_its_mib_a_step_and_its_line_are_found(
    memory_job, kept_runs, case, rank, mib, calm
):
    run = kept_runs[case].run_dir
    growth = memory_growth(allocation_lives(load_memory(run), load_run(run, cache=False).events))
    assert list(growth["rank"]) == [rank], "only the rank that keeps memory grows"
    found = growth.iloc[0]
    assert found["mib_per_step"] == pytest.approx(mib, rel=0.2)
    assert found["line"] == kept_line(memory_job, case)
    assert found["steps"] >= found["of_steps"] - 1 and calm not in set(growth["rank"])


@pytest.mark.parametrize("case, rank, mib", [("forward", 1, "1.00"), ("loss", 0, "0.50")])
def test_the_report_says_the_rank_the_mib_a_step_and_the_line(
    memory_job, kept_runs, case, rank, mib
):
    report = build_report([kept_runs[case].run_dir])
    (section,) = [s for s in report.sections if s.title == "Where the memory went"]
    said = f"rank {rank} keeps {mib} MiB a step allocated at `{kept_line(memory_job, case)}`"
    assert said in section.text
    assert f"Rank {1 - rank}: no growth." in section.text


def test_the_profilers_timeline_gives_every_allocation_its_category(memory_job, kept_runs):
    run = kept_runs["forward"].run_dir
    categories = load_memory_categories(run)
    lives = allocation_lives(load_memory(run), load_run(run, cache=False).events, categories)
    assert (lives["category_from"] == "profiler").mean() > 0.99
    line = lives["line"] == kept_line(memory_job, "forward")
    kept = lives[line & lives["free_us"].isna()]
    assert set(kept["category"]) == {"activation"}, "the profiler calls the kept copy so"


def test_the_kept_copies_are_inferred_activations_as_the_profiler_calls_them(memory_job, kept_runs):
    run = kept_runs["forward"].run_dir
    lives = allocation_lives(load_memory(run), load_run(run, cache=False).events)
    kept = lives[(lives["line"] == kept_line(memory_job, "forward")) & lives["free_us"].isna()]
    assert len(kept) >= 5 and set(kept["category"]) == {"activation"}
    assert set(kept["category_from"]) == {"inferred"}


def test_where_the_inference_and_the_profiler_differ_at_a_cpu_peak_it_is_the_optimizers_own_results(kept_runs):  # fmt: skip
    # what keeps the ranks that keep nothing at 80.7-81.8 % agreement on a CPU
    # (benchmarks/memory_categories.py): Adam's sqrt and div results, made and freed within its
    # step, which the profiler on a CPU files under parameter and activation (and an 8-byte
    # scalar under input), categories that a block living under a millisecond cannot be
    run = kept_runs["forward"].run_dir
    memory, events = load_memory(run), load_run(run, cache=False).events
    theirs = allocation_lives(memory, events, load_memory_categories(run))
    ours = allocation_lives(memory, events)["category"].to_numpy()
    (calm,) = peak_moments(theirs, memory).query("rank == 0").itertuples()
    alive = allocations_at_peak(theirs.assign(inferred=ours), memory).query("rank == 0")
    differ = alive[alive["category"].fillna("") != alive["inferred"].fillna("")]
    steps = events[(events["rank"] == 0) & events["name"].str.startswith("Optimizer.step")]
    within = [((steps["start_us"] <= a) & (f <= steps["end_us"])).any() for a, f in zip(differ["alloc_us"], differ["free_us"])]  # fmt: skip
    assert calm.phase == "optimizer" and len(differ) and all(within), differ
    assert set(differ["category"]) <= {"parameter", "activation", "input"}
    assert differ["bytes"].sum() / alive["bytes"].sum() < 0.2


def test_the_memory_timeline_beside_the_traces_is_not_read_as_a_trace(kept_runs):
    run = load_run(kept_runs["forward"].run_dir, cache=False)
    assert not run.skipped and sorted(run.events["rank"].unique()) == [0, 1]


def test_comparing_the_fix_says_the_peak_fell_and_the_growth_stopped(kept_runs):
    compared = compare_runs(kept_runs["forward"].run_dir, kept_runs["fixed"].run_dir)
    rank1 = compared.memory.set_index("rank").loc[1]
    assert rank1["verdict"] == "lower" and rank1["grows_before"] > 0 == rank1["grows_after"]
    assert compared.memory.set_index("rank").loc[0, "verdict"] == "same"
    assert "Rank 1: its peak went from" in compared.verdict
    assert "its growth stopped (1.00 MiB a step before, none after)" in compared.verdict


def test_the_report_of_two_runs_says_the_peak_fell_and_the_growth_stopped(kept_runs):
    report = build_comparison(kept_runs["forward"].run_dir, kept_runs["fixed"].run_dir)
    (section,) = [s for s in report.sections if s.title.startswith("Memory")]
    assert (
        section.text.startswith("Rank 1: its peak went from") and "growth stopped" in section.text
    )


def test_why_the_keeping_rank_peaks_highest_is_the_line_that_keeps(memory_job, kept_runs):
    run = kept_runs["forward"].run_dir
    memory, events = load_memory(run), load_run(run, cache=False).events
    lives = allocation_lives(memory, events, load_memory_categories(run))
    gap = peak_moments(lives, memory).set_index("rank")["peak_mib"].diff().iloc[-1]
    by_line, by_kind = (peak_difference(lives, memory, by) for by in ("line", "category"))
    assert by_line.attrs["highest"] == (1, "cpu") and by_line.attrs["lowest"] == (0, "cpu")
    kept = by_line.iloc[0]
    assert kept["line"] == kept_line(memory_job, "forward") and kept["lowest_mib"] == 0
    assert kept["more_mib"] == pytest.approx(gap, rel=0.05) and gap > 4, "1 MiB a step"
    assert by_kind.iloc[0]["category"] == "activation", "the profiler's name for the copies"
    assert by_kind["more_mib"].sum() == pytest.approx(kept["more_mib"], abs=0.01)


def test_the_report_says_why_the_highest_rank_peaked_above_the_lowest(memory_job, kept_runs):
    report = build_report([kept_runs["forward"].run_dir])
    (section,) = [s for s in report.sections if s.title == "Where the memory went"]
    said = re.search(r"Rank 1 peaked ([\d.]+) MiB above rank 0: at its peak it held more activation \(\+[\d.]+ MiB\).*?, the most of it from `([^`]+)` \(\+([\d.]+) MiB\)", section.text)  # fmt: skip
    assert said and said[2] == kept_line(memory_job, "forward")
    assert float(said[3]) == pytest.approx(float(said[1]), rel=0.05), "the line holds the gap"


def test_ranks_that_peak_alike_get_no_why(kept_runs):
    report = build_report([kept_runs["fixed"].run_dir])
    (section,) = [s for s in report.sections if s.title == "Where the memory went"]
    assert "above rank" not in section.text


@pytest.fixture(scope="module")
def replicated_and_sharded(memory_job, tmp_path_factory):
    """The job with its first step traced (where Adam makes its state), under DDP and FSDP2."""
    root = tmp_path_factory.mktemp("sharding")
    return {
        name: launch(
            memory_job,
            2,
            experiment=name,
            args=["--first-step", *args],
            echo=False,
            traces_root=root,
            timeout=180,
        )  # fmt: skip
        for name, args in {"ddp": [], "fsdp2": ["--fsdp"]}.items()
    }


def test_fsdp2_holds_half_the_optimizer_state_that_ddp_holds_on_each_rank(replicated_and_sharded):
    # Adam keeps two tensors the size of the parameters: four layers of 512 x 512 + 512 floats
    params_mib = 4 * (512 * 512 + 512) * 4 / 2**20
    held = {}
    for name, run in replicated_and_sharded.items():
        memory, events = load_memory(run.run_dir), load_run(run.run_dir, cache=False).events
        alive = alive_at_peak(allocation_lives(memory, events), memory)
        held[name] = alive[alive["category"] == "optimizer state"].set_index("rank")["mib"]
    assert held["ddp"].to_list() == pytest.approx([2 * params_mib] * 2, abs=0.02)
    assert held["fsdp2"].to_list() == pytest.approx([params_mib] * 2, abs=0.02), "a half each"
