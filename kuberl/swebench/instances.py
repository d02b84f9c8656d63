"""SWE-bench-format instance files: JSONL rows read as the datasets write them, and the Task each becomes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from kuberl.api.environment import Task
from kuberl.api.spec import SWE_BENCH, TaskSplit
from kuberl.api.swebench import DEFAULT_WORKDIR, RepositoryTask, SWEBenchInstance
from kuberl.swebench.environments import recipe_for

SUITE = SWE_BENCH
TEST_FRACTION = 0.25
"""Rows without a `split` key: about this share is held out, decided by a hash of the instance id."""

PROMPT = """You are working in a checkout of the repository {repo}. An issue was reported:

{problem}

Find the cause in the repository's source and fix it. Do not edit the tests: hidden tests decide whether the \
issue is resolved. Use the tools to list, read and search files, run commands and tests, then submit."""


@dataclass(frozen=True)
class RowProblem:
    """Why one row cannot be used: one line naming the file, the line, the instance and the field."""

    file: str
    line: int
    instance: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file} line {self.line}: instance {self.instance}: {self.field}: {self.message}"


def read_instances(path: str | Path) -> tuple[list[SWEBenchInstance], list[RowProblem]]:
    """Every usable row of a JSONL file, and one problem per row that is not (blank lines are skipped)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: cannot read the instance file: {error}") from error
    instances: list[SWEBenchInstance] = []
    problems: list[RowProblem] = []
    first: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            problems.append(RowProblem(str(path), number, "?", "(row)", f"not valid JSON: {error}"))
            continue
        name = str(row.get("instance_id", "?")) if isinstance(row, dict) else "?"
        try:
            instance = SWEBenchInstance.model_validate(row)
        except ValidationError as error:
            for item in error.errors():
                field = ".".join(str(p) for p in item["loc"]) or "(row)"
                problems.append(RowProblem(str(path), number, name, field, item["msg"]))
            continue
        if instance.instance_id in first:
            problems.append(
                RowProblem(str(path), number, name, "instance_id", f"duplicate, first on line {first[name]}")
            )
            continue
        first[instance.instance_id] = number
        instances.append(instance)
    return instances, problems


def load_instances(path: str | Path) -> list[SWEBenchInstance]:
    """The rows of a file; ValueError listing every problem when any row cannot be used."""
    instances, problems = read_instances(path)
    if problems:
        raise ValueError("\n".join(str(p) for p in problems))
    return instances


def split_of(instance: SWEBenchInstance) -> TaskSplit:
    """The row's own `split` when it has one, else test for about a quarter of ids (a stable hash)."""
    given = instance.extra_fields.get("split")
    if given in (TaskSplit.TRAIN.value, TaskSplit.TEST.value):
        return TaskSplit(given)
    digest = int.from_bytes(hashlib.sha256(instance.instance_id.encode()).digest()[:4], "big")
    return TaskSplit.TEST if digest / 2**32 < TEST_FRACTION else TaskSplit.TRAIN


def instance_task(instance: SWEBenchInstance) -> Task:
    """The Task a sandbox session plays for an instance (the gold patch stays out of it)."""
    return Task(
        task_id=instance.instance_id,
        split=split_of(instance),
        prompt=PROMPT.format(repo=instance.repo, problem=instance.problem_statement.strip()),
        test_command="python -m pytest -q",
        metadata={**template_fields_of(instance), "suite": SUITE},
        image=instance.image,
        repository=RepositoryTask(
            repo=instance.repo,
            base_commit=instance.base_commit,
            environment=recipe_for(instance).key,
            test_patch=instance.test_patch,
            fail_to_pass=instance.fail_to_pass,
            pass_to_pass=instance.pass_to_pass,
            workdir=instance.workdir or DEFAULT_WORKDIR,
        ),
    )


# Fields too long or too secret for an image name; the rest of a row's scalar fields may name its image
# (spec.sandbox.imageTemplate) and travel in the task's metadata, which the agent never sees.
_NOT_TEMPLATE_FIELDS = frozenset(
    {"patch", "test_patch", "problem_statement", "hints_text", "FAIL_TO_PASS", "PASS_TO_PASS"}
)


def template_fields_of(instance: SWEBenchInstance) -> dict[str, str]:
    """The row's short scalar fields (SWE-bench's and a dataset's own) by their names in the row."""
    row = instance.model_dump(by_alias=True, exclude_none=True)
    return {
        key: str(value)
        for key, value in row.items()
        if key not in _NOT_TEMPLATE_FIELDS and isinstance(value, str | int | float) and len(str(value)) <= 256
    }


def read_tasks(path: str | Path) -> list[Task]:
    """The Tasks of an instance file (every row must be usable)."""
    return [instance_task(instance) for instance in load_instances(path)]
