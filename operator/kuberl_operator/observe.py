"""What the operator reads back: the job's pods per tier and the learner's report, as state-machine input.

Pure functions over the objects the API returned, so they are tested with plain dictionaries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kuberl.api.rljob import RLJob
from kuberl.api.status import LEARNER_STOPPED, Reason
from kuberl_operator.desired import GPU
from kuberl_operator.lifecycle import TIERS, LearnerStop, TierState
from kuberl_operator.meta import LEARNER, ROLLOUT, SANDBOX, TIER_LABEL
from kuberl_operator.placement import PREEMPTION_NOTICE_TAINTS, SPOT_NODE_LABELS
from kuberl_operator.sandbox import DEFAULT_POOL, POOL_LABEL

# The learner reports that it stopped itself (a breaker, or training done) with the LEARNER_STOPPED condition
# on the RLJob status, reason = a kuberl.api.status.Reason; the fields it owns (step, policyVersion,
# lastCheckpoint, rewardMean, ...) it writes directly (kuberl_trainer.cluster_status, the writer).


def pod_summary(pod: dict[str, Any]) -> dict[str, Any]:
    """The fields of a pod the functions below read: what the operator's pod index keeps in memory."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    return {
        "metadata": {k: meta[k] for k in ("name", "labels", "deletionTimestamp") if k in meta},
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": [
                {"resources": c.get("resources") or {}, "ports": c.get("ports") or []}
                for c in spec.get("containers") or []
            ],
        },
        "status": {
            **{k: v for k, v in status.items() if k in ("phase", "conditions", "podIP")},
            "terminationMessages": termination_messages(status),
            "waiting": waiting_reasons(status),
        },
    }


def waiting_reasons(status: dict[str, Any]) -> list[dict[str, Any]]:
    """Why the pod's containers (init containers too) wait, with their restarts: an image that cannot be
    pulled or a server that keeps crashing says so here (kuberl_operator.pool_health reads it)."""
    waiting = []
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            state = (container.get("state") or {}).get("waiting") or {}
            if state.get("reason"):
                waiting.append(
                    {
                        "reason": str(state["reason"]),
                        "message": str(state.get("message") or "")[:1024],
                        "restarts": int(container.get("restartCount") or 0),
                    }
                )
    return waiting


def termination_messages(status: dict[str, Any]) -> list[str]:
    """What the pod's containers (init containers first) said as they ended (now or the last time), newest
    state first."""
    messages = []
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        for state in ("state", "lastState"):
            message = (((container.get(state) or {}).get("terminated")) or {}).get("message")
            if message:
                messages.append(str(message).strip())
    return messages


def sandbox_start_failure(pods: list[dict[str, Any]]) -> str | None:
    """Why a sandbox server of the job would not start (its own words,
    kuberl_sandbox.session_manager.report_start_failure), if one said so; pods given as pod_summary keeps them."""
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        if ((pod["metadata"].get("labels") or {}).get(TIER_LABEL)) != SANDBOX or in_image_pool(pod):
            continue
        status = pod.get("status") or {}
        messages = status.get("terminationMessages")
        if messages is None:
            messages = termination_messages(status)
        if messages:
            return messages[0]
    return None


def in_image_pool(pod: dict[str, Any]) -> bool:
    """A sandbox pod of an image's pool: its failures are its image's (kuberl_operator.pool_health), never the
    tier's, so they neither spend the retry budget nor hold the job's start."""
    pool = ((pod.get("metadata") or {}).get("labels") or {}).get(POOL_LABEL)
    return pool is not None and pool != DEFAULT_POOL


@dataclass(frozen=True)
class NodeCapacity:
    """What the operator needs to know of a node: spot or not, and whether it is about to go away."""

    spot: bool
    notice: bool  # a preemption or termination notice is on the node (its taint)


def node_capacity(node: dict[str, Any]) -> NodeCapacity:
    labels = (node.get("metadata") or {}).get("labels") or {}
    taints = {t.get("key") for t in (node.get("spec") or {}).get("taints") or []}
    return NodeCapacity(
        spot=any(labels.get(key) == value for key, value in SPOT_NODE_LABELS),
        notice=bool(taints & PREEMPTION_NOTICE_TAINTS),
    )


def desired_replicas(job: RLJob, scaled_down: bool) -> dict[str, int]:
    """Pods each tier should have (the sandbox tier is autoscaled above its minimum)."""
    if scaled_down:
        return dict.fromkeys(TIERS, 0)
    spec = job.spec
    return {LEARNER: spec.learner.replicas, ROLLOUT: spec.rollout.replicas, SANDBOX: spec.sandbox.min_replicas}


def tier_states(
    pods: list[dict[str, Any]], desired: dict[str, int], nodes: Mapping[str, NodeCapacity] | None = None
) -> dict[str, TierState]:
    """Ready, failed and disrupted pods per tier. Terminating pods are left out: the operator (or the
    node) is already replacing them, so counting them again would charge one failure twice. A pod is
    disrupted when it has a DisruptionTarget condition or its node carries a preemption notice."""
    nodes = nodes or {}
    ready: dict[str, int] = dict.fromkeys(TIERS, 0)
    failed: dict[str, list[str]] = {t: [] for t in TIERS}
    disrupted: dict[str, list[str]] = {t: [] for t in TIERS}
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        meta, status = pod["metadata"], pod.get("status") or {}
        tier = (meta.get("labels") or {}).get(TIER_LABEL)
        if tier not in ready or meta.get("deletionTimestamp") or in_image_pool(pod):
            continue
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        node = nodes.get((pod.get("spec") or {}).get("nodeName") or "")
        if conditions.get("DisruptionTarget") == "True" or (node is not None and node.notice):
            disrupted[tier].append(meta["name"])
        elif status.get("phase") == "Failed":
            failed[tier].append(meta["name"])
        elif conditions.get("Ready") == "True":
            ready[tier] += 1
    return {t: TierState(desired[t], ready[t], tuple(failed[t]), tuple(disrupted[t])) for t in TIERS}


def gpus_by_tier(
    pods: list[dict[str, Any]], nodes: Mapping[str, NodeCapacity] | None = None
) -> tuple[dict[str, float], dict[str, float]]:
    """GPUs held by running pods per tier (limits, which Kubernetes requires to equal requests for GPUs),
    and the part of them on spot nodes."""
    nodes = nodes or {}
    total: dict[str, float] = dict.fromkeys(TIERS, 0.0)
    spot: dict[str, float] = dict.fromkeys(TIERS, 0.0)
    for pod in pods:
        tier = ((pod.get("metadata") or {}).get("labels") or {}).get(TIER_LABEL)
        if tier not in total or (pod.get("status") or {}).get("phase") != "Running":
            continue
        gpus = sum(
            float(((c.get("resources") or {}).get("limits") or {}).get(GPU, 0) or 0)
            for c in (pod.get("spec") or {}).get("containers") or []
        )
        total[tier] += gpus
        node = nodes.get((pod.get("spec") or {}).get("nodeName") or "")
        if node is not None and node.spot:
            spot[tier] += gpus
    return total, spot


def gpus_in_use(pods: list[dict[str, Any]]) -> float:
    """GPUs held by the job's running pods."""
    return sum(gpus_by_tier(pods)[0].values())


def learner_stop(status: dict[str, Any]) -> LearnerStop | None:
    """The learner's stop report, if it made one with a reason the state machine knows."""
    for condition in status.get("conditions") or []:
        if condition.get("type") == LEARNER_STOPPED and condition.get("status") == "True":
            try:
                return LearnerStop(Reason(condition.get("reason")), condition.get("message") or "")
            except ValueError:
                return None
    return None
