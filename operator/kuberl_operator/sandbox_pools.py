"""Sandbox pools per environment image: the objects of one image's pool, as pure builders.

A task that names its own image (an instance's `image`, or spec.sandbox.imageTemplate) runs its episodes in a
pool of that image: multi-session sandbox pods like the default pool's, behind a ClusterIP Service named
`pool_service_name(job, image)` that the rollout tier reaches through KUBERL_SANDBOX_POOL_URL. The image is the
task's, not KubeRL's, so the server comes with the pod: an init container from the job's sandbox image copies
the self-contained server bundle onto an emptyDir (kuberl.portable_server), and the main container runs it
from there inside the task's image. Everything else (token, probes, resources, hardening, placement, pull
secrets) is the default pool's.

Two engines hold the pods: `kuberl`, a Deployment per image; `agent-sandbox`, a SandboxTemplate (the same pod
template) and a SandboxWarmPool per image (kubernetes-sigs/agent-sandbox). The replicas come from the pool
planner (kuberl_operator.pools) either way; render shows every pool at zero.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from kuberl.api.environment import Task
from kuberl.api.rljob import RLJob
from kuberl.api.sandbox_images import episode_image, pool_key, pool_service_name
from kuberl.api.spec import SandboxSpec
from kuberl.portable_server import PORTABLE_MOUNT, install_argv, server_argv, server_env
from kuberl_operator.images import JobImages
from kuberl_operator.meta import SANDBOX, common_labels, object_meta, selector_labels
from kuberl_operator.pod import env_list
from kuberl_operator.rollout import SANDBOX_PORT
from kuberl_operator.sandbox import (
    POOL_LABEL,
    sandbox_container,
    sandbox_pod_spec,
    sandbox_server_options,
)
from kuberl_operator.security import NON_ROOT_UID, SandboxPodSecurity, restricted_container_security_context

IMAGE_ANNOTATION = "kuberl.io/sandbox-image"
"""The pool's image on its objects (an image reference may be longer than a label value allows)."""
TEMPLATE_DIGEST_ANNOTATION = "kuberl.io/sandbox-template-digest"
KUBERL_ENGINE, AGENT_SANDBOX_ENGINE = "kuberl", "agent-sandbox"
AGENT_SANDBOX_GROUP = "extensions.agents.x-k8s.io"
AGENT_SANDBOX_VERSION = "v1beta1"
AGENT_SANDBOX_API = f"{AGENT_SANDBOX_GROUP}/{AGENT_SANDBOX_VERSION}"
AGENT_SANDBOX_KINDS = {"SandboxTemplate": "sandboxtemplates", "SandboxWarmPool": "sandboxwarmpools"}
BUNDLE_VOLUME = "kuberl-server"
INSTALLER = "install-server"
# Copying the server bundle is a file copy: small requests, a bound on memory.
_INSTALLER_RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}


def task_images(tasks: Iterable[Task], sandbox: SandboxSpec) -> list[str]:
    """The environment images of `tasks` (each task's episode_image; those on the default pool left out), sorted;
    ImageTemplateError names spec.sandbox.imageTemplate and the first field a task lacks."""
    return sorted({image for task in tasks if (image := episode_image(task, sandbox)) is not None})


def pool_selector(job: RLJob, image: str) -> dict[str, str]:
    """What an image's pool selects on: the job, the sandbox tier and the pool key (never changes for a pool)."""
    return {**selector_labels(job, SANDBOX), POOL_LABEL: pool_key(image)}


