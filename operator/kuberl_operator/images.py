"""The images of a job's pods and the Secrets they are pulled with: what the job names, else the operator's
defaults (the chart's jobDefaults), which point every job at one registry."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kuberl import __version__
from kuberl.api import env_vars
from kuberl.api.rljob import RLJob
from kuberl.api.spec import DEFAULT_IMAGE_REGISTRY
from kuberl.api.types import DNS_SUBDOMAIN_PATTERN
from kuberl_operator.meta import LEARNER, ROLLOUT, SANDBOX

# The image each tier runs unless its spec names one, under the registry prefix: those `make images` builds.
# The sandbox default is the base sandbox server; jobs on Python repositories name sandbox-swe (git, pytest).
TIER_IMAGES = {LEARNER: "learner", ROLLOUT: "rollout", SANDBOX: "sandbox"}

# A registry host (with an optional port) and path, as image references spell them: no scheme, tag or digest.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)*(?::[0-9]+)?"
REGISTRY_PREFIX_PATTERN = rf"^{_HOST}(?:/{_COMPONENT})*$"
TAG_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$"


def release_tag(version: str = __version__) -> str:
    """The image tag of a KubeRL release: its version, with PEP 440's local '+' (not allowed in tags) as '-'."""
    return version.replace("+", "-")


@dataclass(frozen=True)
class JobImages:
    """The operator's defaults for job images, the same for every RLJob it serves."""

    registry: str = DEFAULT_IMAGE_REGISTRY
    """Prefix of the default images: `<registry>/learner:<tag>`, `<registry>/rollout:<tag>`, ..."""
    tag: str = field(default_factory=release_tag)
    """Tag of the default images: the operator's own release unless told otherwise."""
    pull_secrets: tuple[str, ...] = ()
    """Secrets every job pod is pulled with, besides its tier's spec.<tier>.imagePullSecrets."""

    def __post_init__(self) -> None:
        _check(
            env_vars.OPERATOR_JOB_IMAGE_REGISTRY,
            self.registry,
            REGISTRY_PREFIX_PATTERN,
            "a registry and path such as registry.example.com/team, without scheme, tag or trailing '/'",
        )
        _check(env_vars.OPERATOR_JOB_IMAGE_TAG, self.tag, TAG_PATTERN, "an image tag such as 0.1.0")
        for name in self.pull_secrets:
            _check(
                env_vars.OPERATOR_JOB_IMAGE_PULL_SECRETS,
                name,
                DNS_SUBDOMAIN_PATTERN,
                "Secret names (lowercase DNS subdomains) separated by commas, such as regcred,mirror-pull",
            )

    @staticmethod
    def from_env(env: Mapping[str, str] = os.environ) -> JobImages:
        """From the variables the chart sets; the built-in defaults for those unset or empty."""
        default = JobImages()
        secrets = env.get(env_vars.OPERATOR_JOB_IMAGE_PULL_SECRETS, "")
        return JobImages(
            registry=env.get(env_vars.OPERATOR_JOB_IMAGE_REGISTRY, "").strip().rstrip("/") or default.registry,
            tag=env.get(env_vars.OPERATOR_JOB_IMAGE_TAG, "").strip() or default.tag,
            pull_secrets=tuple(dict.fromkeys(s.strip() for s in secrets.split(",") if s.strip())),
        )

    def image(self, job: RLJob, tier: str) -> str:
        """The tier's image: spec.<tier>.image, else `<registry>/<tier image>:<tag>`."""
        return getattr(job.spec, tier).image or f"{self.registry}/{TIER_IMAGES[tier]}:{self.tag}"

    def resolved(self, job: RLJob, running: Mapping[str, str] | None = None) -> RLJob:
        """The job with each unset tier image filled in, so that its job file says what its pods run:
        the image `running` names for the tier (what its pods started with), else the default. A new
        default (an upgrade, another registry) thus never mixes versions within a running job."""
        running = running or {}
        update = {
            tier: section.model_copy(update={"image": running.get(tier) or self.image(job, tier)})
            for tier in TIER_IMAGES
            if (section := getattr(job.spec, tier)).image is None
        }
        return job.model_copy(update={"spec": job.spec.model_copy(update=update)}) if update else job

    def pull_secrets_of(self, job: RLJob, tier: str) -> list[dict[str, str]]:
        """The tier's pod imagePullSecrets: its spec's, then the defaults not among them. Empty when neither
        names one, so the pod's ServiceAccount supplies its own (Kubernetes adds those only to pods with none)."""
        names = [s.name for s in getattr(job.spec, tier).image_pull_secrets] + list(self.pull_secrets)
        return [{"name": name} for name in dict.fromkeys(names)]

    def pod_fields(self, job: RLJob, tier: str) -> dict[str, Any]:
        """The pod-spec field this adds: imagePullSecrets, left out when empty."""
        secrets = self.pull_secrets_of(job, tier)
        return {"imagePullSecrets": secrets} if secrets else {}


def running_images(job_file: Mapping[str, Any] | None) -> dict[str, str]:
    """tier -> image of a job file the operator wrote (its ConfigMap's): the images the job's pods run."""
    spec = (job_file or {}).get("spec") or {}
    sections = {tier: spec.get(tier) for tier in TIER_IMAGES}
    return {t: s["image"] for t, s in sections.items() if isinstance(s, dict) and isinstance(s.get("image"), str)}


def _check(variable: str, value: str, pattern: str, expected: str) -> None:
    if not re.fullmatch(pattern, value):
        raise ValueError(f"{variable}: expected {expected}, got {value!r}")
