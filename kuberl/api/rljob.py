"""The RLJob custom resource as one model: apiVersion, kind, metadata, spec, status."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import ConfigDict, Field

from kuberl.api.base import ApiModel
from kuberl.api.spec import API_VERSION, KIND, RLJobSpec
from kuberl.api.status import RLJobStatus
from kuberl.api.types import DNS_LABEL_PATTERN

# Child objects are named "<job>-<tier>" and StatefulSet pods add "-<ordinal>" plus a revision hash
# label (63 characters at most), so job names are kept well under the DNS-1123 limit.
MAX_JOB_NAME = 40


class ObjectMeta(ApiModel):
    """The part of Kubernetes object metadata KubeRL reads; server-set fields are kept as they are."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=MAX_JOB_NAME, pattern=DNS_LABEL_PATTERN)
    """Job name: lowercase letters, digits and '-', at most 40 characters."""
    namespace: str | None = Field(None, max_length=63, pattern=DNS_LABEL_PATTERN)
    """Namespace; `kuberl run` ignores it."""
    labels: dict[str, str] = Field(default_factory=dict)
    """Labels, copied onto every child object."""
    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations."""


class RLJob(ApiModel):
    """An agentic RL training job: one manifest for the learner, rollout and sandbox tiers."""

    api_version: Literal["kuberl.io/v1alpha1"] = API_VERSION
    """Always kuberl.io/v1alpha1."""
    kind: Literal["RLJob"] = KIND
    """Always RLJob."""
    metadata: ObjectMeta
    """Name, namespace, labels."""
    spec: RLJobSpec = Field(default_factory=RLJobSpec)
    """Desired state."""
    status: RLJobStatus | None = None
    """Observed state, written by KubeRL."""

    @classmethod
    def from_manifest(cls, data: dict[str, Any]) -> RLJob:
        """Validate a parsed manifest with JSON typing, as the API server does: '5' is not an integer
        and `true` is not a number (pydantic's lax Python mode would coerce both)."""
        return cls.model_validate_json(json.dumps(data, default=str), strict=True)

    @property
    def name(self) -> str:
        return self.metadata.name
