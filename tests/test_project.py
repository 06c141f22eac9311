"""The project's own set-up: dependencies agree, CI runs the README's command."""

import re
from pathlib import Path

import tomllib

from helpers.doctor import _pins

REPO = Path(__file__).resolve().parents[1]


def requirements() -> dict[str, str]:
    return {name.lower(): version for name, version in _pins(REPO / "requirements.txt").items()}


def test_every_requirement_is_pinned_and_torch_matches_the_design():
    pins = requirements()
    assert all(pins.values()), "every line of requirements.txt pins a version with =="
    assert pins["torch"] == "2.14.1" and pins["torchvision"] == "0.29.1"
    for needed in ("jupyterlab", "nbval", "matplotlib", "pandas", "pytest"):
        assert needed in pins


def test_environment_yml_installs_exactly_the_requirements():
    text = (REPO / "environment.yml").read_text().split("dependencies:")[1]
    conda_deps = [d for d in re.findall(r"^  - (\S+)\s*$", text, re.M) if d != "pip:"]
    pip_lines = re.findall(r"^      - (.+)$", text, re.M)
    assert sorted(conda_deps) == ["pip", "python=3.11"], "Python packages come from pip only"
    assert "  - pip:" in text
    assert pip_lines == ["-r requirements.txt", "-e ."]


def test_the_package_depends_on_what_helpers_import():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = requirements()
    assert set(declared) <= set(pins), "every dependency of helpers/ is pinned in requirements.txt"
    imported = set()
    for path in (REPO / "helpers").rglob("*.py"):
        imported |= set(re.findall(r"^(?:import|from) (\w+)", path.read_text(), re.M))
    third_party = imported & {"torch", "numpy", "pandas", "matplotlib", "msgspec", "psutil", "tqdm"}
    assert third_party <= set(declared)


def test_ci_runs_the_test_command_of_the_readme():
    ci = [
        line
        for line in (REPO / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith(("#", "set ", "cd "))
    ]
    assert ci[-1] == "make test", "the test command comes last, after the browser's install"
    assert [line.split()[0] for line in ci[:-1]] == ["tools/install_browser.sh"]
    assert "make test" in (REPO / "README.md").read_text()


# ------------------------------------------------------------------ the library's shape


def helper_modules():
    import ast

    for path in sorted((REPO / "helpers").rglob("*.py")):
        yield path, ast.parse(path.read_text())


def test_no_function_in_helpers_is_longer_than_60_lines():
    import ast

    long = [
        f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path, tree in helper_modules()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > 60
    ]
    assert long == []


def test_every_public_helper_module_declares_its_public_names():
    import ast

    for path, tree in helper_modules():
        if path.name.startswith("_"):
            continue
        names = {
            t.id
            for node in tree.body
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        assert "__all__" in names, path.name


def test_the_lessons_import_only_what_helpers_exports():
    import json

    import helpers

    for notebook in sorted((REPO / "notebooks").glob("*.ipynb")) + sorted(
        (REPO / "solutions").glob("*.ipynb")
    ):
        code = "\n".join(
            "".join(c["source"])
            for c in json.loads(notebook.read_text())["cells"]
            if c["cell_type"] == "code"
        )
        assert not re.search(r"^from helpers\.\w+ import", code, re.M), notebook.name
        for block in re.findall(
            r"^from helpers import \(?([^)\n]*(?:\n[ \t]+[^)\n]*)*)\)?", code, re.M
        ):
            for name in (n.strip() for n in block.replace("\n", " ").split(",") if n.strip()):
                assert name in helpers.__all__, f"{notebook.name} imports {name}"


def test_jupyterlab_opens_without_asking_about_news():
    import json

    overrides = REPO / ".venv" / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    if not overrides.is_file():
        import pytest

        pytest.skip("the environment was not made by make install")
    settings = json.loads(overrides.read_text())["@jupyterlab/apputils-extension:notification"]
    assert settings == {"fetchNews": "false", "checkForUpdates": False}


def test_every_notebook_names_the_python3_kernel():
    import json

    for notebook in sorted((REPO / "notebooks").glob("*.ipynb")) + sorted(
        (REPO / "solutions").glob("*.ipynb")
    ):
        assert json.loads(notebook.read_text())["metadata"]["kernelspec"]["name"] == "python3"


def _in_the_quick_loop(cases: list) -> list:
    """The values of the ``pytest.param``s ``cases`` that are not marked ``slow``."""
    return [c.values[0] for c in cases if not any(m.name == "slow" for m in c.marks)]


def test_a_sweeps_quick_sample_keeps_every_case_and_one_of_each_family_out_of_slow():
    import pytest

    from conftest import quick_sample

    cases = ["ddp-a", "ddp-b", pytest.param("fsdp-a", id="fsdp"), "ddp-c", "fsdp-b"]
    sampled = quick_sample(cases, lambda name: name.split("-")[0])
    quick = _in_the_quick_loop(sampled)
    assert [c.values[0] for c in sampled] == ["ddp-a", "ddp-b", "fsdp-a", "ddp-c", "fsdp-b"]
    assert quick == ["ddp-a", "fsdp-a"] and sampled[2].id == "fsdp"


def test_the_quick_loop_reads_one_recording_of_each_job():
    from test_critical_path import RECORDED_SWEEP

    from conftest import recording_family

    quick = _in_the_quick_loop(RECORDED_SWEEP)
    families = [recording_family(folder) for folder in quick]
    assert len(families) == len(set(families)) and len(quick) < len(RECORDED_SWEEP) / 2
    assert {"ddp", "pipeline", "gpu/ddp"} <= set(families)


def test_a_test_of_the_quick_loop_that_starts_a_process_fails_naming_it():
    import subprocess
    import sys

    import pytest

    with pytest.raises(AssertionError, match="started .*: mark it slow"):
        subprocess.run([sys.executable, "-c", "pass"])
