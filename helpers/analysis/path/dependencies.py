"""The kinds of dependency between two moments of a run: one registry, :data:`DEPENDENCIES`, of
values that the builders (:mod:`.builders`) pass and that the graph, the path, the replay, the
figure and the report read. No module outside this one interprets a dependency by its name: it
reads the registry's flags.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "Dependency",
    "DEPENDENCIES",
    "TRANSFER",
    "RECEIVE",
    "SEND",
    "WAKE_UP",
    "SYNC",
    "STREAM_WAIT",
    "LAUNCH",
    "COMPLETION",
    "WORK",
    "QUEUE",
    "UNTRACED",
    "BEGIN",
    "LANE_ORDER",
    "STEP_END",
    "UNTRACED_NAME",
    "COLLECTIVE_KIND",
    "dependency_names",
    "segment_kind",
    "own_reason",
]


@dataclass(frozen=True)
class Dependency:
    """One kind of dependency between two moments of a run.

    code: its place in :data:`DEPENDENCIES` (the graph keeps codes; ties between edges that
        arrive together go to the smaller).
    name: the word for it, and the path's ``reason`` for a segment it decides.
    segment_kind: the ``kind`` the path gives such a segment; None: the kind of its event.
    own_start: its edge runs from an interval's own start to its end (every interval has
        exactly one such edge).
    own_time: that edge carries the interval's own time (a what-if that shortens the
        interval's events shortens it).
    waits: an edge of a wait, from something the interval waited for: its delay (lag) is the
        wait's, after the last of what it waited for ended (:func:`.graph.wait_delays`).
    removable: a what-if can remove it by naming its event: the report offers it as a fix.
    dotted: the figure draws it dotted (time that is no work of the rank's own).
    means: what it is, in words (the report's cautions say it of the edges they name: "A
        launch edge is ...").
    names_next: its segment is named after the event that starts after the gap (a launch:
        the kernel launched), not the gap.
    collective: it ends when the last of several ranks arrived: the path takes the transfer,
        on the rank that arrived last, and goes on there (always a segment, even of no time,
        so that the move is seen).
    across: its edges may join two ranks (the rest stay within one).
    """

    code: int
    name: str
    segment_kind: str | None
    means: str
    own_start: bool = False
    own_time: bool = False
    waits: bool = False
    removable: bool = False
    dotted: bool = False
    names_next: bool = False
    collective: bool = False
    across: bool = False


TRANSFER = Dependency(
    0,
    "transfer",
    "communication",
    "a collective on one rank, held until the last rank arrived, then its transfer",
    collective=True,
    across=True,
)
RECEIVE = Dependency(
    1,
    "receive",
    "communication",
    "a receive's wait on one rank, held until its send was issued on another (or, where the "
    "data was there first, until it was posted), then the transfer",
    waits=True,
    collective=True,
    across=True,
)
SEND = Dependency(
    2,
    "send",
    "communication",
    "a send's wait on one rank, held until its receive was posted on another (or, where that "
    "was first, until it was issued), then the transfer",
    waits=True,
    collective=True,
    across=True,
)
WAKE_UP = Dependency(
    3,
    "wake-up",
    "wake-up",
    "a thread's wait, until what it waited for on another lane ended",
    waits=True,
    dotted=True,
)
SYNC = Dependency(
    4,
    "sync",
    "sync",
    "a CPU thread's wait in a CUDA synchronisation or a blocking copy, until the GPU work it "
    "waited for ended",
    waits=True,
    dotted=True,
)
#: Listed before ``stream wait`` and ``launch``, the other edges into a start: an event that
#: began as the one before it on its lane ended and as what it waited for ended is held by its
#: lane, the step the path takes back from a start.
LANE_ORDER = Dependency(
    5, "lane order", None, "an interval's start, where the one before it on its lane ended"
)
STREAM_WAIT = Dependency(
    6,
    "stream wait",
    "stream wait",
    "a GPU stream's gap, until the work on another stream it was made to wait for (a CUDA "
    "event recorded there) ended",
    waits=True,
    dotted=True,
    names_next=True,
)
LAUNCH = Dependency(
    7,
    "launch",
    "launch",
    "a worker lane's gap, until its next event was issued",
    waits=True,
    dotted=True,
    names_next=True,
)
COMPLETION = Dependency(
    8,
    "completion",
    "wake-up",
    "a rank's end of a step, held until the collectives it ran on a CPU worker lane in it ended",
    dotted=True,
)
WORK = Dependency(9, "work", None, "an event's own time", own_start=True, own_time=True, removable=True)  # fmt: skip
QUEUE = Dependency(
    10,
    "queue",
    "queue",
    "a worker lane's gap behind an event issued earlier: its previous event held it",
    own_start=True,
    own_time=True,
    dotted=True,
)
UNTRACED = Dependency(
    11,
    "untraced",
    "untraced",
    "time with no event, where nothing is found that held it",
    own_start=True,
    own_time=True,
    dotted=True,
)
BEGIN = Dependency(12, "begin", None, "a collective's end, no sooner than it began", own_start=True)  # fmt: skip
STEP_END = Dependency(
    13,
    "step end",
    None,
    "a step's end, when the last of its ranks has ended it (where the step's path begins)",
    across=True,
)

#: The dependencies, one row each, in the order of their codes: the order breaks ties between
#: edges that arrive together.
DEPENDENCIES: tuple[Dependency, ...] = (
    TRANSFER, RECEIVE, SEND, WAKE_UP, SYNC, LANE_ORDER, STREAM_WAIT, LAUNCH, COMPLETION, WORK,
    QUEUE, UNTRACED, BEGIN, STEP_END,
)  # fmt: skip

#: The name the path gives a stretch of a lane with no event.
UNTRACED_NAME = "(untraced)"
#: The kind of a collective's segment on the path.
COLLECTIVE_KIND = TRANSFER.segment_kind


def own_reason(dependency: Dependency, label: int) -> str:
    """The reason of a segment of an interval taken as its own time: its dependency's name where
    that is own time, else (a wait taken as its own time, in a cycle) ``work`` for an event,
    ``untraced`` for a gap."""
    if dependency.own_time:
        return dependency.name
    return WORK.name if label >= 0 else UNTRACED.name


def segment_kind(reason: str) -> str | None:
    """The kind the path gives a segment of ``reason`` (None: the kind of its event)."""
    return _SEGMENT_KIND.get(reason)


_SEGMENT_KIND = {d.name: d.segment_kind for d in DEPENDENCIES}


def dependency_names(predicate: Callable[[Dependency], bool]) -> tuple[str, ...]:
    """The names of the dependencies for which ``predicate(dependency)`` holds (the figure's
    dotted reasons, the kinds a what-if cannot remove, ...)."""
    return tuple(d.name for d in DEPENDENCIES if predicate(d))
