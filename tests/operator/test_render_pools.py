"""`kuberl render JOB --tasks FILE`: one sandbox pool per environment image of the tasks, at zero pods, valid
Kubernetes (kubernetes-validate --strict); a template naming a field the tasks lack fails with one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import kubernetes_validate
import yaml
from helpers.kuberl_cli import kuberl_here

from kuberl.api.sandbox_images import pool_service_name

NEWEST = kubernetes_validate.utils.latest_version()
TEST_PATCH = (
    "diff --git a/tests/test_a.py b/tests/test_a.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/test_a.py\n"
    "@@ -0,0 +1,2 @@\n+def test_a():\n+    assert True\n"
)
IMAGE_FIELDS = ("image", "image_name", "docker_image")  # SWE-bench's, SWE-smith's, SWE-rebench's


def instance(i: int, **fields: str) -> dict:
    return {
        "instance_id": f"octo__lib-{i}",
        "repo": "octo/lib",
        "base_commit": f"{i:040x}",
        "patch": "",
        "test_patch": TEST_PATCH,
        "problem_statement": f"issue {i}",
        "FAIL_TO_PASS": ["tests/test_a.py::test_a"],
        "PASS_TO_PASS": [],
        **fields,
    }


def write_job(folder: Path, tasks: Path, **sandbox: object) -> Path:
    job = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "swe-pools", "namespace": "rl"},
        "spec": {
            "model": {"uri": "s3://models/tiny"},
            "checkpoint": {"uri": "s3://ckpt/swe-pools"},
            "environment": {"name": "swe-bench", "tasks": {"uri": str(tasks)}},
            "reward": {"function": "swe-bench-resolved"},
            "sandbox": sandbox,
        },
    }
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def write_instances(folder: Path, rows: list[dict]) -> Path:
    path = folder / "instances.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def render(*args: str) -> subprocess.CompletedProcess[str]:
    return kuberl_here("render", *args)


def test_twenty_images_render_twenty_pools_at_zero_valid_for_kubernetes(tmp_path):
    images = [f"registry.example.com/swe/instance-{i}:v1" for i in range(20)]
    rows = [instance(i, **{IMAGE_FIELDS[i % 3]: image}) for i, image in enumerate(images)]
    tasks = write_instances(tmp_path, rows)
    result = render(str(write_job(tmp_path, tasks)), "--tasks", str(tasks))
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    pools = {pool_service_name("swe-pools", image): image for image in images}
    deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    assert set(pools) <= set(deployments) and set(pools) <= set(services)
    assert len(set(deployments) - set(pools)) == 1  # the default pool
    for name, image in pools.items():
        deployment = deployments[name]
        assert deployment["spec"]["replicas"] == 0  # warmed by the operator at run time
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == image
        assert services[name]["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    for obj in objects:
        kubernetes_validate.validate(obj, NEWEST, strict=True)
    assert "20 sandbox pool(s)" in result.stderr


def test_an_image_template_names_the_pools_and_a_missing_field_is_one_line(tmp_path):
    tasks = write_instances(tmp_path, [instance(i) for i in range(3)])
    template = "docker.io/swebench/sweb.eval.x86_64.{swebench_id}:latest"
    result = render(str(write_job(tmp_path, tasks, imageTemplate=template)), "--tasks", str(tasks))
    assert result.returncode == 0, result.stderr
    images = {
        c["image"]
        for o in yaml.safe_load_all(result.stdout)
        if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert "docker.io/swebench/sweb.eval.x86_64.octo_1776_lib-2:latest" in images

    bad = render(
        str(write_job(tmp_path, tasks, imageTemplate="registry.example.com/{dataset_tag}:1")), "--tasks", str(tasks)
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert "spec.sandbox.imageTemplate" in bad.stderr and "{dataset_tag}" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def test_the_agent_sandbox_engine_renders_templates_and_warm_pools(tmp_path):
    tasks = write_instances(tmp_path, [instance(0, image="registry.example.com/swe/a:1")])
    result = render(str(write_job(tmp_path, tasks, pools={"engine": "agent-sandbox"})), "--tasks", str(tasks))
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    name = pool_service_name("swe-pools", "registry.example.com/swe/a:1")
    kinds = {o["kind"] for o in objects if o["metadata"]["name"] == name}
    assert kinds == {"Service", "SandboxTemplate", "SandboxWarmPool"}
    template = next(o for o in objects if o["kind"] == "SandboxTemplate")
    # the pod template is a valid PodTemplateSpec
    pod_template = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": name},
        "template": template["spec"]["podTemplate"],
    }
    kubernetes_validate.validate(pod_template, NEWEST, strict=True)
    warm = next(o for o in objects if o["kind"] == "SandboxWarmPool")
    assert warm["spec"] == {"replicas": 0, "sandboxTemplateRef": {"name": name}}


def test_a_missing_task_file_is_one_line(tmp_path):
    tasks = write_instances(tmp_path, [instance(0)])
    result = render(str(write_job(tmp_path, tasks)), "--tasks", str(tmp_path / "nope.jsonl"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"{tmp_path / 'nope.jsonl'}: file not found"]
