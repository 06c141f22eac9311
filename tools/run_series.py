"""Execute the lessons in order, as ``make run`` does, into a folder of executed copies: every
notebook, even after one fails, then a summary of what failed and what to do.

    python tools/run_series.py --out build/notebooks notebooks/*.ipynb

A notebook that fails keeps its executed cells up to the failing one, with the error, in its
copy; the series goes on with the next lesson (each runs on its own). The exit status is 1 when
any failed, else 0. The committed notebooks are never changed.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

#: How long one cell may run (s): a lesson's longest cell takes about a minute.
CELL_TIMEOUT_S = 900


@dataclass
class Failure:
    """Where a notebook stopped: its ``cell`` (counted from 1, as JupyterLab does not number
    them: the position among all cells), that cell's first line, and the error's last line."""

    notebook: Path
    cell: int
    first_line: str
    error: str


def execute(notebook: Path, out: Path) -> Failure | None:
    """Execute ``notebook`` in its own folder with a fresh kernel and write the executed copy
    into ``out`` (up to the failing cell when one fails); the failure, or None."""
    node = nbformat.read(notebook, as_version=4)
    # kernels talk to nbclient over encrypted local sockets where the machine allows it
    kernel = KernelManager(kernel_name="python3", transport_encryption="auto")
    client = NotebookClient(
        node,
        km=kernel,
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(notebook.parent)}},
    )
    failure = None
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as err:
        failure = _where(notebook, node, err)
    finally:
        nbformat.write(node, out / notebook.name)
        if kernel.has_kernel:  # a kernel handed to nbclient is ours to stop: each holds its lesson
            kernel.shutdown_kernel(now=True)
    return failure


def _where(notebook: Path, node, err: Exception) -> Failure:
    """The cell that failed: the first with an error in its outputs, else the last executed."""
    code = [(i, c) for i, c in enumerate(node.cells) if c.cell_type == "code"]
    failed = [(i, c) for i, c in code if any(o.get("output_type") == "error" for o in c.outputs)]
    ran = [(i, c) for i, c in code if c.get("execution_count")]
    index, cell = (failed or ran or code or [(0, node.cells[0])])[0 if failed else -1]
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    error = next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else "")
    first = next((line for line in cell.source.splitlines() if line.strip()), "")
    return Failure(notebook, index + 1, first.strip(), _plain(error).strip())


def _plain(text: str) -> str:
    """``text`` without the terminal's colour codes (IPython's tracebacks carry them)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def summary(failures: list[Failure], total: int, recorded: bool) -> str:
    """What the run did, in words: all passed, or each failure and what to do about it."""
    if not failures:
        return f"All {total} notebooks ran."
    lines = [f"{len(failures)} of {total} notebooks stopped at an error (the others ran):"]
    for f in failures:
        lines += [
            f"  {f.notebook}: cell {f.cell} ({f.first_line[:60]})",
            f"    {f.error[:300]}",
        ]
    lines += [
        "What to do: run that lesson again (make run NOTEBOOKS=<the notebook above>, or open it",
        "in JupyterLab: make lab). A claim that fails once and then holds is a bug of the",
        "series: please report it with the lines above.",
    ]
    if not recorded:
        lines.append(
            "If this machine cannot launch jobs (memory, a firewall): make run RECORDED=1 "
            "replays the runs shipped in recordings/."
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="folder of the executed copies")
    parser.add_argument("--recorded", action="store_true", help="runs are replayed (say so)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    failures = []
    for notebook in args.notebooks:
        print(f"== executing {notebook}", flush=True)
        started = time.monotonic()
        failure = execute(notebook, args.out)
        said = "ran" if failure is None else f"STOPPED at cell {failure.cell}"
        print(f"   {said} in {time.monotonic() - started:.0f} s", flush=True)
        if failure is not None:
            failures.append(failure)
    print("\n" + summary(failures, len(args.notebooks), args.recorded), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
