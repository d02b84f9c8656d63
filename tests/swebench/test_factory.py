"""The task factory on a real package: inflection's sdist from PyPI, its own tests run with pytest, and the
instances checked the SWE-bench way; plus the mutations and test hiding on small sources."""

from __future__ import annotations

import ast
import difflib
import json
import os
import stat
from pathlib import Path

import pytest

from kuberl.api.swebench import SWEBenchInstance
from kuberl.api.swebench import test_file_of as file_of_test
from kuberl.swebench import pytest_report
from kuberl.swebench.environments import EnvironmentRecipe, prepare
from kuberl.swebench.factory import FactoryError, make_instances, parse_requirement
from kuberl.swebench.factory.mutations import KINDS, candidates
from kuberl.swebench.factory.packages import fetch_sdist, unpack
from kuberl.swebench.factory.repository import PRISTINE_TAG, export, files_at, pristine_repository, read
from kuberl.swebench.factory.statements import failure_details, problem_statement
from kuberl.swebench.factory.testfiles import definitions, is_source_file, is_test_file, without_tests
from kuberl.swebench.factory.testfiles import test_name as name_of_test
from kuberl.swebench.factory.testruns import run_tests
from kuberl.swebench.factory.validation import apply_patch
from kuberl.swebench.mirror import git

INFLECTION = "inflection==0.5.1"


