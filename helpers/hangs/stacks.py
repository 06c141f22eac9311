"""Python stacks as a table: the tracebacks of every thread that Python's ``faulthandler``
writes (a rank's debug server answers with them, lesson 9; a rank can also renew them in a file
every few seconds, lesson 8), one row per frame, and the line of a script each rank is on."""

from __future__ import annotations

import linecache
import re
from pathlib import Path

import pandas as pd

from ..jobs.runs import REPO_ROOT

__all__ = ["STACK_COLUMNS", "stack_frames", "load_stack_dumps", "lines_in_script"]

#: The columns of a table of stacks, one row per frame (depth 0: the innermost call).
STACK_COLUMNS = ["rank", "thread", "depth", "file", "line", "function", "code"]
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.MULTILINE)
_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')
_TIMEOUT = re.compile(r"^Timeout \(\d+:\d\d:\d\d(?:\.\d+)?\)!$", re.MULTILINE)
#: A stack dump file is read up to this size: a dump renewed every second for an hour.
MAX_DUMP_BYTES = 64 * 2**20


def stack_frames(rank: int, text: str) -> list[dict]:
    """The frames of a traceback dump in ``faulthandler``'s format (``text``; innermost first):
    one dict per frame with the keys of :data:`STACK_COLUMNS`, ``code`` read from the file."""
    linecache.checkcache()  # a script rewritten since it was last read: its new lines
    rows, thread, depth = [], None, 0
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            thread, depth = head.group(2), 0
            continue
        frame = _FRAME.match(line)
        if frame and thread is not None:
            path, number, function = frame.group(1), int(frame.group(2)), frame.group(3)
            code = linecache.getline(_readable(path), number).strip()
            rows.append(
                dict(rank=rank, thread=thread, depth=depth, file=path, line=number,
                     function=function, code=code)
            )  # fmt: skip
            depth += 1
    return rows


def _readable(path: str) -> str:
    """``path``, or the file of the repository it names when it is relative to it (a recording
    keeps no absolute path of the machine that made it)."""
    if Path(path).is_absolute() or Path(path).exists():
        return path
    return str(REPO_ROOT / path)


def load_stack_dumps(folder: str | Path, pattern: str = "stacks_*.txt") -> pd.DataFrame:
    """The last dump of each rank's stack file in ``folder`` (``stacks_<rank>.txt``, as
    ``faulthandler.dump_traceback_later(..., repeat=True)`` appends them), as a table with
    :data:`STACK_COLUMNS`. A file larger than :data:`MAX_DUMP_BYTES` is read from its end."""
    rows = []
    for path in sorted(Path(folder).glob(pattern)):
        rank = int(re.sub(r"\D", "", path.stem) or -1)
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - MAX_DUMP_BYTES))
            text = f.read().decode(errors="replace")
        starts = [m.start() for m in _TIMEOUT.finditer(text)]
        rows += stack_frames(rank, text[starts[-1] :] if starts else text)
    return pd.DataFrame(rows, columns=STACK_COLUMNS)


def lines_in_script(stacks: pd.DataFrame, script: str) -> pd.DataFrame:
    """One row per rank of ``stacks``: the line of the file named ``script`` that the rank's
    thread running the script is on (the innermost frame in that file of the thread whose
    outermost frame is the script's ``<module>``; of any thread in the script when none is),
    with ``line, function, code``."""
    in_script = stacks[stacks["file"].map(lambda f: Path(f).name) == script]
    outermost = stacks.sort_values("depth").groupby(["rank", "thread"]).tail(1)
    main = outermost[
        (outermost["function"] == "<module>")
        & (outermost["file"].map(lambda f: Path(f).name) == script)
    ]
    runs_it = in_script.merge(main[["rank", "thread"]], on=["rank", "thread"])
    chosen = pd.concat([runs_it, in_script[~in_script["rank"].isin(runs_it["rank"])]])
    innermost = chosen.sort_values(["rank", "depth"]).groupby("rank").head(1)
    return innermost.set_index("rank")[["line", "function", "code"]]
