"""The learner tier: a headless Service for the torchrun rendezvous and a StatefulSet, one pod per rank."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kuberl.api.command_lines import CLI_MODULE, learner_args
from kuberl.api.env_vars import JOB_NAME as JOB_NAME_ENV
from kuberl.api.env_vars import JOB_STARTED_AT
from kuberl.api.env_vars import NAMESPACE as NAMESPACE_ENV
from kuberl.api.rljob import RLJob
from kuberl_operator.images import JobImages
from kuberl_operator.meta import LEARNER, child_name, selector_labels
from kuberl_operator.placement import pod_placement
from kuberl_operator.pod import (
    JOB_FILE,
    RUN_DIR,
    env_list,
    job_token_env,
    parallel_statefulset,
    resources,
    runtime_env,
    storage_env,
    tier_service,
    workload_volumes,
)
from kuberl_operator.rbac import service_account_name
from kuberl_operator.rollout import rollout_urls
from kuberl_operator.security import restricted_container_security_context, restricted_pod_security_context

RENDEZVOUS_PORT = 29400  # torchrun's c10d default
METRICS_PORT = 9400  # rank 0's Prometheus metrics (`kuberl learner --metrics-port`)
# Long enough for the final checkpoint of a large model to reach S3 after SIGTERM; the kubelet kills
# the pod when it runs out, preStop included.
TERMINATION_GRACE_SECONDS = 900


def learner_replicas(job: RLJob) -> int:
    """World size, or 0 while the job is suspended (it resumes from the checkpoint taken on the way down)."""
    return 0 if job.spec.suspend else job.spec.learner.replicas


def rendezvous_endpoint(job: RLJob, namespace: str) -> str:
    """Pod 0's stable DNS name through the headless Service: c10d hosts its store there."""
    service = child_name(job, LEARNER)
    return f"{service}-0.{service}.{namespace}.svc:{RENDEZVOUS_PORT}"


def build_learner_service(job: RLJob, namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    """Headless, and publishing not-ready pods: ranks must find each other before any of them is ready."""
    return tier_service(
        job,
        LEARNER,
        namespace,
        owner,
        {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(job, LEARNER),
            "ports": [
                {"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": "rendezvous", "protocol": "TCP"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    )


def torchrun_argv(job: RLJob, namespace: str) -> list[str]:
    """torchrun with c10d rendezvous on pod 0, then the same `kuberl learner JOB.yaml` as `kuberl run`.

    c10d ranks nodes by sorting their addresses, so `--local-addr` is the pod's own stable DNS name: pod 0
    sorts first and is always rank 0 (the driver, with the metrics port), and ranks follow the pod
    ordinals (in string order beyond ten pods; FSDP does not care which rank is which). --node-rank is not
    passed: c10d ignores it. max-restarts 0: a failed rank fails the pod and the operator restarts the
    whole gang from the newest checkpoint, counting it against the retry budget."""
    service = child_name(job, LEARNER)
    world = job.spec.learner.replicas
    return [
        "torchrun",
        f"--nnodes={world}",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rendezvous_endpoint(job, namespace)}",
        f"--rdzv-id={job.name}",
        f"--local-addr=$(POD_NAME).{service}.{namespace}.svc",
        "--max-restarts=0",
        "-m",
        CLI_MODULE,
        *learner_args(JOB_FILE, RUN_DIR, METRICS_PORT, rollout_urls(job, namespace)),
    ]


def learner_env(job: RLJob, clock_start: datetime | None = None) -> list[dict[str, Any]]:
    """NCCL and torch settings for a gang in pods: async error handling makes the surviving ranks fail
    fast when one dies (instead of hanging in a collective until the NCCL timeout), so the operator sees
    the failure and restarts the gang; loopback and docker bridges are never the route between pods. With
    the job's `clock_start` (status.clockStartTime, once it ran), a restarted gang counts its wall clock from
    it rather than from its own start."""
    started = {JOB_STARTED_AT: f"{clock_start.timestamp():.3f}"} if clock_start is not None else {}
    return [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        # which RLJob the learner reports into (kuberl_trainer.cluster_status)
        {"name": NAMESPACE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        *env_list({JOB_NAME_ENV: job.name, **started}),
        job_token_env(),  # it calls the rollout servers
        *env_list({"NCCL_SOCKET_IFNAME": "^lo,docker", "NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}),
        *runtime_env(),
        *storage_env(job),
    ]


def final_checkpoint_hook() -> dict[str, Any]:
    """preStop: SIGTERM the learner process (torchrun's worker) and wait until it has written its final
    checkpoint and exited. Signalling torchrun instead would not do: it SIGKILLs its workers 30 s after
    forwarding a SIGTERM, which can cut a large checkpoint short."""
    return {"exec": {"command": ["python", "-m", "kuberl_trainer.final_checkpoint"]}}


def build_learner_statefulset(
    job: RLJob,
    namespace: str,
    owner: dict[str, Any] | None,
    images: JobImages | None = None,
    clock_start: datetime | None = None,
) -> dict[str, Any]:
    """One pod per rank. Parallel pod management starts (and stops) all ranks at once: a gang cannot
    rendezvous one pod at a time, and an ordered scale-down would wait on ranks blocked in collectives.
    OnDelete updates: the operator restarts the gang as a whole; a rolling update would break it rank by
    rank. `images`: the operator's image defaults (its environment's by default); `clock_start`: see
    learner_env."""
    images = images or JobImages.from_env()
    volumes, mounts = workload_volumes(job)
    volumes.append({"name": "run", "emptyDir": {}})
    mounts.append({"name": "run", "mountPath": RUN_DIR.rsplit("/", 1)[0]})
    container = {
        "name": LEARNER,
        "image": images.image(job, LEARNER),
        "command": torchrun_argv(job, namespace),
        "env": learner_env(job, clock_start),
        "ports": [
            {"name": "rendezvous", "containerPort": RENDEZVOUS_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": resources(job.spec.learner.resources),
        "volumeMounts": mounts,
        "lifecycle": {"preStop": final_checkpoint_hook()},
        "securityContext": restricted_container_security_context(),
    }
    pod_spec = {
        "serviceAccountName": service_account_name(job),
        # the learner reports progress into its RLJob's status (see rbac.role_rules)
        "automountServiceAccountToken": True,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": restricted_pod_security_context(),
        **pod_placement(job, LEARNER),
        **images.pod_fields(job, LEARNER),
        "containers": [container],
        "volumes": volumes,
    }
    return parallel_statefulset(
        job, LEARNER, namespace, owner, replicas=learner_replicas(job), update_strategy="OnDelete", pod_spec=pod_spec
    )
