"""The project's own set-up: dependencies agree, CI runs the README's command."""

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def requirements() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.lower()] = version
    return pins


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
    for path in (REPO / "helpers").glob("*.py"):
        imported |= set(re.findall(r"^(?:import|from) (\w+)", path.read_text(), re.M))
    third_party = imported & {"torch", "numpy", "pandas", "matplotlib", "msgspec", "psutil"}
    assert third_party <= set(declared)


def test_ci_runs_the_test_command_of_the_readme():
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert ci == ["make test"]
    assert "make test" in (REPO / "README.md").read_text()
