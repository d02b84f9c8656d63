"""Procedural bugs in Python source, SWE-smith style: one small change inside one function, made with libcst.

`candidates` lists every place in a module where a kind of bug can be put; `Mutation.apply` returns the
module's source with that one change. Only code inside function bodies is changed (never a default value,
a decorator or module-level code), so that a bug is a wrong behaviour, not a broken import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

KINDS = (
    "comparison",
    "binary_operator",
    "boolean_operator",
    "off_by_one",
    "negate_condition",
    "remove_condition",
    "swap_arguments",
    "return_none",
    "drop_else",
)

_COMPARISONS: dict[type[cst.BaseCompOp], type[cst.BaseCompOp]] = {
    cst.LessThan: cst.LessThanEqual,
    cst.LessThanEqual: cst.LessThan,
    cst.GreaterThan: cst.GreaterThanEqual,
    cst.GreaterThanEqual: cst.GreaterThan,
    cst.Equal: cst.NotEqual,
    cst.NotEqual: cst.Equal,
    cst.Is: cst.IsNot,
    cst.IsNot: cst.Is,
    cst.In: cst.NotIn,
    cst.NotIn: cst.In,
}
_BINARY: dict[type[cst.BaseBinaryOp], type[cst.BaseBinaryOp]] = {
    cst.Add: cst.Subtract,
    cst.Subtract: cst.Add,
    cst.Multiply: cst.FloorDivide,
    cst.FloorDivide: cst.Multiply,
    cst.Divide: cst.Multiply,
    cst.Modulo: cst.FloorDivide,
    cst.Power: cst.Multiply,
    cst.BitAnd: cst.BitOr,
    cst.BitOr: cst.BitAnd,
    cst.BitXor: cst.BitAnd,
    cst.LeftShift: cst.RightShift,
    cst.RightShift: cst.LeftShift,
}
_AUGMENTED: dict[type[cst.BaseAugOp], type[cst.BaseAugOp]] = {
    cst.AddAssign: cst.SubtractAssign,
    cst.SubtractAssign: cst.AddAssign,
    cst.MultiplyAssign: cst.FloorDivideAssign,
    cst.FloorDivideAssign: cst.MultiplyAssign,
    cst.BitOrAssign: cst.BitAndAssign,
    cst.BitAndAssign: cst.BitOrAssign,
}
_STRINGS = (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)
# Expressions that bind less tightly than `not`: negating them needs parentheses.
_LOOSE = (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr)


@dataclass(frozen=True, eq=False)
class Mutation:
    """One possible bug: its kind, where it goes (file, 1-based line, enclosing function) and how to make it."""

    kind: str
    file: str
    line: int
    function: str
    _module: cst.Module
    _target: cst.CSTNode
    _replace: Callable[[cst.CSTNode], cst.CSTNode | cst.RemovalSentinel]

    def apply(self) -> str:
        """The module's source with this one change; ValueError when the result is not valid Python."""
        code = self._module.visit(_Replace(self._target, self._replace)).code
        if code == self._module.code:
            raise ValueError(f"{self.kind} at {self.file}:{self.line} changes nothing")
        try:
            compile(code, self.file, "exec")
        except SyntaxError as error:
            raise ValueError(f"{self.kind} at {self.file}:{self.line} is not valid Python: {error}") from None
        return code


class _Replace(cst.CSTTransformer):
    def __init__(self, target: cst.CSTNode, replace: Callable[[cst.CSTNode], cst.CSTNode | cst.RemovalSentinel]):
        super().__init__()
        self.target, self.replace = target, replace

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):  # type: ignore[override]
        if original_node is self.target:
            return self.replace(updated_node)
        return updated_node


def candidates(source: str, file: str) -> list[Mutation]:
    """Every mutation the module's function bodies allow, in source order; [] when it does not parse."""
    try:
        wrapper = MetadataWrapper(cst.parse_module(source))
    except cst.ParserSyntaxError:
        return []
    finder = _Finder(wrapper.module, file)
    wrapper.visit(finder)
    return finder.found


