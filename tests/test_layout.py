"""The layout of ``helpers/``: one folder per job (a room), layered, with one import surface.

A room imports only itself, the rooms before it in :data:`ROOMS` and the shared ``_files``;
no module imports another room's private modules or names; no import runs in a circle; no
module is longer than 400 lines; every name that lessons, solutions, tests and the README
import from ``helpers`` today is still importable from ``helpers`` itself.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

import helpers

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "helpers"

#: The rooms in the order they may import each other: each imports only those before it.
ROOMS = ["jobs", "traces", "analysis", "drawing", "hangs", "report", "live", "exercises", "doctor", "rehearsal"]  # fmt: skip
#: Rooms that are one module, run as a command, not imported by the lessons.
COMMANDS = ("doctor", "rehearsal")
#: Modules at the top of helpers/ that every room may import.
SHARED = {"helpers._files", "helpers._plaindata"}

#: The public names that lessons, solutions, tests, examples, benchmarks and the README
#: imported from helpers or one of its modules when it was laid out by job (issue 28).
PUBLIC_NAMES = """
launch launch_in_background BackgroundRun processes_of_run choose_device Device RunRecord
new_run_dir show_path usable_cores CACHE_DIR LaunchError RankFailed RunTimedOut
RendezvousTimedOut RunInterrupted use_recorded_runs RecordingMissing RECORDINGS_ROOT replay
INTERFACE_VARIABLES Listener ListenerWatch loopback_interface script_from_lesson
hide_kineto_noise load_trace load_run Trace RunTraces TraceError TraceWarning trace_files
merge_traces gather_traces summarise_run RunSummary rank_events kept_of_file summary_of KINDS
KIND_NAMES KIND_COLORS event_kind event_names name_matches busy_ms busy_ms_per_group
step_times time_per_kind top_ops time_by_source_line COLLECTIVE_NAMES NCCL_KERNELS
collective_source collective_waits waiting_per_step find_straggler communication_overlap
collective_bandwidth bus_factor gpu_idle_time clock_offsets shift_ranks by_rpc_node
max_parallel_lanes profiling_cost plot_rank_timeline step_window plot_collective_sequences
COLLAPSED_COMMUNICATION STEP_TICK load_flight_records first_mismatch analyse_with_pytorch
FlightRecorderError serve_debug_requests debug_servers where_ranks_are rank_stacks
profile_ranks flight_records_now wait_counters listening_sockets saved_answers LiveRunError
MAX_ANSWER_MB check evaluate CHECKS ExerciseNotSolved MUST_PASS_ENV
""".split()


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported(path: Path) -> list[tuple[str, str | None]]:
    """``(module, name)`` for every import of helpers' modules in ``path`` (name: what a
    ``from`` import takes, None for ``import x``), relative imports resolved."""
    here = module_name(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.startswith("helpers")]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if module.startswith("helpers"):
                found += [(module, a.name) for a in node.names]
    return found


def target(module: str, name: str | None, known: dict[str, Path]) -> str:
    """The module an import reaches: ``from pkg import mod`` reaches ``pkg.mod``."""
    return f"{module}.{name}" if name and f"{module}.{name}" in known else module


def room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else None


def private(part: str) -> bool:
    return part.startswith("_") and not part.endswith("__")


def edges() -> list[tuple[str, str, str | None]]:
    known = modules()
    return [
        (source, target(module, name, known), name)
        for source, path in known.items()
        for module, name in imported(path)
    ]


def test_every_module_of_helpers_is_in_a_room_or_shared():
    loose = [m for m in modules() if m != "helpers" and room(m) is None and m not in SHARED]
    assert loose == []


@pytest.mark.parametrize("name", [r for r in ROOMS if r not in COMMANDS])
def test_every_room_says_what_it_does_and_what_it_exports(name):
    init = PACKAGE / name / "__init__.py"
    module = getattr(helpers, name)
    assert (module.__doc__ or "").strip(), f"{init} needs a docstring"
    assert module.__all__, f"{init} needs __all__"
    for path in sorted((PACKAGE / name).glob("*.py")):
        if path.name != "__init__.py" and name != "exercises":
            assert f"``{path.stem}``" in module.__doc__, f"{init}'s docstring names {path.name}"


def upward(found: list[tuple[str, str, str | None]]) -> list[str]:
    """The imports in ``found`` that reach a room after their own in :data:`ROOMS`."""
    return [
        f"{source} -> {reached}"
        for source, reached, _ in found
        if room(source) and room(reached) and ROOMS.index(room(reached)) > ROOMS.index(room(source))
    ]


def leaks(found: list[tuple[str, str, str | None]]) -> list[str]:
    """The imports in ``found`` of another room's private module or name."""
    return [
        f"{source} -> {reached} ({name})"
        for source, reached, name in found
        if room(source) != room(reached)
        and reached not in SHARED
        and (any(private(p) for p in reached.split(".")) or (name and private(name)))
    ]


def circles(found: list[tuple[str, str, str | None]]) -> list[list[str]]:
    """Every loop of imports in ``found`` (a package importing its own modules is no loop)."""
    graph: dict[str, set[str]] = {}
    for source, reached, _ in found:
        if reached != source:
            graph.setdefault(source, set()).add(reached)
    done, path, loops = set(), [], []

    def visit(node: str) -> None:
        if node in path:
            loops.append(path[path.index(node) :] + [node])
        elif node not in done:
            done.add(node)
            path.append(node)
            for nxt in sorted(graph.get(node, ())):
                visit(nxt)
            path.pop()

    for node in sorted(graph):
        visit(node)
    return loops


