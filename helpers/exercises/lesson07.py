"""The checks of lesson 7's exercises (``notebooks/07_multi_node.ipynb``; worked in
``solutions/07_solutions.ipynb``): which node's folder holds which rank's trace, and a clock skew
chosen at random (:func:`helpers.skew_a_node`) recovered from the events alone."""

from __future__ import annotations

from typing import Any

from .common import TRAIN_DDP_SCRIPT, WINDOW_TRACES, Check, close, file_names, number, wrong_run
from .hidden import HIDDEN_SKEW

__all__ = [
    "CHECKS",
    "SCRIPTS",
    "FLAGS",
    "TRAIN_DDP_SCRIPT",
    "NODE_FOLDER",
    "WINDOW_TRACES",
    "SKEW_TOLERANCE_US",
]

#: The scripts these checks rely on, and the flags of train_ddp.py they pass.
SCRIPTS = (TRAIN_DDP_SCRIPT,)
FLAGS = ("--steps", "--wait", "--warmup", "--active", "--profile-ranks")
#: The folder of node N inside a multi-node run's folder (node0, node1, ...).
NODE_FOLDER = "node{}"
#: How close an estimate of the hidden skew must be, in µs (lesson 7's tolerance).
SKEW_TOLERANCE_US = 10_000


def _which_node_holds_which_trace(prediction: Any, run: Any) -> tuple[bool, str]:
    """7.1: which node's folder holds the traces of ranks 0 and 2."""
    asked = {
        "--steps": "7",
        "--wait": "2",
        "--warmup": "1",
        "--active": "4",
        "--profile-ranks": "0,2",
    }
    wrong = wrong_run(run, TRAIN_DDP_SCRIPT, asked, nproc=2, nnodes=2)
    if wrong:
        return False, wrong
    actual = {
        NODE_FOLDER.format(n): sorted(
            p.name for p in (run.run_dir / NODE_FOLDER.format(n)).glob(WINDOW_TRACES)
        )
        for n in range(run.nnodes)
    }
    if not isinstance(prediction, dict) or set(prediction) != set(actual):
        return False, 'predict {"node0": [...], "node1": [...]}'
    predicted = {node: file_names(names) for node, names in prediction.items()}
    if predicted == actual:
        return True, f"each node's folder holds the traces of its own ranks: {actual}"
    every_predicted = sorted(name for names in predicted.values() for name in names or [])
    if every_predicted == sorted(name for names in actual.values() for name in names):
        return False, (
            "the right files, in the wrong folders: each node writes into its own folder, "
            "and run.nodes says which global ranks each node got"
        )
    return False, (
        "only ranks 0 and 2 write traces, one file each, named rank<N>_iter<first>_<last>.json "
        "after the window's first and last step (steps count from 0)"
    )


def _recover_a_hidden_skew(estimate_us: Any, events: Any, nodes: Any) -> tuple[bool, str]:
    """7.2: how far skew_a_node moved the last node's clock, estimated from the events alone."""
    hidden = getattr(events, "attrs", {}).get(HIDDEN_SKEW)
    if not isinstance(hidden, dict) or len(hidden) != 1:
        return False, (
            "hand the check the events that skew_a_node returned: "
            "mystery = skew_a_node(events, run.nodes)"
        )
    if not isinstance(nodes, dict) or len(nodes) < 2:
        return False, "hand the check the run's nodes (run.nodes)"
    ((node, offset_us),) = hidden.items()
    estimate = number(estimate_us)
    if estimate is None:
        return False, f"estimate node {node}'s offset as a number of µs (clock_offsets)"
    if close(estimate * 1000, offset_us, 0.0, SKEW_TOLERANCE_US):
        return False, "clock_offsets gives microseconds; you gave milliseconds"
    if close(-estimate, offset_us, 0.0, SKEW_TOLERANCE_US):
        return False, (
            "the size is right and the sign is not: the offset is how far the node's clock is "
            "ahead of the first node's (shift its ranks by minus that to correct it)"
        )
    if not close(estimate, offset_us, 0.0, SKEW_TOLERANCE_US):
        return False, (
            "that is not the offset these events hold: call clock_offsets(mystery, run.nodes) "
            f"on them and read node {node}'s"
        )
    return True, (
        f"node {node}'s clock was moved {offset_us / 1e3:+.0f} ms; you found "
        f"{estimate / 1e3:+.1f} ms from the ends of the collectives alone"
    )


#: Lesson 7's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "07.1": _which_node_holds_which_trace,
    "07.2": _recover_a_hidden_skew,
}
