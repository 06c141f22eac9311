"""Bring a script that an earlier lesson writes into this lesson's folder.

Every script of the series is written by exactly one lesson, in a ``%%writefile NAME``
cell that the learner reads there. A later lesson that runs the same script calls::

    script_from_lesson("train_ddp.py", "03_ddp_under_torchrun.ipynb")

which writes the file from that cell, so any lesson runs on a fresh clone and there is
still one copy of each script's code in the repository.
"""

from __future__ import annotations

import json
from pathlib import Path

from .runs import REPO_ROOT, show_path

__all__ = ["script_from_lesson", "LESSONS_DIR"]

LESSONS_DIR = REPO_ROOT / "notebooks"


def script_from_lesson(script: str, lesson: str, dest: str | Path = ".") -> None:
    """Write ``script`` into ``dest`` (default: the current folder) from the ``%%writefile``
    cell of ``lesson`` (a notebook in ``notebooks/``), and say so."""
    notebook = LESSONS_DIR / lesson
    if not notebook.is_file():
        raise FileNotFoundError(f"{show_path(notebook)}: no such lesson")
    for cell in json.loads(notebook.read_text())["cells"]:
        source = "".join(cell["source"])
        first, _, body = source.partition("\n")
        if (
            cell["cell_type"] == "code"
            and first.split()[-1:] == [script]
            and first.startswith("%%writefile")
        ):
            path = Path(dest) / script
            path.write_text(body)
            print(f"{script} written from lesson {lesson}")
            return
    raise LookupError(f"{show_path(notebook)} has no %%writefile {script} cell")