def test_a_room_imports_only_the_rooms_before_it():
    assert upward(edges()) == []


def test_the_parser_imports_nothing_of_the_analysis():
    parser_imports = [(a, b, name) for a, b, name in edges() if room(a) == "traces"]
    assert parser_imports and [e for e in parser_imports if room(e[1]) == "analysis"] == []


def test_no_module_imports_a_private_module_or_name_of_another_room():
    assert leaks(edges()) == []


def test_no_private_name_crosses_modules_inside_a_room():
    crossing = [
        (importer, module, name)
        for importer, module, name in edges()
        if room(importer)
        and room(importer) == room(module)
        and private(name or "")
        and not module.endswith(f".{name}")  # a room's own private module, imported whole
    ]
    assert crossing == []


def test_no_import_runs_in_a_circle():
    assert circles(edges()) == []


def written_order(path: str, pattern: str, name: str) -> list[str]:
    """The rooms in the order a document writes them: the names ``name`` finds in the first
    match of ``pattern`` (a regular expression over the whole text)."""
    text = (REPO / path).read_text()
    return re.findall(name, re.search(pattern, text, re.S | re.M).group(0))


@pytest.mark.parametrize(
    "path, pattern, name",
    [
        ("README.md", r"^## Layout.*?^## ", r"^  - `(\w+)(?:/|\.py)`"),
        ("CONTRIBUTING.md", r"in this order: .*?\(then", r"`(\w+)`"),
        ("helpers/__init__.py", r"in this order: .*?\n\(", r"``(\w+)``"),
    ],
    ids=["README's layout", "CONTRIBUTING", "helpers' docstring"],
)
def test_every_map_of_the_code_gives_the_rooms_in_the_order_they_import(path, pattern, name):
    written = written_order(path, pattern, re.compile(name, re.M))
    assert written == ROOMS[: len(written)] and len(written) >= len(ROOMS) - len(COMMANDS)


def test_the_layering_rules_catch_what_they_forbid():
    assert upward([("helpers.traces._columns", "helpers.analysis.steps", "step_times")])
    assert not upward([("helpers.analysis.steps", "helpers.traces.kinds", "KIND_NAMES")])
    assert leaks([("helpers.live.questions", "helpers.jobs._guard", "RUN_MARKER")])
    assert leaks([("helpers.live.questions", "helpers.jobs.runs", "_shorten_paths")])
    assert not leaks([("helpers.jobs.launch", "helpers.jobs._guard", "RUN_MARKER")])
    assert not leaks([("helpers.jobs.runs", "helpers._files", "write_atomically")])
    loop = [("helpers.a.x", "helpers.a.y", None), ("helpers.a.y", "helpers.a.x", None)]
    assert circles(loop) == [["helpers.a.x", "helpers.a.y", "helpers.a.x"]]


def test_no_module_of_helpers_is_longer_than_400_lines():
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


def test_every_public_name_used_before_the_layout_is_importable_from_helpers():
    missing = [name for name in PUBLIC_NAMES if name not in helpers.__all__]
    assert missing == []
    for name in PUBLIC_NAMES:
        assert getattr(helpers, name) is not None


def test_the_one_import_surface_is_the_union_of_the_rooms():
    rooms = [n for r in ROOMS if r not in COMMANDS for n in getattr(helpers, r).__all__]
    assert sorted(helpers.__all__) == sorted(rooms)
    assert len(set(helpers.__all__)) == len(helpers.__all__), "a name exported by two rooms"


def undocumented_parameters(function) -> list[str]:
    """The parameters of ``function`` that its docstring's ``Args:`` does not give one by one
    (``name:`` at the start of a line); all of them when it has no ``Args:``."""
    doc = inspect.getdoc(function) or ""
    args = doc.split("Args:", 1)[1] if "Args:" in doc else ""
    named = [p.name for p in inspect.signature(function).parameters.values()]
    return [n for n in named if not re.search(rf"^\s+\**{n}:", args, re.MULTILINE)]


def public_functions() -> dict[str, object]:
    """Every public function of every public module of helpers, by ``module.name``."""
    found = {}
    for name in modules():
        if not any(private(part) for part in name.split(".")):
            for value in vars(importlib.import_module(name)).values():
                if inspect.isfunction(value) and value.__module__ == name:
                    if not private(value.__name__):
                        found[f"{name}.{value.__name__}"] = value
    return found


MANY_PARAMETERS = {
    name: f for name, f in public_functions().items() if len(inspect.signature(f).parameters) > 3
}


@pytest.mark.parametrize("name", sorted(MANY_PARAMETERS))
def test_every_public_function_of_more_than_three_parameters_gives_each_under_args(name):
    assert undocumented_parameters(MANY_PARAMETERS[name]) == []


def test_a_parameter_missing_from_args_is_found():
    def documented(a, b, *, c, **options):
        """A function.

        Args:
            a: one.
            b: two.
            **options: the rest.
        """

    assert undocumented_parameters(documented) == ["c"]
