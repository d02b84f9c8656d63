"""The swe-toy suite: tiny generated Python modules, each with one planted one-line bug.

A task is a module of 2-4 short functions, a visible unittest file whose failing assertion names the expression
the buggy line should use, and a hidden test file scored at submit: the buggy function's hidden tests are the
task's FAIL_TO_PASS tests, every other hidden test its PASS_TO_PASS. The format is described in docs/tasks.md.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kuberl.api.environment import CallCheck, Oracle, Task
from kuberl.api.spec import TaskSplit

SUITE = "swe-toy"
TEST_COMMAND = "python -m unittest -q"
MAX_MODULE_LINES = 20
MAX_FUNCTIONS = 4
VISIBLE_CASES = 2
# One case per hidden test method for the buggy function: each is a FAIL_TO_PASS test of its own.
HIDDEN_TARGET_CASES = 3
HIDDEN_FILLER_CASES = 2
MAX_DRAWS = 1000

# Words that name no standard-library module, so `import <module>` always finds the generated file.
MODULE_NAMES = (
    "geometry",
    "billing",
    "inventory",
    "payroll",
    "shipping",
    "garden",
    "kitchen",
    "travel",
    "weather",
    "library",
    "scoring",
    "grading",
    "ledger",
    "warehouse",
    "recipes",
    "fitness",
    "parking",
    "tickets",
    "orchard",
    "bakery",
    "theater",
    "harbor",
    "school",
    "clinic",
    "farm",
    "studio",
    "arcade",
    "museum",
    "market",
    "hotel",
)

Args = tuple[Any, ...]


@dataclass(frozen=True)
class Function:
    """A function of a generated module; `site` is the expression where its bug would be planted."""

    name: str
    params: tuple[str, ...]
    body: tuple[str, ...]
    """Body lines (relative indentation), with "{site}" where the site expression goes."""
    site: str
    bug: str
    """The wrong expression planted when this function carries the bug."""
    decoys: tuple[str, ...]
    """Other plausible wrong expressions, offered as candidate fixes."""
    draw_args: Callable[[random.Random], Args]

    @property
    def signature(self) -> str:
        return f"{self.name}({', '.join(self.params)})"

    def source(self, site: str | None = None) -> str:
        """The function's code, with `site` (default: the correct expression) at the bug site."""
        body = (line.replace("{site}", site or self.site) for line in self.body)
        return "\n".join([f"def {self.signature}:", *(f"    {line}" for line in body)])


# A group is what one template produces: helpers first, then the function that may carry the bug.
Group = list[Function]
Template = Callable[[random.Random], Group]


