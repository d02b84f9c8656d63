"""The sandbox tier: a Deployment of sandbox servers (untrusted agent code runs here) and its Service."""

from __future__ import annotations

from typing import Any

from kuberl.api.command_lines import sandbox_args, sandbox_command
from kuberl.api.env_vars import SANDBOX_ADVERTISE_URL as ADVERTISE_ENV
from kuberl.api.env_vars import SANDBOX_EGRESS
from kuberl.api.rljob import RLJob
from kuberl_operator.autoscale import ScalingPolicy
from kuberl_operator.images import JobImages
from kuberl_operator.meta import SANDBOX, child_name, common_labels, object_meta, selector_labels
from kuberl_operator.placement import pod_placement
from kuberl_operator.pod import TMP_DIR, empty_dir, env_list, http_probe, resources, sandbox_token_env, tier_service
from kuberl_operator.rollout import SANDBOX_PORT
from kuberl_operator.security import (
    SandboxPodSecurity,
    sandbox_container_security_context,
    sandbox_pod_security_context,
    sandbox_uses_user_namespace,
)

WORKSPACE_DIR = "/workspace"
SESSIONS_DIR = f"{WORKSPACE_DIR}/sessions"  # KUBERL_SANDBOX_ROOT of the sandbox image


def sandbox_replicas(job: RLJob) -> int:
    """minReplicas to start with; the autoscaler (operator or HPA) moves it within [min, max] later."""
    return 0 if job.spec.suspend else job.spec.sandbox.min_replicas


POOL_LABEL = "kuberl.io/sandbox-pool"
"""Which sandbox pool a pod belongs to: `default` (the job's sandbox image), else its image's pool key
(kuberl.api.sandbox_images.pool_key). Every pool's pods also carry the sandbox tier's labels, so the sandbox
NetworkPolicy covers them all; each pool's Service selects its own pool only."""
DEFAULT_POOL = "default"


def default_pool_selector(job: RLJob) -> dict[str, str]:
    """The default pool's Service selects its own pods only (not the per-image pools' sandbox pods). The
    Deployment keeps its tier selector: a Deployment's selector cannot change."""
    return {**selector_labels(job, SANDBOX), POOL_LABEL: DEFAULT_POOL}


