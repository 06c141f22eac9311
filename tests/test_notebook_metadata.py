"""Committed notebooks keep their outputs but nothing that changes on every run."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO

CLEANER = REPO / "tools" / "clean_notebooks.py"
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb")) + sorted(
    (REPO / "solutions").glob("*.ipynb")
)


def check(*paths) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CLEANER), "--check", *map(str, paths)], capture_output=True, text=True
    )


def test_no_committed_notebook_carries_timestamps_or_other_volatile_metadata():
    done = check(*NOTEBOOKS)
    assert done.returncode == 0, done.stdout


def test_the_check_fails_on_a_notebook_with_an_execution_timestamp(tmp_path):
    notebook = json.loads(NOTEBOOKS[0].read_text())
    code = next(c for c in notebook["cells"] if c["cell_type"] == "code")
    code["metadata"]["execution"] = {"iopub.execute_input": "2026-11-23T11:55:07.020102Z"}
    dirty = tmp_path / "dirty.ipynb"
    dirty.write_text(json.dumps(notebook))

    done = check(dirty)

    assert done.returncode == 1 and "'execution'" in done.stdout


def test_cleaning_keeps_outputs_counts_and_tags(tmp_path):
    notebook = json.loads(NOTEBOOKS[0].read_text())
    for cell in notebook["cells"]:
        cell["metadata"]["execution"] = {"shell.execute_reply": "2026-11-23T11:55:09Z"}
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(notebook))

    subprocess.run([sys.executable, str(CLEANER), str(path)], check=True)
    cleaned = json.loads(path.read_text())

    original = json.loads(NOTEBOOKS[0].read_text())
    assert [c.get("outputs") for c in cleaned["cells"]] == [
        c.get("outputs") for c in original["cells"]
    ]
    assert [c.get("execution_count") for c in cleaned["cells"]] == [
        c.get("execution_count") for c in original["cells"]
    ]
    assert [c["metadata"] for c in cleaned["cells"]] == [c["metadata"] for c in original["cells"]]
    assert check(path).returncode == 0
