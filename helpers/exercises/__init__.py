"""Checks for the exercises at the end of each lesson.

After trying an exercise, run its check in the next cell::

    check("04.1", answer, run=my_run)

It says whether the answer is right and, when it is not, why (a hint, not the solution).
Every check first makes sure that the evidence is the one the exercise asks for (the run's
script and arguments, read from its manifest), then compares the answer with what *your own*
run produced (its files, its traces, its measured times, with tolerances), never with numbers
stored here. An exercise not yet tried is a normal state: leave ``answer = ...`` and the check
says so.

Each check is a function registered under the exercise's number; it returns ``(True,
message)`` or ``(False, hint)``, and answers a malformed answer with a hint, never an
exception. :func:`evaluate` runs one and returns that pair (the tests use it); :func:`check`
prints the verdict for the learner. With the environment variable ``PDP_CHECKS_MUST_PASS=1``
(CI sets it) :func:`check` also raises :class:`ExerciseNotSolved` on a wrong answer, so that a
worked solution that stops passing its check fails its notebook; an exercise not answered yet
never raises.

The checks live next to what they check, one module per lesson: ``lesson01`` to ``lesson16``
(``common`` holds what they share, ``hidden`` the helpers that choose an exercise's answer at
random and keep it for the check). To add the checks of lesson NN:

1. Write ``helpers/exercises/lessonNN.py``: a docstring naming the lesson's notebook
   (``notebooks/NN_*.ipynb``) and its solution (``solutions/NN_solutions.ipynb``); at the top,
   ``SCRIPTS`` and ``FLAGS`` (the script names and flags of the lesson's scripts that the
   checks rely on, each a tuple, empty when none) and any file name a check reads, each with a
   one-line comment; then the checks, built from :mod:`helpers.exercises.common` and the
   public names of ``helpers``; at the end ``CHECKS = {"NN.1": ..., "NN.2": ...}``.
2. Import it below and add it to :data:`LESSONS`.
3. Feed the checks wrong answers in ``tests/test_exercises.py``;
   ``tests/test_exercise_modules.py`` checks the module's shape (its numbers, its declared
   scripts and flags against the lessons, no private imports).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from . import (
    lesson01,
    lesson02,
    lesson03,
    lesson04,
    lesson05,
    lesson06,
    lesson07,
    lesson08,
    lesson09,
    lesson10,
    lesson11,
    lesson12,
    lesson13,
    lesson14,
    lesson15,
    lesson16,
)
from .common import NOT_ANSWERED, Check
from .hidden import (
    FEW_RANKS_DELAYS_MS,
    anonymise_traces,
    launch_with_a_hidden_leak,
    launch_with_a_hidden_slowdown,
    launch_with_a_hidden_stall,
    launch_with_a_hidden_straggler,
    skew_a_node,
    slow_a_rank,
)
from .lesson16 import past_reports

__all__ = [
    "check",
    "evaluate",
    "CHECKS",
    "LESSONS",
    "ExerciseNotSolved",
    "MUST_PASS_ENV",
    "anonymise_traces",
    "FEW_RANKS_DELAYS_MS",
    "launch_with_a_hidden_straggler",
    "launch_with_a_hidden_slowdown",
    "launch_with_a_hidden_stall",
    "launch_with_a_hidden_leak",
    "past_reports",
    "skew_a_node",
    "slow_a_rank",
]

#: The lessons' check modules, in order; each has ``CHECKS``, its exercises' checks by number.
LESSONS: tuple[ModuleType, ...] = (
    lesson01,
    lesson02,
    lesson03,
    lesson04,
    lesson05,
    lesson06,
    lesson07,
    lesson08,
    lesson09,
    lesson10,
    lesson11,
    lesson12,
    lesson13,
    lesson14,
    lesson15,
    lesson16,
)

#: Set to 1 to make :func:`check` raise on a wrong answer (CI runs the solutions so).
MUST_PASS_ENV = "PDP_CHECKS_MUST_PASS"


class ExerciseNotSolved(AssertionError):
    """A check said "not yet" while ``PDP_CHECKS_MUST_PASS`` was set."""


def _register(lessons: Iterable[ModuleType]) -> dict[str, Check]:
    """Every lesson's checks in one table, by exercise number; a number twice is an error."""
    checks: dict[str, Check] = {}
    for lesson in lessons:
        for number, fn in lesson.CHECKS.items():
            if number in checks:
                raise ValueError(f"exercise {number} has two checks (in {lesson.__name__} too)")
            checks[number] = fn
    return checks


#: The checks, by exercise number (``"04.1"``): each takes the answer and the evidence.
CHECKS: dict[str, Check] = _register(LESSONS)


def evaluate(exercise: str, answer: Any = ..., **evidence: Any) -> tuple[bool | None, str]:
    """``(True, why)`` for a right answer, ``(False, hint)`` for a wrong one, ``(None, ...)``
    when the exercise has not been answered yet (``answer`` or evidence still ``...``)."""
    if exercise not in CHECKS:
        raise KeyError(f"no exercise {exercise!r}; exercises: {', '.join(sorted(CHECKS))}")
    if answer is ... or any(value is ... for value in evidence.values()):
        return None, NOT_ANSWERED
    return CHECKS[exercise](answer, **evidence)


def _must_pass() -> bool:
    return os.environ.get(MUST_PASS_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def check(exercise: str, answer: Any = ..., **evidence: Any) -> None:
    """Print whether the answer to an exercise is right, and a hint when it is not."""
    ok, message = evaluate(exercise, answer, **evidence)
    verdict = {True: "right", False: "not yet", None: ""}[ok]
    line = f"Exercise {exercise}: " + (f"{verdict}. {message}" if verdict else message)
    print(line)
    if ok is False and _must_pass():
        raise ExerciseNotSolved(f"{line} ({MUST_PASS_ENV} is set)")
