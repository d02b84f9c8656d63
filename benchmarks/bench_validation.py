"""How fast RLJob manifests validate: the operator validates every spec on every reconcile."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from kuberl.validation import validate_document

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "swe-gpu.yaml"


def run(seconds: float = 2.0) -> dict[str, float]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    bad = {**doc, "spec": {**doc["spec"], "sandbox": {"minReplicas": 9, "maxReplicas": 2}}}
    out = {}
    for label, manifest in (("valid", doc), ("invalid", bad)):
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            validate_document(manifest, "bench")
            count += 1
        out[f"{label}_documents_per_second"] = round(count / (time.perf_counter() - started), 1)
    return out
