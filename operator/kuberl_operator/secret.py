"""The Secret holding a job's sandbox token (rollout pods present it, sandbox servers check it)."""

from __future__ import annotations

from typing import Any

from kuberl.api.rljob import RLJob
from kuberl_operator.meta import SANDBOX, child_name, object_meta
from kuberl_operator.pod import SANDBOX_TOKEN_KEY


def sandbox_token_secret_name(job: RLJob) -> str:
    return child_name(job, "sandbox-token")


def build_sandbox_token_secret(job: RLJob, namespace: str, owner: dict[str, Any] | None, token: str) -> dict[str, Any]:
    """The token is an input, not made here: builders stay pure, and the operator creates this Secret
    once (create-if-absent) so that a re-applied desired state never rotates a token pods already hold.
    It is therefore not part of desired_objects."""
    if not token:
        raise ValueError(f"RLJob {job.name!r}: the sandbox token must not be empty")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": object_meta(job, sandbox_token_secret_name(job), SANDBOX, namespace, owner),
        "type": "Opaque",
        "stringData": {SANDBOX_TOKEN_KEY: token},
    }
