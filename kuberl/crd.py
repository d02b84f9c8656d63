"""Generate the RLJob CustomResourceDefinition from the pydantic models.

Pydantic emits JSON Schema (2020-12, with $refs); Kubernetes wants a *structural* OpenAPI v3 schema:
every node typed, no $ref, no `additionalProperties: false` next to `properties`, nullable instead of
`anyOf [..., null]`, boolean exclusive bounds. Defaults of nested sections are spelled out so that the
API server defaults a manifest exactly as pydantic does (and CEL rules see the defaulted values).
"""

from __future__ import annotations

import copy
import typing
from typing import Any

import yaml
from pydantic import BaseModel

from kuberl.api.rljob import MAX_JOB_NAME
from kuberl.api.spec import API_VERSION, KIND, RLJobSpec
from kuberl.api.status import RLJobStatus

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "rljobs"
CRD_NAME = f"{PLURAL}.{GROUP}"
_DROPPED_KEYS = {"title", "$defs"}


def _model_classes(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model reachable from `root`, by the name pydantic gives its $def."""
    found: dict[str, type[BaseModel]] = {}
    pending = [root]
    while pending:
        cls = pending.pop()
        if cls.__name__ in found:
            continue
        found[cls.__name__] = cls
        for field in cls.model_fields.values():
            for arg in _flatten(field.annotation):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    pending.append(arg)
    return found


def _flatten(annotation: Any) -> list[Any]:
    args = typing.get_args(annotation)
    if not args:
        return [annotation]
    return [leaf for arg in args for leaf in _flatten(arg)]


def _factory_default(cls: type[BaseModel], alias: str) -> Any:
    """The wire form of a field's default_factory, or None when it adds nothing."""
    for name, field in cls.model_fields.items():
        if (field.alias or name) != alias or field.default_factory is None:
            continue
        value = field.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json", by_alias=True, exclude_defaults=True, exclude_none=True)
        return None  # empty dicts and lists: absent means the same
    return None


class _Converter:
    def __init__(self, root: type[BaseModel]) -> None:
        raw = root.model_json_schema(by_alias=True, mode="validation")
        self.defs: dict[str, Any] = raw.pop("$defs", {})
        self.classes = _model_classes(root)
        self.root_schema = raw
        self.root_name = root.__name__

    def convert(self) -> dict[str, Any]:
        return self._node(self.root_schema, self.root_name)

    def _node(self, node: dict[str, Any], model_name: str | None = None) -> dict[str, Any]:
        node = copy.deepcopy(node)
        if "$ref" in node:
            name = node.pop("$ref").rsplit("/", 1)[-1]
            resolved = copy.deepcopy(self.defs[name])
            resolved.update(node)  # the field's own description and default win
            return self._node(resolved, name)
        if "anyOf" in node:
            branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
            if node.get("x-kubernetes-int-or-string"):
                node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            elif len(branches) == 1:
                merged = dict(branches[0])
                merged.update(node)
                return self._node(merged)
            else:
                raise ValueError(f"a union of several types cannot be structural: {branches}")
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _DROPPED_KEYS or (key == "default" and value is None):
                continue
            if key == "const":
                out["enum"] = [value]
            elif key in ("exclusiveMinimum", "exclusiveMaximum"):
                out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
                out[key] = True
            elif key == "additionalProperties":
                if isinstance(value, dict):
                    out[key] = self._node(value)
                # `false` is not structural; the API server prunes unknown fields instead
            elif key == "items":
                out[key] = self._node(value)
            elif key == "properties":
                out[key] = {prop: self._property(sub, model_name, prop) for prop, sub in value.items()}
            else:
                out[key] = value
        if "properties" in out or "additionalProperties" in out:
            out.setdefault("type", "object")
        return _ordered(out)

    def _property(self, sub: dict[str, Any], model_name: str | None, prop: str) -> dict[str, Any]:
        converted = self._node(sub)
        cls = self.classes.get(model_name or "")
        if (
            cls is not None
            and "default" not in converted
            and converted.get("type") == "object"
            and "properties" in converted
        ):
            default = _factory_default(cls, prop)
            if default is not None:
                converted = _ordered({**converted, "default": default})
        return converted


_KEY_ORDER = ("type", "description", "default", "enum", "format", "minimum", "maximum")


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    """Readable key order: type and description first, then the rest alphabetically."""
    first = [k for k in _KEY_ORDER if k in node]
    return {k: node[k] for k in first + sorted(k for k in node if k not in _KEY_ORDER)}


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a model."""
    return _Converter(model).convert()


def rljob_crd() -> dict[str, Any]:
    """The RLJob CustomResourceDefinition as a dict."""
    spec_schema = openapi_schema(RLJobSpec)
    status_schema = openapi_schema(RLJobStatus)
    root = {
        "type": "object",
        "description": "An agentic RL training job: one manifest for the learner, rollout and sandbox tiers.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {**spec_schema, "default": {}},
            "status": status_schema,
        },
        "x-kubernetes-validations": [
            {
                "rule": f"self.metadata.name.size() <= {MAX_JOB_NAME}",
                "message": f"metadata.name must be at most {MAX_JOB_NAME} characters "
                "(child objects append their tier and ordinal)",
            }
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "kuberl", "app.kubernetes.io/part-of": "kuberl"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["rlj"],
                "categories": ["kuberl"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                        {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
                        {"name": "Reward", "type": "number", "jsonPath": ".status.rewardMean"},
                        {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
                        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                    ],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def rljob_crd_yaml() -> str:
    """The CRD as the YAML text that `crds/rljob.yaml` holds (stable across runs)."""
    header = "# Generated from the pydantic models in kuberl/api by `make crds` (kuberl crds). Do not edit.\n"
    return header + yaml.safe_dump(rljob_crd(), sort_keys=False, width=100, allow_unicode=True)
