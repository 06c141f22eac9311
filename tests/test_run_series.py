"""``make run`` (``tools/run_series.py``) as a specification: every notebook is executed even
after one fails, and the run ends in a summary of what failed, where, and what to do."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

import nbformat
import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import run_series  # noqa: E402


def notebook(path: Path, *cells: str) -> Path:
    """A notebook of code ``cells`` at ``path``."""
    node = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    node.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nbformat.write(node, path)
    return path


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> tuple[int, str, Path]:
    """A series of three notebooks whose second fails in its second cell, run: the exit status,
    what was printed, and the folder of executed copies."""
    folder = tmp_path_factory.mktemp("series")
    books = [
        notebook(folder / "01_first.ipynb", "print('one')"),
        notebook(folder / "02_fails.ipynb", "x = 1", "assert x == 2, 'x is two'", "print('never')"),
        notebook(folder / "03_last.ipynb", "print('three')"),
    ]
    out = folder / "build"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = run_series.main([*map(str, books), "--out", str(out)])
    return status, printed.getvalue(), out


def test_a_failing_notebook_does_not_stop_the_ones_after_it(series):
    _, _, out = series
    last = nbformat.read(out / "03_last.ipynb", as_version=4)
    assert last.cells[0].outputs[0]["text"] == "three\n"


def test_the_failing_notebooks_copy_keeps_its_cells_up_to_the_error(series):
    _, _, out = series
    failed = nbformat.read(out / "02_fails.ipynb", as_version=4)
    assert failed.cells[1].outputs[0]["output_type"] == "error"
    assert failed.cells[2].get("execution_count") is None


def test_the_summary_names_the_notebook_the_cell_the_error_and_what_to_do(series):
    status, printed, _ = series
    summary = printed.split("\n\n")[-1]
    assert status == 1
    assert summary.startswith("1 of 3 notebooks stopped at an error")
    assert "02_fails.ipynb: cell 2 (assert x == 2, 'x is two')" in summary
    assert "AssertionError: x is two" in summary
    assert "make run NOTEBOOKS=" in summary and "RECORDED=1" in summary


def test_a_series_that_runs_whole_says_so_and_exits_0(tmp_path, capsys):
    book = notebook(tmp_path / "01_fine.ipynb", "print('fine')")
    assert run_series.main([str(book), "--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.rstrip().endswith("All 1 notebooks ran.")


def test_each_notebooks_kernel_is_stopped_once_it_has_run(tmp_path):
    # a kernel left running keeps its lesson's models and frames until the series ends
    book = notebook(tmp_path / "01_pid.ipynb", "import os\nprint(os.getpid())")
    (tmp_path / "out").mkdir()
    assert run_series.execute(book, tmp_path / "out") is None
    pid = int(nbformat.read(tmp_path / "out" / book.name, as_version=4).cells[0].outputs[0]["text"])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
