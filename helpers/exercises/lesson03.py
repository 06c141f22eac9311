"""The checks of lesson 3's exercises (``notebooks/03_ddp_under_torchrun.ipynb``; worked in
``solutions/03_solutions.ipynb``): the trace files of a two-cycle schedule, and which rank
wrote each trace when every process names its file after its process id and the names are then
made to say nothing (:func:`helpers.anonymise_traces`)."""

from __future__ import annotations

import json
from typing import Any

from ..traces import TraceError, load_trace
from .common import TRAIN_DDP_SCRIPT, WINDOW_TRACES, Check, file_names, whole, wrong_run
from .hidden import RENAMED_FILE

__all__ = [
    "CHECKS",
    "SCRIPTS",
    "FLAGS",
    "TRAIN_DDP_SCRIPT",
    "PID_SCRIPT",
    "WINDOW_TRACES",
    "PID_TRACES",
]

#: The copy of train_ddp.py that exercise 3.2 has the learner write (files named by pid).
PID_SCRIPT = "train_ddp_pid.py"
#: The scripts these checks rely on, and the flags of train_ddp.py they pass.
SCRIPTS = (TRAIN_DDP_SCRIPT, PID_SCRIPT)
FLAGS = (
    "--steps",
    "--wait",
    "--warmup",
    "--active",
    "--repeat",
    "--profile-ranks",
    "--shared-trace-name",
)
#: The traces of exercise 3.2's script with --shared-trace-name, trace_<pid>.json.
PID_TRACES = "trace_*.json"


def _files_of_a_two_cycle_schedule(prediction: Any, run: Any) -> tuple[bool, str]:
    """3.1: the trace files of a two-cycle schedule on rank 0, against the run's files."""
    asked = {
        "--steps": "8",
        "--wait": "1",
        "--warmup": "1",
        "--active": "2",
        "--repeat": "2",
        "--profile-ranks": "0",
    }
    wrong = wrong_run(run, TRAIN_DDP_SCRIPT, asked)
    if wrong:
        return False, wrong
    actual = sorted(p.name for p in run.paths(WINDOW_TRACES))
    predicted = file_names(prediction)
    if predicted is None:
        return False, "predict a list of file names"
    if predicted == actual:
        return True, f"exactly these files: {actual}"
    if any(not name.startswith("rank0_") for name in predicted):
        return False, "only the ranks named in --profile-ranks write traces"
    if len(predicted) != len(actual):
        return False, "each cycle of the schedule (repeat) ends with its own active window and file"
    return False, (
        "the names hold the window's first and last step: write_trace computes them "
        "from prof.step_num when the window ends (steps count from 0)"
    )


def _renamed_files(run: Any) -> dict[str, str] | None:
    """``{name now: name written}`` of the files :func:`helpers.anonymise_traces` renamed in the
    run, those still there; None when it was not run."""
    try:
        renamed = json.loads((run.run_dir / RENAMED_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(renamed, dict):
        return None
    return {new: str(old) for new, old in renamed.items() if (run.run_dir / str(new)).is_file()}


def _which_rank_wrote_each_file(which_rank: Any, run: Any) -> tuple[bool, str]:
    """3.2: which rank wrote each trace_<pid>.json, renamed at random, read from the files."""
    asked = {
        "--steps": "3",
        "--wait": "1",
        "--warmup": "1",
        "--active": "1",
        "--shared-trace-name": None,
    }
    wrong = wrong_run(run, None, asked, shown=f"your {PID_SCRIPT}")
    if wrong:
        return False, wrong
    renamed = _renamed_files(run)
    written = len(renamed) if renamed is not None else len(run.paths(PID_TRACES))
    if written != run.world_size:
        return False, (
            f"{written} trace_<pid>.json files for {run.world_size} ranks: change the "
            f"--shared-trace-name branch of write_trace so that every process writes a file "
            f"of its own name (os.getpid())"
        )
    if renamed is None:
        return False, (
            "first make the names say nothing, so that only the files can tell: "
            "anonymise_traces(pid_run), then answer with the new names"
        )
    actual = {}
    for name, written in renamed.items():
        try:
            trace = load_trace(run.run_dir / name)
        except (OSError, TraceError) as err:
            return False, f"{name} is not a trace the profiler wrote ({err})"
        if written.removesuffix(".json").split("_", 1)[-1] not in set(
            trace.events["pid"].astype(str)
        ):
            return False, (
                f"{written} was not named after the process that wrote it: name each file "
                f"with os.getpid(), the process id"
            )
        actual[name] = trace.header.rank
    if isinstance(which_rank, dict) and set(which_rank) == set(renamed.values()):
        return False, f"answer with the names the files have now: {sorted(actual)}"
    if not isinstance(which_rank, dict) or set(which_rank) != set(actual):
        return False, f"answer with a dict of every file name to its rank: {sorted(actual)}"
    if {name: whole(rank) for name, rank in which_rank.items()} != actual:
        return False, (
            "the names say nothing about ranks; load each file and read "
            "load_trace(path).header.rank (from the trace's distributedInfo)"
        )
    return True, f"every rank kept its own trace, and each file says which rank wrote it: {actual}"


#: Lesson 3's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "03.1": _files_of_a_two_cycle_schedule,
    "03.2": _which_rank_wrote_each_file,
}
