"""Task suites on disk: JSONL, one Task per line in its camelCase wire form, UTF-8."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kuberl.api.environment import Task


def write_jsonl(tasks: Iterable[Task], path: str | Path) -> None:
    """Write `tasks` to `path`, one JSON object per line (parent folders are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as out:
        for task in tasks:
            out.write(json.dumps(task.to_manifest(), ensure_ascii=False) + "\n")


def read_jsonl(path: str | Path) -> list[Task]:
    """Read the tasks of a JSONL file; a bad line raises ValueError naming the file, the line and the field."""
    tasks, problems = _read(Path(path))
    if problems:
        raise ValueError(problems[0])
    return tasks


def task_file_problems(path: str | Path) -> list[str]:
    """Every bad line of a JSONL task file, one message each naming the line and field (empty: all good)."""
    return _read(Path(path))[1]


def _read(path: Path) -> tuple[list[Task], list[str]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        return [], [f"{path}: cannot read task file: {error}"]
    tasks: list[Task] = []
    problems: list[str] = []
    first_line_of: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():  # blank lines (a trailing one, say) carry no task
            continue
        try:
            task = _parse_line(path, number, line)
        except ValueError as error:
            problems.append(str(error))
            continue
        if task.task_id in first_line_of:
            where = f"{path} line {number}: taskId"
            problems.append(f"{where}: duplicate {task.task_id!r}, first on line {first_line_of[task.task_id]}")
            continue
        first_line_of[task.task_id] = number
        tasks.append(task)
    return tasks, problems


def _parse_line(path: Path, number: int, line: str) -> Task:
    where = f"{path} line {number}"
    try:
        document: Any = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise ValueError(f"{where}: expected a JSON object (one Task), got {type(document).__name__}")
    try:
        return Task.model_validate(document)
    except ValidationError as error:
        raise ValueError(f"{where}: {_describe(error)}") from None


def _describe(error: ValidationError) -> str:
    """Each problem as 'field: message', the field in its camelCase wire form (e.g. 'metadata' or 'files')."""
    problems = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(task)"
        problems.append(f"{field}: {item['msg']}")
    return "; ".join(problems)
