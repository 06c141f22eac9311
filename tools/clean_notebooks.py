"""Keep what changes on every run out of the committed notebooks: cell execution timestamps and
the Python version in the notebook's metadata. Outputs, execution counts and cell tags stay
(they are the lesson, and nbval needs them).

    python tools/clean_notebooks.py notebooks/*.ipynb solutions/*.ipynb          # clean in place
    python tools/clean_notebooks.py --check notebooks/*.ipynb solutions/*.ipynb  # only report

Exits 1 when ``--check`` finds a notebook to clean (the pre-commit hook and a test use it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: Cell metadata that a run writes (nbconvert/JupyterLab timings); everything else is kept.
VOLATILE_CELL_KEYS = ("execution", "collapsed", "scrolled", "jupyter")
#: Notebook metadata kept: the kernel the notebook runs on. Everything else (language_info with
#: the Python version of the machine that ran it, widget state) is dropped.
KEPT_NOTEBOOK_KEYS = ("kernelspec",)


def volatile(notebook: dict) -> list[str]:
    """What would be removed from ``notebook``, in words (empty when it is clean)."""
    found = [f"notebook metadata {k!r}" for k in notebook.get("metadata", {})
             if k not in KEPT_NOTEBOOK_KEYS]  # fmt: skip
    for i, cell in enumerate(notebook.get("cells", [])):
        found += [f"cell {i} metadata {k!r}" for k in cell.get("metadata", {})
                  if k in VOLATILE_CELL_KEYS]  # fmt: skip
    return found


def clean(notebook: dict) -> dict:
    """``notebook`` without its volatile metadata (changed in place and returned)."""
    meta = notebook.get("metadata", {})
    notebook["metadata"] = {k: v for k, v in meta.items() if k in KEPT_NOTEBOOK_KEYS}
    for cell in notebook.get("cells", []):
        cell["metadata"] = {
            k: v for k, v in cell.get("metadata", {}).items() if k not in VOLATILE_CELL_KEYS
        }
    return notebook


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report, change nothing")
    parser.add_argument("notebooks", nargs="+", type=Path)
    args = parser.parse_args(argv)
    dirty = 0
    for path in args.notebooks:
        notebook = json.loads(path.read_text())
        found = volatile(notebook)
        if not found:
            continue
        dirty += 1
        if args.check:
            print(f"{path}: {', '.join(found[:3])}{' ...' if len(found) > 3 else ''}")
        else:
            text = json.dumps(clean(notebook), indent=1, sort_keys=True, ensure_ascii=False) + "\n"
            path.write_text(text)
    if args.check and dirty:
        print(f"{dirty} notebook(s) carry volatile metadata: run python tools/clean_notebooks.py")
    return 1 if args.check and dirty else 0


if __name__ == "__main__":
    sys.exit(main())
