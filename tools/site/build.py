"""Build the series as a static site into ``build/site/`` (``make site``).

The pages are the committed notebooks **as committed** (their outputs are real runs that nbval
checks; nothing is executed here), the solutions (in a section of their own, after the guides),
the guides in ``docs/``, and the README: its first part, up to its layout, is the home page; the
rest is the page "The project". They are copied into a staging folder with the repository's
layout, so that the links between them work on the site as they do on a code host; only links to
the README are pointed at the page that now holds it. Sphinx (``tools/site/conf.py``, myst-nb,
the book theme) turns the staging folder into HTML with a sidebar, previous/next and search.

Usage: ``python tools/site/build.py [--out build/site]``; open ``build/site/index.html``, or serve
the folder to a room with ``python -m http.server --directory build/site``.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
#: The guides, in the order the sidebar lists them (the README's second part comes after them).
GUIDES = (
    "docs/RUN_IT_YOURSELF.md",
    "docs/GLOSSARY.md",
    "docs/CHEATSHEET.md",
    "docs/INSTRUCTORS.md",
    "data/gpu-traces/README.md",
    "data/h200-job/README.md",
    "data/h200-memory/README.md",
    "data/nccl-job/README.md",
    "data/nvrx-hang/README.md",
)
#: What a page is made from: the files Sphinx reads as documents.
PAGE_SUFFIXES = (".md", ".ipynb")
#: The README's heading where the home page stops and the page on the project begins.
PROJECT_PART = "## Layout"
#: A link to the README, and the anchor it may carry.
README_LINK = re.compile(r"\]\(((?:\.\./)*)README\.md(#[^)]*)?\)")
#: An anchor written in HTML at the start of a line, as the glossary gives each word.
HTML_ANCHOR = re.compile(r'^<a id="([^"]+)"></a>', re.M)


def lessons() -> list[str]:
    """The lessons' notebooks, in order (``notebooks/NN_*.ipynb``)."""
    return sorted(str(p.relative_to(REPO)) for p in REPO.glob("notebooks/[0-9]*.ipynb"))


def solutions() -> list[str]:
    """The solutions' notebooks, in order (``solutions/NN_*.ipynb``)."""
    return sorted(str(p.relative_to(REPO)) for p in REPO.glob("solutions/[0-9]*.ipynb"))


def readme_parts() -> tuple[str, str]:
    """The README cut in two at :data:`PROJECT_PART`: the home page's text and the project's."""
    text = (REPO / "README.md").read_text()
    head, cut, rest = text.partition(f"\n{PROJECT_PART}\n")
    if not cut:
        raise SystemExit(f"README.md: no heading {PROJECT_PART!r} to cut the home page at")
    project = "# The project: layout, security, tests, performance\n\n" + cut.lstrip() + rest
    return head, project


def toctree(caption: str, pages: list[str]) -> str:
    """A MyST toctree of ``pages`` (paths without their suffix) under ``caption``."""
    entries = "\n".join(str(Path(p).with_suffix("")) for p in pages)
    return f"\n```{{toctree}}\n:caption: {caption}\n:hidden:\n\n{entries}\n```\n"


def home_page(head: str) -> str:
    """The home page: the README's first part, then the sidebar's sections (hidden toctrees)."""
    return (
        head
        + toctree("Lessons", lessons())
        + toctree("Guides", [*GUIDES, "project.md", "CONTRIBUTING.md"])
        + toctree("Solutions", solutions())
    )


def headings(markdown: str) -> set[str]:
    """The anchors of ``markdown``'s headings, as GitHub and MyST make them."""
    return {
        re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        for title in re.findall(r"^#+\s+(.+)$", markdown, re.M)
    }


def to_readme_pages(markdown: str, project_anchors: set[str]) -> str:
    """``markdown`` with its links to the README pointed at the page that now holds their anchor:
    ``project.md`` where the anchor is one of ``project_anchors`` (the headings of the README's
    second part), else the home page."""

    def repoint(match: re.Match[str]) -> str:
        up, anchor = match.group(1), match.group(2) or ""
        page = "project.md" if anchor and anchor[1:] in project_anchors else "index.md"
        return f"]({up}{page}{anchor})"

    return README_LINK.sub(repoint, markdown)


