"""The RBAC check the emulated API server leaves out: each request a pod made through the node's API relay
(tests/cluster/network.py records method, path and the pod's address) is authorized as the API server
would, against the Roles and ClusterRoles bound to the pod's service account. Non-resource URLs
(discovery, /version, OpenAPI) are left out: every authenticated user may read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from helpers.emulator import Api


@dataclass(frozen=True)
class Attributes:
    verb: str
    group: str
    resource: str  # with the subresource: rljobs/status
    namespace: str | None
    name: str | None


def attributes(method: str, url: str) -> Attributes | None:
    """What the authorizer sees of a request, or None for a non-resource URL."""
    split = urlsplit(url)
    parts = [p for p in split.path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, rest = "", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        return None
    if not rest:
        return None
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    resource, name = rest[0], rest[1] if len(rest) > 1 else None
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    watch = parse_qs(split.query).get("watch", [""])[0] in ("true", "1")
    verb = {
        "GET": "watch" if watch else ("get" if name else "list"),
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }[method]
    return Attributes(verb, group, resource, namespace, name)


def _allows(rule: dict[str, Any], request: Attributes) -> bool:
    def has(values: list[str] | None, value: str) -> bool:
        return bool(values) and ("*" in values or value in values)

    names = rule.get("resourceNames") or []
    return (
        has(rule.get("apiGroups"), request.group)
        and has(rule.get("resources"), request.resource)
        and has(rule.get("verbs"), request.verb)
        and (not names or request.name in names)
    )


def _binds(binding: dict[str, Any], namespace: str, account: str) -> bool:
    return any(
        s.get("kind") == "ServiceAccount" and s.get("name") == account and s.get("namespace", namespace) == namespace
        for s in binding.get("subjects") or []
    )


def rules_of(api: Api, namespace: str, account: str, request_namespace: str | None) -> list[dict[str, Any]]:
    """The rules the account holds for a request in `request_namespace` (None: cluster-scoped)."""

    def role(ref: dict[str, Any], binding_namespace: str | None) -> list[dict[str, Any]]:
        if ref["kind"] == "ClusterRole":
            found = api.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{ref['name']}")
        else:
            found = api.get(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{binding_namespace}/roles/{ref['name']}")
        return (found or {}).get("rules") or []

    rules = []
    for binding in api.items("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"):
        if _binds(binding, namespace, account):
            rules += role(binding["roleRef"], None)
    if request_namespace:
        path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{request_namespace}/rolebindings"
        for binding in api.items(path):
            if _binds(binding, request_namespace, account):
                rules += role(binding["roleRef"], request_namespace)
    return rules


def refused(api: Api, requests: list[tuple[str, str, str]], accounts: dict[str, tuple[str, str]]) -> list[str]:
    """Each distinct request (pod address, method, URL) that RBAC would refuse, as `ACCOUNT VERB RESOURCE`.
    `accounts`: pod address -> (namespace, service account)."""
    out = set()
    for address, method, url in requests:
        request = attributes(method, url)
        if request is None or address not in accounts:
            continue
        namespace, account = accounts[address]
        if not any(_allows(rule, request) for rule in rules_of(api, namespace, account, request.namespace)):
            where = f"{request.namespace}/" if request.namespace else ""
            group = f"{request.group}/" if request.group else ""
            out.add(f"{namespace}:{account} {request.verb} {group}{request.resource} {where}{request.name or ''}")
    return sorted(out)
