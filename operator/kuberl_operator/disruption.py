"""PodDisruptionBudgets: voluntary evictions (drains, upgrades) must not break the learner gang."""

from __future__ import annotations

from typing import Any

from kuberl.api.rljob import RLJob
from kuberl_operator.meta import LEARNER, ROLLOUT, child_name, object_meta, selector_labels


def build_learner_pdb(job: RLJob, namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    """All ranks: evicting one rank stops the whole gang until it restarts from a checkpoint, so a drain
    waits for the operator to stop the job (or for spot preemption, which PDBs do not govern)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(job, child_name(job, LEARNER), LEARNER, namespace, owner),
        "spec": {"minAvailable": job.spec.learner.replicas, "selector": {"matchLabels": selector_labels(job, LEARNER)}},
    }


def build_rollout_pdb(job: RLJob, namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    """One at a time: a rollout pod costs only its in-flight trajectories, but losing several at once
    would starve the learner."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(job, child_name(job, ROLLOUT), ROLLOUT, namespace, owner),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(job, ROLLOUT)}},
    }