def with_targets(markdown: str) -> str:
    """``markdown`` with each ``<a id="word"></a>`` opening a line made a MyST target,
    ``(word)=`` on a line of its own: Sphinx then knows the anchor, and links to it resolve."""
    return HTML_ANCHOR.sub(lambda m: f"({m.group(1)})=\n", markdown)


def with_alt_text(notebook: dict, page: str) -> dict:
    """``notebook`` (the file ``page``) with each figure's alternative text where myst-nb reads it.

    ``helpers.show_figure`` keeps it in the output's metadata (``"image/png": {"alt": ...}``);
    myst-nb takes an image's options from the cell's ``mystnb.image`` metadata instead, one for
    the cell: a cell that shows two figures with different texts is refused.
    """
    for cell in notebook["cells"]:
        alts = [
            out["metadata"]["image/png"]["alt"]
            for out in cell.get("outputs", [])
            if out.get("metadata", {}).get("image/png", {}).get("alt")
        ]
        if len(set(alts)) > 1:
            raise SystemExit(f"{page}: a cell shows {len(alts)} figures; show one per cell")
        if alts:
            cell.setdefault("metadata", {}).setdefault("mystnb", {})["image"] = {"alt": alts[0]}
    return notebook


def linked_files(page: str, markdown: str) -> list[str]:
    """The files of the repository other than pages that ``markdown`` (of ``page``) links to
    (a licence, say): the site offers them for download."""
    found = []
    for link in re.findall(r"\]\(([^)#\s]+)", markdown):
        target = (REPO / page).parent / link
        if (
            not re.match(r"^[a-z]+:", link)
            and target.is_file()
            and target.suffix not in PAGE_SUFFIXES
        ):
            found.append(str(target.resolve().relative_to(REPO)))
    return found


def stage(folder: Path) -> None:
    """Copy the site's pages into ``folder``, with the repository's layout, and the other files
    they link to."""
    head, project = readme_parts()
    links = functools.partial(to_readme_pages, project_anchors=headings(project))
    (folder / "index.md").write_text(links(home_page(head)))
    (folder / "project.md").write_text(links(project))
    for page in [*GUIDES, "CONTRIBUTING.md"]:
        target = folder / page
        target.parent.mkdir(parents=True, exist_ok=True)
        text = (REPO / page).read_text()
        target.write_text(with_targets(links(text)))
        for linked in linked_files(page, text):
            shutil.copyfile(REPO / linked, folder / linked)
    for page in [*lessons(), *solutions()]:
        notebook = with_alt_text(json.loads((REPO / page).read_text()), page)
        for cell in notebook["cells"]:
            if cell["cell_type"] == "markdown":
                cell["source"] = links("".join(cell["source"]))
        target = folder / page
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(notebook))


def build(out: Path, strict: bool = True) -> None:
    """Stage the pages and build the site into ``out`` (replaced). With ``strict``, any warning
    of Sphinx (a broken link, a page outside the sidebar) fails the build."""
    with tempfile.TemporaryDirectory(prefix="pdp-site-") as tmp:
        staging = Path(tmp) / "src"
        staging.mkdir()
        stage(staging)
        if out.exists():
            shutil.rmtree(out)
        command = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-c", str(HERE)]
        command += ["-W", "--keep-going"] if strict else []
        done = subprocess.run([*command, str(staging), str(out)], check=False)
        shutil.rmtree(out / ".doctrees", ignore_errors=True)
    if done.returncode:
        raise SystemExit(f"the site did not build (Sphinx's messages above); {out} is incomplete")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "build" / "site")
    parser.add_argument("--lenient", action="store_true", help="warnings do not fail the build")
    args = parser.parse_args(argv)
    build(args.out, strict=not args.lenient)
    print(f"site: {args.out / 'index.html'}  (serve it: python -m http.server -d {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
