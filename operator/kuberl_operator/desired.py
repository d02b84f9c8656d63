"""Every child object of an RLJob, in apply order, and the YAML stream `kuberl render` prints."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import yaml

from kuberl.api.rljob import RLJob
from kuberl.api.spec import GPU_RESOURCE, SandboxAutoscaler, SandboxPoolEngine
from kuberl_operator.disruption import build_learner_pdb, build_rollout_pdb
from kuberl_operator.images import JobImages
from kuberl_operator.job_config import build_config_map
from kuberl_operator.learner_gang import build_learner_service, build_learner_statefulset
from kuberl_operator.meta import TIER_LABEL
from kuberl_operator.network_policy import (
    NetworkPeers,
    build_learner_network_policy,
    build_rollout_network_policy,
    build_sandbox_network_policy,
)
from kuberl_operator.queueing import build_workload
from kuberl_operator.rbac import build_role, build_role_binding, build_service_account
from kuberl_operator.rollout import build_rollout_service, build_rollout_statefulset
from kuberl_operator.sandbox import build_sandbox_deployment, build_sandbox_hpa, build_sandbox_service
from kuberl_operator.sandbox_pools import AGENT_SANDBOX_ENGINE, KUBERL_ENGINE, pool_objects
from kuberl_operator.secret import sandbox_token_secret_name
from kuberl_operator.security import SandboxPodSecurity

DEFAULT_NAMESPACE = "default"
GPU = GPU_RESOURCE


def target_namespace(job: RLJob, override: str | None = None) -> str:
    """An explicit namespace, else the manifest's, else `default` (as kubectl would)."""
    return override or job.metadata.namespace or DEFAULT_NAMESPACE


def desired_objects(
    job: RLJob,
    namespace: str,
    *,
    owner: dict[str, Any] | None,
    sandbox_token_secret: str | None = None,
    security: SandboxPodSecurity | None = None,
    peers: NetworkPeers | None = None,
    images: JobImages | None = None,
    pool_images: Iterable[str] = (),
    clock_start: datetime | None = None,
) -> list[dict[str, Any]]:
    """All children, ordered so that each exists before what needs it: identity and config first, every
    tier's NetworkPolicy before any of its pods (untrusted code never runs unfenced, and no job's servers
    are open to other tenants even for a moment), Services before the workloads that resolve them, the
    learner last (it waits on rollout servers). `security`: see build_sandbox_deployment; `peers`: who
    outside the job the policies admit (NetworkPeers); `images`: the images and pull secrets of jobs that name
    none (JobImages; the environment's by default, as the operator's); `pool_images`: environment images whose
    sandbox pools to show, at zero pods (`kuberl render --tasks`; the operator makes and scales them at run
    time, kuberl_operator.pool_reconcile); `clock_start`: status.clockStartTime, for the learner pods."""
    secret = sandbox_token_secret or sandbox_token_secret_name(job)
    images = images or JobImages.from_env()
    job = images.resolved(job)
    workloads = [
        build_sandbox_deployment(job, namespace, owner, secret, security, images),
        build_rollout_statefulset(job, namespace, owner, secret, images),
        build_learner_statefulset(job, namespace, owner, images, clock_start),
    ]
    queue = []
    if job.spec.scheduling.queue_name:
        # first: Kueue must know the job before any of its pods may start; its pod sets are the tiers' templates
        templates = {w["metadata"]["labels"][TIER_LABEL]: w["spec"]["template"] for w in workloads}
        queue.append(build_workload(job, namespace, owner, templates))
    return [
        *queue,
        build_service_account(job, namespace, owner),
        build_role(job, namespace, owner),
        build_role_binding(job, namespace, owner),
        build_config_map(job, namespace, owner),
        build_sandbox_network_policy(job, namespace, owner, peers),
        build_rollout_network_policy(job, namespace, owner, peers),
        build_learner_network_policy(job, namespace, owner, peers),
        build_sandbox_service(job, namespace, owner),
        build_rollout_service(job, namespace, owner),
        build_learner_service(job, namespace, owner),
        build_rollout_pdb(job, namespace, owner),
        build_learner_pdb(job, namespace, owner),
        *workloads,
        *pool_objects(
            job,
            dict.fromkeys(pool_images, 0),
            namespace,
            owner,
            secret,
            security or SandboxPodSecurity.from_env(),
            images,
            render_engine(job),
        ),
        *([build_sandbox_hpa(job, namespace, owner)] if job.spec.sandbox.autoscaler == SandboxAutoscaler.HPA else []),
    ]


def render_engine(job: RLJob) -> str:
    """The pools' engine as render shows it: agent-sandbox when the spec names it; `auto` depends on the
    cluster's API (the operator asks it), so render shows kuberl's Deployments."""
    engine = job.spec.sandbox.pools.engine
    return AGENT_SANDBOX_ENGINE if engine == SandboxPoolEngine.AGENT_SANDBOX else KUBERL_ENGINE


def render_warnings(job: RLJob) -> list[str]:
    """Specs that render fine but will not work well in a cluster, one line each naming the field."""
    spec = job.spec
    out = []
    if not (spec.checkpoint.uri or "").startswith("s3://"):
        out.append(
            f"spec.checkpoint.uri: {spec.checkpoint.uri or 'unset'}: the operator needs an s3:// URI; "
            f"checkpoints written inside a learner pod are lost when it restarts"
        )
    if not spec.model.uri.startswith("s3://"):
        out.append(
            f"spec.model.uri: {spec.model.uri}: not s3://, so it must exist inside the learner and rollout images"
        )
    learner_gpus = _whole(spec.learner.resources.limits.get(GPU))
    if learner_gpus is not None and learner_gpus > 1:
        out.append(
            f"spec.learner.resources.limits['{GPU}']: {learner_gpus}, but a learner pod runs one rank on one "
            f"GPU; raise spec.learner.replicas instead"
        )
    rollout_gpus = _whole(spec.rollout.resources.limits.get(GPU))
    if rollout_gpus is not None and rollout_gpus < spec.rollout.engine.tensor_parallel_size:
        out.append(
            f"spec.rollout.resources.limits['{GPU}']: {rollout_gpus}, fewer than "
            f"spec.rollout.engine.tensorParallelSize ({spec.rollout.engine.tensor_parallel_size})"
        )
    return out


def _whole(quantity: int | str | None) -> int | None:
    if isinstance(quantity, int):
        return quantity
    return int(quantity) if isinstance(quantity, str) and quantity.isdigit() else None


class _StreamDumper(yaml.SafeDumper):
    """Multi-line strings (the job file in the ConfigMap) as literal blocks, readable in the stream."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_StreamDumper.add_representer(str, _str)


def render_yaml_stream(objects: list[dict[str, Any]]) -> str:
    """A `---`-separated YAML stream, like `helm template`."""
    return yaml.dump_all(objects, Dumper=_StreamDumper, sort_keys=False, explicit_start=True, width=120)
