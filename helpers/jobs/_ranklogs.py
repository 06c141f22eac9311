"""What the ranks print: the per-rank log files that torchrun writes, followed line by line
with bounded memory (:class:`RankLogs`)."""

from __future__ import annotations

import os
from pathlib import Path

from .runs import show_path

TAIL_LINES = 2000  # lines of each rank's output (and of each agent's) kept in memory
MAX_LINE = 10_000  # characters of a line kept in memory; the log files on disk keep all
_READ_BYTES = 1 << 20  # read from a log file per poll, at most
_FINAL_BYTES = 4 << 20  # read from a log file at the end of a run, at most: its tail


class RankLogs:
    """Follow the per-rank log files that torchrun writes with ``--redirects``.

    torchrun puts each worker's stdout and stderr in
    ``<log_dir>/<id>/attempt_<n>/<local_rank>/{stdout,stderr}.log``. Reading them
    ourselves (rather than torchrun's echo to the console) keeps each line whole and
    labelled with its rank. ``poll()`` returns the complete new lines as
    ``(rank, line)``; ``poll(final=True)`` also returns an unfinished last line.

    Memory stays bounded whatever a rank prints: a poll reads at most ``_READ_BYTES`` of a
    file, the final one its last ``_FINAL_BYTES`` (saying how much it skipped), and a line
    longer than ``MAX_LINE`` characters is cut. The files keep everything.
    """

    def __init__(self, log_dir: Path, first_rank: int | None = 0):
        self.log_dir = log_dir
        self.first_rank = first_rank  # None until known (multi-node: from torchrun's log)
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}
        self._cutting: set[Path] = set()  # files in the middle of a line too long to keep

    def poll(self, final: bool = False) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        if self.first_rank is None:
            return out
        # stdout before stderr, so an error message follows the output that led to it
        paths = self.log_dir.glob("*/attempt_*/*/std*.log")
        for path in sorted(paths, key=lambda p: (p.parent, p.name != "stdout.log")):
            rank = self.first_rank + int(path.parent.name)
            offset = self._offsets.get(path, 0)
            try:
                with path.open("rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    if final and size - offset > _FINAL_BYTES:
                        skipped, offset = size - _FINAL_BYTES - offset, size - _FINAL_BYTES
                        self._partial.pop(path, None)
                        self._cutting.add(path)  # the tail starts inside a line
                        out.append((rank, f"[{skipped:,} bytes not shown: see {show_path(path)}]"))
                    f.seek(offset)
                    data = f.read(_FINAL_BYTES if final else _READ_BYTES)
            except OSError:
                continue
            self._offsets[path] = offset + len(data)
            out.extend((rank, line) for line in self._lines(path, data, final))
        return out

    def _lines(self, path: Path, data: bytes, final: bool) -> list[str]:
        """The complete lines of ``path`` that ``data`` ends, each cut to ``MAX_LINE``."""
        *complete, rest = (self._partial.pop(path, b"") + data).split(b"\n")
        if path in self._cutting:  # drop the rest of a line already cut
            if complete:
                complete.pop(0)
                self._cutting.discard(path)
            else:
                rest = b""
        if len(rest) > MAX_LINE:  # a line too long to wait for: cut it now
            complete.append(rest)
            rest = b""
            self._cutting.add(path)
        if rest and final:
            complete.append(rest)
        elif rest:
            self._partial[path] = rest
        return [cut_line(line.decode(errors="replace")) for line in complete]


def cut_line(line: str) -> str:
    """``line``, cut to ``MAX_LINE`` characters."""
    return line if len(line) <= MAX_LINE else line[:MAX_LINE] + " [line cut]"
