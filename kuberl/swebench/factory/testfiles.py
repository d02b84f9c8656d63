"""Which files of a package are tests and which are its source, and hiding test functions from a test file.

A hidden test is a whole function or method removed with libcst (its decorators, parametrization included),
so that an instance's `test_patch` adds it back; a test file left without any test is removed entirely.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

import libcst as cst

# Folders of an sdist that hold no code the tests import (or code that is not the package's).
_NOT_SOURCE = {"docs", "doc", "examples", "example", "benchmarks", "bench", "scripts", "tools", "build", "dist"}
_NOT_SOURCE_FILES = {"setup.py", "conftest.py", "noxfile.py", "fabfile.py", "tasks.py", "__main__.py"}
_TEST_FOLDERS = {"test", "tests", "testing"}


def is_test_file(path: str) -> bool:
    """A pytest test module by its name: `test_*.py` or `*_test.py`."""
    name = PurePosixPath(path).name
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def is_source_file(path: str) -> bool:
    """A module of the package itself: Python, not a test, not under tests/, docs/, examples/ and the like."""
    parts = PurePosixPath(path).parts
    if not path.endswith(".py") or is_test_file(path) or parts[-1] in _NOT_SOURCE_FILES:
        return False
    folders = {p.lower() for p in parts[:-1]}
    return not (folders & (_NOT_SOURCE | _TEST_FOLDERS)) and not any(p.startswith(".") for p in parts)


@dataclass(frozen=True)
class TestName:
    """Where a pytest test is defined: its file, the classes around it and the function's name."""

    file: str
    classes: tuple[str, ...]
    function: str


_PARAMETERS = re.compile(r"\[.*\]$", re.DOTALL)


def test_name(node_id: str) -> TestName | None:
    """`tests/t.py::TestX::test_y[1-a]` -> TestName("tests/t.py", ("TestX",), "test_y"); None for a doctest or
    any id that does not name a function in a test file."""
    file, _, rest = node_id.partition("::")
    if not rest or not is_test_file(file):
        return None
    names = _PARAMETERS.sub("", rest).split("::")
    if not all(n.isidentifier() for n in names):
        return None
    return TestName(file, tuple(names[:-1]), names[-1])


Definitions = frozenset[tuple[tuple[str, ...], str]]
"""The functions a module defines, each as (the classes it is written in, its name)."""


def definitions(source: str) -> Definitions:
    """Every function written in a test module, outside other functions; empty when it does not parse."""
    finder = _Definitions()
    try:
        cst.parse_module(source).visit(finder)
    except cst.ParserSyntaxError:
        return frozenset()
    return frozenset(finder.found)


def defined(name: TestName, written: Definitions) -> bool:
    """Whether the test's function is written where its id says (not inherited from another class or file)."""
    return (name.classes, name.function) in written


def without_tests(source: str, names: list[TestName]) -> str | None:
    """The test file's source with these test functions removed; None when no test would be left in it."""
    module = cst.parse_module(source).visit(_Remove({(n.classes, n.function) for n in names}))
    if not any(function.startswith("test") for _, function in definitions(module.code)):
        return None
    return module.code


class _Definitions(cst.CSTVisitor):
    """Every function of a module with the chain of classes it is written in."""

    def __init__(self) -> None:
        super().__init__()
        self.classes: list[str] = []
        self.found: set[tuple[tuple[str, ...], str]] = set()

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.classes.append(node.name.value)
        return True

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.classes.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.found.add((tuple(self.classes), node.name.value))
        return False  # a function defined inside a function is no test


class _Remove(cst.CSTTransformer):
    def __init__(self, names: set[tuple[tuple[str, ...], str]]) -> None:
        super().__init__()
        self.names = names
        self.classes: list[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.classes.append(node.name.value)
        return True

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.classes.pop()
        body = updated_node.body
        if not isinstance(body, cst.IndentedBlock):
            return updated_node
        if not body.body:
            # A class whose every test was hidden stays (another class may derive from it), as `pass`.
            return updated_node.with_changes(body=body.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])]))
        first = body.body[0]
        if first is not original_node.body.body[0] and isinstance(first, cst.FunctionDef | cst.ClassDef):
            # The class's first method was hidden: the next one must not start with its blank separator line.
            kept = [line for line in first.leading_lines if line.comment is not None]
            body = body.with_changes(body=[first.with_changes(leading_lines=kept), *body.body[1:]])
            return updated_node.with_changes(body=body)
        return updated_node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef | cst.RemovalSentinel:
        if (tuple(self.classes), original_node.name.value) in self.names:
            return cst.RemovalSentinel.REMOVE
        return updated_node
