"""SWE-bench-format instances: a real repository at a base commit, a hidden test patch, pytest test ids.

An instance is read as the public datasets write it (SWE-bench, SWE-Gym, SWE-smith, SWE-rebench, R2E-Gym):
SWE-bench's field names, FAIL_TO_PASS / PASS_TO_PASS as JSON lists or as JSON-encoded strings, and whatever
extra keys a dataset adds (kept, never refused). `RepositoryTask` is what a sandbox session needs of one:
it travels inside a `Task` to the sandbox server, which alone reads the test patch.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from kuberl.api.base import ApiModel

COMMIT_PATTERN = r"^[0-9a-f]{7,40}$"
REPO_PATTERN = r"^[A-Za-z0-9_.\-]+/[A-Za-z0-9_.\-]+$"


def _json_list(value: Any) -> Any:
    """A list of test ids as datasets store it: a JSON list, or a string holding one (SWE-bench on the Hub)."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else []
        except json.JSONDecodeError:
            raise ValueError("expected a JSON list of test ids (or a string holding one)") from None
    return value


def _text(value: Any) -> Any:
    """Versions come as strings ("1.3") or, from some exports, as numbers."""
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


TestIds = Annotated[list[Annotated[str, Field(min_length=1)]], BeforeValidator(_json_list)]
"""Pytest node ids (`tests/test_x.py::TestY::test_z[case]`)."""


class InstallConfig(BaseModel):
    """How an instance's environment is made, SWE-rebench-V2 style (`install_config` of a row)."""

    model_config = ConfigDict(extra="allow")

    python: Annotated[str | None, BeforeValidator(_text)] = None
    """The Python version the environment needs, e.g. "3.11"; unset: the sandbox's own."""
    install: list[str] | str = Field(default_factory=list)
    """Shell commands run in the repository at its environment commit with the environment's venv first on
    PATH (e.g. `pip install -e .`)."""
    pip_packages: list[str] | str = Field(default_factory=list)
    """Extra requirements installed before the commands (e.g. `pytest==8.3.3`)."""
    pre_install: list[str] | str = Field(default_factory=list)
    """Commands run before `pip_packages` (system packages cannot be installed here: they are refused)."""
    test_cmd: str | list[str] | None = None
    """The dataset's test command; KubeRL runs pytest itself and keeps this for reference."""
    log_parser: str | None = None
    """The dataset's log parser name; only pytest's is supported (the per-test outcomes come from a report)."""

    @field_validator("install", "pip_packages", "pre_install", mode="after")
    @classmethod
    def _as_list(cls, value: list[str] | str) -> list[str] | str:
        return [value] if isinstance(value, str) and value.strip() else [] if isinstance(value, str) else value

    def commands(self) -> list[str]:
        return list(self.install) if isinstance(self.install, list) else [self.install]

    def packages(self) -> list[str]:
        packages = self.pip_packages if isinstance(self.pip_packages, list) else [self.pip_packages]
        return [p for item in packages for p in item.split()]


class SWEBenchInstance(BaseModel):
    """One row of a SWE-bench-format dataset, with SWE-bench's own field names."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    instance_id: str = Field(min_length=1, max_length=256)
    repo: Annotated[str, Field(pattern=REPO_PATTERN)]
    """`owner/name`; the mirror holds it as `owner__name`."""
    base_commit: Annotated[str, Field(pattern=COMMIT_PATTERN)]
    patch: str = ""
    """The gold fix (a unified diff); needed by `kuberl tasks check`, never shown to the agent."""
    test_patch: str = Field(min_length=1)
    """The tests that check the fix (a unified diff), applied only when scoring."""
    problem_statement: str = Field(min_length=1)
    hints_text: str = ""
    created_at: str | None = None
    version: Annotated[str | None, BeforeValidator(_text)] = None
    environment_setup_commit: Annotated[str | None, Field(pattern=COMMIT_PATTERN)] = None
    """The commit the environment is built from; unset: `base_commit`."""
    fail_to_pass: TestIds = Field(alias="FAIL_TO_PASS", min_length=1)
    pass_to_pass: TestIds = Field(alias="PASS_TO_PASS", default_factory=list)
    image: str | None = Field(None, validation_alias=AliasChoices("image", "image_name", "docker_image"))
    """An image that holds the instance's environment (used on a cluster): SWE-bench's `image`, SWE-smith's
    `image_name` or SWE-rebench's `docker_image`."""
    workdir: str | None = Field(None, pattern=r"^/[^\s]*$")
    """Where the repository lives inside the image; unset: /testbed (SWE-bench's images)."""
    install_config: InstallConfig | None = None

    @property
    def mirror_name(self) -> str:
        """The repository's folder in a mirror, named as SWE-bench names its images: `owner__name`."""
        return self.repo.replace("/", "__")

    @property
    def environment_commit(self) -> str:
        return self.environment_setup_commit or self.base_commit

    @property
    def extra_fields(self) -> dict[str, Any]:
        """The keys a dataset added beyond SWE-bench's (kept as they came)."""
        return dict(self.model_extra or {})


DEFAULT_WORKDIR = "/testbed"
ENVIRONMENT_KEY_PATTERN = r"^[0-9a-f]{16,64}$"
_NODE_FILE = re.compile(r"^([^:\[\s]+\.py)(::|$)")


def test_file_of(node_id: str) -> str | None:
    """The test file a pytest node id names (`tests/test_x.py::test_y` -> `tests/test_x.py`), if any."""
    match = _NODE_FILE.match(node_id)
    return match.group(1) if match else None


class RepositoryTask(ApiModel):
    """A task on a real repository, as a sandbox session needs it: where the workspace comes from, which
    prepared environment runs it, and how it is scored (SWE-bench's rules; docs/tasks.md)."""

    repo: Annotated[str, Field(pattern=REPO_PATTERN)]
    """`owner/name` of a repository in the sandbox's mirror."""
    base_commit: Annotated[str, Field(pattern=COMMIT_PATTERN)]
    """The workspace starts as this commit's tree (without its history)."""
    environment: Annotated[str, Field(pattern=ENVIRONMENT_KEY_PATTERN)]
    """The key of the prepared environment (a virtualenv) the session's commands and tests run in."""
    test_patch: str = Field(min_length=1)
    """Applied to a scratch copy of the workspace at submit; the agent never sees it."""
    fail_to_pass: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    """Pytest node ids that must pass after the fix (and fail before it)."""
    pass_to_pass: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    """Pytest node ids that pass before the fix and must still pass."""
    workdir: Annotated[str, Field(pattern=r"^/[^\s]*$", max_length=1024)] = DEFAULT_WORKDIR
    """Where the repository lives inside the task's own image (a sandbox server running in that image copies
    it as the workspace and runs the image's own environment); SWE-bench's images keep it at /testbed."""

    @field_validator("fail_to_pass", "pass_to_pass")
    @classmethod
    def _name_test_files(cls, ids: list[str]) -> list[str]:
        if unnamed := [i for i in ids if test_file_of(i) is None]:
            raise ValueError(f"expected pytest node ids that name a test file (path.py::test), got {unnamed[:3]}")
        return ids

    @property
    def test_files(self) -> list[str]:
        """The test files the ids name, in order of first mention."""
        files = (test_file_of(i) for i in [*self.fail_to_pass, *self.pass_to_pass])
        return list(dict.fromkeys(f for f in files if f is not None))
