"""The shape of ``helpers/exercises/``: one module of checks per lesson, next to what it checks.

Each lesson's module says which notebook and solution it serves, registers the checks of that
lesson only, declares the scripts and flags its checks rely on (and those are the ones the
lessons write), and imports only public names: a private helper of another module is no part
of what a check may depend on.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path

import pytest

import helpers.exercises as exercises

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "helpers" / "exercises"
LESSON_FILES = sorted(PACKAGE.glob("lesson[0-9][0-9].py"))
FLAG = re.compile(r"--[a-z][a-z0-9-]*")


def private(name: str) -> bool:
    """A name that starts with ``_`` and is not a dunder such as ``__future__``."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(source: str) -> list[str]:
    """Every private module or name that ``source`` imports, and every private attribute it
    reads from a module it imported (``analysis._wall_ms``), as ``line: what``."""
    tree = ast.parse(source)
    found, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                modules.add((alias.asname or alias.name).split(".")[0])
                if any(private(part) for part in alias.name.split(".")):
                    found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if any(private(part) for part in module.split(".") if part):
                found.append(f"{node.lineno}: from {'.' * node.level}{module} import")
            for alias in node.names:
                modules.add(alias.asname or alias.name)
                if private(alias.name):
                    found.append(f"{node.lineno}: from {'.' * node.level}{module} {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id in modules:
                found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return found


@pytest.mark.parametrize(
    "source",
    [
        "from ..analysis import _wall_ms",
        "from .._tracefile import read",
        "from helpers._files import atomic_write",
        "from . import _registry",
        "import helpers._guard",
        "from .. import analysis\nanalysis._wall_ms(frame, [])",
    ],
)
def test_the_private_import_rule_catches_every_spelling(source):
    assert private_imports(source)


def test_the_private_import_rule_allows_public_names_and_dunders():
    source = "from __future__ import annotations\nfrom ..analysis import busy_ms\nimport json\n"
    assert private_imports(source + "json.__name__\n") == []


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_no_exercise_module_imports_a_private_name(path):
    assert private_imports(path.read_text()) == [], path.name


def lesson_module(path: Path):
    return importlib.import_module(f"helpers.exercises.{path.stem}")


def test_every_lesson_module_is_registered_in_order():
    assert [m.__name__ for m in exercises.LESSONS] == [
        f"helpers.exercises.{p.stem}" for p in LESSON_FILES
    ]
    registered = {n: fn for m in exercises.LESSONS for n, fn in m.CHECKS.items()}
    assert exercises.CHECKS == registered


@pytest.mark.parametrize("path", LESSON_FILES, ids=lambda p: p.stem)
def test_a_lesson_module_names_its_notebook_and_solution_and_checks_only_that_lesson(path):
    module, lesson = lesson_module(path), path.stem[-2:]
    doc = " ".join((module.__doc__ or "").split())
    (notebook,) = (REPO / "notebooks").glob(f"{lesson}_*.ipynb")
    assert f"notebooks/{notebook.name}" in doc
    assert f"solutions/{lesson}_solutions.ipynb" in doc
    assert module.CHECKS and all(n.startswith(f"{lesson}.") for n in module.CHECKS)


def notebook_text(notebook: Path) -> str:
    return "\n".join("".join(c["source"]) for c in json.loads(notebook.read_text())["cells"])


def written_scripts() -> dict[str, str]:
    """Every script a lesson or a solution writes with ``%%writefile``, by file name."""
    scripts = {}
    for notebook in sorted(REPO.glob("notebooks/*.ipynb")) + sorted(REPO.glob("solutions/*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] == "code" and source.startswith("%%writefile "):
                name = source.splitlines()[0].split()[1]
                scripts.setdefault(name, source)
    return scripts


@pytest.mark.parametrize("path", LESSON_FILES, ids=lambda p: p.stem)
def test_a_lesson_module_declares_the_scripts_and_flags_its_lesson_has(path):
    module, lesson = lesson_module(path), path.stem[-2:]
    texts = [notebook_text(n) for n in REPO.glob(f"*/{lesson}_*.ipynb")]
    for script in module.SCRIPTS:
        assert any(script in text for text in texts), f"lesson {lesson} never names {script}"
    written = written_scripts()
    defined = {
        flag
        for script in module.SCRIPTS
        for flag in re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", written.get(script, ""))
    }
    assert set(module.FLAGS) <= defined, f"not flags of {module.SCRIPTS}"
    used = {
        node.value
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and FLAG.fullmatch(node.value)
    }
    assert used <= set(module.FLAGS), f"{path.name} uses flags it does not declare"