def pool_meta(job: RLJob, image: str, namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    """metadata of an image's pool objects: the sandbox tier's, the pool label and the image annotation."""
    meta = object_meta(job, pool_service_name(job.name, image), SANDBOX, namespace, owner)
    meta["labels"] = {**meta["labels"], POOL_LABEL: pool_key(image)}
    meta["annotations"] = {**meta.get("annotations", {}), IMAGE_ANNOTATION: image}
    return meta


def build_pool_service(job: RLJob, image: str, namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    """Load-balanced over the image's pool for opening sessions; later calls go to the pod that answered
    (its advertised address), as on the default pool."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": pool_meta(job, image, namespace, owner),
        "spec": {
            "type": "ClusterIP",
            "selector": pool_selector(job, image),
            "ports": [{"name": "http", "port": SANDBOX_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_pool_pod_template(
    job: RLJob, image: str, sandbox_token_secret: str, security: SandboxPodSecurity, images: JobImages
) -> dict[str, Any]:
    """The pod of an image's pool: the installer copies the server bundle from the job's sandbox image onto
    an emptyDir, which the task's image then runs read-only with the default pool's options."""
    bundle = {"name": BUNDLE_VOLUME, "mountPath": PORTABLE_MOUNT}
    installer = {
        "name": INSTALLER,
        "image": images.image(job, SANDBOX),
        "command": install_argv(),
        "resources": _INSTALLER_RESOURCES,
        "volumeMounts": [bundle],
        # the sandbox image runs as root by default: the copy needs no privilege, so it runs as non-root
        "securityContext": {
            **restricted_container_security_context(),
            "runAsUser": NON_ROOT_UID,
            "runAsGroup": NON_ROOT_UID,
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",  # cp's own error as the pod's message
    }
    container = sandbox_container(job, sandbox_token_secret, security, image, server_argv(sandbox_server_options(job)))
    foreign = server_env()  # an env list is keyed by name: one entry per variable, the bundle's winning
    if job.spec.sandbox.pools.image_path is not None:
        foreign["PATH"] = job.spec.sandbox.pools.image_path  # the server runs by absolute path; commands use it
    container["env"] = [*(e for e in container["env"] if e["name"] not in foreign), *env_list(foreign)]
    container["volumeMounts"] = [*container["volumeMounts"], {**bundle, "readOnly": True}]
    labels = {**common_labels(job, SANDBOX), POOL_LABEL: pool_key(image)}
    volumes = [{"name": BUNDLE_VOLUME, "emptyDir": {}}]
    spec = sandbox_pod_spec(job, security, images, [container], initContainers=[installer], volumes=volumes)
    return {"metadata": {"labels": labels, "annotations": {IMAGE_ANNOTATION: image}}, "spec": spec}


def build_pool_deployment(
    job: RLJob,
    image: str,
    replicas: int,
    namespace: str,
    owner: dict[str, Any] | None,
    sandbox_token_secret: str,
    security: SandboxPodSecurity,
    images: JobImages,
) -> dict[str, Any]:
    """The kuberl engine's pool: a Deployment of `replicas` multi-session pods of the image."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": pool_meta(job, image, namespace, owner),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": pool_selector(job, image)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": build_pool_pod_template(job, image, sandbox_token_secret, security, images),
        },
    }


def build_sandbox_template(
    job: RLJob,
    image: str,
    namespace: str,
    owner: dict[str, Any] | None,
    sandbox_token_secret: str,
    security: SandboxPodSecurity,
    images: JobImages,
) -> dict[str, Any]:
    """The agent-sandbox engine's pod template of an image's pool. Its NetworkPolicy is left to the job's
    own (`Unmanaged`): agent-sandbox's managed default admits only its router, not the rollout pods."""
    return {
        "apiVersion": AGENT_SANDBOX_API,
        "kind": "SandboxTemplate",
        "metadata": pool_meta(job, image, namespace, owner),
        "spec": {
            "podTemplate": build_pool_pod_template(job, image, sandbox_token_secret, security, images),
            "networkPolicyManagement": "Unmanaged",
        },
    }


def build_sandbox_warm_pool(
    job: RLJob, image: str, replicas: int, namespace: str, owner: dict[str, Any] | None
) -> dict[str, Any]:
    """The agent-sandbox engine's pool: `replicas` warm pods of the image's SandboxTemplate."""
    return {
        "apiVersion": AGENT_SANDBOX_API,
        "kind": "SandboxWarmPool",
        "metadata": pool_meta(job, image, namespace, owner),
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": pool_service_name(job.name, image)}},
    }


def pool_objects(
    job: RLJob,
    replicas: Mapping[str, int],
    namespace: str,
    owner: dict[str, Any] | None,
    sandbox_token_secret: str,
    security: SandboxPodSecurity,
    images: JobImages,
    engine: str = KUBERL_ENGINE,
) -> list[dict[str, Any]]:
    """Every object of the pools of `replicas` (image -> pods), in apply order: each pool's Service before its
    pods, and with agent-sandbox the template before its warm pool. A suspended job's pools hold no pods."""
    objects: list[dict[str, Any]] = []
    for image in sorted(replicas):
        n = 0 if job.spec.suspend else replicas[image]
        objects.append(build_pool_service(job, image, namespace, owner))
        if engine == AGENT_SANDBOX_ENGINE:
            template = build_sandbox_template(job, image, namespace, owner, sandbox_token_secret, security, images)
            warm_pool = build_sandbox_warm_pool(job, image, n, namespace, owner)
            # the warm pool names its template's digest: a changed template (a spec change) shows on the warm
            # pool, the one object of a pool the operator reads back
            digest = hashlib.sha256(json.dumps(template["spec"], sort_keys=True).encode()).hexdigest()[:16]
            warm_pool["metadata"]["annotations"][TEMPLATE_DIGEST_ANNOTATION] = digest
            objects += [template, warm_pool]
        else:
            objects.append(
                build_pool_deployment(job, image, n, namespace, owner, sandbox_token_secret, security, images)
            )
    return objects