def build_sandbox_service(job: RLJob, namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    """Load-balanced over the default pool's sandbox pods for opening sessions. A session lives in one pod's
    memory and workspace: the pod answers with its own address (KUBERL_SANDBOX_ADVERTISE_URL) and the rollout
    pod sends the session's later calls there, so every sandbox pod the autoscaler adds takes new sessions."""
    return tier_service(
        job,
        SANDBOX,
        namespace,
        owner,
        {
            "type": "ClusterIP",
            "selector": default_pool_selector(job),
            "ports": [{"name": "http", "port": SANDBOX_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    )


def sandbox_server_options(job: RLJob) -> list[str]:
    """The options of `kuberl sandbox` for the job's pools, the default one and every image's."""
    return sandbox_args(job, "0.0.0.0", SANDBOX_PORT, SESSIONS_DIR)


def sandbox_container(
    job: RLJob, sandbox_token_secret: str, security: SandboxPodSecurity, image: str, command: list[str]
) -> dict[str, Any]:
    """The sandbox server's container: token, advertised address, probes, resources and the hardened
    securityContext (security.sandbox_container_security_context), whichever image it runs in."""
    spec = job.spec.sandbox
    user_namespace = sandbox_uses_user_namespace(security, spec.runtime_class_name)
    return {
        "name": SANDBOX,
        "image": image,
        "command": command,
        "env": [
            sandbox_token_env(sandbox_token_secret),
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            *env_list(
                {
                    ADVERTISE_ENV: f"http://$(POD_IP):{SANDBOX_PORT}",
                    SANDBOX_EGRESS: spec.egress.value,
                    "PYTHONUNBUFFERED": "1",
                }
            ),
        ],
        "ports": [{"name": "http", "containerPort": SANDBOX_PORT, "protocol": "TCP"}],
        "resources": resources(spec.resources),
        "volumeMounts": [{"name": "workspace", "mountPath": WORKSPACE_DIR}, {"name": "tmp", "mountPath": TMP_DIR}],
        "readinessProbe": http_probe("/readyz", "http", period=5, failures=3),
        "livenessProbe": http_probe("/healthz", "http", period=20, failures=3),
        "securityContext": sandbox_container_security_context(security, user_namespace),
    }


def sandbox_pod_spec(
    job: RLJob, security: SandboxPodSecurity, images: JobImages, containers: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    """A sandbox pod around `containers`: no service-account token, no service-link variables, its own user
    namespace unless the cluster lacks them, the spec's RuntimeClass, placement and pull secrets; `extra`
    adds fields (init containers) and volumes beside the sessions' emptyDirs."""
    spec = job.spec.sandbox
    volumes = [empty_dir("workspace"), empty_dir("tmp"), *extra.pop("volumes", [])]
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        **({"hostUsers": False} if sandbox_uses_user_namespace(security, spec.runtime_class_name) else {}),
        "terminationGracePeriodSeconds": 30,
        "securityContext": sandbox_pod_security_context(security),
        **pod_placement(job, SANDBOX),
        **images.pod_fields(job, SANDBOX),
        **extra,
        "containers": containers,
        "volumes": volumes,
    }
    if spec.runtime_class_name:
        pod_spec["runtimeClassName"] = spec.runtime_class_name
    return pod_spec


def build_sandbox_deployment(
    job: RLJob,
    namespace: str,
    owner: dict[str, Any] | None,
    sandbox_token_secret: str,
    security: SandboxPodSecurity | None = None,
    images: JobImages | None = None,
) -> dict[str, Any]:
    """The default pool: the same `kuberl sandbox` as `kuberl run`, hardened for untrusted code: its own user
    namespace (`hostUsers: false`) unless the operator is told the cluster lacks them, no service-account
    token, no service-link variables, a read-only root filesystem with sessions on an emptyDir, and the
    RuntimeClass of the spec (gVisor, Kata) when one is given. Its root user is explained in
    security.sandbox_container_security_context; `security` and `images` default to the operator's
    environment."""
    security = security or SandboxPodSecurity.from_env()
    images = images or JobImages.from_env()
    argv = sandbox_command(job, "0.0.0.0", SANDBOX_PORT, SESSIONS_DIR)
    container = sandbox_container(job, sandbox_token_secret, security, images.image(job, SANDBOX), argv)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(job, child_name(job, SANDBOX), SANDBOX, namespace, owner),
        "spec": {
            "replicas": sandbox_replicas(job),
            "selector": {"matchLabels": selector_labels(job, SANDBOX)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": {**common_labels(job, SANDBOX), POOL_LABEL: DEFAULT_POOL}},
                "spec": sandbox_pod_spec(job, security, images, [container]),
            },
        },
    }


# The External metric an HPA scales the sandbox tier on (`spec.sandbox.autoscaler: hpa`): the rollout tier's
# sessions wanted per job, which a metrics adapter serves from Prometheus (rule in docs/operator.md).
SESSIONS_WANTED_METRIC = "kuberl_sandbox_sessions_wanted"


def build_sandbox_hpa(job: RLJob, namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    """For clusters that prefer an HPA: the same rules as the operator's autoscaler
    (kuberl_operator.autoscale) in HPA terms: a target of sessionsPerPod / (1 + headroom) sessions per pod,
    scale-up at once, scale-down to the highest recommendation of 5 minutes and by at most half a minute."""
    spec, policy = job.spec.sandbox, ScalingPolicy()
    per_pod_milli = int(1000 * spec.sessions_per_pod / (1 + policy.headroom))
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": object_meta(job, child_name(job, SANDBOX), SANDBOX, namespace, owner),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": child_name(job, SANDBOX)},
            "minReplicas": max(1, spec.min_replicas),  # an HPA cannot hold zero pods
            "maxReplicas": spec.max_replicas,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {"name": SESSIONS_WANTED_METRIC, "selector": {"matchLabels": {"rljob": job.name}}},
                        "target": {"type": "AverageValue", "averageValue": f"{per_pod_milli}m"},
                    },
                }
            ],
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Percent", "value": 1000, "periodSeconds": 15}],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": int(policy.scale_down_window_s),
                    "policies": [
                        {
                            "type": "Percent",
                            "value": int(100 * policy.scale_down_max_fraction),
                            "periodSeconds": int(policy.scale_down_period_s),
                        }
                    ],
                },
            },
        },
    }