@pytest.fixture(scope="session")
def made(tmp_path_factory):
    """Three instances of inflection, made once: the report, the instances and the folders."""
    root = tmp_path_factory.mktemp("factory")
    mirror, environments, out = root / "mirror", root / "environments", root / "instances.jsonl"
    seen: list[tuple[int, int, str]] = []
    report = make_instances(
        [INFLECTION],
        mirror,
        environments,
        out,
        per_package=3,
        seed=0,
        progress=lambda done, total, message: seen.append((done, total, message)),
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return {"report": report, "rows": rows, "mirror": mirror, "environments": environments, "progress": seen}


def _instances(made) -> list[SWEBenchInstance]:
    return [SWEBenchInstance.model_validate(row) for row in made["rows"]]


def _repository(made) -> Path:
    return made["mirror"] / "pypi__inflection"


@pytest.mark.slow
def test_makes_the_instances_asked_for(made):
    report = made["report"]
    [package] = report.packages
    assert package.error is None, package.error
    assert package.kept == 3 == report.instances == len(made["rows"])
    assert package.tried >= 3 and package.passing_tests > 100
    assert [i.instance_id for i in _instances(made)] == [f"pypi__inflection-{n}" for n in (1, 2, 3)]
    assert made["progress"][-1][0] == made["progress"][-1][1] == 3
    assert report.to_json()["instances"] == 3


@pytest.mark.slow
def test_each_instance_is_swe_bench_shaped(made):
    for row, instance in zip(made["rows"], _instances(made), strict=True):
        assert instance.repo == "pypi/inflection" and instance.version == "0.5.1"
        assert 1 <= len(instance.fail_to_pass) <= 20
        assert not set(instance.fail_to_pass) & set(instance.pass_to_pass)
        assert {file_of_test(t) for t in instance.fail_to_pass} == {"test_inflection.py"}
        assert instance.hints_text == "" and instance.created_at
        assert row["kuberl_bug"]["kind"] in KINDS and row["kuberl_bug"]["file"] == "inflection/__init__.py"
        assert "FAIL_TO_PASS" in row and "fail_to_pass" not in row


@pytest.mark.slow
def test_base_commit_holds_the_bug_without_the_hidden_tests(made):
    repo = _repository(made)
    for row, instance in zip(made["rows"], _instances(made), strict=True):
        base, pristine = instance.base_commit, instance.environment_commit
        source = row["kuberl_bug"]["file"]
        assert read(repo, base, source) != read(repo, pristine, source)
        buggy_line = read(repo, base, source).splitlines()[row["kuberl_bug"]["line"] - 1]
        assert f"-{buggy_line}\n" in instance.patch or row["kuberl_bug"]["kind"] == "drop_else"
        written = definitions(read(repo, base, "test_inflection.py"))
        for test in instance.fail_to_pass:
            name = name_of_test(test)
            assert name is not None and (name.classes, name.function) not in written
            assert f"def {name.function}(" in instance.test_patch
        assert "test_inflection.py" not in instance.patch and source not in instance.test_patch


@pytest.mark.slow
def test_base_commit_is_a_kept_child_of_pristine(made):
    repo = _repository(made)
    tag = git(repo, "rev-parse", f"refs/tags/{PRISTINE_TAG}^{{commit}}").decode().strip()
    for instance in _instances(made):
        assert instance.environment_setup_commit == tag
        log = git(repo, "log", "-n1", "--format=%H %P", instance.base_commit).decode().split()
        assert log == [instance.base_commit, tag]
        ref = git(repo, "rev-parse", f"refs/kuberl/{instance.instance_id}").decode().strip()
        assert ref == instance.base_commit


@pytest.mark.slow
def test_test_patch_and_patch_give_back_the_pristine_tree(made, tmp_path):
    repo = _repository(made)
    for instance in _instances(made):
        folder = tmp_path / instance.instance_id
        export(repo, instance.base_commit, folder)
        apply_patch(folder, instance.test_patch)
        apply_patch(folder, instance.patch)
        pristine = instance.environment_commit
        for path in files_at(repo, pristine):
            assert (folder / path).read_text() == read(repo, pristine, path), path


@pytest.mark.slow
def test_hidden_tests_fail_on_the_base_and_pass_with_the_fix(made, tmp_path):
    instance = _instances(made)[0]
    repo, environments = _repository(made), made["environments"]
    environment = prepare(
        EnvironmentRecipe(repo=instance.repo, commit=instance.environment_commit), made["mirror"], environments
    )
    folder = tmp_path / "work"
    export(repo, instance.base_commit, folder)
    paths = pytest_report.source_paths(files_at(repo, instance.base_commit))
    apply_patch(folder, instance.test_patch)
    before = run_tests(folder, ["test_inflection.py"], environment.python, paths, 120)
    assert not any(pytest_report.passed(before.outcomes, t) for t in instance.fail_to_pass)
    assert all(pytest_report.passed(before.outcomes, t) for t in instance.pass_to_pass)
    apply_patch(folder, instance.patch)
    after = run_tests(folder, ["test_inflection.py"], environment.python, paths, 120)
    assert all(pytest_report.passed(after.outcomes, t) for t in [*instance.fail_to_pass, *instance.pass_to_pass])


@pytest.mark.slow
def test_problem_statement_names_a_failing_test_and_hides_its_code(made):
    for instance in _instances(made):
        statement = instance.problem_statement
        assert instance.fail_to_pass[0] in statement
        added = [line[1:].strip() for line in instance.test_patch.splitlines() if line.startswith("+")]
        assert not [line for line in added if line.startswith(("def ", "assert ", "@pytest")) and line in statement]
        assert "diff --git" not in statement and "@@" not in statement


@pytest.mark.slow
def test_mirror_repository_is_private_and_reproducible(made, tmp_path):
    repo = _repository(made)
    assert stat.S_IMODE(os.stat(repo).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(made["mirror"] / ".sdists").st_mode) == 0o700
    archive = fetch_sdist(parse_requirement(INFLECTION), made["mirror"] / ".sdists")
    message = f"{INFLECTION} as published (sdist {archive.name})"
    again = pristine_repository(tmp_path / "pypi__inflection", unpack(archive, tmp_path / "sdist"), message)
    assert again == _instances(made)[0].environment_commit  # fixed identity and dates: the same commit id


def test_requirements_must_be_pinned():
    assert parse_requirement("More_Itertools == 10.5.0").name == "more-itertools"
    with pytest.raises(FactoryError, match="toolz"):
        parse_requirement("toolz>=1")
    with pytest.raises(FactoryError, match="toolz"):
        make_instances(["toolz"], Path("/nonexistent"), Path("/nonexistent"), Path("/nonexistent/x"), per_package=1)


SOURCE = """\
LIMIT = 10


def clamp(value, low=0, high=LIMIT):
    if value < low and low is not None:
        return low
    elif value > high:
        return high
    else:
        value = value + 1
    total = max(value, low)
    total *= 2
    return total
"""


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_mutation_changes_one_place_and_stays_python(kind):
    found = [m for m in candidates(SOURCE, "clamp.py") if m.kind == kind]
    assert found, f"no {kind} candidate in the sample"
    for mutation in found:
        changed = mutation.apply()
        ast.parse(changed)
        diff = [
            line
            for line in difflib.unified_diff(SOURCE.splitlines(), changed.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))
        ]
        if kind == "drop_else":  # the one multi-line kind: it only removes the else block
            assert diff == ["-    else:", "-        value = value + 1"]
        else:
            removed, added = [d for d in diff if d[0] == "-"], [d for d in diff if d[0] == "+"]
            assert len(removed) == len(added) == 1, diff
            assert removed[0][1:] == SOURCE.splitlines()[mutation.line - 1]
        assert mutation.function == "clamp"


