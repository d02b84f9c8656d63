"""Server-side printing for the emulated API server: the `meta.k8s.io` Table that `kubectl get` asks for
(`Accept: application/json;as=Table;...`). A custom resource is printed with its CRD's
`additionalPrinterColumns`, as the API server does; the built-in kinds the operator creates with the columns
a real API server prints for them (simplified: a pod's status is its phase or a waiting container's reason);
any other kind with Name and Age, as a CRD without printer columns."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

Cell = Callable[[dict[str, Any]], Any]


def wants_table(accept: str) -> str | None:
    """The Table version ('v1' or 'v1beta1') a client's Accept header asks for first, or None."""
    for media in accept.split(","):
        params = dict(p.strip().partition("=")[::2] for p in media.split(";")[1:])
        if params.get("as") == "Table" and params.get("g", "meta.k8s.io") == "meta.k8s.io":
            return params.get("v", "v1")
    return None


def human_age(stamp: str | None, now: datetime | None = None) -> str | None:
    """`2026-01-01T00:00:00Z` as kubectl's age: 45s, 3m20s, 2h5m, 4d."""
    if not stamp:
        return None
    start = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    seconds = int(((now or datetime.now(UTC)) - start).total_seconds())
    if seconds < 0:
        return "0s" if seconds > -2 else "<invalid>"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m" + (f"{seconds % 60}s" if seconds % 60 else "")
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h" + (f"{minutes % 60}m" if minutes % 60 else "")
    if hours < 48:
        return f"{hours}h"
    if days < 8:
        return f"{days}d" + (f"{hours % 24}h" if hours % 24 else "")
    return f"{days}d" if days < 730 else f"{days // 365}y"


def json_path(obj: Any, path: str) -> Any:
    """A printer column's simple JSONPath (`.status.phase`, `.spec.containers[0].image`); None otherwise."""
    for name, index in re.findall(r"\.([^.\[\]]+)|\[(\d+)\]", path):
        if name and isinstance(obj, dict):
            obj = obj.get(name)
        elif index and isinstance(obj, list) and int(index) < len(obj):
            obj = obj[int(index)]
        else:
            return None
    return obj


def _get(path: str) -> Cell:
    return lambda obj: json_path(obj, path)


def _age(obj: dict[str, Any]) -> str | None:
    return human_age((obj.get("metadata") or {}).get("creationTimestamp"))


def _pod_status(pod: dict[str, Any]) -> str | None:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        state = container.get("state") or {}
        if reason := (state.get("waiting") or state.get("terminated") or {}).get("reason"):
            return reason
    return (pod.get("status") or {}).get("phase") or "Pending"


def _pod_ready(pod: dict[str, Any]) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or []) or len(statuses)
    return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"


def _replicas_ready(obj: dict[str, Any]) -> str:
    return f"{(obj.get('status') or {}).get('readyReplicas') or 0}/{(obj.get('spec') or {}).get('replicas', 1)}"


def _ports(service: dict[str, Any]) -> str | None:
    ports = (service.get("spec") or {}).get("ports") or []
    return ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in ports) or None


def _event_object(event: dict[str, Any]) -> str:
    involved = event.get("involvedObject") or {}
    return f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}"


def _column(name: str, kind: str, cell: Cell, priority: int = 0) -> tuple[dict[str, Any], Cell]:
    return {"name": name, "type": kind, "format": "", "description": name, "priority": priority}, cell


AGE = _column("Age", "string", _age)
# (group, plural) -> the columns after Name, for the built-in kinds the operator creates and reads
BUILT_IN: dict[tuple[str, str], list[tuple[dict[str, Any], Cell]]] = {
    ("", "pods"): [
        _column("Ready", "string", _pod_ready),
        _column("Status", "string", _pod_status),
        _column(
            "Restarts",
            "integer",
            lambda p: sum(s.get("restartCount", 0) for s in json_path(p, ".status.containerStatuses") or []),
        ),
        AGE,
        _column("IP", "string", _get(".status.podIP"), 1),
        _column("Node", "string", _get(".spec.nodeName"), 1),
    ],
    ("apps", "statefulsets"): [_column("Ready", "string", _replicas_ready), AGE],
    ("apps", "deployments"): [
        _column("Ready", "string", _replicas_ready),
        _column("Up-to-date", "integer", lambda d: json_path(d, ".status.updatedReplicas") or 0),
        _column("Available", "integer", lambda d: json_path(d, ".status.availableReplicas") or 0),
        AGE,
    ],
    ("", "services"): [
        _column("Type", "string", lambda s: json_path(s, ".spec.type") or "ClusterIP"),
        _column("Cluster-IP", "string", _get(".spec.clusterIP")),
        _column("External-IP", "string", lambda s: ",".join(json_path(s, ".spec.externalIPs") or []) or None),
        _column("Port(s)", "string", _ports),
        AGE,
    ],
    ("", "configmaps"): [
        _column("Data", "integer", lambda c: len(c.get("data") or {}) + len(c.get("binaryData") or {})),
        AGE,
    ],
    ("", "secrets"): [
        _column("Type", "string", lambda s: s.get("type", "Opaque")),
        _column("Data", "integer", lambda s: len(s.get("data") or {}) + len(s.get("stringData") or {})),
        AGE,
    ],
    ("", "events"): [
        _column("Last Seen", "string", lambda e: human_age(e.get("lastTimestamp") or e.get("eventTime"))),
        _column("Type", "string", _get(".type")),
        _column("Reason", "string", _get(".reason")),
        _column("Object", "string", _event_object),
        _column("Message", "string", _get(".message")),
    ],
}


def printer_columns(crd_columns: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Cell]]:
    """A CRD version's `additionalPrinterColumns` as table columns; a date column prints as an age."""
    columns = []
    for column in crd_columns:
        path = column["jsonPath"]
        cell = (lambda p: lambda obj: human_age(json_path(obj, p)))(path) if column["type"] == "date" else _get(path)
        definition = {
            "name": column["name"],
            "type": column["type"],
            "format": column.get("format", ""),
            "description": column.get("description", ""),
            "priority": column.get("priority", 0),
        }
        columns.append((definition, cell))
    return columns


def table(
    objects: list[dict[str, Any]], columns: list[tuple[dict[str, Any], Cell]], version: str, params: Mapping[str, str]
) -> dict[str, Any]:
    """The Table of `objects` (Name first); each row carries the object as `?includeObject=` says
    (PartialObjectMetadata by default, as kubectl needs for the namespace and labels columns)."""
    name = {"name": "Name", "type": "string", "format": "name", "description": "Name of the object", "priority": 0}
    include = params.get("includeObject", "PartialObjectMetadata")
    rows = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        row: dict[str, Any] = {"cells": [meta.get("name"), *(cell(obj) for _, cell in columns)]}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": f"meta.k8s.io/{version}", "metadata": meta}
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": f"meta.k8s.io/{version}",
        "metadata": {},
        "columnDefinitions": [name, *(definition for definition, _ in columns)],
        "rows": rows,
    }
