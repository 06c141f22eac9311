"""The GPU rehearsal (``make gpu-rehearsal``), as a specification, on the CPU: what it plans for
a machine's GPUs, the checks it applies to a run's traces (on other people's GPU traces), its
report, and its one line on a machine without a GPU. CUDA itself is only met on a GPU machine."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from conftest import REPO
from helpers import rehearsal, script_from_lesson
from helpers.rehearsal import (
    Result,
    Step,
    _ddp,
    _run,
    check_traces,
    main,
    plan,
    rehearsal_report,
    shared_gpu_script,
)


def names(gpus: int) -> list[str]:
    return [step.name for step in plan(gpus)]


def test_without_a_gpu_nothing_is_planned():
    assert plan(0) == []


def test_one_gpu_runs_lesson_2_on_it_one_nccl_rank_and_two_gloo_ranks_sharing_it():
    assert names(1) == [
        "make doctor",
        "lesson 2 on the GPU",
        "train_ddp.py, nccl, 1 rank(s), one per GPU",
        "train_ddp.py, gloo, 2 ranks sharing the GPU (CUDA tensors)",
        "lesson 3 (the CPU: 1 GPU)",
        "lesson 4 (the CPU: 1 GPU)",
        "lesson 9 (the CPU: 1 GPU)",
    ]


@pytest.mark.parametrize("gpus", [2, 8])
def test_several_gpus_run_a_nccl_rank_on_each_and_the_lessons_on_them(gpus):
    assert names(gpus) == [
        "make doctor",
        "lesson 2 on the GPU",
        f"train_ddp.py, nccl, {gpus} rank(s), one per GPU",
        "lesson 3 (GPUs)",
        "lesson 4 (GPUs)",
        "lesson 9 (GPUs)",
    ]


def test_the_nccl_run_asks_the_script_for_nccl_whatever_the_launcher_chose():
    (step,) = [s for s in plan(1) if "nccl" in s.name]
    assert step.env == {} and "'DIST_BACKEND': 'nccl'" in step.command[-1]


def test_the_gpu_runs_of_a_one_gpu_machine_show_the_ranks_the_gpu_the_launcher_hides(monkeypatch):
    # launch puts ranks on the CPU below two GPUs and hides the GPU from them
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    runs = [s for s in plan(1) if s.traces]
    assert len(runs) == 2 and all("'CUDA_VISIBLE_DEVICES': '0'" in s.command[-1] for s in runs)


def test_the_lessons_run_through_nbconvert_s_module_not_a_script_on_the_path():
    lessons = [s for s in plan(1) if s.name.startswith("lesson")]
    assert all(s.command[1:3] == ["-m", "nbconvert"] for s in lessons)


@pytest.mark.filterwarnings("ignore:this trace has nccl")  # one rank: NCCL launched no kernel
@pytest.mark.parametrize("run", ["gpu-ddp-nccl", "gpu-ddp-gloo-shared"])
def test_every_check_passes_on_the_rehearsals_own_h200_runs(run):
    (folder,) = (REPO / "recordings" / "gpu").glob(f"{run}-*")
    checks = check_traces(folder / "files")
    assert len(checks) >= 3 and all(ok for _, ok, _ in checks), checks


def test_on_a_machine_without_a_gpu_it_says_so_in_one_line_and_exits_0(capsys):
    assert main(["--gpus", "0"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "no CUDA GPU" in out


@pytest.mark.slow  # launches a process: make test, not the quick loop
def test_the_make_target_exits_0_here_without_a_gpu():
    done = subprocess.run(
        [sys.executable, "-m", "helpers.rehearsal"], cwd=REPO, capture_output=True, text=True, timeout=120
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "no CUDA GPU" in done.stdout


def test_lesson_3s_script_moves_onto_the_one_gpu_and_still_compiles(tmp_path):
    script_from_lesson("train_ddp.py", "03_ddp_under_torchrun.ipynb", dest=tmp_path)
    moved = shared_gpu_script((tmp_path / "train_ddp.py").read_text())
    assert 'torch.device("cuda", local_rank % torch.cuda.device_count())' in moved
    assert 'dist.init_process_group("gloo")' in moved
    compile(moved, "train_ddp_shared_gpu.py", "exec")


def test_a_script_whose_setup_changed_is_refused_with_what_to_update():
    with pytest.raises(ValueError, match="update the rehearsal"):
        shared_gpu_script("def setup():\n    pass\n")


def test_the_checks_pass_on_a_real_nccl_trace(real_traces):
    checks = {name: (ok, what) for name, ok, what in check_traces(real_traces / "hta" / "nccl_parser_config")}  # fmt: skip
    assert all(ok for ok, _ in checks.values()), checks
    assert {"GPU events in their launch's step", "NCCL kernels read as the collectives",
            "overlap computed", "idle time computed"} <= set(checks)  # fmt: skip


def test_the_nccl_check_fails_when_the_collectives_are_not_matched_on_every_rank(
    real_traces, monkeypatch
):
    one_rank_only = pd.DataFrame(
        {"rank": [0, 0]}
    )  # what collective_waits gives when rank 1's are lost
    monkeypatch.setattr(rehearsal, "collective_waits", lambda events: one_rank_only)
    checks = {name: ok for name, ok, _ in check_traces(real_traces / "hta" / "trace_filter")}
    assert checks["NCCL kernels read as the collectives"] is False


def test_the_checks_fail_on_a_trace_without_kernels(real_traces):
    checks = check_traces(real_traces / "hta" / "cpu_only")
    assert ("GPU events recorded", False, "no kernel in the traces") in checks


def test_the_checks_name_a_folder_that_cannot_be_loaded(tmp_path):
    ((name, ok, what),) = check_traces(tmp_path)
    assert (name, ok) == ("traces load", False) and "no trace files" in what


def test_the_report_gives_the_machine_each_step_its_checks_and_what_failed():
    good = Result(Step("make doctor", []), True, 12.3)
    bad = Result(Step("lesson 4 (GPUs)", []), False, 40.0, tail="RankFailed: rank 1 exited 1")
    checked = Result(Step("train_ddp.py, nccl", []), True, 20.0,
                     checks=[("NCCL kernels read as the collectives", True, "^ncclKernel")])  # fmt: skip
    text = rehearsal_report({"GPU": "1 x H100", "torch": "2.14.1"}, [good, bad, checked])
    assert text.startswith("# GPU rehearsal\n\n- **GPU**: 1 x H100\n- **torch**: 2.14.1\n")
    assert "| make doctor | ok | 12 |" in text and "| lesson 4 (GPUs) | FAILED | 40 |" in text
    assert "- ok: NCCL kernels read as the collectives (^ncclKernel)" in text
    failed = text.split("## What failed")[1]
    assert "lesson 4 (GPUs)" in failed and "RankFailed: rank 1 exited 1" in failed
    assert "make doctor" not in failed


@pytest.mark.slow
def test_a_rehearsal_step_launches_lesson_3s_script_and_checks_its_traces_on_the_cpu():
    """The step's plumbing, with gloo on the CPU: the script written, launched, its traces
    checked (and found without kernels, as a CPU run is)."""
    result = _run(Step("cpu", _ddp("rehearsal-cpu", 2, {}), traces="rehearsal-cpu"), record=False)
    assert result.ok, result.tail
    assert ("GPU events recorded", False, "no kernel in the traces") in result.checks
