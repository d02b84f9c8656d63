"""The environment variables one part of KubeRL sets and another reads: each name written once, here.

The operator (pod templates), `kuberl run` (its supervisor) and the tests set them; the tiers read them. A
name that both sides spell by hand drifts; import it from here instead.
"""

from __future__ import annotations

# --- the sandbox tier (read by `kuberl sandbox`; set by the operator's sandbox pods and `kuberl run`)
SANDBOX_TOKEN = "KUBERL_SANDBOX_TOKEN"
"""Shared secret of the sandbox API (`Authorization: Bearer`); also the rollout tier's, to call it."""
SANDBOX_ADVERTISE_URL = "KUBERL_SANDBOX_ADVERTISE_URL"
"""The server's own address, returned with each session it opens (in Kubernetes its pod IP)."""
SANDBOX_ROOT = "KUBERL_SANDBOX_ROOT"
"""Folder holding one folder per session."""
SANDBOX_PYTHON = "KUBERL_SANDBOX_PYTHON"
"""Interpreter sessions get as `python`."""
SANDBOX_ALLOW_SHARED_USER = "KUBERL_SANDBOX_ALLOW_SHARED_USER"
"""`1`: start unisolated when sessions cannot get users of their own (development only)."""
SANDBOX_REPOS = "KUBERL_SANDBOX_REPOS"
"""Folder of git repositories (`owner__name`) that sessions of SWE-bench-format tasks start from."""
SANDBOX_ENVIRONMENTS = "KUBERL_SANDBOX_ENVIRONMENTS"
"""Folder of prepared environments (`kuberl tasks prepare`) those sessions run in."""
SANDBOX_EGRESS = "KUBERL_SANDBOX_EGRESS"
"""`allow`: sessions reach the internet through a guarded user-mode network stack; else (`deny`) only their
own loopback (spec.sandbox.egress)."""
SANDBOX_NETWORK_NAMESPACE = "KUBERL_SANDBOX_NETWORK_NAMESPACE"
"""`0`: sessions share the server's network, to measure what their own costs (benchmarks only)."""
SANDBOX_HIDDEN = "KUBERL_SANDBOX_HIDDEN"
"""Colon-separated folders sessions must not see, beside the server's own installation (a run's task store)."""
SANDBOX_FOREIGN_IMAGE = "KUBERL_SANDBOX_FOREIGN_IMAGE"
"""`1`: the server runs from its portable bundle inside a task's own image (kuberl.portable_server): a repository
task's workspace is a copy of its `workdir` in the image and its commands use the image's own environment."""

# --- the job token (read with `kuberl.tokens.read_job_token`; set by the operator's learner and rollout pods and
# `kuberl run`, never given to sandbox pods)
JOB_TOKEN_FILE = "KUBERL_JOB_TOKEN_FILE"
"""A file holding the job token (a mounted Secret in a pod); wins over JOB_TOKEN. Rollout servers ask every
caller but the probes for it (`Authorization: Bearer`); the learner presents it."""
JOB_TOKEN = "KUBERL_JOB_TOKEN"
"""The job token itself, for a process started by hand."""

# --- the rollout tier
SANDBOX_URLS = "KUBERL_SANDBOX_URLS"
"""Comma-separated sandbox server addresses the rollout server opens sessions on."""
SANDBOX_POOL_URL = "KUBERL_SANDBOX_POOL_URL"
"""The address of an image's sandbox pool with `{pool}` where the pool's Service name goes
(kuberl.api.sandbox_images.pool_service_name), e.g. `http://{pool}.ns.svc.cluster.local:8700`; a task whose
episode image is set opens its session there, the others on SANDBOX_URLS."""

# --- vLLM's CPU engine in the rollout server
OMP_NUM_THREADS = "OMP_NUM_THREADS"
VLLM_CPU_OMP_THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"


def cpu_engine_threads(threads: int) -> dict[str, str]:
    """The environment that gives vLLM's CPU engine `threads` OpenMP threads, unpinned.

    Left to itself the engine binds one thread per core it can see: both cores of a 2-core machine that the
    learner and the sandboxes share, or every core of the node in a pod without a static CPU policy. For a
    small model the second thread mostly spin-waits between tiny kernels: measured on the demo's model, the
    engine took 41 of 60 CPU-seconds with two threads and 16 of 45 with one, and the demo's 12-group waves
    went from 13-18 s to 8-10 s (docs/getting-started.md).
    """
    return {VLLM_CPU_OMP_THREADS_BIND: "nobind", OMP_NUM_THREADS: str(max(1, threads))}


# --- the learner (set by the operator's learner pods and by `kuberl run`)
JOB_NAME = "KUBERL_JOB_NAME"
"""The RLJob the learner reports its status into."""
NAMESPACE = "KUBERL_NAMESPACE"
"""Its namespace (the downward API in a pod)."""
JOB_STARTED_AT = "KUBERL_JOB_STARTED_AT"
"""Unix time the job started (the wall-clock breaker counts from it)."""
STAGING = "KUBERL_STAGING"
"""Local folder where checkpoints are written before upload."""

# --- every tier
CACHE = "KUBERL_CACHE"
"""Where models and task files fetched from S3 are cached."""

# --- the operator (set by the Helm chart, read by `kuberl operator`)
OPERATOR_INTERVAL = "KUBERL_OPERATOR_INTERVAL"
OPERATOR_AUTOSCALE_INTERVAL = "KUBERL_OPERATOR_AUTOSCALE_INTERVAL"
OPERATOR_METRICS_PORT = "KUBERL_OPERATOR_METRICS_PORT"
OPERATOR_WATCH_NODES = "KUBERL_OPERATOR_WATCH_NODES"
OPERATOR_WORKERS = "KUBERL_OPERATOR_WORKERS"
OPERATOR_SANDBOX_USER_NAMESPACE = "KUBERL_OPERATOR_SANDBOX_USER_NAMESPACE"
OPERATOR_SANDBOX_APPARMOR_PROFILE = "KUBERL_OPERATOR_SANDBOX_APPARMOR_PROFILE"
OPERATOR_SANDBOX_SECCOMP_PROFILE = "KUBERL_OPERATOR_SANDBOX_SECCOMP_PROFILE"
OPERATOR_JOB_IMAGE_REGISTRY = "KUBERL_OPERATOR_JOB_IMAGE_REGISTRY"
"""Prefix of the images of jobs that name none: <prefix>/learner:<tag>, <prefix>/rollout:<tag>, ..."""
OPERATOR_JOB_IMAGE_TAG = "KUBERL_OPERATOR_JOB_IMAGE_TAG"
"""Tag of those images; unset: the operator's KubeRL version."""
OPERATOR_JOB_IMAGE_PULL_SECRETS = "KUBERL_OPERATOR_JOB_IMAGE_PULL_SECRETS"
"""Comma-separated Secret names every job pod is pulled with (each in the job's namespace)."""
OPERATOR_NAMESPACE = "KUBERL_OPERATOR_NAMESPACE"
"""The operator's own namespace: the jobs' rollout pods admit its scrapes from there."""
OPERATOR_MONITORING_NAMESPACE = "KUBERL_OPERATOR_MONITORING_NAMESPACE"
"""The namespace whose pods may scrape every job pod's metrics port; empty for none."""
WATCH_SERVER_TIMEOUT = "KUBERL_WATCH_SERVER_TIMEOUT"
