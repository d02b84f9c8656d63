"""Which environment image an episode's sandbox runs in, and the name of that image's pool: one rule each, used
by the operator (which keeps the pools), the rollout tier (which opens sessions on them) and `kuberl validate`.

An episode runs in its task's own `image` (an instance's `image`, `image_name` or `docker_image`), else in
spec.sandbox.imageTemplate filled from the task's fields, else on the job's sandbox image (the default pool).
"""

from __future__ import annotations

import hashlib
import re
import string
from collections.abc import Mapping
from typing import Any

from kuberl.api.environment import Task
from kuberl.api.spec import SandboxSpec

POOL_KEY_LENGTH = 10
"""Hex digits of an image's digest in its pool's name: collisions stay negligible for thousands of images."""
_POOL_PREFIX_MAX = 63 - len("-sbx-") - POOL_KEY_LENGTH


class ImageTemplateError(ValueError):
    """A template that names a field a task lacks, or that is not a format string; the message names both."""


def swebench_id(instance_id: str) -> str:
    """An instance id as SWE-bench's namespaced images spell it: `__` as `_1776_`, lower case
    (`django__django-11099` -> `django_1776_django-11099`)."""
    return instance_id.replace("__", "_1776_").lower()


def template_fields(task: Task) -> dict[str, str]:
    """The values a template may name: the task's scalar metadata (an instance's own fields: `instance_id`,
    `repo`, `version`, `base_commit`, ...), `task_id`, and the derived `swebench_id`, `repo_owner` and
    `repo_name`."""
    fields = {k: str(v) for k, v in task.metadata.items() if isinstance(v, str | int | float) and v is not None}
    fields.setdefault("instance_id", task.task_id)
    fields["task_id"] = task.task_id
    fields["swebench_id"] = swebench_id(fields["instance_id"])
    if "/" in fields.get("repo", ""):
        fields["repo_owner"], fields["repo_name"] = fields["repo"].split("/", 1)
    return fields


def template_names(template: str) -> list[str]:
    """The field names a template refers to, in order; ImageTemplateError when it is not a format string."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as error:
        raise ImageTemplateError(f"spec.sandbox.imageTemplate {template!r}: {error}") from None
    names = [name for _, name, _, _ in parsed if name is not None]
    if bad := [n for n in names if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n)]:
        raise ImageTemplateError(
            f"spec.sandbox.imageTemplate {template!r}: {{{bad[0]}}} is not a field name (write {{instance_id}}, "
            "{swebench_id}, {repo_name}, ...)"
        )
    return names


def fill_template(template: str, fields: Mapping[str, Any], task_id: str) -> str:
    """The template with the task's fields in it; ImageTemplateError naming the first field the task lacks."""
    for name in template_names(template):
        if name not in fields:
            known = ", ".join(sorted(fields))
            raise ImageTemplateError(
                f"spec.sandbox.imageTemplate refers to {{{name}}}, which task {task_id} lacks; its fields: {known}"
            )
    image = template.format_map(dict(fields))
    if not image or any(c.isspace() for c in image):
        raise ImageTemplateError(f"spec.sandbox.imageTemplate gives {image!r} for task {task_id}: not an image name")
    return image


def episode_image(task: Task, sandbox: SandboxSpec) -> str | None:
    """The image `task`'s episodes run in: its own, else the template's; None: the job's default pool."""
    if task.image is not None:
        return task.image
    if sandbox.image_template is None:
        return None
    return fill_template(sandbox.image_template, template_fields(task), task.task_id)


def pool_key(image: str) -> str:
    """A short, stable key of an image (a digest of its reference)."""
    return hashlib.sha256(image.encode()).hexdigest()[:POOL_KEY_LENGTH]


def pool_service_name(job_name: str, image: str) -> str:
    """The name of `image`'s pool in job `job_name` (its Deployment and Service): a DNS label,
    `<job>-sbx-<key>`, the job's name cut to fit."""
    prefix = job_name[:_POOL_PREFIX_MAX].rstrip("-")
    return f"{prefix}-sbx-{pool_key(image)}"
