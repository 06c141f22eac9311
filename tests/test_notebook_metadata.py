"""Committed notebooks keep their outputs but nothing that changes on every run."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
import clean_notebooks  # noqa: E402

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb")) + sorted(
    (REPO / "solutions").glob("*.ipynb")
)


def check(*paths) -> tuple[int, str]:
    """``tools/clean_notebooks.py --check`` on ``paths``, in this process: its status and what
    it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = clean_notebooks.main(["--check", *map(str, paths)])
    return status, printed.getvalue()


def test_no_committed_notebook_carries_timestamps_or_other_volatile_metadata():
    status, printed = check(*NOTEBOOKS)
    assert status == 0, printed


def test_the_check_fails_on_a_notebook_with_an_execution_timestamp(tmp_path):
    notebook = json.loads(NOTEBOOKS[0].read_text())
    code = next(c for c in notebook["cells"] if c["cell_type"] == "code")
    code["metadata"]["execution"] = {"iopub.execute_input": "2026-11-23T11:55:07.020102Z"}
    dirty = tmp_path / "dirty.ipynb"
    dirty.write_text(json.dumps(notebook))

    status, printed = check(dirty)

    assert status == 1 and "'execution'" in printed


def test_cleaning_keeps_outputs_counts_and_tags(tmp_path):
    notebook = json.loads(NOTEBOOKS[0].read_text())
    for cell in notebook["cells"]:
        cell["metadata"]["execution"] = {"shell.execute_reply": "2026-11-23T11:55:09Z"}
    path = tmp_path / "n.ipynb"
    path.write_text(json.dumps(notebook))

    assert clean_notebooks.main([str(path)]) == 0
    cleaned = json.loads(path.read_text())

    original = json.loads(NOTEBOOKS[0].read_text())
    assert [c.get("outputs") for c in cleaned["cells"]] == [
        c.get("outputs") for c in original["cells"]
    ]
    assert [c.get("execution_count") for c in cleaned["cells"]] == [
        c.get("execution_count") for c in original["cells"]
    ]
    assert [c["metadata"] for c in cleaned["cells"]] == [c["metadata"] for c in original["cells"]]
    assert check(path)[0] == 0


def figures_without_alt_text(notebook: dict) -> list[int]:
    """The cells of ``notebook`` with a figure (a PNG output) that carries no alternative text."""
    return [
        number
        for number, cell in enumerate(notebook["cells"])
        for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {})
        and not ((output.get("metadata") or {}).get("image/png") or {}).get("alt", "").strip()
    ]


def test_every_figure_of_the_lessons_and_solutions_says_what_it_shows():
    missing = {
        path.name: cells
        for path in NOTEBOOKS
        if (cells := figures_without_alt_text(json.loads(path.read_text())))
    }
    assert missing == {}, "show each figure with show_figure(fig, alt=...)"


def test_a_figure_without_alt_text_is_found():
    png = {"data": {"image/png": "iVBOR", "text/plain": "<Figure>"}, "metadata": {}}
    described = {**png, "metadata": {"image/png": {"alt": "Bars of step time per rank."}}}
    notebook = {"cells": [{"outputs": [png]}, {"outputs": [described]}, {"outputs": []}]}
    assert figures_without_alt_text(notebook) == [0]


@pytest.mark.slow  # launches a process: make test, not the quick loop
def test_the_html_of_make_run_gives_every_figure_its_alternative_text(tmp_path):
    lesson = REPO / "notebooks" / "04_reading_ddp_traces.ipynb"
    done = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "html",
         "--TemplateExporter.extra_template_basedirs=" + str(REPO / "tools" / "nbconvert"),
         "--template", "series", "--output-dir", str(tmp_path), str(lesson)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    html = (tmp_path / "04_reading_ddp_traces.html").read_text()
    images = re.findall(r"<img [^>]*>", html)
    assert images and all("alt=" in img and "No description" not in img for img in images)
    assert "Alternative text is missing" not in done.stderr


#: Scripts whose lines the recordings point at (stack samples, dumps of stacks, source lines of
#: the profiler's Python events): rewrapping them would move every line the lessons read back.
LINES_RECORDED = {
    ("03_ddp_under_torchrun.ipynb", "train_ddp.py"),
    ("08_when_a_job_hangs.ipynb", "hang.py"),
    ("09_look_inside_a_running_job.ipynb", "live_train.py"),
}
CODE_WIDTH = 88  # what the site's code box shows without scrolling sideways


def test_the_code_of_every_lesson_and_solution_fits_the_sites_code_box():
    wide = []
    for path in NOTEBOOKS:
        for cell in json.loads(path.read_text())["cells"]:
            source = "".join(cell["source"])
            script = re.match(r"%%writefile (\S+)", source)
            if cell["cell_type"] != "code" or (script and (path.name, script[1]) in LINES_RECORDED):
                continue
            wide += [
                f"{path.name}: {line}" for line in source.splitlines() if len(line) > CODE_WIDTH
            ]
    assert wide == [], f"{len(wide)} lines wider than {CODE_WIDTH} characters"


LESSON_WORDS = 3800  # what a workshop can hold in one sitting (lessons round 7)


def prose_words(path) -> int:
    """The words of a notebook's markdown cells, leaving out fenced code and link targets."""
    words = 0
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            text = re.sub(r"```.*?```", " ", "".join(cell["source"]), flags=re.S)
            words += len(re.sub(r"\]\([^)]*\)", "]", text).split())
    return words


def test_no_lesson_has_more_prose_than_a_workshop_can_hold():
    counts = {path.name: prose_words(path) for path in NOTEBOOKS}
    assert {name: n for name, n in counts.items() if n > LESSON_WORDS} == {}
