"""Every link between the series' own pages leads somewhere: the lessons, the solutions, the
README and the pages in docs/ link files that exist, and anchors that the page defines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [*REPO.glob("*.md"), *REPO.glob("docs/*.md"), *REPO.glob("notebooks/*.ipynb")]
    + [*REPO.glob("solutions/*.ipynb"), *REPO.glob("data/**/*.md")]
)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def markdown_of(page: Path) -> str:
    if page.suffix != ".ipynb":
        return page.read_text()
    cells = json.loads(page.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def anchors_of(page: Path) -> set[str]:
    """The anchors a page defines: ``<a id="...">`` and its headings, as GitHub slugs them."""
    text = markdown_of(page)
    ids = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#+\s+(.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        ids.add(slug)
    return ids


def local_links(page: Path) -> list[str]:
    return [
        link
        for link in LINK.findall(markdown_of(page))
        if not re.match(r"^[a-z]+:", link)  # http:, https:, mailto:
    ]


def broken(page: Path, link: str) -> str | None:
    """Why ``link`` on ``page`` leads nowhere, or None."""
    path, _, anchor = link.partition("#")
    target = (page.parent / path).resolve() if path else page
    if not target.exists():
        return f"{link}: no file {target.relative_to(REPO) if REPO in target.parents else target}"
    if anchor and target.suffix in (".md", ".ipynb") and anchor not in anchors_of(target):
        return f"{link}: no anchor #{anchor}"
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_of_the_page_leads_to_a_file_and_anchor_that_exist(page):
    assert [why for link in local_links(page) if (why := broken(page, link))] == []


def test_the_guides_are_in_docs_and_the_lessons_link_them_there():
    assert {p.name for p in (REPO / "docs").glob("*.md")} >= {
        "INSTRUCTORS.md",
        "CHEATSHEET.md",
        "GLOSSARY.md",
    }
    glossary_links = [
        link
        for page in REPO.glob("notebooks/*.ipynb")
        for link in local_links(page)
        if "GLOSSARY.md" in link
    ]
    assert glossary_links and all(link.startswith("../docs/GLOSSARY.md") for link in glossary_links)


def test_a_missing_anchor_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text('# Title\n<a id="here"></a> text\n')
    assert broken(page, "#here") is None
    assert broken(page, "#title") is None
    assert "no anchor" in broken(page, "#elsewhere")
    assert "no file" in broken(page, "other.md")
