"""Where the memory went, on a GPU: lesson 15's ``memory_job.py`` recorded on one H200 (torch
2.11.0+cu130, 2 ranks sharing the GPU over gloo with CUDA tensors, the profiler's CUDA activity
on; ``tools/record_gpu_memory.py``, ``data/h200-memory/README.md``). Each run's answers are
known by construction: which rank keeps memory, how much a step and where. Torch 2.11 writes no
call sites, so the place is the job's function that keeps it; the CUDA memory snapshot names the
line."""

from __future__ import annotations

import sys

import pytest

from conftest import KEPT_IN, REPO
from helpers import (
    allocation_lives,
    load_memory,
    load_memory_categories,
    load_memory_snapshot,
    load_run,
    memory_growth,
    snapshot_summary,
)
from helpers._plaindata import read_plain_data
from helpers.report import build_report
from helpers.traces import snapshot as snapshot_module

sys.path.insert(0, str(REPO / "benchmarks"))
from memory_categories import agreement  # noqa: E402

DATA = REPO / "data" / "h200-memory"
JOB = (DATA / "memory_job.py").read_text().splitlines()

#: case: (the rank that keeps memory, MiB a step, the function that keeps it)
KEEPS = {"leak": (1, 1.0, "forward"), "held-out": (0, 0.5, "loss"), "wide": (1, 1.0, "forward")}
FUNCTION = {"forward": "forward", "loss": "loss_of"}
CASES = pytest.mark.parametrize(
    "case",
    ["leak", "held-out", "wide"],
    ids=["rank-1-keeps-1-MiB-in-its-forward", "rank-0-keeps-half-a-MiB-in-its-loss", "width-768-batch-128"],
)  # fmt: skip
#: Every run with the profiler's timeline: ``wide`` and ``keeps-nothing`` were recorded after
#: the category rules were last changed, so they hold the rules to runs never read before.
TIMELINED = pytest.mark.parametrize(
    "case",
    ["leak", "held-out", "wide", "keeps-nothing"],
    ids=["leak", "held-out", "held-out-width-768-batch-128", "held-out-keeps-nothing"],
)  # fmt: skip


def number_of(text: str) -> int:
    """The line of the GPU's ``memory_job.py`` that holds ``text`` (once)."""
    (number,) = [i + 1 for i, line in enumerate(JOB) if text in line]
    return number


def keeping_function(place: str) -> str:
    """The function that keeps a copy in ``place``, as the profiler names it."""
    name = FUNCTION[place]
    return f"memory_job.py({number_of(f'def {name}(')}): {name}"


def lives_of(case: str, with_categories: bool = False):
    run = DATA / case
    categories = load_memory_categories(run) if with_categories else None
    memory = load_memory(run)
    return allocation_lives(memory, load_run(run, cache=False).events, categories), memory


@CASES
def test_the_rank_that_keeps_memory_on_a_gpu_its_mib_a_step_and_its_function_are_found(case):
    rank, mib, place = KEEPS[case]
    growth = memory_growth(lives_of(case)[0])
    assert list(zip(growth["rank"], growth["device"])) == [(rank, "cuda:0")], "the other rank does not grow"  # fmt: skip
    found = growth.iloc[0]
    assert found["mib_per_step"] == pytest.approx(mib, rel=0.2)
    assert found["line"] == keeping_function(place)


@CASES
def test_the_report_of_a_gpu_run_names_the_rank_the_mib_a_step_and_the_function(case):
    rank, mib, place = KEEPS[case]
    report = build_report([DATA / case], critical=False)
    (section,) = [s for s in report.sections if s.title == "Where the memory went"]
    assert f"rank {rank} keeps {mib:.2f} MiB a step on cuda:0 allocated at `{keeping_function(place)}`" in section.text  # fmt: skip
    assert f"Rank {1 - rank}: no growth." in section.text


def test_a_gpu_run_that_keeps_nothing_grows_on_no_rank():
    assert memory_growth(lives_of("keeps-nothing")[0]).empty


@TIMELINED
def test_the_inferred_categories_on_a_gpu_agree_with_the_profilers_at_each_peak(case):
    theirs, _ = lives_of(case, with_categories=True)
    on_the_gpu = theirs[theirs["device"] == "cuda:0"]
    assert (on_the_gpu["category_from"] == "profiler").all(), "the timeline is of cuda:0"
    agree, differ = agreement(DATA / case, device="cuda:0")
    assert agree.tolist() == pytest.approx([1.0, 1.0]), differ


def test_a_real_snapshot_names_the_line_that_keeps_a_mib_every_step_on_the_keeping_rank_only():
    kept = f"/srv/job/memory_job.py:{number_of(KEPT_IN['forward'])}"
    held = {}
    for rank in (0, 1):
        blocks = load_memory_snapshot(DATA / "leak" / f"rank{rank}.snapshot.pickle")
        in_use = blocks[blocks["state"] == "active_allocated"]
        held[rank] = in_use.loc[in_use["line"] == kept, "bytes"].sum() / 2**20
    assert held == {0: 0, 1: 8.0}, "1 MiB a step, 8 steps (the profiler's warmup step too)"


def test_a_real_snapshot_reserves_at_least_what_it_allocates_and_counts_its_segments():
    for rank in (0, 1):
        blocks = load_memory_snapshot(DATA / "leak" / f"rank{rank}.snapshot.pickle")
        (summary,) = snapshot_summary(blocks).itertuples()
        assert summary.reserved_mib >= summary.allocated_mib + summary.cached_free_mib - 1e-9
        assert summary.segments == blocks["segment"].nunique() > 0


def blocks_in_use(rank: int) -> list[dict]:
    """The blocks in use of the leak run's snapshot of ``rank``, as the file holds them."""
    path = DATA / "leak" / f"rank{rank}.snapshot.pickle"
    snapshot = read_plain_data(path, snapshot_module._bounds())
    blocks = [block for segment in snapshot["segments"] for block in segment["blocks"]]
    return [block for block in blocks if block["state"] == "active_allocated"]


def job_lines(block: dict) -> list[int]:
    return [f["line"] for f in block["frames"] if f["filename"] == "/srv/job/memory_job.py"]


def named(block: dict, part: str) -> bool:
    return any(part in frame["name"] for frame in block["frames"])


def test_the_first_matrix_products_line_holds_cublass_workspaces():
    first_product = number_of("x = torch.relu(self.layers[0](x))")
    there = [b for b in blocks_in_use(1) if job_lines(b)[:1] == [first_product]]
    assert sorted(b["size"] / 2**20 for b in there) == [1, 32]
    assert all(named(b, "getCUDABlasLtWorkspace") for b in there)


def test_the_blocks_without_a_line_of_the_job_are_the_backwards_workspace_and_last_gradients():
    lineless = [b for b in blocks_in_use(1) if not job_lines(b)]
    assert sum(b["size"] for b in lineless) / 2**20 == pytest.approx(36.0078125)
    assert all(named(b, "torch::autograd::Engine::evaluate_function") for b in lineless)
    (workspace,) = [b for b in lineless if b["size"] == 32 * 2**20]
    assert named(workspace, "setWorkspaceForHandle")
    gradients = sorted(b["size"] for b in lineless if b is not workspace)
    assert gradients == [2048] * 4 + [2**20] * 4, "the last step's: four weights and biases"
