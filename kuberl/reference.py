"""The RLJob field reference (docs/rljob.md), generated from the CRD schema so it cannot drift."""

from __future__ import annotations

import json
from typing import Any

from kuberl.crd import rljob_crd

HEADER = """# RLJob reference (`kuberl.io/v1alpha1`)

Generated from the API models by `make crds`; do not edit. Every field is optional unless marked
**required**; the default is what KubeRL uses when the field is left out. `kuberl validate FILE` checks a
manifest against all of this, including the cross-field rules listed at the end, and what would fail once the
job runs: an unknown environment or reward function (the known ones listed), a `module:function` that does not
import, a process reward model, every bad row of a local task file (by line and field), a model named like a
Hugging Face id that is not a local folder. Numbers are read as kubectl reads them (`1e-6`).

| Field | Type | Default | Description |
|---|---|---|---|
"""


def _type_of(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "quantity"
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    kind = node.get("type", "")
    if kind == "array":
        return f"list of {_type_of(node.get('items', {}))}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map of {_type_of(node['additionalProperties'])}"
    if node.get("pattern") and "(ms|s|m|h|d)" in node["pattern"]:
        return "duration"
    return kind


def _rows(node: dict[str, Any], path: str, required: set[str]) -> list[str]:
    rows = []
    for name, sub in node.get("properties", {}).items():
        field = f"{path}.{name}"
        default = "" if "default" not in sub or sub["default"] == {} else f"`{json.dumps(sub['default'])}`"
        mark = " **required**" if name in required else ""
        text = " ".join(sub.get("description", "").split()).replace("|", "\\|")
        rows.append(f"| `{field}`{mark} | {_type_of(sub)} | {default} | {text} |")
        item = sub.get("items", {})
        if "properties" in sub:
            rows += _rows(sub, field, set(sub.get("required", [])))
        elif "properties" in item:
            rows += _rows(item, field + "[]", set(item.get("required", [])))
    return rows


def _rules(node: dict[str, Any], path: str) -> list[str]:
    found = [f"- `{path}{r.get('fieldPath', '')}`: {r['message']}" for r in node.get("x-kubernetes-validations", [])]
    for name, sub in node.get("properties", {}).items():
        found += _rules(sub, f"{path}.{name}")
    return found


def reference_markdown() -> str:
    """docs/rljob.md: one table row per spec field, then the CEL-enforced rules."""
    root = rljob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = root["properties"]["spec"]
    rules = _rules(spec, "spec")
    return (
        HEADER
        + "\n".join(_rows(spec, "spec", set()))
        + "\n\n## Rules the API server also enforces (CEL)\n\n"
        + "\n".join(rules)
        + "\n\n`kuberl validate` enforces these and a few CEL cannot express "
        "(for example `environment.turnTimeout` <= `environment.trajectoryTimeout`).\n"
    )
