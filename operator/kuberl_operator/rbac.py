"""ServiceAccount, Role and RoleBinding of a job's learner: the only pods that talk to the API server."""

from __future__ import annotations

from typing import Any

from kuberl.api.rljob import RLJob
from kuberl.api.spec import API_VERSION
from kuberl_operator.meta import CONFIG, LEARNER, child_name, object_meta

RBAC_API = "rbac.authorization.k8s.io/v1"


def service_account_name(job: RLJob) -> str:
    return child_name(job, LEARNER)


def build_service_account(job: RLJob, namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    """The learner's identity. No token is mounted by default: the learner pod opts in, rollout and
    sandbox pods never do."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": object_meta(job, service_account_name(job), LEARNER, namespace, owner),
        "automountServiceAccountToken": False,
    }


def role_rules(job: RLJob) -> list[dict[str, Any]]:
    """Least privilege, every rule pinned to this job's objects by resourceNames:
    - get its own RLJob: the learner reads spec changes (e.g. suspend) and the status it is about to patch;
    - get and patch its own RLJob's status subresource: it reports step, reward, staleness and its final
      checkpoint there (the main resource is not patchable, so it cannot change its own spec);
    - get its own ConfigMap: the resolved job it runs.
    No list or watch (those cannot be limited by resourceNames), no create or delete, no wildcards."""
    group = API_VERSION.split("/")[0]
    return [
        {"apiGroups": [group], "resources": ["rljobs"], "resourceNames": [job.name], "verbs": ["get"]},
        {"apiGroups": [group], "resources": ["rljobs/status"], "resourceNames": [job.name], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [child_name(job, CONFIG)], "verbs": ["get"]},
    ]


def build_role(job: RLJob, namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "apiVersion": RBAC_API,
        "kind": "Role",
        "metadata": object_meta(job, service_account_name(job), LEARNER, namespace, owner),
        "rules": role_rules(job),
    }


def build_role_binding(job: RLJob, namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    name = service_account_name(job)
    return {
        "apiVersion": RBAC_API,
        "kind": "RoleBinding",
        "metadata": object_meta(job, name, LEARNER, namespace, owner),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
    }
