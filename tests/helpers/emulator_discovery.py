"""Discovery for the emulated API server, built from what it serves (kmock's `resources`: group, version,
plural -> kind, scope, verbs, short names, categories, subresources):

- the legacy documents (`/api`, `/apis`, `/apis/G`, `/api/v1`, `/apis/G/V`) that kopf and the Python client
  read, and the aggregated `APIGroupDiscoveryList` (apidiscovery.k8s.io/v2) that kubectl 1.32 asks for
  first, so that one request answers what would take one per group version;
- the OpenAPI v3 documents kubectl reads before it writes: each resource's PATCH takes `fieldValidation`
  (so kubectl leaves validation to the server instead of downloading OpenAPI v2), and a custom resource's
  schema is published for `kubectl explain`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
SUBRESOURCE_VERBS = ["get", "patch", "update"]
ResourceKey = Any  # kmock.resource: .group, .version, .plural
Info = Any  # kmock.ResourceInfo: .kind, .singular, .namespaced, .verbs, .shortnames, .categories, .subresources


def group_version(group: str, version: str) -> str:
    return f"{group}/{version}" if group else version


def version_priority(version: str) -> tuple[int, int, int]:
    """Kubernetes' order of versions, most preferred first when sorted: v2 > v1 > v1beta2 > v1beta1 > v1alpha1."""
    match = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if not match:
        return (-1, 0, 0)
    major, stage, minor = match.groups()
    return ({"alpha": 0, "beta": 1}.get(stage or "", 2), int(major), int(minor or 0))


def _versions(resources: Iterable[ResourceKey], group: str) -> list[str]:
    found = {r.version for r in resources if r.group == group}
    return sorted(found, key=version_priority, reverse=True)


def _subresource_kind(info: Info, group: str, version: str, subresource: str) -> dict[str, str]:
    if subresource == "scale":
        return {"group": "autoscaling", "version": "v1", "kind": "Scale"}
    return {"group": group, "version": version, "kind": info.kind}


def api_versions() -> dict[str, Any]:
    """`/api`: the core group's versions."""
    return {"kind": "APIVersions", "apiVersion": "v1", "versions": ["v1"], "serverAddressByClientCIDRs": []}


def api_group(resources: Iterable[ResourceKey], group: str) -> dict[str, Any] | None:
    """`/apis/GROUP`, or None when nothing of that group is served."""
    versions = _versions(list(resources), group)
    if not versions:
        return None
    entries = [{"groupVersion": group_version(group, v), "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": entries, "preferredVersion": entries[0]}


def api_group_list(resources: Iterable[ResourceKey]) -> dict[str, Any]:
    """`/apis`: every group but the core one."""
    resources = list(resources)
    groups = sorted({r.group for r in resources if r.group})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group(resources, g) for g in groups]}


def api_resource_list(served: Mapping[ResourceKey, Info], group: str, version: str) -> dict[str, Any] | None:
    """`/api/v1` or `/apis/GROUP/VERSION`: each resource and subresource, or None when none is served."""
    entries = []
    for resource, info in sorted(served.items(), key=lambda item: item[0].plural):
        if (resource.group, resource.version) != (group, version):
            continue
        entries.append(
            {
                "name": resource.plural,
                "singularName": info.singular or info.kind.lower(),
                "namespaced": bool(info.namespaced),
                "kind": info.kind,
                "verbs": sorted(info.verbs),
                "shortNames": sorted(info.shortnames),
                "categories": sorted(info.categories),
            }
        )
        for sub in sorted(info.subresources):
            kind = _subresource_kind(info, group, version, sub)
            extra = {} if kind["group"] == group else {"group": kind["group"], "version": kind["version"]}
            entries.append(
                {
                    "name": f"{resource.plural}/{sub}",
                    "singularName": "",
                    "namespaced": bool(info.namespaced),
                    "kind": kind["kind"],
                    "verbs": SUBRESOURCE_VERBS,
                    **extra,
                }
            )
    if not entries:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version(group, version),
        "resources": entries,
    }


def aggregated(served: Mapping[ResourceKey, Info], core: bool) -> dict[str, Any]:
    """The aggregated discovery of `/api` (`core`) or `/apis`: every group, version and resource at once."""
    groups = sorted({r.group for r in served if (r.group == "") == core})
    items = []
    for group in groups:
        versions = []
        for version in _versions(served, group):
            resources = []
            for resource, info in sorted(served.items(), key=lambda item: item[0].plural):
                if (resource.group, resource.version) != (group, version):
                    continue
                resources.append(
                    {
                        "resource": resource.plural,
                        "responseKind": {"group": group, "version": version, "kind": info.kind},
                        "scope": "Namespaced" if info.namespaced else "Cluster",
                        "singularResource": info.singular or info.kind.lower(),
                        "verbs": sorted(info.verbs),
                        "shortNames": sorted(info.shortnames),
                        "categories": sorted(info.categories),
                        "subresources": [
                            {
                                "subresource": sub,
                                "responseKind": _subresource_kind(info, group, version, sub),
                                "verbs": SUBRESOURCE_VERBS,
                            }
                            for sub in sorted(info.subresources)
                        ],
                    }
                )
            versions.append({"version": version, "resources": resources, "freshness": "Current"})
        items.append({"metadata": {"name": group}, "versions": versions})
    return {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items}


def wants_aggregated(accept: str) -> bool:
    """Whether a discovery request's Accept header asks for the aggregated form."""
    return any("as=APIGroupDiscoveryList" in media and "v=v2;" in media + ";" for media in accept.split(","))


def _schema_name(group: str, version: str, kind: str) -> str:
    """`io.kuberl.v1alpha1.RLJob`: the API server's name for a custom resource's schema."""
    return ".".join([*reversed(group.split(".")), version, kind]) if group else f"io.k8s.api.core.{version}.{kind}"


def openapi_document(
    served: Mapping[ResourceKey, Info], schemas: Mapping[ResourceKey, dict[str, Any]], group: str, version: str
) -> dict[str, Any]:
    """The OpenAPI v3 document of one group version: a PATCH per resource that takes `fieldValidation`,
    and the schemas the emulator knows (those of custom resources), for `kubectl explain`."""
    root = f"/apis/{group}/{version}" if group else f"/api/{version}"
    paths, components = {}, {}
    for resource, info in served.items():
        if (resource.group, resource.version) != (group, version):
            continue
        gvk = {"group": group, "version": version, "kind": info.kind}
        scope = "/namespaces/{namespace}" if info.namespaced else ""
        paths[f"{root}{scope}/{resource.plural}/{{name}}"] = {
            "patch": {
                "operationId": f"patch{info.kind}",
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
                "responses": {"200": {"description": "OK"}},
            }
        }
        if (schema := schemas.get(resource)) is not None:
            components[_schema_name(group, version, info.kind)] = {**schema, "x-kubernetes-group-version-kind": [gvk]}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": components},
    }


def openapi_root(served: Mapping[ResourceKey, Info], schemas: Mapping[ResourceKey, dict[str, Any]]) -> dict[str, Any]:
    """`/openapi/v3`: each group version's document, with a hash of its content (kubectl caches by it)."""
    paths = {}
    for group, version in sorted({(r.group, r.version) for r in served}):
        path = f"apis/{group}/{version}" if group else f"api/{version}"
        document = json.dumps(openapi_document(served, schemas, group, version), sort_keys=True)
        digest = hashlib.sha256(document.encode()).hexdigest().upper()
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": paths}
