"""The checks of lesson 7's exercises (``notebooks/07_multi_node.ipynb``; worked in
``solutions/07_solutions.ipynb``): which node's folder holds which rank's trace, and the clock
skew ``clock_offsets`` recovers after the learner shifts node 1 behind node 0."""

from __future__ import annotations

from typing import Any

from ..analysis import clock_offsets
from .common import TRAIN_DDP_SCRIPT, WINDOW_TRACES, Check, close, file_names, number, wrong_run

__all__ = [
    "CHECKS",
    "SCRIPTS",
    "FLAGS",
    "TRAIN_DDP_SCRIPT",
    "NODE_FOLDER",
    "WINDOW_TRACES",
    "SKEW_7_2_US",
]

#: The scripts these checks rely on, and the flags of train_ddp.py they pass.
SCRIPTS = (TRAIN_DDP_SCRIPT,)
FLAGS = ("--steps", "--wait", "--warmup", "--active", "--profile-ranks")
#: The folder of node N inside a multi-node run's folder (node0, node1, ...).
NODE_FOLDER = "node{}"
#: The skew exercise 7.2 asks for: node 1's clock 30 ms behind node 0's, in µs.
SKEW_7_2_US = -30_000


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


def _recover_your_own_skew(
    estimate_us: Any, events: Any, nodes: Any, injected_us: Any
) -> tuple[bool, str]:
    """7.2: node 1 shifted 30 ms behind, and the offset clock_offsets recovers."""
    injected = number(injected_us)
    if injected is None or abs(injected - SKEW_7_2_US) > 1:
        if injected is not None and abs(injected + SKEW_7_2_US) <= 1:
            return False, (
                "that moves node 1 ahead of node 0: a clock that runs behind reads earlier "
                "times, so its events move the other way"
            )
        if injected is not None and abs(injected - SKEW_7_2_US / 1000) <= 0.001:
            return False, "shift_ranks takes microseconds, not milliseconds"
        return False, "shift node 1's ranks so that its clock runs 30 ms behind node 0's (in µs)"
    if not isinstance(nodes, dict) or len(nodes) < 2:
        return False, "hand the check the run's nodes (run.nodes)"
    try:
        recovered = clock_offsets(events, nodes)[max(nodes)]
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        return False, f"clock_offsets cannot read these events ({err}): pass the shifted events"
    estimate = number(estimate_us)
    if estimate is None or not close(estimate, recovered, 0.0, 1000):
        return (
            False,
            "your estimate is not what clock_offsets finds in these events: call it on them",
        )
    if not close(recovered, injected, 0.0, 10_000):  # lesson 7's tolerance
        return False, (
            f"these events give {recovered / 1e3:+.1f} ms, not the {injected / 1e3:+.1f} ms "
            f"you say you injected: shift the ranks of node 1 only, once"
        )
    return True, (
        f"recovered {recovered / 1e3:+.2f} ms for an injected {injected / 1e3:+.1f} ms, "
        f"from the ends of the collectives alone"
    )


#: Lesson 7's checks, by exercise number.
CHECKS: dict[str, Check] = {
    "07.1": _which_node_holds_which_trace,
    "07.2": _recover_your_own_skew,
}
