"""What the checks of every lesson share: reading an answer, and telling a run apart.

A check is handed whatever the learner typed, so nothing here raises on a malformed value:
:func:`number`, :func:`whole`, :func:`whole_numbers` and :func:`file_names` read an answer as a
number, a whole number, a list of them or a list of file names, or give ``None``. A run is
checked with :func:`wrong_run`, which reads its manifest (script, arguments, shape, status) and
says what differs from the run the exercise asks for, in a hint the learner can act on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "Check",
    "NOT_ANSWERED",
    "predictions",
    "TRAIN_DDP_SCRIPT",
    "WINDOW_TRACES",
    "arguments",
    "close",
    "file_names",
    "is_run",
    "number",
    "one_hint",
    "same_value",
    "spelled",
    "still_unanswered",
    "whole",
    "whole_numbers",
    "within",
    "wrong_run",
]

#: The series' DDP training script: lesson 3 writes it, lessons 4 and 7 launch it too.
TRAIN_DDP_SCRIPT = "train_ddp.py"
#: The traces train_ddp.py writes, rank<N>_iter<first>_<last>.json, one per window.
WINDOW_TRACES = "rank*_iter*.json"

#: A check: takes the answer and the evidence (keywords), returns ``(right?, why or hint)``;
#: ``(None, NOT_ANSWERED)`` where the answer is still the exercise's ``...``.
Check = Callable[..., tuple[bool | None, str]]
#: What a check says of an exercise not answered yet.
NOT_ANSWERED = "not answered yet: replace the ... above with your answer and run both cells"


def is_run(value: Any) -> bool:
    """Whether ``value`` looks like a ``RunRecord`` (it has a run folder and exit codes)."""
    return hasattr(value, "run_dir") and hasattr(value, "exit_codes")


def arguments(run: Any) -> dict[str, str | None]:
    """A run's script arguments as ``{"--option": "value"}`` (``None`` for a bare flag)."""
    args = [str(a) for a in getattr(run, "args", None) or []]
    found: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if token.startswith("--"):
            if "=" in token:
                option, value = token.split("=", 1)
                found[option] = value
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                found[token] = args[i + 1]
                i += 1
            else:
                found[token] = None
        i += 1
    return found


def same_value(given: str | None, wanted: str | None) -> bool:
    """Whether an argument's value is the one wanted: numbers compare as numbers ("50.0" is
    "50"), lists such as "0,2" as sets, bare flags (``None``) only with bare flags."""
    if given is None or wanted is None:
        return given is wanted
    try:
        return math.isclose(float(given), float(wanted))
    except ValueError:
        pass
    if "," in given or "," in wanted:
        return {v.strip() for v in given.split(",")} == {v.strip() for v in wanted.split(",")}
    return given == wanted


def spelled(options: Mapping[str, str | None]) -> str:
    """Arguments as a learner types them: ``{"--part": "legacy", "--x": None}`` gives
    ``"--part legacy --x"``."""
    return " ".join(
        option if value is None else f"{option} {value}" for option, value in options.items()
    )


def wrong_run(
    run: Any,
    script: str | None,
    wanted: Mapping[str, str | None],
    *,
    defaults: Mapping[str, str] | None = None,
    nproc: int | None = None,
    nnodes: int | None = None,
    finished: bool = True,
    shown: str | None = None,
) -> str | None:
    """``None`` when ``run`` is the run an exercise asks for, else a hint saying what differs.

    Args:
        run: what the learner handed in (a :class:`RunRecord`, or anything else).
        script: the script it must have run (``None``: any).
        wanted: arguments the run must have been given.
        defaults: arguments that may be left out (the script's default is the one asked for)
            but, if given, must have that value.
        nproc: the ranks per node it must have had (``None``: any).
        nnodes: the nodes it must have had (``None``: any).
        finished: it must have ended well.
        shown: the script's name in the hint when ``script`` is ``None``.
    """
    shape = ", ".join(f"{k}={v}" for k, v in (("nproc", nproc), ("nnodes", nnodes)) if v)
    asked = f"launch {script or shown or 'the script'}"
    if shape:
        asked += f" with {shape}"
    if wanted:
        asked += f" {'and' if shape else 'with'} the arguments {spelled(wanted)}"
    if not is_run(run):
        return f"hand the check the RunRecord that launch(...) returned: {asked}"
    given = arguments(run)
    problems = []
    if script is not None and run.script != script:
        problems.append(f"it ran {run.script}")
    if nproc is not None and run.nproc != nproc:
        problems.append(f"nproc was {run.nproc}")
    if nnodes is not None and run.nnodes != nnodes:
        problems.append(f"nnodes was {run.nnodes}")
    for option, value in wanted.items():
        if option not in given:
            problems.append(f"{option} is missing")
        elif not same_value(given[option], value):
            problems.append(f"{option} was {given[option]}")
    for option, value in (defaults or {}).items():
        if option in given and not same_value(given[option], value):
            problems.append(f"{option} was {given[option]}, not {value}")
    if finished and run.status != "ok":
        problems.append(f"it ended with status '{run.status}'")
    if problems:
        return f"this is not the run the exercise asks for ({'; '.join(problems)}): {asked}"
    return None


