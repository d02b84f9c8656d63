"""Which image an episode runs in and its pool's name: rules the operator, the rollout tier and validation share."""

from __future__ import annotations

import json

import pytest

from kuberl.api.environment import Task
from kuberl.api.sandbox_images import (
    ImageTemplateError,
    episode_image,
    pool_key,
    pool_service_name,
    swebench_id,
    template_fields,
)
from kuberl.api.spec import SandboxSpec
from kuberl.api.types import DNS_LABEL_PATTERN
from kuberl.swebench.instances import read_tasks

SWEBENCH_TEMPLATE = "docker.io/swebench/sweb.eval.x86_64.{swebench_id}:latest"


def _row(instance_id: str, **extra: object) -> dict:
    return {
        "instance_id": instance_id,
        "repo": "django/django",
        "base_commit": "abcdef1",
        "test_patch": "diff --git a/t.py b/t.py\n",
        "problem_statement": "it breaks",
        "FAIL_TO_PASS": json.dumps(["tests/test_a.py::test_b"]),
        "version": 4.2,
        **extra,
    }


def _tasks(tmp_path, *rows: dict) -> list[Task]:
    path = tmp_path / "instances.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return read_tasks(path)


def test_swebench_naming_swaps_the_double_underscore():
    assert swebench_id("django__django-11099") == "django_1776_django-11099"
    assert swebench_id("Matplotlib__matplotlib-24026") == "matplotlib_1776_matplotlib-24026"


def test_the_instance_image_wins_in_each_datasets_spelling(tmp_path):
    rows = [
        _row("a__a-1", image="reg/a:1"),
        _row("b__b-2", image_name="reg/b:2"),
        _row("c__c-3", docker_image="reg/c:3"),
        _row("d__d-4"),
    ]
    sandbox = SandboxSpec.model_validate({"imageTemplate": SWEBENCH_TEMPLATE})
    images = [episode_image(task, sandbox) for task in _tasks(tmp_path, *rows)]
    assert images == ["reg/a:1", "reg/b:2", "reg/c:3", "docker.io/swebench/sweb.eval.x86_64.d_1776_d-4:latest"]


def test_without_image_or_template_the_default_pool_runs_the_task(tmp_path):
    (task,) = _tasks(tmp_path, _row("django__django-1"))
    assert episode_image(task, SandboxSpec()) is None


def test_a_template_takes_any_short_field_of_the_row(tmp_path):
    (task,) = _tasks(tmp_path, _row("django__django-1", env_tag="py311"))
    sandbox = SandboxSpec.model_validate({"imageTemplate": "reg/{repo_name}:{version}-{env_tag}"})
    assert episode_image(task, sandbox) == "reg/django:4.2-py311"
    assert "patch" not in template_fields(task) and "test_patch" not in template_fields(task)


def test_a_template_naming_a_missing_field_names_it_and_the_task(tmp_path):
    (task,) = _tasks(tmp_path, _row("django__django-1"))
    sandbox = SandboxSpec.model_validate({"imageTemplate": "reg/{image_tag}"})
    with pytest.raises(ImageTemplateError, match=r"imageTemplate refers to \{image_tag\}.*django__django-1"):
        episode_image(task, sandbox)


@pytest.mark.parametrize("template", ["reg/{0}", "reg/{a.b}", "reg/{unclosed"])
def test_a_template_that_is_not_a_field_format_is_refused(tmp_path, template):
    (task,) = _tasks(tmp_path, _row("django__django-1"))
    with pytest.raises(ImageTemplateError, match="imageTemplate"):
        episode_image(task, SandboxSpec.model_validate({"imageTemplate": template}))


def test_the_workdir_comes_from_the_row_else_testbed(tmp_path):
    tasks = _tasks(tmp_path, _row("a__a-1", workdir="/app"), _row("b__b-2"))
    assert [t.repository.workdir for t in tasks] == ["/app", "/testbed"]


def test_pool_names_are_dns_labels_and_differ_per_image():
    import re

    long_job = "j" * 40
    names = {pool_service_name(long_job, f"reg/image-{i}:latest") for i in range(500)}
    assert len(names) == 500
    assert all(re.fullmatch(DNS_LABEL_PATTERN, n) and len(n) <= 63 for n in names)
    assert pool_key("reg/a:1") == pool_key("reg/a:1") != pool_key("reg/a:2")
