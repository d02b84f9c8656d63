"""The rollout tier: a StatefulSet of rollout servers (one vLLM engine each) behind a headless Service."""

from __future__ import annotations

from typing import Any

from kuberl.api.command_lines import rollout_server_command
from kuberl.api.env_vars import SANDBOX_POOL_URL
from kuberl.api.rljob import RLJob
from kuberl_operator.images import JobImages
from kuberl_operator.meta import ROLLOUT, SANDBOX, child_name, selector_labels
from kuberl_operator.placement import pod_placement
from kuberl_operator.pod import (
    JOB_FILE,
    cpu_engine_env,
    env_list,
    http_probe,
    job_token_env,
    parallel_statefulset,
    resources,
    runtime_env,
    sandbox_token_env,
    storage_env,
    tier_service,
    workload_volumes,
)
from kuberl_operator.security import restricted_container_security_context, restricted_pod_security_context

ROLLOUT_PORT = 8800  # `kuberl rollout-server --port` default; serves the API, /readyz, /healthz, /metrics
SANDBOX_PORT = 8700  # `kuberl sandbox` in env-images/sandbox/Dockerfile
# Losing a rollout pod costs at most its in-flight trajectories; a short grace lets them finish.
TERMINATION_GRACE_SECONDS = 60


def rollout_urls(job: RLJob, namespace: str) -> list[str]:
    """One URL per rollout server, by the stable pod names the headless Service gives: the learner spreads
    task groups over them and publishes weights to each."""
    name = child_name(job, ROLLOUT)
    return [f"http://{name}-{i}.{name}.{namespace}.svc:{ROLLOUT_PORT}" for i in range(job.spec.rollout.replicas)]


def sandbox_url(job: RLJob, namespace: str) -> str:
    return f"http://{child_name(job, SANDBOX)}.{namespace}.svc:{SANDBOX_PORT}"


def sandbox_pool_url(namespace: str) -> str:
    """The address of an image's sandbox pool with `{pool}` where its Service's name goes
    (kuberl.api.sandbox_images.pool_service_name): tasks with an image of their own open sessions there."""
    return f"http://{{pool}}.{namespace}.svc:{SANDBOX_PORT}"


def rollout_replicas(job: RLJob) -> int:
    return 0 if job.spec.suspend else job.spec.rollout.replicas


def build_rollout_service(job: RLJob, namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    """Headless: it gives every rollout pod the stable DNS name the learner addresses it by."""
    return tier_service(
        job,
        ROLLOUT,
        namespace,
        owner,
        {
            "clusterIP": "None",
            "selector": selector_labels(job, ROLLOUT),
            "ports": [{"name": "http", "port": ROLLOUT_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    )


def rollout_env(job: RLJob, namespace: str, sandbox_token_secret: str) -> list[dict[str, Any]]:
    """The rollout server's environment: the tokens, storage, the CPU engine's threads, where the pools are."""
    return [
        sandbox_token_env(sandbox_token_secret),
        job_token_env(),  # what its callers present
        *runtime_env(),
        *storage_env(job),
        *cpu_engine_env(job.spec.rollout.resources),
        *env_list({SANDBOX_POOL_URL: sandbox_pool_url(namespace)}),
    ]


def build_rollout_statefulset(
    job: RLJob,
    namespace: str,
    owner: dict[str, Any] | None,
    sandbox_token_secret: str,
    images: JobImages | None = None,
) -> dict[str, Any]:
    """The same `kuberl rollout-server JOB.yaml` as `kuberl run`. Ready on /readyz once the engine holds
    weights; a startup probe covers downloading and loading a large model before liveness applies.
    `images`: the operator's image defaults (its environment's by default)."""
    images = images or JobImages.from_env()
    volumes, mounts = workload_volumes(job)
    argv = rollout_server_command(JOB_FILE, "0.0.0.0", ROLLOUT_PORT, [sandbox_url(job, namespace)])
    container = {
        "name": ROLLOUT,
        "image": images.image(job, ROLLOUT),
        "command": argv,
        "env": rollout_env(job, namespace, sandbox_token_secret),
        "ports": [{"name": "http", "containerPort": ROLLOUT_PORT, "protocol": "TCP"}],
        "resources": resources(job.spec.rollout.resources),
        "volumeMounts": mounts,
        "startupProbe": http_probe("/healthz", "http", period=10, failures=180),
        "readinessProbe": http_probe("/readyz", "http", period=10, failures=3),
        "livenessProbe": http_probe("/healthz", "http", period=20, failures=3),
        "securityContext": restricted_container_security_context(),
    }
    pod_spec = {
        # no API access: the namespace's default account (whose imagePullSecrets apply when the pod names
        # none), no token mounted
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": restricted_pod_security_context(),
        **pod_placement(job, ROLLOUT),
        **images.pod_fields(job, ROLLOUT),
        "containers": [container],
        "volumes": volumes,
    }
    # servers are independent: all load their models at once; a rolling update replaces one at a time
    return parallel_statefulset(
        job,
        ROLLOUT,
        namespace,
        owner,
        replicas=rollout_replicas(job),
        update_strategy="RollingUpdate",
        pod_spec=pod_spec,
    )
