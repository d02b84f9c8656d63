"""The StatefulSet and Deployment controllers of kube-controller-manager, as far as the operator's children
need them: pods created from the template up to `replicas` and removed above it (a StatefulSet's named by
ordinal, with the hostname and subdomain of its headless Service; a Deployment's with a template hash and
a random suffix, owned by the Deployment directly: no ReplicaSet in between), a failed pod deleted and
replaced, and the replica counts in the workload's status. Template changes are not rolled out (OnDelete
for both kinds); the garbage collector (the emulator's) removes the pods of a deleted workload.
"""

from __future__ import annotations

import copy
import hashlib
import json
import secrets
from typing import Any

from helpers.emulator import Api


def template_hash(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def owned_by(pod: dict[str, Any], owner: dict[str, Any]) -> bool:
    uid = owner["metadata"].get("uid")
    return any(ref.get("uid") == uid for ref in pod["metadata"].get("ownerReferences") or [])


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_from_template(owner: dict[str, Any], name: str, labels: dict[str, str], spec: dict[str, Any]) -> dict:
    template = owner["spec"]["template"]
    meta = owner["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": {**(template.get("metadata") or {}).get("labels", {}), **labels},
            "annotations": dict((template.get("metadata") or {}).get("annotations") or {}),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": owner["kind"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {**copy.deepcopy(template["spec"]), **spec},
    }


class WorkloadControllers:
    def __init__(self, api: Api) -> None:
        self.api = api

    def sync(self, pods: list[dict[str, Any]]) -> None:
        for sts in self.api.items("/apis/apps/v1/statefulsets"):
            if not sts["metadata"].get("deletionTimestamp"):
                self.stateful_set(sts, [p for p in pods if owned_by(p, sts)])
        for deployment in self.api.items("/apis/apps/v1/deployments"):
            if not deployment["metadata"].get("deletionTimestamp"):
                self.deployment(deployment, [p for p in pods if owned_by(p, deployment)])

    def pods_path(self, namespace: str) -> str:
        return f"/api/v1/namespaces/{namespace}/pods"

    def delete(self, pod: dict[str, Any]) -> None:
        if not pod["metadata"].get("deletionTimestamp"):
            meta = pod["metadata"]
            self.api.delete(f"{self.pods_path(meta['namespace'])}/{meta['name']}")

    def stateful_set(self, sts: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        meta, spec = sts["metadata"], sts["spec"]
        replicas = spec.get("replicas", 1)
        by_name = {p["metadata"]["name"]: p for p in pods}
        revision = f"{meta['name']}-{template_hash(spec['template'])}"
        for ordinal in range(replicas):
            name = f"{meta['name']}-{ordinal}"
            pod = by_name.get(name)
            if pod is None:
                labels = {
                    "statefulset.kubernetes.io/pod-name": name,
                    "apps.kubernetes.io/pod-index": str(ordinal),
                    "controller-revision-hash": revision,
                }
                extra = {"hostname": name, "subdomain": spec.get("serviceName")}
                self.api.post(self.pods_path(meta["namespace"]), pod_from_template(sts, name, labels, extra))
            elif (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded"):
                self.delete(pod)  # recreated under the same name once it is gone
        for name, pod in by_name.items():
            if int(name.rsplit("-", 1)[1]) >= replicas:
                self.delete(pod)
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        self.write_status(sts, live, revision)

    def deployment(self, deployment: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        meta, spec = deployment["metadata"], deployment["spec"]
        replicas = spec.get("replicas", 1)
        revision = template_hash(spec["template"])
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        for pod in live:
            if (pod.get("status") or {}).get("phase") == "Failed":
                self.delete(pod)
        live = [p for p in live if (p.get("status") or {}).get("phase") != "Failed"]
        for _ in range(replicas - len(live)):
            name = f"{meta['name']}-{revision}-{secrets.token_hex(3)[:5]}"
            pod = pod_from_template(deployment, name, {"pod-template-hash": revision}, {})
            self.api.post(self.pods_path(meta["namespace"]), pod)
        # newest first, not-ready first: the pods a ReplicaSet gives up when it scales down
        newest = sorted(live, key=lambda p: p["metadata"].get("creationTimestamp", ""), reverse=True)
        surplus = sorted(newest, key=ready)
        for pod in surplus[: max(0, len(live) - replicas)]:
            self.delete(pod)
        self.write_status(deployment, live, revision)

    def write_status(self, owner: dict[str, Any], live: list[dict[str, Any]], revision: str) -> None:
        meta = owner["metadata"]
        ready_count = sum(1 for p in live if ready(p))
        status = {
            "observedGeneration": meta.get("generation", 1),
            "replicas": len(live),
            "readyReplicas": ready_count,
            "availableReplicas": ready_count,
            "updatedReplicas": len(live),
        }
        if owner["kind"] == "StatefulSet":
            status.update(currentReplicas=len(live), currentRevision=revision, updateRevision=revision)
        if all((owner.get("status") or {}).get(k) == v for k, v in status.items()):
            return
        plural = "statefulsets" if owner["kind"] == "StatefulSet" else "deployments"
        path = f"/apis/apps/v1/namespaces/{meta['namespace']}/{plural}/{meta['name']}/status"
        self.api.patch(path, {"status": status})
