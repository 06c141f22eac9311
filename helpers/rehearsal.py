"""The GPU rehearsal: the series' GPU path run on whatever GPUs a machine has, in one command.

``make gpu-rehearsal`` (``python -m helpers.rehearsal``) plans its steps for the machine's GPU
count (:func:`plan`), runs them one after the other, checks every trace they wrote the way
``tests/test_gpu_traces.py`` checks other people's (:func:`check_traces`), and writes what it
found to ``build/gpu-rehearsal.md`` (:func:`rehearsal_report`). The runs are recorded under
``recordings/gpu/`` (never over the CPU recordings the lessons replay). On a machine without a
GPU it says so in one line and exits 0.

The steps, with N GPUs:

- ``make doctor``'s checks;
- lesson 2 executed (one process: it profiles the GPU whenever there is one);
- lesson 3's ``train_ddp.py`` with nccl, one rank per GPU (one rank on a one-GPU machine);
- on a one-GPU machine, the same script on 2 ranks sharing the GPU over gloo with CUDA tensors
  (so that a two-rank trace holds real kernels);
- lessons 3, 4 and 9 executed with ``choose_device``'s answer for the machine (the CPU below 2
  GPUs: those lessons need a GPU per rank).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .analysis import (
    NCCL_KERNELS,
    collective_source,
    collective_waits,
    communication_overlap,
    gpu_idle_time,
)
from .jobs.runs import REPO_ROOT, show_path
from .traces import TraceError, load_run, trace_files
from .traces.kinds import GPU_WORK_KINDS

__all__ = ["Step", "Result", "plan", "check_traces", "rehearsal_report", "main"]

OUT = REPO_ROOT / "build" / "gpu-rehearsal"
REPORT = REPO_ROOT / "build" / "gpu-rehearsal.md"
RECORDINGS = "recordings/gpu"
SHORT = ["--steps", "6", "--wait", "2", "--warmup", "1", "--active", "3"]
#: What lesson 3's setup() does on the CPU, and what the shared-GPU run does instead.
CPU_DEVICE = 'device = torch.device("cpu")'
SHARED_GPU = 'device = torch.device("cuda", local_rank % torch.cuda.device_count())'


@dataclass
class Step:
    """One thing the rehearsal runs: ``command`` in the repository, with ``env`` added."""

    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    traces: str | None = None  # the traces/ experiment whose runs it writes


@dataclass
class Result:
    """How a step went: ``ok``, its seconds, the last lines it printed, its traces' checks."""

    step: Step
    ok: bool
    seconds: float
    tail: str = ""
    checks: list[tuple[str, bool, str]] = field(default_factory=list)


def _notebook(lesson: str) -> list[str]:
    # nbconvert's own module, not ``jupyter nbconvert``: that needs its script on the PATH
    return [sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute",
            "--ExecutePreprocessor.timeout=900", "--output-dir", str(OUT), f"notebooks/{lesson}"]  # fmt: skip


def _ddp(experiment: str, nproc: int, env: dict[str, str], shared_gpu: bool = False) -> list[str]:
    """Lesson 3's script written out of its lesson (moved onto the one GPU with
    ``shared_gpu``) and launched."""
    code = (
        "from pathlib import Path\n"
        "from helpers import launch, script_from_lesson\n"
        "from helpers.rehearsal import shared_gpu_script\n"
        "out = Path('build/gpu-rehearsal')\n"
        "out.mkdir(parents=True, exist_ok=True)\n"
        "script_from_lesson('train_ddp.py', '03_ddp_under_torchrun.ipynb', dest=out)\n"
        "script = out / 'train_ddp.py'\n"
        f"if {shared_gpu}:\n"
        "    script = out / 'train_ddp_shared_gpu.py'\n"
        "    script.write_text(shared_gpu_script((out / 'train_ddp.py').read_text()))\n"
        f"launch(script, nproc={nproc}, experiment='{experiment}', args={SHORT!r}, env={env!r})\n"
    )
    return [sys.executable, "-c", code]


def _gpus_shown(gpus: int) -> dict[str, str]:
    """The GPUs a rank must see: ``launch`` hides them from ranks it puts on the CPU (below
    two GPUs), and these steps run on the GPU all the same."""
    shown = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(gpus))))
    return {"CUDA_VISIBLE_DEVICES": shown}


def plan(gpus: int) -> list[Step]:
    """The steps for a machine with ``gpus`` GPUs (none without one)."""
    if gpus < 1:
        return []
    steps = [
        Step("make doctor", [sys.executable, "-m", "helpers.doctor"]),
        Step("lesson 2 on the GPU", _notebook("02_profiler_primer.ipynb")),
        Step(
            f"train_ddp.py, nccl, {gpus} rank(s), one per GPU",
            _ddp("gpu-ddp-nccl", gpus, {"DIST_BACKEND": "nccl", **_gpus_shown(gpus)}),
            traces="gpu-ddp-nccl",
        ),
    ]
    if gpus == 1:
        steps.append(
            Step(
                "train_ddp.py, gloo, 2 ranks sharing the GPU (CUDA tensors)",
                _ddp("gpu-ddp-gloo-shared", 2, _gpus_shown(gpus), shared_gpu=True),
                traces="gpu-ddp-gloo-shared",
            )
        )
    for lesson in ("03_ddp_under_torchrun", "04_reading_ddp_traces", "09_look_inside_a_running_job"):  # fmt: skip
        steps.append(Step(f"lesson {int(lesson[:2])} ({'GPUs' if gpus >= 2 else 'the CPU: 1 GPU'})", _notebook(f"{lesson}.ipynb")))  # fmt: skip
    return steps