def _bug_and_decoys(rng: random.Random, wrongs: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """Plant one wrong expression; two or three of the rest become decoy candidates."""
    bug = rng.choice(wrongs)
    rest = [w for w in wrongs if w != bug]
    return bug, tuple(rng.sample(rest, min(len(rest), rng.choice((2, 3)))))


# ------------------------------------------------------------------------------------------- operator
OPERATORS = ("+", "-", "*", "//", "%")
OPERATOR_VOCABULARY = (
    ("area", "width", "height", "*"),
    ("total_cost", "price", "quantity", "*"),
    ("distance", "speed", "hours", "*"),
    ("pay", "rate", "hours_worked", "*"),
    ("remaining", "budget", "spent", "-"),
    ("change_due", "paid", "cost", "-"),
    ("net_weight", "gross", "tare", "-"),
    ("score_gap", "winner", "loser", "-"),
    ("headcount", "adults", "children", "+"),
    ("total_points", "home", "away", "+"),
    ("combined_length", "first", "second", "+"),
    ("stock", "shelved", "stored", "+"),
    ("per_person", "total", "people", "//"),
    ("full_boxes", "items", "box_size", "//"),
    ("leftover", "eggs", "carton_size", "%"),
    ("spare_seats", "guests", "table_size", "%"),
)


def _draw_operands(rng: random.Random) -> Args:
    return rng.randint(12, 60), rng.randint(2, 9)


def _operator(rng: random.Random) -> Group:
    name, a, b, op = rng.choice(OPERATOR_VOCABULARY)
    bug, decoys = _bug_and_decoys(rng, [f"{a} {other} {b}" for other in OPERATORS if other != op])
    return [Function(name, (a, b), ("return {site}",), f"{a} {op} {b}", bug, decoys, _draw_operands)]


# ----------------------------------------------------------------------------------------- off-by-one
SUM_VOCABULARY = (
    ("sum_upto", "n", "i"),
    ("sum_squares", "n", "i * i"),
    ("triangle", "rows", "i"),
    ("sum_doubles", "count", "2 * i"),
    ("total_laps", "days", "i"),
    ("pyramid", "levels", "i * i"),
)
SLICE_VOCABULARY = (
    ("first_n", "items", "n"),
    ("head", "lines", "count"),
    ("take", "values", "k"),
    ("top_picks", "ranked", "k"),
    ("opening", "words", "size"),
)
SEQUENCE_VOCABULARY = (
    ("schedule", "first", "gap", "count"),
    ("ticks", "origin", "spacing", "n"),
    ("seat_numbers", "first_seat", "stride", "rows"),
    ("milestones", "start", "step", "total"),
)


def _sum_range(rng: random.Random) -> Group:
    name, n, term = rng.choice(SUM_VOCABULARY)
    wrongs = [f"range(1, {n})", f"range(2, {n} + 1)", f"range(1, {n} + 2)", f"range(1, {n} - 1)"]
    bug, decoys = _bug_and_decoys(rng, wrongs)
    body = ("total = 0", "for i in {site}:", f"    total += {term}", "return total")
    return [Function(name, (n,), body, f"range(1, {n} + 1)", bug, decoys, _draw_length)]


def _draw_length(rng: random.Random) -> Args:
    return (rng.randint(3, 12),)


def _draw_sliceable(rng: random.Random) -> Args:
    items = rng.sample(range(1, 100), rng.randint(5, 8))
    return items, rng.randint(2, len(items) - 2)


def _slice(rng: random.Random) -> Group:
    name, items, n = rng.choice(SLICE_VOCABULARY)
    wrongs = [f"{items}[:{n} + 1]", f"{items}[:{n} - 1]", f"{items}[1:{n} + 1]"]
    bug, decoys = _bug_and_decoys(rng, wrongs)
    return [Function(name, (items, n), ("return {site}",), f"{items}[:{n}]", bug, decoys, _draw_sliceable)]


def _sequence(rng: random.Random) -> Group:
    name, start, step, count = rng.choice(SEQUENCE_VOCABULARY)
    wrongs = [f"range({count} + 1)", f"range({count} - 1)", f"range(1, {count} + 1)"]
    bug, decoys = _bug_and_decoys(rng, wrongs)
    body = (f"return [{start} + i * {step} for i in {{site}}]",)
    return [Function(name, (start, step, count), body, f"range({count})", bug, decoys, _draw_progression)]


def _draw_progression(rng: random.Random) -> Args:
    # A step of 2 or more: starting the range at 1 instead of 0 then changes every element.
    return rng.randint(0, 20), rng.randint(2, 9), rng.randint(2, 6)


# ----------------------------------------------------------------------------------------- comparison
COMPARISONS = {"<": "below", "<=": "at_most", ">": "above", ">=": "at_least"}
COMPARISON_VOCABULARY = (
    ("values", "v", "limit"),
    ("scores", "s", "cutoff"),
    ("prices", "p", "budget"),
    ("ages", "a", "threshold"),
    ("temps", "t", "level"),
    ("sizes", "x", "bound"),
)


def _draw_values_and_bound(rng: random.Random) -> Args:
    # The bound itself is always among the values: that is where < and <= (or > and >=) differ.
    bound = rng.randint(10, 30)
    values = [bound + rng.choice((-4, -3, -2, -1, 1, 2, 3, 4)) for _ in range(rng.randint(3, 6))]
    values.insert(rng.randint(0, len(values)), bound)
    return values, bound


def _comparison(rng: random.Random, name_format: str, body: str) -> Group:
    plural, item, bound = rng.choice(COMPARISON_VOCABULARY)
    op = rng.choice(list(COMPARISONS))
    bug, decoys = _bug_and_decoys(rng, [f"{item} {other} {bound}" for other in COMPARISONS if other != op])
    name = name_format.format(plural=plural, relation=COMPARISONS[op])
    body = body.format(item=item, plural=plural)
    return [Function(name, (plural, bound), (body,), f"{item} {op} {bound}", bug, decoys, _draw_values_and_bound)]


def _count(rng: random.Random) -> Group:
    return _comparison(rng, "count_{plural}_{relation}", "return sum(1 for {item} in {plural} if {{site}})")


def _filter(rng: random.Random) -> Group:
    return _comparison(rng, "{plural}_{relation}", "return [{item} for {item} in {plural} if {{site}}]")


# ------------------------------------------------------------------------------------------- constant
# No factor's digits start another's in the same row: a wrong candidate is never a substring of the fix.
CONVERSIONS = (
    ("hours_to_minutes", "hours", 60, (30, 100, 24)),
    ("minutes_to_seconds", "minutes", 60, (100, 30, 24)),
    ("days_to_hours", "days", 24, (12, 60, 7)),
    ("weeks_to_days", "weeks", 7, (5, 30, 14)),
    ("dollars_to_cents", "dollars", 100, (25, 50, 60)),
    ("kilos_to_grams", "kilos", 1000, (500, 1024, 2000)),
    ("feet_to_inches", "feet", 12, (10, 3, 24)),
    ("years_to_months", "years", 12, (10, 52, 365)),
    ("dozens_to_eggs", "dozens", 12, (10, 6, 24)),
    ("hours_to_seconds", "hours", 3600, (60, 1440, 24)),
    ("gallons_to_quarts", "gallons", 4, (2, 8, 3)),
    ("tons_to_pounds", "tons", 2000, (1000, 2240, 500)),
)


def _conversion(rng: random.Random) -> Group:
    name, unit, factor, wrong_factors = rng.choice(CONVERSIONS)
    bug, decoys = _bug_and_decoys(rng, [f"{unit} * {wrong}" for wrong in wrong_factors])
    return [Function(name, (unit,), ("return {site}",), f"{unit} * {factor}", bug, decoys, _draw_quantity)]


def _draw_quantity(rng: random.Random) -> Args:
    return (rng.randint(2, 9),)


# --------------------------------------------------------------------------------------- swapped-args
@dataclass(frozen=True)
class Helper:
    """A two-argument helper whose arguments do not commute, and the callers that use it."""

    name: str
    expression: str
    """Over (a, b)."""
    first: tuple[int, int]
    """Range of the first argument."""
    second: tuple[int, int]
    """Range of the second argument."""
    callers: tuple[tuple[str, str, str], ...]
    """(name, first parameter, second parameter)."""

    def draw_args(self, rng: random.Random) -> Args:
        return rng.randint(*self.first), rng.randint(*self.second)


HELPERS = (
    Helper(
        "subtract",
        "a - b",
        (10, 30),
        (1, 9),
        (("days_left", "deadline", "today"), ("profit", "revenue", "cost"), ("elapsed", "finish", "start")),
    ),
    Helper(
        "divide",
        "a // b",
        (20, 60),  # at least twice the divisor, so that dividing a number by itself (1) is always wrong
        (2, 6),
        (("average_speed", "distance", "duration"), ("per_box", "items", "boxes"), ("share", "total", "people")),
    ),
    Helper(
        "power",
        "a ** b",
        (2, 5),  # small: a swapped call must still print a short number
        (2, 4),
        (("combinations", "choices", "slots"), ("volume", "edge", "dimensions"), ("grid_cells", "side", "axes")),
    ),
    Helper(
        "remainder",
        "a % b",
        (10, 40),
        (3, 9),
        (("leftover_cards", "cards", "players"), ("wrap_index", "position", "length")),
    ),
)


def _helper_call(rng: random.Random) -> Group:
    helper = rng.choice(HELPERS)
    name, x, y = rng.choice(helper.callers)
    body = ("return {site}",)
    # The helper is never the one bugged: it only gives the caller an argument order to get wrong.
    helper_function = Function(helper.name, ("a", "b"), body, helper.expression, "", (), helper.draw_args)
    swapped = f"{helper.name}({y}, {x})"
    decoys = (f"{helper.name}({x}, {x})", f"{helper.name}({y}, {y})")
    caller = Function(name, (x, y), body, f"{helper.name}({x}, {y})", swapped, decoys, helper.draw_args)
    return [helper_function, caller]


BUG_KINDS: dict[str, tuple[Template, ...]] = {
    "operator": (_operator,),
    "off-by-one": (_sum_range, _slice, _sequence),
    "comparison": (_count, _filter),
    "constant": (_conversion,),
    "swapped-args": (_helper_call,),
}
ALL_TEMPLATES = tuple(template for templates in BUG_KINDS.values() for template in templates)


# ----------------------------------------------------------------------------------------- the module
@dataclass
class Module:
    """A generated module: its functions in file order and the one that carries the bug."""

    name: str
    functions: list[Function]
    target: Function

    def source(self, target_site: str | None = None) -> str:
        """The module's code, with `target_site` (default: the correct expression) on the buggy line."""
        parts = [f.source(target_site if f is self.target else None) for f in self.functions]
        return "\n\n".join(parts) + "\n"

    @property
    def candidates(self) -> list[str]:
        return [self.target.site, *self.target.decoys]


def _is_well_formed(module: Module) -> bool:
    """Distinct names, short enough, and each candidate edit locatable: the bug once, no candidate yet."""
    names = [f.name for f in module.functions]
    buggy = module.source(module.target.bug)
    return (
        len(set(names)) == len(names)
        and len(module.functions) <= MAX_FUNCTIONS
        and buggy.count("\n") <= MAX_MODULE_LINES
        and buggy.count(module.target.bug) == 1
        and not any(candidate in buggy for candidate in module.candidates)
    )


def _build_module(rng: random.Random, target_group: Group) -> Module:
    """Add correct filler functions around the target until the module has 2-4 functions."""
    groups = [target_group]
    module = Module(rng.choice(MODULE_NAMES), list(target_group), target_group[-1])
    wanted = rng.randint(2, MAX_FUNCTIONS)
    for _ in range(MAX_DRAWS):
        if len(module.functions) >= wanted and _is_well_formed(module):
            return module
        filler = rng.choice(ALL_TEMPLATES)(rng)
        trial = [*groups]
        trial.insert(rng.randint(0, len(groups)), filler)
        candidate = Module(module.name, [f for group in trial for f in group], module.target)
        if _is_well_formed(candidate):
            groups, module = trial, candidate
    raise RuntimeError(f"could not fill a module around {module.target.name}")


# ------------------------------------------------------------------------------------------- the cases
ERROR = object()
"""Outcome of a call that raised."""


def _load(source: str) -> dict[str, Any]:
    # Our own generated code: run it here to compute the expected values the tests assert.
    namespace: dict[str, Any] = {}
    exec(compile(source, "<swe-toy>", "exec"), namespace)
    return namespace


def _call(namespace: dict[str, Any], name: str, args: Args) -> Any:
    try:
        return namespace[name](*args)
    except Exception:
        return ERROR


@dataclass(frozen=True)
class Case:
    """One call and the value the correct code returns."""

    args: Args
    expected: Any


def _draw_distinct(rng: random.Random, function: Function, count: int, taken: Sequence[Case]) -> list[Args]:
    draws: list[Args] = []
    for _ in range(MAX_DRAWS):
        args = function.draw_args(rng)
        if args not in draws and all(args != case.args for case in taken):
            draws.append(args)
            if len(draws) == count:
                return draws
    raise RuntimeError(f"could not draw {count} distinct calls of {function.name}")


def _filler_cases(
    rng: random.Random, module: Module, function: Function, count: int, taken: Sequence[Case]
) -> list[Case]:
    correct = _load(module.source())
    return [Case(args, _call(correct, function.name, args)) for args in _draw_distinct(rng, function, count, taken)]


def _target_cases(rng: random.Random, module: Module, count: int, taken: Sequence[Case]) -> list[Case]:
    """Calls that the buggy code gets wrong (without raising) and that every decoy gets wrong at least once."""
    target = module.target
    correct = _load(module.source())
    buggy = _load(module.source(target.bug))
    decoys = [_load(module.source(decoy)) for decoy in target.decoys]
    for _ in range(MAX_DRAWS):
        cases = [Case(args, _call(correct, target.name, args)) for args in _draw_distinct(rng, target, count, taken)]
        got_by_bug = [_call(buggy, target.name, case.args) for case in cases]
        if any(case.expected is ERROR for case in cases) or any(got is ERROR for got in got_by_bug):
            continue
        bug_fails_each = all(got != case.expected for got, case in zip(got_by_bug, cases, strict=True))
        if bug_fails_each and all(any(_call(d, target.name, c.args) != c.expected for c in cases) for d in decoys):
            return cases
    raise RuntimeError(f"could not find telling cases for {target.name}")


# ------------------------------------------------------------------------------------------ test files
def _call_text(function: Function, case: Case) -> str:
    return f"{function.name}({', '.join(repr(a) for a in case.args)})"


def _expectation(function: Function, module: Module) -> str:
    # The failing assertion names the right expression and, for the buggy function, the wrong one it has (as
    # a regression test written by whoever found the bug would): the test output tells which edit to make.
    # Quoting the wrong expression lets a small model copy the edit's `old` text from one cue, instead of
    # finding the named function in the file first (a lookup a 2-layer model rarely got right: 48 in 112).
    wrong = f", not {function.bug}" if function is module.target else ""
    return f"{function.signature} should use {function.site}{wrong}"


def _class_name(module: str) -> str:
    return "".join(part.capitalize() for part in module.split("_"))


def _test_file(module: Module, class_name: str, methods: list[tuple[str, list[str]]]) -> str:
    header = ["import unittest", "", f"from {module.name} import {', '.join(f.name for f in module.functions)}"]
    lines = [*header, "", "", f"class {class_name}(unittest.TestCase):"]
    for index, (method, asserts) in enumerate(methods):
        lines += ([""] if index else []) + [f"    def {method}(self):", *(f"        {a}" for a in asserts)]
    lines += ["", "", 'if __name__ == "__main__":', "    unittest.main()"]
    return "\n".join(lines) + "\n"


def _visible_tests(module: Module, cases: dict[str, list[Case]]) -> str:
    methods = []
    for f in module.functions:
        message = json.dumps(_expectation(f, module))
        asserts = [f"self.assertEqual({_call_text(f, c)}, {c.expected!r}, {message})" for c in cases[f.name]]
        methods.append((f"test_{f.name}", asserts))
    return _test_file(module, f"Test{_class_name(module.name)}", methods)


def _check(module: Module, function: Function, case: Case, test_id: str, message: str | None = None) -> CallCheck:
    if json.loads(json.dumps([list(case.args), case.expected])) != [list(case.args), case.expected]:
        raise RuntimeError(f"{function.name}{case.args!r} -> {case.expected!r} is not plain JSON: no oracle check")
    return CallCheck(
        test_id=test_id,
        module=module.name,
        function=function.name,
        args=list(case.args),
        expected=case.expected,
        message=message,
    )


def _visible_checks(module: Module, cases: dict[str, list[Case]]) -> list[CallCheck]:
    """The visible tests as oracle checks, with the assertion messages the test file has."""
    test_class = f"test_{module.name}.Test{_class_name(module.name)}"
    return [
        _check(module, f, c, f"{test_class}.test_{f.name}", _expectation(f, module))
        for f in module.functions
        for c in cases[f.name]
    ]


@dataclass(frozen=True)
class HiddenTests:
    """The hidden test file and its test ids: the target's methods fail on the buggy code, the rest pass."""

    path: str
    source: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    checks: list[CallCheck]
    """The same tests as oracle checks."""


def _hidden_tests(module: Module, cases: dict[str, list[Case]]) -> HiddenTests:
    methods: list[tuple[str, list[str]]] = []
    targeted: list[str] = []
    calls: list[tuple[str, Function, Case]] = []  # (method, function, case) of every assert
    for f in module.functions:
        asserts = [f"self.assertEqual({_call_text(f, c)}, {c.expected!r})" for c in cases[f.name]]
        if f is module.target:  # one method per case: a case the bug gets wrong is its own FAIL_TO_PASS test
            names = [f"test_{f.name}_{i}" for i in range(1, len(asserts) + 1)]
            targeted += names
            methods += [(name, [a]) for name, a in zip(names, asserts, strict=True)]
            calls += [(name, f, c) for name, c in zip(names, cases[f.name], strict=True)]
        else:
            methods.append((f"test_{f.name}", asserts))
            calls += [(f"test_{f.name}", f, c) for c in cases[f.name]]
    class_name, test_module = f"HiddenTest{_class_name(module.name)}", f"hidden_test_{module.name}"
    ids = {name: f"{test_module}.{class_name}.{name}" for name, _ in methods}
    return HiddenTests(
        path=f"{test_module}.py",
        source=_test_file(module, class_name, methods),
        fail_to_pass=[ids[name] for name in targeted],
        pass_to_pass=[ids[name] for name, _ in methods if name not in targeted],
        checks=[_check(module, f, c, ids[name]) for name, f, c in calls],
    )


# -------------------------------------------------------------------------------------------- the suite
def _split(seed: int, index: int, test_fraction: float) -> TaskSplit:
    # Its own random stream, keyed by the task alone: adding tasks never moves an existing one between splits.
    draw = random.Random(f"{SUITE}:split:{seed}:{index}").random()
    return TaskSplit.TEST if draw < test_fraction else TaskSplit.TRAIN


def make_task(index: int, seed: int = 0, test_fraction: float = 0.25) -> Task:
    """Task number `index` of the suite drawn with `seed`; it depends on nothing else."""
    rng = random.Random(f"{SUITE}:{seed}:{index}")  # string seeds hash the same in every process
    kind = rng.choice(sorted(BUG_KINDS))
    module = _build_module(rng, rng.choice(BUG_KINDS[kind])(rng))
    visible: dict[str, list[Case]] = {}
    hidden: dict[str, list[Case]] = {}
    for f in module.functions:
        if f is module.target:
            visible[f.name] = _target_cases(rng, module, VISIBLE_CASES, [])
            hidden[f.name] = _target_cases(rng, module, HIDDEN_TARGET_CASES, visible[f.name])
        else:
            visible[f.name] = _filler_cases(rng, module, f, VISIBLE_CASES, [])
            hidden[f.name] = _filler_cases(rng, module, f, HIDDEN_FILLER_CASES, visible[f.name])
    candidates = module.candidates
    rng.shuffle(candidates)
    file, test_file = f"{module.name}.py", f"test_{module.name}.py"
    hidden_tests = _hidden_tests(module, hidden)
    return Task(
        task_id=f"{SUITE}-{index:04d}",
        split=_split(seed, index, test_fraction),
        prompt=f"The tests in {test_file} fail. Fix the bug in {file}, run the tests, then submit.",
        files={file: module.source(module.target.bug), test_file: _visible_tests(module, visible)},
        test_command=TEST_COMMAND,
        hidden_tests={hidden_tests.path: hidden_tests.source},
        fail_to_pass=hidden_tests.fail_to_pass,
        pass_to_pass=hidden_tests.pass_to_pass,
        oracle=Oracle(visible=_visible_checks(module, visible), hidden=hidden_tests.checks),
        metadata={
            "bugKind": kind,
            "module": module.name,
            "file": file,
            "function": module.target.name,
            "buggy": module.target.bug,
            "fix": module.target.site,
            "candidates": candidates,
        },
    )


def generate(count: int = 400, seed: int = 0, test_fraction: float = 0.25) -> list[Task]:
    """The first `count` tasks of the suite drawn with `seed`; about `test_fraction` of them are held out."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    if not 0.0 <= test_fraction <= 1.0:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction}")
    return [make_task(index, seed, test_fraction) for index in range(count)]
