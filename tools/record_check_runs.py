"""Record every run that exercises 11.2's and 14.2's checks can launch, into recordings/.

Those checks run the lesson's job themselves, with values they draw (rank 1's lateness and
rank 0's work for 11.2, micro-batch counts for 14.2), so recorded mode and the tests need a
recording of each draw; running the lessons (``make record``) makes only the lessons' own runs.
``make record`` calls this after the lessons, from ``notebooks/`` where their scripts are.

    cd notebooks && PDP_RECORD=1 ../.venv/bin/python ../tools/record_check_runs.py [11.2] [14.2]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.exercises import lesson11, lesson14  # noqa: E402


def runs_of_11_2() -> None:
    """Exercise 11.2: each row's run with 40 ms of work and with each of its factors'."""
    job = SimpleNamespace(script=lesson11.OVERLAP_SCRIPT, nproc=2)
    for late, factors in lesson11.DRAWS:
        for factor in (1.0, *factors):
            lesson11._overlap_run(job, late, 40 * factor)


def runs_of_14_2() -> None:
    """Exercise 14.2: the GPipe job at every micro-batch count a pair can draw."""
    job = SimpleNamespace(script=lesson14.PIPELINE_SCRIPT, nproc=3)  # three stages
    for m in sorted({m for pair in lesson14.MICROBATCH_PAIRS for m in pair}):
        lesson14._gpipe_run(job, m)


RECORDERS = {"11.2": runs_of_11_2, "14.2": runs_of_14_2}


def main(which: list[str]) -> None:
    if os.environ.get("PDP_RECORD") != "1":
        sys.exit("set PDP_RECORD=1, or the runs are launched and not recorded")
    for exercise in which or RECORDERS:
        if exercise not in RECORDERS:
            sys.exit(f"no such exercise {exercise!r}: choose from {', '.join(RECORDERS)}")
        print(f"== recording the runs of exercise {exercise}'s check", flush=True)
        RECORDERS[exercise]()


if __name__ == "__main__":
    main(sys.argv[1:])