class _Finder(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, module: cst.Module, file: str) -> None:
        super().__init__()
        self.module, self.file = module, file
        self.found: list[Mutation] = []
        self.scopes: list[str] = []
        self.bodies: dict[int, str] = {}  # id of a function's body -> the function's qualified name
        self.functions: list[str] = []

    # Where we are: the innermost function whose body holds the node.
    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.scopes.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.scopes.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scopes.append(node.name.value)
        self.bodies[id(node.body)] = ".".join(self.scopes)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.scopes.pop()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if id(node) in self.bodies:
            self.functions.append(self.bodies[id(node)])
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        if id(original_node) in self.bodies:
            self.functions.pop()

    def _line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def _one_line(self, *nodes: cst.CSTNode) -> bool:
        positions = [self.get_metadata(PositionProvider, n) for n in nodes]
        return len({p.start.line for p in positions} | {p.end.line for p in positions}) == 1

    def _add(
        self,
        kind: str,
        target: cst.CSTNode,
        replace: Callable[[cst.CSTNode], cst.CSTNode | cst.RemovalSentinel],
        line_of: cst.CSTNode | None = None,
    ) -> None:
        if self.functions:
            line = self._line(line_of or target)
            self.found.append(Mutation(kind, self.file, line, self.functions[-1], self.module, target, replace))

    # The kinds of bug.
    def visit_ComparisonTarget(self, node: cst.ComparisonTarget) -> None:
        flipped = _COMPARISONS.get(type(node.operator))
        if flipped is not None:
            self._add("comparison", node.operator, lambda op, new=flipped: _same_spacing(op, new), node.operator)

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        swapped = _BINARY.get(type(node.operator))
        # `"a" + b` -> `"a" - b` is a TypeError any test finds; it teaches nothing about the code.
        if swapped is not None and not isinstance(node.left, _STRINGS) and not isinstance(node.right, _STRINGS):
            self._add("binary_operator", node.operator, lambda op, new=swapped: _same_spacing(op, new), node.operator)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        swapped = _AUGMENTED.get(type(node.operator))
        if swapped is not None and not isinstance(node.value, _STRINGS):
            self._add("binary_operator", node.operator, lambda op, new=swapped: _same_spacing(op, new), node.operator)

    def visit_BooleanOperation(self, node: cst.BooleanOperation) -> None:
        other = cst.Or if isinstance(node.operator, cst.And) else cst.And
        self._add("boolean_operator", node.operator, lambda op, new=other: _same_spacing(op, new), node.operator)

    def visit_Integer(self, node: cst.Integer) -> None:
        value = node.evaluated_value
        for changed in (value + 1, value - 1) if value > 0 else (value + 1,):
            self._add("off_by_one", node, lambda n, v=changed: n.with_changes(value=str(v)))

    def visit_If(self, node: cst.If) -> None:
        self._condition(node)
        if isinstance(node.orelse, cst.Else):
            self._add("drop_else", node, lambda n: n.with_changes(orelse=None), node.orelse)

    def visit_While(self, node: cst.While) -> None:
        self._condition(node)

    def _condition(self, node: cst.If | cst.While) -> None:
        test = node.test
        self._add("negate_condition", test, _negated)
        if isinstance(test, cst.BooleanOperation) and not test.lpar and self._one_line(test):
            self._add("remove_condition", test, lambda t: t.left.with_changes(lpar=t.lpar, rpar=t.rpar))
            self._add("remove_condition", test, lambda t: t.right.with_changes(lpar=t.lpar, rpar=t.rpar))

    def visit_Call(self, node: cst.Call) -> None:
        positional = [a for a in node.args if a.keyword is None and not a.star]
        for first, second in pairwise(positional):
            same = self.module.code_for_node(first.value) == self.module.code_for_node(second.value)
            if not same and self._one_line(first, second):
                i, j = node.args.index(first), node.args.index(second)
                self._add("swap_arguments", node, lambda n, i=i, j=j: _swap(n, i, j), first)

    def visit_Return(self, node: cst.Return) -> None:
        value = node.value
        if value is not None and not (isinstance(value, cst.Name) and value.value == "None") and self._one_line(node):
            self._add("return_none", value, lambda v: cst.Name("None", lpar=[], rpar=[]), node)


def _same_spacing(operator: cst.CSTNode, new: type) -> cst.CSTNode:
    """The operator `new` with the spacing of `operator` (a two-word one keeps a single space between)."""
    fields = {"whitespace_before": operator.whitespace_before, "whitespace_after": operator.whitespace_after}  # type: ignore[attr-defined]
    if new in (cst.IsNot, cst.NotIn):
        fields["whitespace_between"] = cst.SimpleWhitespace(" ")
    if not hasattr(operator, "whitespace_before"):  # augmented assignment operators have only `after`
        fields.pop("whitespace_before")
    return new(**fields)


def _negated(test: cst.CSTNode) -> cst.CSTNode:
    """`x` -> `not x`, `not x` -> `x` (parentheses where `not` would bind differently)."""
    assert isinstance(test, cst.BaseExpression)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not) and not test.lpar:
        return test.expression
    if isinstance(test, _LOOSE) and not test.lpar:
        test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.UnaryOperation(operator=cst.Not(), expression=test)


def _swap(call: cst.CSTNode, i: int, j: int) -> cst.CSTNode:
    """The call with the values of arguments i and j exchanged (commas and spacing stay where they were)."""
    assert isinstance(call, cst.Call)
    args = list(call.args)
    args[i], args[j] = args[i].with_changes(value=args[j].value), args[j].with_changes(value=args[i].value)
    return call.with_changes(args=args)
