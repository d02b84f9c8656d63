"""What an image's pool pods say about the image: ready pods, and whether the image can run at all. Pure.

An image is unusable when its pods can never serve a session, whatever the scale: the kubelet cannot pull it
(ErrImagePull, ImagePullBackOff, InvalidImageName), the server's container keeps crashing (CrashLoopBackOff
after CRASH_LOOP_RESTARTS restarts), or a container ended with a message of its own (the server says why it
cannot run in the image, e.g. no /bin/sh; the runtime says why it could not start it). Its instances are then
left out of training (the learner reads status.sandboxPools) instead of holding pods that never get ready.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kuberl_operator.observe import in_image_pool, termination_messages, waiting_reasons
from kuberl_operator.sandbox import POOL_LABEL

PULL_FAILURES = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})
CRASH_LOOP = "CrashLoopBackOff"
CRASH_LOOP_RESTARTS = 3
"""A server that crashed this often is the image's fault, not a node's hiccup (the kubelet's back-off
reaches a minute by then)."""
SERVER_CANNOT_START = "ServerCannotStart"


@dataclass(frozen=True)
class ImageFailure:
    reason: str  # a PULL_FAILURES reason, CrashLoopBackOff or ServerCannotStart
    message: str  # the kubelet's or the server's own words


@dataclass(frozen=True)
class PoolHealth:
    pods: int = 0  # pods of the pool that are not terminating
    ready: int = 0
    failure: ImageFailure | None = None


def pods_by_pool(pods: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The pods of image pools by pool key (the default pool's and other tiers' pods are left out)."""
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for pod in pods:
        if in_image_pool(pod):
            grouped[pod["metadata"]["labels"][POOL_LABEL]].append(pod)
    return dict(grouped)


def pod_failure(pod: dict[str, Any]) -> ImageFailure | None:
    """Why this pod says its image cannot run, if it does (pods as the operator's index keeps them, or whole)."""
    status = pod.get("status") or {}
    waiting = status.get("waiting")
    waiting = waiting_reasons(status) if waiting is None else waiting
    for state in waiting:
        if state["reason"] in PULL_FAILURES:
            return ImageFailure(state["reason"], state["message"] or f"{state['reason']}: the image cannot be pulled")
    messages = status.get("terminationMessages")
    messages = termination_messages(status) if messages is None else messages
    if messages:
        return ImageFailure(SERVER_CANNOT_START, messages[0])
    for state in waiting:
        if state["reason"] == CRASH_LOOP and state["restarts"] >= CRASH_LOOP_RESTARTS:
            return ImageFailure(CRASH_LOOP, state["message"] or f"the sandbox server crashed {state['restarts']} times")
    return None


def pool_health(pods: Iterable[dict[str, Any]]) -> PoolHealth:
    """Pods, ready pods and the first failure (by pod name) of one pool's pods."""
    live = sorted(
        (p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")), key=lambda p: p["metadata"]["name"]
    )
    ready = sum(
        1
        for p in live
        if any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (p.get("status") or {}).get("conditions") or []
        )
    )
    failure = next((f for p in live if (f := pod_failure(p)) is not None), None)
    return PoolHealth(len(live), ready, failure)
