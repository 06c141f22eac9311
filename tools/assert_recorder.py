"""Record every ``assert`` a notebook's cells run, with the values it compared: what the repeat
tool (``tools/repeat_notebooks.py --record``) needs to show each claim's margin over many runs.

Loaded into the kernel from an IPython startup file (the repeat tool writes one into a profile of
its own, so a learner's kernels never load it): :func:`install` adds an AST transformer that
rewrites each cell's ``assert a < b, "claim"`` as ``assert _pdp_assert(site, "<", a, b),
"claim"``. The call evaluates the comparison as Python would (chains, ``in``, ``is``), appends
one JSON line to the file named by ``PDP_ASSERT_LOG`` (the assertion's source, its message, the
compared values where they are numbers, and whether it held), and returns the result, so the
assertion passes or fails exactly as written. Assertions that are not comparisons are recorded
with their result only. All operands of a chain are evaluated, even after one comparison fails.
"""

from __future__ import annotations

import ast
import json
import numbers
import operator
import os
import re
from pathlib import Path
from typing import Any

#: How ``ast`` names each comparison, as Python evaluates it.
OPERATORS = {
    "Eq": operator.eq, "NotEq": operator.ne, "Lt": operator.lt, "LtE": operator.le,
    "Gt": operator.gt, "GtE": operator.ge, "Is": operator.is_, "IsNot": operator.is_not,
    "In": lambda a, b: a in b, "NotIn": lambda a, b: a not in b,
}  # fmt: skip


def _number(value: Any) -> float | None:
    """``value`` as a float where it is one number (numpy's scalars included), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def record(site: str, ops: list[str], values: list[Any]) -> bool:
    """Evaluate ``values[0] ops[0] values[1] ...`` as a chained comparison, append what was
    compared to ``PDP_ASSERT_LOG`` (``site``: the assertion, as JSON), and return the truth of it
    (as the ``assert`` would read it)."""
    held = True
    for op, left, right in zip(ops, values, values[1:]):
        held = bool(OPERATORS[op](left, right))
        if not held:
            break
    _write(site, {"ops": ops, "values": [_number(v) for v in values], "held": held})
    return held


def record_truth(site: str, value: Any) -> Any:
    """Record whether an assertion that is no comparison held, and return its value."""
    _write(site, {"ops": [], "values": [], "held": bool(value)})
    return value


def _write(site: str, result: dict) -> None:
    path = os.environ.get("PDP_ASSERT_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({**json.loads(site), **result}) + "\n")


class AssertRewriter(ast.NodeTransformer):
    """Rewrites the asserts of one cell (see the module); ``cell`` is the kernel's count."""

    def __init__(self, cell: int):
        self.cell = cell

    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        message = node.msg.value if isinstance(node.msg, ast.Constant) else None
        site = json.dumps({"cell": self.cell, "line": node.lineno, "message": message,
                           "test": ast.unparse(node.test)})  # fmt: skip
        test = node.test
        if isinstance(test, ast.Compare):
            ops = [type(op).__name__ for op in test.ops]
            call = _call("record", site, [ast.List([ast.Constant(o) for o in ops], ast.Load()),
                                          ast.List([test.left, *test.comparators], ast.Load())])  # fmt: skip
        else:
            call = _call("record_truth", site, [test])
        return ast.copy_location(ast.Assert(test=call, msg=node.msg), node)


def _call(name: str, site: str, args: list[ast.expr]) -> ast.Call:
    """``__import__("assert_recorder").<name>(site, *args)``."""
    module = ast.Call(ast.Name("__import__", ast.Load()), [ast.Constant("assert_recorder")], [])
    return ast.Call(ast.Attribute(module, name, ast.Load()), [ast.Constant(site), *args], [])


class CellTransformer:
    """IPython's hook: rewrites the asserts of each cell the kernel runs."""

    def __init__(self, shell):
        self.shell = shell

    def visit(self, tree: ast.Module) -> ast.Module:
        cell = int(self.shell.execution_count)
        return ast.fix_missing_locations(AssertRewriter(cell).visit(tree))


def install() -> None:
    """Add the rewriting to the running IPython kernel (a no-op outside one)."""
    try:
        shell = get_ipython()  # type: ignore[name-defined]  # noqa: F821
    except NameError:
        return
    shell.ast_transformers.append(CellTransformer(shell))


def claims_of(notebook: Path) -> list[str]:
    """Every claim a notebook makes: each ``assert``'s message (its expression in backticks where
    it has none) and, in a solution, each exercise check it runs (``check("NN.k")``), in order."""
    claims = []
    for cell in json.loads(Path(notebook).read_text())["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] != "code" or source.lstrip().startswith("%%"):  # a script it writes
            continue
        code = "\n".join(line for line in source.splitlines() if not line.startswith(("%", "!")))
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Assert):
                message = node.msg.value if isinstance(node.msg, ast.Constant) else None
                claims.append(message or f"`{ast.unparse(node.test)}`")
        if Path(notebook).parent.name == "solutions":  # a lesson's checks wait for an answer
            claims += [f'`check("{n}")`' for n in re.findall(r'^check\("([\d.]+)"', code, re.M)]
    return claims
