"""No function of the shipped code is longer than 60 lines, its docstring included: a longer one does
several jobs, each of which deserves a name."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("kuberl", "app", "operator", "trainer", "rollout-server", "env-images")
MAX_LINES = 60


def long_functions() -> list[str]:
    """'file:line name length' of every function over MAX_LINES in the shipped packages."""
    found = []
    for folder in SHIPPED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > MAX_LINES:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} {length}")
    return found


def test_no_shipped_function_is_longer_than_60_lines():
    found = long_functions()
    assert not found, f"functions over {MAX_LINES} lines (split them into named helpers):\n" + "\n".join(found)
