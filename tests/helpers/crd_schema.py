"""What the API server does with a CRD schema that the tests need without one: apply the schema's
defaults, evaluate its CEL `x-kubernetes-validations` (with cel-python) on the defaulted object, and find
the fields it does not declare (strict field validation, as the emulated API server applies it)."""

from __future__ import annotations

import copy
from typing import Any

import celpy

_ENV = celpy.Environment()


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """A copy of `value` as the API server stores it: null fields of non-nullable properties pruned,
    then every missing property that has a schema default filled in, recursively."""
    value = _without_nulls(schema, copy.deepcopy(value))
    _default_in_place(schema, value)
    return value


def _without_nulls(schema: dict[str, Any], value: Any) -> Any:
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return {
            k: _without_nulls(props.get(k, {}), v)
            for k, v in value.items()
            if v is not None or props.get(k, {}).get("nullable")
        }
    return value


def _default_in_place(schema: dict[str, Any], value: Any) -> None:
    if isinstance(value, dict):
        for prop, sub in schema.get("properties", {}).items():
            if prop not in value and "default" in sub:
                value[prop] = copy.deepcopy(sub["default"])
            if prop in value:
                _default_in_place(sub, value[prop])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value:
                _default_in_place(extra, value[key])
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            _default_in_place(schema["items"], item)


def cel_violations(schema: dict[str, Any], value: Any, path: str = "") -> list[tuple[str, str]]:
    """(field path, message) for every CEL rule in `schema` that `value` breaks."""
    found: list[tuple[str, str]] = []
    for rule in schema.get("x-kubernetes-validations", []):
        program = _ENV.program(_ENV.compile(rule["rule"]))
        if not bool(program.evaluate({"self": celpy.json_to_cel(_as_declared(schema, value))})):
            found.append((path + rule.get("fieldPath", ""), rule["message"]))
    if isinstance(value, dict):
        for prop, sub in schema.get("properties", {}).items():
            if prop in value:
                found += cel_violations(sub, value[prop], f"{path}.{prop}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += cel_violations(schema["items"], item, f"{path}[{i}]")
    return found


def _as_declared(schema: dict[str, Any], value: Any) -> Any:
    """`value` with the CEL types its schema gives it: a `number` field is a double, even written as 0 (CEL has
    no ordering between an int and a double)."""
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict):
        props, extra = schema.get("properties", {}), schema.get("additionalProperties")
        fallback = extra if isinstance(extra, dict) else {}
        return {k: _as_declared(props.get(k, fallback), v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_declared(schema.get("items", {}), item) for item in value]
    return value


def undeclared_fields(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """The fields of `value` that a structural schema does not declare, as `.spec.modle` (what the API server
    refuses under `?fieldValidation=Strict`)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, list):
        items = schema.get("items") or {}
        return [f for i, v in enumerate(value) for f in undeclared_fields(items, v, f"{path}[{i}]")]
    if not isinstance(value, dict):
        return []
    if "properties" not in schema:
        extra = schema.get("additionalProperties")
        if not isinstance(extra, dict):
            return []  # a free-form map (`metadata`, `additionalProperties: true`)
        return [f for k, v in value.items() for f in undeclared_fields(extra, v, f"{path}.{k}")]
    found = []
    for key, sub in value.items():
        if key not in schema["properties"]:
            found.append(f"{path}.{key}")
        else:
            found += undeclared_fields(schema["properties"][key], sub, f"{path}.{key}")
    return found
