"""A small Kubernetes REST client for the handlers: get, list, create, server-side apply, merge-patch and
delete any object.

Built on the `kubernetes` package's ApiClient, so credentials come from the in-cluster service account
or the kubeconfig exactly as kopf finds them. Objects a controller owns are written with server-side apply
under its field manager (`apply`): the API server then keeps track of which manager owns which field, so
fields another controller manages (an HPA's replicas, Kueue's) are left to it. JSON merge patch (`patch`)
is for single fields written by a writer that does not own the object (the status, a replica count).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from kuberl.crd import GROUP, PLURAL, VERSION

# The kinds the operator creates or reads, and their resource names in URLs.
_PLURALS = {
    "ConfigMap": "configmaps",
    "Deployment": "deployments",
    "Event": "events",
    "NetworkPolicy": "networkpolicies",
    "Pod": "pods",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "RLJob": PLURAL,
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Secret": "secrets",
    "Service": "services",
    "ServiceAccount": "serviceaccounts",
    "StatefulSet": "statefulsets",
    "Workload": "workloads",
    "HorizontalPodAutoscaler": "horizontalpodautoscalers",
    "SandboxTemplate": "sandboxtemplates",  # agent-sandbox (kubernetes-sigs/agent-sandbox)
    "SandboxWarmPool": "sandboxwarmpools",
}
RLJOB_API_VERSION = f"{GROUP}/{VERSION}"


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    """`/api/v1/namespaces/NS/pods` or `/apis/GROUP/VERSION/namespaces/NS/PLURAL`."""
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{root}/namespaces/{namespace}/{_PLURALS[kind]}"


def object_path(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{collection_path(obj['apiVersion'], obj['kind'], meta['namespace'])}/{meta['name']}"


def rljob_path(namespace: str, name: str) -> str:
    return f"{collection_path(RLJOB_API_VERSION, 'RLJob', namespace)}/{name}"


class Kube:
    def __init__(self, api: client.ApiClient, timeout_s: float = 30.0) -> None:
        self.api = api
        self.timeout_s = timeout_s

    @classmethod
    def from_environment(cls) -> Kube:
        """In-cluster credentials when running in a pod, else the kubeconfig ($KUBECONFIG or ~/.kube/config)."""
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls(client.ApiClient())

    def _call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        response = self.api.call_api(
            path,
            method,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=self.timeout_s,
        )
        data = response.data
        return json.loads(data) if data else None

    def get(self, path: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self._call("GET", path)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def list(self, path: str, label_selector: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Items of a collection. The selector is also applied here: some API emulators ignore it."""
        selector = label_selector or {}
        query = ",".join(f"{k}={v}" for k, v in selector.items())
        items = (self._call("GET", f"{path}?labelSelector={query}" if query else path) or {}).get("items") or []
        return [i for i in items if selector.items() <= ((i.get("metadata") or {}).get("labels") or {}).items()]

    def create(self, obj: dict[str, Any], exist_ok: bool = False) -> dict[str, Any] | None:
        """The created object; with `exist_ok`, None when one of that name exists already."""
        meta = obj["metadata"]
        try:
            return self._call("POST", collection_path(obj["apiVersion"], obj["kind"], meta["namespace"]), obj)
        except ApiException as err:
            if exist_ok and err.status == 409:
                return None
            raise

    def apply(self, obj: dict[str, Any], field_manager: str, force: bool = True) -> dict[str, Any]:
        """Server-side apply: create `obj` if missing, else make the fields it holds what it says and own
        them as `field_manager`. With `force`, fields another manager owns are taken over instead of
        answering 409, so leave out of `obj` whatever another manager should keep."""
        query = {"fieldManager": field_manager, **({"force": "true"} if force else {})}
        # a JSON body is valid YAML: the apply content type accepts either
        return self._call("PATCH", f"{object_path(obj)}?{urlencode(query)}", obj, "application/apply-patch+yaml")

    def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """JSON merge patch: the fields in `body` are written, None removes one, lists are replaced whole."""
        return self._call("PATCH", path, body, "application/merge-patch+json")

    def delete(self, path: str) -> bool:
        """Delete; False when it was already gone."""
        try:
            self._call("DELETE", path)
        except ApiException as err:
            if err.status == 404:
                return False
            raise
        return True
