"""The base of every API model: camelCase on the wire, unknown fields rejected, cross-field rules.

A cross-field rule is written once, as a Python predicate with its CEL twin. Pydantic enforces the
predicate; the CRD generator copies the CEL into `x-kubernetes-validations`, so the API server and
`kuberl validate` agree (tests evaluate both on the same manifests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

CROSS_FIELD_ERROR = "cross_field"


@dataclass(frozen=True)
class CrossFieldRule:
    """A constraint between fields of one model.

    `field` is the camelCase path (relative to the model) that the error is reported on;
    `cel` is the same rule in CEL over `self`, or None where CEL cannot express it (the rule is then
    enforced by pydantic only: `kuberl validate` and the operator); `holds` is the Python predicate;
    `explain` renders the message with the offending values.
    """

    field: str
    cel: str | None
    message: str
    holds: Callable[[Any], bool]
    explain: Callable[[Any], str] | None = None

    def describe(self, model: Any) -> str:
        return self.explain(model) if self.explain else self.message


class ApiModel(BaseModel):
    """Base for every model of the external API (RLJob, trajectories, HTTP bodies)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
    )

    cross_field_rules: ClassVar[tuple[CrossFieldRule, ...]] = ()

    @model_validator(mode="after")
    def _enforce_cross_field_rules(self) -> ApiModel:
        broken = [(rule.field, rule.describe(self)) for rule in self.cross_field_rules if not rule.holds(self)]
        if broken:
            raise PydanticCustomError(
                CROSS_FIELD_ERROR,
                "{summary}",
                {"summary": "; ".join(f"{path}: {text}" for path, text in broken), "problems": broken},
            )
        return self

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        schema: dict[str, Any] = handler(core_schema)
        if any(r.cel for r in cls.cross_field_rules):
            target = handler.resolve_ref_schema(schema)
            target["x-kubernetes-validations"] = [
                {"rule": r.cel, "message": r.message, "fieldPath": "." + r.field}
                for r in cls.cross_field_rules
                if r.cel is not None
            ]
        return schema

    def to_manifest(self) -> dict[str, Any]:
        """The wire form: camelCase keys, unset optional fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
