"""Pieces the tiers share: file layout, volumes, environment, resources and probes of their pods, and the
skeletons of their Services and StatefulSets."""

from __future__ import annotations

from typing import Any

from kuberl.api import env_vars
from kuberl.api.rljob import RLJob
from kuberl.api.spec import GPU_RESOURCE, ResourceRequirements
from kuberl.api.types import quantity_value
from kuberl_operator.meta import CONFIG, child_name, common_labels, object_meta, selector_labels

# The job file every entrypoint reads (`kuberl rollout-server JOB.yaml`, `kuberl learner JOB.yaml`).
JOB_DIR = "/etc/kuberl"
JOB_FILE_KEY = "job.yaml"
JOB_FILE = f"{JOB_DIR}/{JOB_FILE_KEY}"
# Root filesystems are read-only; these emptyDirs take every write.
CACHE_DIR = "/var/cache/kuberl"  # model downloads (KUBERL_CACHE) and Hugging Face files
RUN_DIR = "/var/lib/kuberl/run"  # learner metrics.jsonl, status.json, checkpoint staging
TMP_DIR = "/tmp"

SANDBOX_TOKEN_KEY = "token"
TOKEN_ENV = env_vars.SANDBOX_TOKEN
# The job token (kuberl.tokens): a file of a read-only Secret volume, in learner and rollout pods only
JOB_TOKEN_KEY = "token"
JOB_TOKEN_DIR = "/var/run/secrets/kuberl.io/job-token"
JOB_TOKEN_FILE = f"{JOB_TOKEN_DIR}/{JOB_TOKEN_KEY}"
JOB_TOKEN_VOLUME = "job-token"


def resources(spec: ResourceRequirements) -> dict[str, Any]:
    """Kubernetes resources from the spec; empty sections are left out rather than written as {}."""
    out: dict[str, Any] = {}
    if spec.requests:
        out["requests"] = dict(spec.requests)
    if spec.limits:
        out["limits"] = dict(spec.limits)
    return out


def cpu_engine_env(spec: ResourceRequirements) -> list[dict[str, Any]]:
    """A CPU rollout pod's vLLM engine gets as many OpenMP threads as the pod has cores (the CPU limit, else
    the request): left to itself it binds a thread per core of the node it can see. GPU pods and pods without
    a CPU amount keep vLLM's own choice."""
    if GPU_RESOURCE in spec.limits or GPU_RESOURCE in spec.requests:
        return []
    cpu = spec.limits.get("cpu", spec.requests.get("cpu"))
    return [] if cpu is None else env_list(env_vars.cpu_engine_threads(int(quantity_value(cpu))))


def env_list(values: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in values.items()]


def runtime_env() -> list[dict[str, Any]]:
    """HOME and caches on writable volumes (vLLM, triton and Hugging Face write under HOME); no hub
    access: models come from spec.model.uri."""
    values = {
        "HOME": TMP_DIR,
        env_vars.CACHE: CACHE_DIR,
        "HF_HOME": f"{CACHE_DIR}/huggingface",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    return env_list(values)


def storage_env(job: RLJob) -> list[dict[str, Any]]:
    """S3 credentials from spec.checkpoint.credentialsSecret and the endpoint of an S3-compatible store, as
    kuberl.storage and the checkpoint store read them. Only the learner and rollout tiers get these: they
    read the model and tasks and write checkpoints; untrusted sandbox code never sees them."""
    checkpoint = job.spec.checkpoint
    env: list[dict[str, Any]] = []
    if checkpoint.credentials_secret:
        env += [
            {"name": key, "valueFrom": {"secretKeyRef": {"name": checkpoint.credentials_secret, "key": key}}}
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
        ]
    if checkpoint.endpoint_url:
        env.append({"name": "AWS_ENDPOINT_URL", "value": checkpoint.endpoint_url})
    return env


def sandbox_token_env(secret_name: str) -> dict[str, Any]:
    """The sandbox token from its Secret, never inline in a manifest."""
    return {"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": SANDBOX_TOKEN_KEY}}}


def job_token_secret_name(job: RLJob) -> str:
    return child_name(job, "job-token")


def job_token_env() -> dict[str, Any]:
    """Where the job token is read from: the file of its Secret volume, never the value in a manifest."""
    return {"name": env_vars.JOB_TOKEN_FILE, "value": JOB_TOKEN_FILE}


def job_volume(job: RLJob) -> dict[str, Any]:
    items = [{"key": JOB_FILE_KEY, "path": JOB_FILE_KEY}]
    return {"name": "job", "configMap": {"name": child_name(job, CONFIG), "items": items}}


def empty_dir(name: str, medium: str | None = None) -> dict[str, Any]:
    return {"name": name, "emptyDir": {"medium": medium} if medium else {}}


def workload_volumes(job: RLJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts) of the learner and rollout tiers: the job file, the job token (its Secret's one key,
    readable by the pod's group only), caches, /tmp and a RAM-backed /dev/shm (the default 64 MiB one breaks
    NCCL and vLLM's worker processes)."""
    token = {"key": JOB_TOKEN_KEY, "path": JOB_TOKEN_KEY}
    secret = {"secretName": job_token_secret_name(job), "defaultMode": 0o440, "items": [token]}
    volumes = [
        job_volume(job),
        {"name": JOB_TOKEN_VOLUME, "secret": secret},
        empty_dir("cache"),
        empty_dir("tmp"),
        empty_dir("dshm", "Memory"),
    ]
    mounts = [
        {"name": "job", "mountPath": JOB_DIR, "readOnly": True},
        {"name": JOB_TOKEN_VOLUME, "mountPath": JOB_TOKEN_DIR, "readOnly": True},
        {"name": "cache", "mountPath": CACHE_DIR},
        {"name": "tmp", "mountPath": TMP_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    return volumes, mounts


def http_probe(path: str, port: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def parallel_statefulset(
    job: RLJob,
    tier: str,
    namespace: str,
    owner: dict[str, Any] | None,
    *,
    replicas: int,
    update_strategy: str,
    pod_spec: dict[str, Any],
) -> dict[str, Any]:
    """A tier's StatefulSet behind its headless Service of the same name. Parallel pod management: the
    pods of a tier start (and stop) at once, never one after another."""
    name = child_name(job, tier)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": object_meta(job, name, tier, namespace, owner),
        "spec": {
            "serviceName": name,
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": update_strategy},
            "selector": {"matchLabels": selector_labels(job, tier)},
            "template": {"metadata": {"labels": common_labels(job, tier)}, "spec": pod_spec},
        },
    }


def tier_service(job: RLJob, tier: str, namespace: str, owner: dict[str, Any] | None, spec: dict[str, Any]) -> dict:
    """The Service named after a tier (what its spec says differs by tier)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(job, child_name(job, tier), tier, namespace, owner),
        "spec": spec,
    }
