"""Read RLJob manifests from YAML and turn every problem into one line naming the document and field.

Used by `kuberl validate`, `kuberl run` and the operator, so a bad manifest reads the same everywhere.
Nothing here raises for bad input: problems are returned.
"""

from __future__ import annotations

import difflib
import re
import sys
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from kuberl.agent_resolver import resolve_agent
from kuberl.api.base import CROSS_FIELD_ERROR
from kuberl.api.rljob import RLJob
from kuberl.api.sandbox_images import ImageTemplateError, episode_image
from kuberl.api.spec import (
    AGENT_REF_PATTERN,
    API_VERSION,
    ENVIRONMENT_NAME_PATTERN,
    KIND,
    REWARD_REF_PATTERN,
    SWE_BENCH,
    EnvironmentSpec,
    RLJobSpec,
    openenv_class,
)
from kuberl.api.types import DNS_LABEL_PATTERN, IMAGE_PATTERN
from kuberl.demonstration_files import demonstration_file_problems
from kuberl.rewards import RewardFieldError, job_rewards
from kuberl.suites import BUILTIN_ENVIRONMENTS, environment_tasks
from kuberl.suites.store import task_file_problems

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$")
"""`owner/name`: how the hub names a model, a relative two-part path nobody gives a job by intent."""

STDIN = "-"


class ManifestLoader(yaml.SafeLoader):
    """YAML as kubectl reads it: `1e-6` is a number (YAML 1.2 and JSON), not the string YAML 1.1 makes of it."""


ManifestLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)$"),
    list("-+0123456789."),
)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a manifest: where (`source`, field `path`) and what is expected."""

    source: str
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}: {self.path}: {self.message}" if self.path else f"{self.source}: {self.message}"


@dataclass
class DocumentResult:
    """The outcome for one YAML document: the parsed job, or the problems that stop it."""

    source: str
    job: RLJob | None = None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.job is not None and not self.problems


def read_documents(path: str) -> tuple[list[tuple[str, Any]], list[Problem]]:
    """The YAML documents of a file (or stdin for '-') as (source label, data), or file-level problems."""
    label = "<stdin>" if path == STDIN else path
    try:
        text = sys.stdin.read() if path == STDIN else Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], [Problem(label, "", "file not found")]
    except IsADirectoryError:
        return [], [Problem(label, "", "is a directory; give the YAML files inside it")]
    except PermissionError:
        return [], [Problem(label, "", "permission denied")]
    except UnicodeDecodeError as err:
        return [], [Problem(label, "", f"not UTF-8 text (byte {err.start}); is this a YAML file?")]
    try:
        docs = [doc for doc in yaml.load_all(text, Loader=ManifestLoader) if doc is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = getattr(err, "problem", None) or str(err).splitlines()[0]
        return [], [Problem(label, "", f"not valid YAML: {where}{what}")]
    if not docs:
        return [], [Problem(label, "", "no YAML documents in the file")]
    many = len(docs) > 1
    return [(f"{label}#{i + 1}" if many else label, doc) for i, doc in enumerate(docs)], []


def validate_document(data: Any, source: str, runs_here: bool = False) -> DocumentResult:
    """Validate one parsed YAML document as an RLJob; `runs_here` (`kuberl validate`, `kuberl run`): also what
    would fail once it runs on this machine (`later_failures`)."""
    result = DocumentResult(source)
    if not isinstance(data, dict):
        result.problems.append(Problem(source, "", f"expected a mapping (an RLJob manifest), got {_kind_of(data)}"))
        return result
    header = _header_problems(data, source)
    if header:
        result.problems.extend(header)
        return result
    try:
        result.job = RLJob.from_manifest(data)
    except ValidationError as err:
        result.problems.extend(problems_from_validation_error(err, source))
        return result
    agent = result.job.spec.environment.agent
    if agent is not None:  # the entry point must import where the job is checked, as where it runs
        try:
            resolve_agent(agent)
        except ValueError as err:
            result.problems.append(Problem(source, "spec.environment.agent", str(err)))
    openenv = openenv_class(result.job.spec.environment.name)
    # the class must import where the job is checked, as where it runs
    if openenv is not None and (problem := _openenv_problem(openenv)):
        result.problems.append(Problem(source, "spec.environment.name", problem))
    if runs_here:
        result.problems.extend(Problem(source, path, message) for path, message in later_failures(result.job))
    return result


def later_failures(job: RLJob) -> list[tuple[str, str]]:
    """(field, message) for what the schema lets through but would fail once the job runs: an unknown environment,
    a reward that is not registered or does not import, a process reward model, a bad row of a local task file,
    a bad line of a local demonstrations file, a model named like a Hugging Face id that is not a local folder."""
    spec, found = job.spec, []
    name = spec.environment.name
    if openenv_class(name) is None and name not in BUILTIN_ENVIRONMENTS:
        known = ", ".join(sorted(BUILTIN_ENVIRONMENTS))
        found.append(
            (
                "spec.environment.name",
                f"unknown environment {name!r}: built-in ones are {known}, or "
                "openenv:module:Class for an OpenEnv environment",
            )
        )
    try:
        job_rewards(spec.reward)
    except RewardFieldError as err:
        found.append((err.field, err.message))
    found += [("spec.environment.tasks.uri", message) for message in _task_file_problems(spec.environment)]
    found += _episode_image_problems(spec)
    found += [("spec.training.warmup.demonstrations", message) for message in _demonstrations_problems(spec)]
    uri = spec.model.uri
    if HUB_ID.match(uri) and not Path(uri).exists():
        found.append(
            (
                "spec.model.uri",
                f"{uri!r} looks like a Hugging Face model id, and KubeRL reads models from "
                "a folder or s3:// only: download it (huggingface-cli download "
                f"{uri} --local-dir models/{uri.rsplit('/', 1)[-1]}) and give that folder, or an s3:// copy",
            )
        )
    return found


def _demonstrations_problems(spec: RLJobSpec) -> list[str]:
    """The bad lines of a local demonstrations file (one that is not here yet, or on s3://, is read where the
    job runs: `kuberl run` refuses a missing one before it starts)."""
    uri = spec.training.warmup.demonstrations
    if uri is None or uri.startswith("s3://") or not Path(uri.removeprefix("file://")).is_file():
        return []
    return demonstration_file_problems(uri)


def _task_file_problems(env: EnvironmentSpec) -> list[str]:
    """Every bad row of a task file on this machine (one that is not here is the cluster's to read)."""
    uri = env.tasks.uri
    if uri is None or uri.startswith("s3://") or not Path(uri.removeprefix("file://")).is_file():
        return []
    path = Path(uri.removeprefix("file://"))
    if env.name == SWE_BENCH:
        from kuberl.swebench.instances import read_instances

        return [str(problem) for problem in read_instances(path)[1]]
    return task_file_problems(path)


def _episode_image_problems(spec: RLJobSpec) -> list[tuple[str, str]]:
    """A local task file's tasks that spec.sandbox.imageTemplate cannot name an image for, and SWE-bench-format
    instances that run on the job's own sandbox image (no image of their own) while no mirror is given."""
    env = spec.environment
    uri = env.tasks.uri
    if uri is None or uri.startswith("s3://") or not Path(uri.removeprefix("file://")).is_file():
        return []
    try:
        tasks = environment_tasks(env)
    except ValueError:
        return []  # the row problems are reported by _task_file_problems
    found: list[tuple[str, str]] = []
    without_image: list[str] = []
    for task in tasks:
        try:
            image = episode_image(task, spec.sandbox)
        except ImageTemplateError as err:
            found.append(("spec.sandbox.imageTemplate", str(err)))
            break
        if image is None and task.repository is not None:
            without_image.append(task.task_id)
    if without_image and env.tasks.repos is None:
        shown = ", ".join(without_image[:3]) + (" ..." if len(without_image) > 3 else "")
        found.append(
            (
                "spec.environment.tasks.repos",
                f"{len(without_image)} instance(s) name no image ({shown}) and run on the sandbox image, which needs "
                "the mirror of their repositories: set tasks.repos, or give them images (an `image` in each row, "
                "or spec.sandbox.imageTemplate)",
            )
        )
    return found


def _openenv_problem(ref: str) -> str | None:
    """Why the OpenEnv environment class `ref` cannot be played, or None."""
    try:
        from kuberl.integrations.openenv_adapter import resolve_openenv_class
    except ImportError as err:
        return f"OpenEnv environment {ref!r} needs the openenv-core package (pip install 'kuberl[agents]'): {err}"
    try:
        resolve_openenv_class(ref)
    except ValueError as err:
        return str(err)
    return None


def validate_files(paths: Iterable[str], runs_here: bool = False) -> list[DocumentResult]:
    """Validate every document of every file; file-level problems become results without a job."""
    results: list[DocumentResult] = []
    for path in paths:
        docs, problems = read_documents(path)
        if problems:
            results.append(DocumentResult(problems[0].source, problems=problems))
        results.extend(validate_document(doc, source, runs_here) for source, doc in docs)
    return results


def load_rljob(path: str, runs_here: bool = False) -> RLJob:
    """The single RLJob in `path`; raises ManifestError listing every problem (`runs_here`: validate_document)."""
    results = validate_files([path], runs_here)
    problems = [p for r in results for p in r.problems]
    if problems:
        raise ManifestError(problems)
    if len(results) != 1:
        raise ManifestError([Problem(path, "", f"expected one RLJob document, found {len(results)}")])
    assert results[0].job is not None
    return results[0].job


class ManifestError(Exception):
    """A manifest that cannot be used; str() is one line per problem."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


# ------------------------------------------------------------------------------------- internals
def _header_problems(data: dict[str, Any], source: str) -> list[Problem]:
    """apiVersion and kind are checked first: a Deployment should not get thirty unknown-field errors."""
    api_version, kind = data.get("apiVersion"), data.get("kind")
    problems = []
    if kind != KIND:
        got = "missing" if kind is None else f"got {kind!r}"
        hint = "" if kind is None else f"; this is not an {KIND} manifest"
        problems.append(Problem(source, "kind", f"expected {KIND!r}, {got}{hint}"))
    if api_version != API_VERSION:
        got = "missing" if api_version is None else f"got {api_version!r}"
        problems.append(Problem(source, "apiVersion", f"expected {API_VERSION!r}, {got}"))
    return problems


def problems_from_validation_error(err: ValidationError, source: str) -> list[Problem]:
    """One Problem per pydantic error, with camelCase field paths and plain-language messages."""
    problems: list[Problem] = []
    for error in err.errors(include_url=False):
        loc = _clean_loc(error["loc"])
        if error["type"] == CROSS_FIELD_ERROR:
            for sub_path, text in error["ctx"]["problems"]:
                problems.append(Problem(source, _join(loc + tuple(sub_path.split("."))), text))
            continue
        problems.append(Problem(source, _join(loc), _message(error, loc)))
    return problems


def _clean_loc(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    # Union and validator-wrapper steps ("int", "function-before[...]") are pydantic internals.
    return tuple(part for part in loc if isinstance(part, int) or not (part in _UNION_TAGS or "[" in part))


_UNION_TAGS = {"int", "str", "float", "bool", "none", "list", "dict"}


def _join(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "." in part or "/" in part:
            out += f"[{part!r}]"
        else:
            out += f".{part}" if out else part
    return out


def _message(error: dict[str, Any], loc: tuple[int | str, ...]) -> str:
    kind, value = error["type"], error.get("input")
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return _unknown_field(loc)
    text = error["msg"]
    ctx = error.get("ctx") or {}
    if kind in _BOUNDS:
        return f"must be {_BOUNDS[kind]} {ctx[_BOUNDS_KEY[kind]]}, got {_show(value)}"
    if kind == "string_pattern_mismatch" and ctx.get("pattern") in _PATTERN_MEANING:
        return f"{_PATTERN_MEANING[ctx['pattern']]}, got {_show(value)}"
    if kind == "value_error":
        return text.removeprefix("Value error, ")
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"expected a mapping, got {_kind_of(value)}"
    text = text.replace("Input should be", "expected").replace("String should", "expected a string to")
    text = text.replace("List should", "expected a list to").replace("Dictionary should", "expected a mapping to")
    text = text.split(", unable to parse")[0]
    return f"{text}, got {_show(value)}"


_BOUNDS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
_BOUNDS_KEY = {"greater_than_equal": "ge", "greater_than": "gt", "less_than_equal": "le", "less_than": "lt"}
_PATTERN_MEANING = {
    DNS_LABEL_PATTERN: "must be lowercase letters, digits and '-', starting and ending with a letter or digit",
    IMAGE_PATTERN: "must be a container image reference without spaces",
    REWARD_REF_PATTERN: "must be a registered reward name or module:function",
    AGENT_REF_PATTERN: "must be module:function (an async function of the agent's package)",
    ENVIRONMENT_NAME_PATTERN: "must be a built-in environment such as 'swe-toy', or openenv:module:Class (an OpenEnv "
    "Environment subclass)",
}


def _unknown_field(loc: tuple[int | str, ...]) -> str:
    name = str(loc[-1]) if loc else "?"
    known = _known_fields(loc[:-1])
    if not known:
        return f"unknown field {name!r}"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else "expected one of: " + ", ".join(sorted(known))
    return f"unknown field {name!r}; {hint}"


def _known_fields(loc: tuple[int | str, ...]) -> list[str]:
    """The camelCase field names of the model at `loc` in an RLJob, if `loc` names a model."""
    cls: Any = RLJob
    for part in loc:
        if isinstance(part, int):
            continue
        fields = {(f.alias or n): f for n, f in cls.model_fields.items()}
        if part not in fields:
            return []
        cls = next(
            (a for a in _leaves(fields[part].annotation) if isinstance(a, type) and issubclass(a, BaseModel)), None
        )
        if cls is None:
            return []
    return [f.alias or n for n, f in cls.model_fields.items()]


def _leaves(annotation: Any) -> list[Any]:
    args = typing.get_args(annotation)
    return [leaf for arg in args for leaf in _leaves(arg)] if args else [annotation]


def _kind_of(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    return f"{type(value).__name__} {_show(value)}"


def _show(value: Any) -> str:
    if isinstance(value, dict | list):
        return _kind_of(value)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