def shared_gpu_script(text: str) -> str:
    """Lesson 3's script with its CPU ranks moved onto the one GPU (gloo, CUDA tensors)."""
    if text.count(CPU_DEVICE) != 1:
        raise ValueError(f"lesson 3's setup() no longer says {CPU_DEVICE!r}: update the rehearsal")
    return text.replace(CPU_DEVICE, SHARED_GPU)


def check_traces(folder: str | Path) -> list[tuple[str, bool, str]]:
    """The checks of ``tests/test_gpu_traces.py`` on one run's traces: ``(check, passed,
    what was found)``: every GPU event with a launch is in its launch's step; NCCL's kernels
    are read as the collectives; overlap and idle time computed."""
    try:
        events = load_run(folder, cache=False).events
    except TraceError as err:
        return [("traces load", False, str(err))]
    found = [("traces load", True, f"{events['rank'].nunique()} rank(s), {len(events)} events")]
    gpu = events[events["kind"].isin(GPU_WORK_KINDS)]
    if gpu.empty:
        return [*found, ("GPU events recorded", False, "no kernel in the traces")]
    launched = gpu[gpu["launch_us"].notna()]
    stepped = launched["step"].notna().mean() if len(launched) else 0.0
    found.append(("GPU events in their launch's step", stepped > 0.95, f"{stepped:.1%} of {len(launched)} launched"))  # fmt: skip
    if collective_source(events).pattern == NCCL_KERNELS:
        waits = collective_waits(events)
        ranks = events["rank"].nunique()
        matched = not waits.empty and waits["rank"].nunique() == ranks
        found.append(("NCCL kernels read as the collectives", matched, f"{len(waits) // ranks} collectives matched on {ranks} rank(s)"))  # fmt: skip
        overlap = communication_overlap(events)
        found.append(("overlap computed", not overlap.empty, f"median {overlap['overlap'].median():.2f}" if not overlap.empty else "empty"))  # fmt: skip
    idle = gpu_idle_time(events)
    found.append(("idle time computed", not idle.empty, f"median {idle['idle_fraction'].median():.2f}" if not idle.empty else "empty"))  # fmt: skip
    return found


def rehearsal_report(machine: dict[str, str], results: list[Result]) -> str:
    """The Markdown report: the machine, then each step with its time and checks, then what
    failed."""
    lines = ["# GPU rehearsal", "", *(f"- **{k}**: {v}" for k, v in machine.items()), "", "## Steps", ""]  # fmt: skip
    lines += ["| step | result | seconds |", "| --- | --- | --- |"]
    lines += [
        f"| {r.step.name} | {'ok' if r.ok else 'FAILED'} | {r.seconds:.0f} |" for r in results
    ]
    for r in results:
        if r.checks:
            lines += ["", f"### Traces of {r.step.name}", ""]
            lines += [
                f"- {'ok' if ok else 'FAILED'}: {name} ({what})" for name, ok, what in r.checks
            ]
    failed = [r for r in results if not r.ok or not all(ok for _, ok, _ in r.checks)]
    lines += ["", "## What failed", ""]
    lines += [f"- {r.step.name}:\n\n```\n{r.tail}\n```" for r in failed] or ["- nothing"]
    return "\n".join(lines) + "\n"


def _machine() -> dict[str, str]:
    import torch

    props = torch.cuda.get_device_properties(0)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True)  # fmt: skip
    return {
        "GPU": f"{torch.cuda.device_count()} x {props.name} ({props.total_memory / 2**30:.0f} GiB)",
        "driver": smi.stdout.strip().splitlines()[0] if smi.returncode == 0 else "unknown",
        "CUDA (torch's)": str(torch.version.cuda),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def _run(step: Step, record: bool = True) -> Result:
    """Run one step; with ``record``, its runs are recorded under :data:`RECORDINGS`."""
    kept = {"PDP_RECORD": "1", "PDP_RECORDINGS": RECORDINGS} if record else {"PDP_RECORD": "0"}
    env = {**os.environ, **kept, **step.env}
    started = time.perf_counter()
    try:
        done = subprocess.run(step.command, cwd=REPO_ROOT, env=env, capture_output=True,
                              text=True, timeout=1800)  # fmt: skip
        ok, out = done.returncode == 0, done.stdout + done.stderr
    except subprocess.TimeoutExpired as err:
        ok, out = False, f"timed out after {err.timeout} s"
    result = Result(step, ok, time.perf_counter() - started, "\n".join(out.splitlines()[-15:]))
    if ok and step.traces:
        runs = sorted((REPO_ROOT / "traces" / step.traces).glob("*/"))
        if runs and trace_files(runs[-1]):
            result.checks = check_traces(runs[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m helpers.rehearsal", description=__doc__.splitlines()[0]
    )
    p.add_argument("--gpus", type=int, help="plan for this many GPUs (default: those visible)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    args = p.parse_args(argv)
    if args.gpus is None:
        import torch

        args.gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    steps = plan(args.gpus)
    if not steps:
        print("gpu-rehearsal: no CUDA GPU on this machine: nothing to rehearse (exit 0)")
        return 0
    if args.dry_run:
        print("\n".join(f"{i + 1}. {step.name}" for i, step in enumerate(steps)))
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    results = []
    for step in steps:
        print(f"== {step.name}", flush=True)
        results.append(_run(step))
        print(
            f"   {'ok' if results[-1].ok else 'FAILED'} in {results[-1].seconds:.0f} s", flush=True
        )
        # after every step, so that a rehearsal cut short still leaves what it found
        REPORT.write_text(rehearsal_report(_machine(), results))
    print(f"report: {show_path(REPORT)}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
