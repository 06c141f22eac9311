"""The checks of lesson 10's exercises (``notebooks/10_sharded_training.ipynb``; worked in
``solutions/10_solutions.ipynb``): how many all-gathers and reduce-scatters a sharded step makes
on each rank when ResNet-18's four layers are the units instead of its eight blocks, predicted
and then read from FSDP's own annotations; and a straggler chosen at random in a sharded run
(:func:`helpers.launch_with_a_hidden_straggler`) with its delay."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..analysis import fsdp_phases
from ..traces import load_run
from .common import Check, arguments, is_run, whole
from .hidden import judge_hidden_straggler

__all__ = ["CHECKS", "SCRIPTS", "FLAGS", "FSDP_SCRIPT"]

#: Lesson 10's script: lesson 3's training with FSDP2 (it takes train_ddp.py's flags too).
FSDP_SCRIPT = "train_fsdp.py"
#: The scripts these checks rely on, and the flags of theirs they read.
SCRIPTS = (FSDP_SCRIPT,)
FLAGS = ("--strategy", "--units")
#: How exercise 10.1's run is launched (the hint shows it).
_LAYERS_RUN = 'launch("train_fsdp.py", nproc=NPROC, experiment="fsdp-layers", args=common + ["--units", "layers"])'  # fmt: skip


def _per_step(phases: pd.DataFrame, phase: str) -> int | None:
    """How many ``phase`` rows each rank has per step, when that is the same for all."""
    counts = phases[phases["phase"] == phase].groupby(["rank", "step"]).size()
    return int(counts.iloc[0]) if len(counts) and counts.nunique() == 1 else None


def _collectives_of_a_step_with_layers_as_units(prediction: Any, run: Any) -> tuple[bool, str]:
    """10.1: all-gathers and reduce-scatters per step and rank with the layers as units."""
    given = arguments(run) if is_run(run) else {}
    if not is_run(run) or run.script != FSDP_SCRIPT or given.get("--units") != "layers":
        return False, f"predict first, then launch the run with the layers as units: {_LAYERS_RUN}"
    if given.get("--strategy", "fsdp") != "fsdp":
        return False, "this run replicated the model (--strategy ddp): leave --strategy out"
    phases = fsdp_phases(load_run(run).events)
    gathers, reduces = _per_step(phases, "all-gather"), _per_step(phases, "reduce-scatter")
    if gathers is None or reduces is None:
        return False, "this run's traces have no FSDP annotations in whole steps: was it profiled?"
    if not isinstance(prediction, dict) or {"all_gathers", "reduce_scatters"} - set(prediction):
        return False, 'predict {"all_gathers": ..., "reduce_scatters": ...}'
    units = phases["unit"].nunique()
    said_gathers, said_reduces = whole(prediction["all_gathers"]), whole(prediction["reduce_scatters"])  # fmt: skip
    if said_gathers != gathers:
        if said_gathers == units:
            return (
                False,
                "in backward the units are gathered again: forward let their parameters go",
            )
        if said_gathers == 2 * units:
            return (
                False,
                "not every unit is gathered again in backward: the root keeps its parameters",
            )
        if said_gathers in (units - 1, 2 * (units - 1)):
            return False, "the root is a unit too: it gathers the parameters no layer holds"
        return False, "count the units (the layers and the root), then the gathers of each pass"
    if said_reduces != reduces:
        return False, "every unit's gradients are reduce-scattered once, after its backward: the root's too"  # fmt: skip
    return True, (
        f"{gathers} all-gathers ({units} in forward, {gathers - units} again in backward) and "
        f"{reduces} reduce-scatters per step: fewer, larger collectives than with the blocks"
    )


def _a_straggler_in_a_sharded_job(answer: Any, run: Any) -> tuple[bool, str]:
    """10.2: the rank slowed at random in a sharded run, and its delay per batch."""
    return judge_hidden_straggler(
        answer,
        run,
        FSDP_SCRIPT,
        'launch_with_a_hidden_straggler(NPROC, common, script="train_fsdp.py")',
    )


#: Lesson 10's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "10.1": _collectives_of_a_step_with_layers_as_units,
    "10.2": _a_straggler_in_a_sharded_job,
}