def number(value: Any) -> float | None:
    """``value`` as a finite float, or ``None`` when it is not a number (bools are not)."""
    if isinstance(value, bool):
        return None
    try:
        found = float(value)
    except (TypeError, ValueError):
        return None
    return found if math.isfinite(found) else None


def whole(value: Any) -> int | None:
    """``value`` as an int when it is a whole number, else ``None``."""
    found = number(value)
    return int(found) if found is not None and found == int(found) else None


def whole_numbers(values: Any) -> list[int] | None:
    """A collection of whole numbers as a sorted list, or ``None`` when it is not one."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        return None
    numbers = [whole(v) for v in values]
    return None if any(n is None for n in numbers) else sorted(numbers)


def file_names(values: Any) -> list[str] | None:
    """A collection of file names as a sorted list, or ``None`` when it is not one."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        return None
    values = list(values)
    return sorted(values) if all(isinstance(v, str) for v in values) else None


def close(value: float, truth: float, relative: float, absolute: float) -> bool:
    """Whether ``value`` is close to ``truth``, by the wider of two tolerances.

    Args:
        value: the learner's number.
        truth: the number it should be.
        relative: the tolerance as a fraction of ``truth``.
        absolute: the tolerance in ``truth``'s unit.
    """
    return abs(value - truth) <= max(absolute, relative * abs(truth))


def within(said: float | None, truth: float | None, tolerance: tuple[float, float]) -> bool:
    """Whether the learner's number is ``truth`` within ``(relative, absolute)``, as
    :func:`close` takes them; ``False`` where either is not a number."""
    return said is not None and truth is not None and close(said, truth, *tolerance)


def one_hint(parts_right: Iterable[bool], said_ms: float | None, where_to_look: str) -> str | None:  # fmt: skip
    """The hint for an answer of several parts to a hidden question (exercises 4.2, 10.2, 11.1,
    13.1, 13.2, 14.1, 15.1, 16.1): the same for every wrong answer, so that a blind search learns
    nothing from a try but that it was wrong.

    Args:
        parts_right: whether each part of the answer is right (the rank, the delay...).
        said_ms: the learner's delay in ms (``None``: not a number, or none asked).
        where_to_look: where the traces show each part, never which part was right.

    Returns:
        ``None`` for an answer right in every part; else a delay under 1 ms is taken as given
        in seconds (every hidden delay is 40 ms or more: that says nothing of the answer), and
        any other wrong answer gets ``where_to_look``.
    """
    if said_ms is not None and 0 < said_ms < 1:
        return "give the delay in ms, not seconds (0.08 s is 80 ms)"
    return None if all(parts_right) else where_to_look


def predictions(
    predict: Any, values: Sequence[Any], read: Callable[[Any, Any], tuple[Any, str]]
) -> tuple[dict, tuple[bool | None, str] | None]:
    """``predict(value)`` for each value a check drew, read with ``read(said, value)`` (the
    prediction, or None and why not), all of them before the check runs anything. Returns the
    predictions, or else the check's answer to give: not answered yet (``predict`` still
    returns ``...``), or a hint (it raised, or gave something ``read`` refused). ``predict``
    is called once per value: a prediction can be a whole replay."""
    said = {}
    for value in values:
        try:
            raw = predict(value)
        except Exception as err:  # the learner's own code: any error is a hint, not a crash
            return {}, (False, f"predict({value}) raised {type(err).__name__}: {err}")
        if raw is ... and not said:  # the first value's answer is the exercise's stub
            return {}, (None, NOT_ANSWERED)
        said[value], why = read(raw, value)
        if said[value] is None:
            return {}, (False, why)
    return said, None


def still_unanswered(written: Any, *args: Any) -> bool:
    """Whether ``written(*args)``, a function the learner writes, still returns the exercise's
    ``...`` (not written yet); a function that raises is answered (its error is a hint)."""
    try:
        return written(*args) is ...
    except Exception:
        return False
