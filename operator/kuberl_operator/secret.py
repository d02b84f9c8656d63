"""The Secrets of a job's tokens: the sandbox token (rollout pods present it, sandbox servers check it) and the
job token (the learner presents it, rollout servers check it; sandbox pods never see it).

Tokens are inputs, not made here: builders stay pure, and the operator creates these Secrets once
(create-if-absent) so that a re-applied desired state never rotates a token pods already hold; each new job
gets new ones. They are therefore not part of desired_objects."""

from __future__ import annotations

from typing import Any

from kuberl.api.rljob import RLJob
from kuberl_operator.meta import ROLLOUT, SANDBOX, child_name, object_meta
from kuberl_operator.pod import JOB_TOKEN_KEY, SANDBOX_TOKEN_KEY, job_token_secret_name


def sandbox_token_secret_name(job: RLJob) -> str:
    return child_name(job, "sandbox-token")


def build_sandbox_token_secret(job: RLJob, namespace: str, owner: dict[str, Any] | None, token: str) -> dict[str, Any]:
    """The sandbox token, read by rollout and sandbox pods as an environment variable."""
    return _token_secret(
        job, namespace, owner, "sandbox", sandbox_token_secret_name(job), SANDBOX, SANDBOX_TOKEN_KEY, token
    )


def build_job_token_secret(job: RLJob, namespace: str, owner: dict[str, Any] | None, token: str) -> dict[str, Any]:
    """The job token, mounted as a file into learner and rollout pods (pod.workload_volumes)."""
    return _token_secret(job, namespace, owner, "job", job_token_secret_name(job), ROLLOUT, JOB_TOKEN_KEY, token)


def _token_secret(
    job: RLJob, namespace: str, owner: dict[str, Any] | None, what: str, name: str, tier: str, key: str, token: str
) -> dict[str, Any]:
    if not token:
        raise ValueError(f"RLJob {job.name!r}: the {what} token must not be empty")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": object_meta(job, name, tier, namespace, owner),
        "type": "Opaque",
        "stringData": {key: token},
    }
