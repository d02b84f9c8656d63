"""The ConfigMap holding the resolved job: the JOB.yaml every pod's entrypoint reads."""

from __future__ import annotations

from typing import Any

import yaml

from kuberl.api.rljob import RLJob
from kuberl_operator.meta import CONFIG, child_name, object_meta
from kuberl_operator.pod import JOB_FILE_KEY


def resolved_job_manifest(job: RLJob, namespace: str) -> dict[str, Any]:
    """The job with every default written out, so pods run exactly the spec the operator validated even
    if a later KubeRL version changes a default. Server-set metadata (uid, resourceVersion,
    managedFields, ...) and the status are left out: they change all the time and pods do not need them."""
    metadata = {"name": job.name, "namespace": namespace}
    if job.metadata.labels:
        metadata["labels"] = dict(job.metadata.labels)
    return {
        "apiVersion": job.api_version,
        "kind": job.kind,
        "metadata": metadata,
        "spec": job.spec.model_dump(mode="json", by_alias=True, exclude_none=True),
    }


# libyaml's emitter where PyYAML was built with it: the pure-Python one was a fifth of the operator's CPU
# while a thousand jobs were created (the same document either way; the render goldens hold it)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def resolved_job_yaml(job: RLJob, namespace: str) -> str:
    return yaml.dump(resolved_job_manifest(job, namespace), Dumper=_DUMPER, sort_keys=False)


def build_config_map(job: RLJob, namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(job, child_name(job, CONFIG), CONFIG, namespace, owner),
        "data": {JOB_FILE_KEY: resolved_job_yaml(job, namespace)},
    }
