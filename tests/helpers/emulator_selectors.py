"""Label and field selectors as the API server applies them to a list or a watch (`?labelSelector=`,
`?fieldSelector=`), for the emulated API server: `kubectl get -l`, `kubectl describe` (a job's events by
`involvedObject`) and `kubectl delete` (its wait, by `metadata.name`) send them.

Label selectors take `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k` and `!k`; field selectors
take `path=v`, `path==v` and `path!=v` on any dotted path of the object (a real server accepts only the
fields each kind indexes; here every path works, and a missing field reads as the empty string)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_EXISTS = re.compile(rf"(!?)\s*({_KEY})")
_EQUALS = re.compile(rf"({_KEY})\s*(==|=|!=)\s*([-A-Za-z0-9_./:]*)")
_IN = re.compile(rf"({_KEY})\s+(in|notin)\s*\(([^)]*)\)")


class SelectorError(ValueError):
    """A selector the API server would refuse (400)."""


def _requirements(selector: str) -> list[str]:
    """The comma-separated requirements, commas inside `in (a,b)` kept."""
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [p.strip() for p in [*parts, current] if p.strip()]


def labels_match(selector: str, labels: Mapping[str, str]) -> bool:
    """Whether `labels` satisfy every requirement of a label selector."""
    for requirement in _requirements(selector):
        if match := _IN.fullmatch(requirement):
            key, operator, values = match.groups()
            present = key in labels and labels[key] in {v.strip() for v in values.split(",")}
            if present != (operator == "in"):
                return False
        elif match := _EQUALS.fullmatch(requirement):
            key, operator, value = match.groups()
            if (labels.get(key) == value) != (operator != "!="):
                return False
        elif match := _EXISTS.fullmatch(requirement):
            negated, key = match.groups()
            if (key in labels) == bool(negated):
                return False
        else:
            raise SelectorError(f"unable to parse requirement: {requirement!r}")
    return True


def field_value(obj: Any, path: str) -> str:
    """The field at a dotted path as a field selector compares it: a string, '' when absent."""
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    if isinstance(obj, bool):
        return "true" if obj else "false"
    return "" if obj is None else str(obj)


def fields_match(selector: str, obj: dict[str, Any]) -> bool:
    """Whether `obj` satisfies every requirement of a field selector."""
    for requirement in _requirements(selector):
        match = re.fullmatch(r"([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*)", requirement)
        if not match:
            raise SelectorError(f"invalid field selector: {requirement!r}")
        path, operator, value = match.groups()
        if (field_value(obj, path) == value) != (operator != "!="):
            return False
    return True


def selected(params: Mapping[str, str], obj: dict[str, Any]) -> bool:
    """Whether a list or watch request with these query parameters includes `obj`."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if (label_selector := params.get("labelSelector")) and not labels_match(label_selector, labels):
        return False
    return not (field_selector := params.get("fieldSelector")) or fields_match(field_selector, obj)
