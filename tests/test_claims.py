"""The table of the lessons' claims (tools/ASSERTIONS.md) is kept true: every claim a lesson or a
solution asserts has its row, with why it holds, and no row is left of a claim that is gone."""

from __future__ import annotations

import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
from assert_recorder import claims_of  # noqa: E402

TABLE = REPO / "tools" / "ASSERTIONS.md"
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb")) + sorted(
    (REPO / "solutions").glob("*.ipynb")
)


def table_rows() -> list[list[str]]:
    """The table's rows, each its cells: notebook, claim, kind, why, held/runs, worst margin."""
    rows = []
    for line in TABLE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 6 and cells[0].endswith(".ipynb"):
            rows.append(cells)
    return rows


def made() -> set[tuple[str, str]]:
    return {(str(p.relative_to(REPO)), c) for p in NOTEBOOKS for c in claims_of(p)}


def test_every_claim_a_notebook_asserts_has_its_row_in_the_table():
    listed = {(notebook, claim) for notebook, claim, *_ in table_rows()}
    assert sorted(made() - listed) == [], "add a row to tools/ASSERTIONS.md"


def test_no_row_of_the_table_is_left_of_a_claim_no_notebook_makes():
    listed = {(notebook, claim) for notebook, claim, *_ in table_rows()}
    assert sorted(listed - made()) == []


@pytest.mark.parametrize("row", table_rows(), ids=lambda r: f"{r[0][-30:]} {r[1][:40]}")
def test_each_row_says_whether_its_value_changes_from_run_to_run_and_why_it_holds(row):
    notebook, claim, kind, why, *_ = row
    assert kind in ("fixed", "live") and len(why) > 20


def test_the_claims_of_a_notebook_are_its_asserts_and_in_a_solution_its_checks(tmp_path):
    import nbformat

    cells = ["%%writefile s.py\nassert False, 'a script'", "x = 1\nassert x == 1, 'one'",
             "assert x > 0", 'check("01.1", x)']  # fmt: skip
    for folder in ("notebooks", "solutions"):
        (tmp_path / folder).mkdir()
        node = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
        nbformat.write(node, tmp_path / folder / "01.ipynb")
    assert claims_of(tmp_path / "notebooks" / "01.ipynb") == ["one", "`x > 0`"]
    assert claims_of(tmp_path / "solutions" / "01.ipynb") == ["one", "`x > 0`", '`check("01.1")`']