def test_mutations_leave_module_code_defaults_and_strings_alone():
    found = candidates(SOURCE, "clamp.py")
    assert all(m.line >= 5 for m in found)  # not `LIMIT = 10`, not the default `low=0`
    assert [m.kind for m in candidates('def f(a):\n    return "x" + a\n', "f.py")] == ["return_none"]
    assert candidates("def f(:\n", "f.py") == []
    negated = next(m for m in candidates(SOURCE, "c.py") if m.kind == "negate_condition" and m.line == 5).apply()
    assert "    if not (value < low and low is not None):" in negated


TESTS = """\
import pytest


@pytest.mark.parametrize("x", [1, 2])
def test_one(x):
    assert x


class TestGroup:
    def test_two(self):
        assert True

    def test_three(self):
        assert True
"""


def test_hiding_tests_removes_whole_functions_and_empty_files():
    written = definitions(TESTS)
    assert ((), "test_one") in written and (("TestGroup",), "test_two") in written
    names = [name_of_test("tests/test_x.py::test_one[1]"), name_of_test("tests/test_x.py::TestGroup::test_two")]
    hidden = without_tests(TESTS, [n for n in names if n])
    assert hidden is not None and "test_one" not in hidden and "test_two" not in hidden and "test_three" in hidden
    assert "parametrize" not in hidden
    assert "class TestGroup:\n    def test_three(self):" in hidden  # no blank line left where test_two was
    ast.parse(hidden)
    everything = [
        name_of_test("t/test_x.py::test_one"),
        name_of_test("t/test_x.py::TestGroup::test_two"),
        name_of_test("t/test_x.py::TestGroup::test_three"),
    ]
    assert without_tests(TESTS, [n for n in everything if n]) is None
    assert name_of_test("pkg/mod.py::pkg.mod.func") is None  # a doctest is not a hideable test


def test_source_and_test_files_are_told_apart():
    assert is_test_file("tests/test_a.py") and is_test_file("a_test.py") and not is_test_file("testing.py")
    assert is_source_file("toolz/itertoolz.py") and is_source_file("src/cachetools/func.py")
    assert not is_source_file("toolz/tests/test_x.py") and not is_source_file("setup.py")
    assert not is_source_file("docs/conf.py") and not is_source_file("tests/helpers.py")


def test_problem_statement_uses_error_lines_not_test_source():
    output = """\
=================================== FAILURES ===================================
_______________________________ TestA.test_b[1] ________________________________
test_x.py:3: in test_b
    assert secret_source_line == 2
E   AssertionError: assert 1 == 2 at 0xdeadbeef
=========================== short test summary info ============================
FAILED test_x.py::TestA::test_b[1] - AssertionError: assert 1 == 2
"""
    summaries, errors = failure_details(output, ["test_x.py::TestA::test_b[1]"])
    assert summaries == {"test_x.py::TestA::test_b[1]": "AssertionError: assert 1 == 2"}
    assert errors == {"test_x.py::TestA::test_b[1]": ["AssertionError: assert 1 == 2"]}
    statement = problem_statement("demo", "1.0", ["test_x.py::TestA::test_b[1]"], output)
    assert "test_x.py::TestA::test_b[1]" in statement and "`b`" in statement
    assert "secret_source_line" not in statement
