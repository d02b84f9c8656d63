"""The job token in a cluster: one Secret per job, made once with a fresh token, mounted as a read-only file into
learner and rollout pods (which read it through KUBERL_JOB_TOKEN_FILE) and never into sandbox pods, where
untrusted code runs."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from conftest import EXAMPLES

from kuberl.api import env_vars
from kuberl.api.rljob import RLJob
from kuberl.validation import load_rljob
from kuberl_operator.apply import apply_children, delete_children
from kuberl_operator.desired import desired_objects
from kuberl_operator.meta import owner_reference
from kuberl_operator.secret import build_job_token_secret

UID = "6f1c2a5e-0d4b-4c1e-9a53-1f2d3c4b5a69"


@pytest.fixture(params=EXAMPLES, ids=[p.stem for p in EXAMPLES])
def example(request) -> RLJob:
    return load_rljob(str(request.param))


def pod_specs(job: RLJob) -> dict[str, dict[str, Any]]:
    """tier -> the pod spec of its workload."""
    objects = desired_objects(job, "ns", owner=owner_reference(job, UID))
    workloads = [o for o in objects if o["kind"] in ("StatefulSet", "Deployment")]
    return {w["metadata"]["labels"]["kuberl.io/tier"]: w["spec"]["template"]["spec"] for w in workloads}


def secret_volumes(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v["secret"] for v in spec["volumes"] if "secret" in v}


def test_learner_and_rollout_pods_read_the_job_token_from_a_read_only_secret_file(example):
    pods = pod_specs(example)
    for tier in ("learner", "rollout"):
        spec = pods[tier]
        secret = secret_volumes(spec)["job-token"]
        assert secret["secretName"] == f"{example.name}-job-token"
        assert secret["items"] == [{"key": "token", "path": "token"}] and secret["defaultMode"] == 0o440
        [container] = spec["containers"]
        [mount] = [m for m in container["volumeMounts"] if m["name"] == "job-token"]
        assert mount["readOnly"] is True
        env = {e["name"]: e for e in container["env"]}
        assert env[env_vars.JOB_TOKEN_FILE] == {"name": env_vars.JOB_TOKEN_FILE, "value": f"{mount['mountPath']}/token"}
        assert env_vars.JOB_TOKEN not in env  # the value is never in a manifest


def test_sandbox_pods_never_see_the_job_token(example):
    spec = pod_specs(example)["sandbox"]
    assert secret_volumes(spec) == {}
    assert all(e["name"] not in (env_vars.JOB_TOKEN, env_vars.JOB_TOKEN_FILE) for e in spec["containers"][0]["env"])
    referenced = [
        e["valueFrom"]["secretKeyRef"]["name"]
        for e in spec["containers"][0]["env"]
        if "secretKeyRef" in e.get("valueFrom", {})
    ]
    assert referenced == [f"{example.name}-sandbox-token"]


def test_the_job_token_secret_is_built_from_a_given_token(example):
    secret = build_job_token_secret(example, "ns", owner_reference(example, UID), "s3cr3t")
    kubernetes_validate.validate(secret, kubernetes_validate.utils.latest_version(), strict=True)
    assert secret["metadata"]["name"] == f"{example.name}-job-token" and secret["stringData"] == {"token": "s3cr3t"}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == UID  # gone with the job
    with pytest.raises(ValueError, match="must not be empty"):
        build_job_token_secret(example, "ns", None, "")


class RecordingKube:
    """Creates (create-if-absent), applies and deletes in memory."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    def create(self, obj: dict[str, Any], exist_ok: bool = False) -> dict[str, Any] | None:
        key = f"{obj['kind']}/{obj['metadata']['name']}"
        if key in self.objects:
            return None
        self.objects[key] = obj
        return obj

    def get(self, path: str) -> None:
        return None

    def apply(self, obj: dict[str, Any], manager: str) -> None:
        self.objects[f"{obj['kind']}/{obj['metadata']['name']}"] = obj

    def delete(self, path: str) -> bool:
        return True


def test_each_job_gets_its_own_token_once_and_a_reapply_never_rotates_it():
    jobs = [RLJob.model_validate({"metadata": {"name": name, "namespace": "ns"}, "spec": {}}) for name in ("a", "b")]
    kube = RecordingKube()
    for job in jobs:
        written = apply_children(kube, job, "ns", UID, scaled_down=False, new=True)  # type: ignore[arg-type]
        assert f"Secret/{job.name}-job-token" in written
    tokens = {job.name: kube.objects[f"Secret/{job.name}-job-token"]["stringData"]["token"] for job in jobs}
    assert tokens["a"] != tokens["b"] and len(tokens["a"]) >= 40
    sandbox_tokens = {kube.objects[f"Secret/{job.name}-sandbox-token"]["stringData"]["token"] for job in jobs}
    assert not sandbox_tokens & set(tokens.values())  # the sandbox token is another secret
    again = apply_children(kube, jobs[0], "ns", UID, scaled_down=False)  # type: ignore[arg-type]
    assert (
        "Secret/a-job-token" not in again and kube.objects["Secret/a-job-token"]["stringData"]["token"] == tokens["a"]
    )
    assert "Secret/a-job-token" in delete_children(kube, jobs[0], "ns")  # type: ignore[arg-type]
