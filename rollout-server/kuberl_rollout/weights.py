"""Receiving new policy weights: bucketed safetensors uploads checked against the model's own tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load, save


class WeightError(ValueError):
    """An upload that cannot become the policy; the message names the tensor or the version."""


def expected_tensors(model_folder: str | Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in a Hugging Face safetensors folder."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(Path(model_folder).glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                shapes[name] = tuple(f.get_slice(name).get_shape())
    if not shapes:
        raise WeightError(f"no safetensors files in {model_folder}")
    return shapes


@dataclass
class BucketAssembler:
    """Collects the buckets of one version; `complete` once every bucket arrived."""

    expected: dict[str, tuple[int, ...]]
    version: int = -1
    count: int = 0
    buckets: dict[int, dict] = field(default_factory=dict)

    def add(self, version: int, index: int, count: int, blob: bytes, current_version: int) -> bool:
        """Check and keep one bucket; True when the version is complete."""
        if version <= current_version:
            raise WeightError(f"version {version} is not newer than the served version {current_version}")
        if count < 1 or not 0 <= index < count:
            raise WeightError(f"bucket {index} of {count} does not exist")
        if version != self.version:
            self.version, self.count, self.buckets = version, count, {}
        elif count != self.count:
            raise WeightError(f"version {version} was announced with {self.count} buckets, now {count}")
        try:
            tensors = load(blob)
        except Exception as err:  # safetensors raises its own error types for every kind of corruption
            raise WeightError(f"bucket {index} is not a safetensors blob ({err})") from None
        for name, tensor in tensors.items():
            if name not in self.expected:
                raise WeightError(f"unknown weight {name!r} in bucket {index}")
            if tuple(tensor.shape) != self.expected[name]:
                raise WeightError(
                    f"weight {name!r} has shape {list(tensor.shape)}, expected {list(self.expected[name])}"
                )
        self.buckets[index] = tensors
        return len(self.buckets) == self.count

    def take(self) -> bytes:
        """All buckets as one blob; every expected tensor must be present."""
        merged = {name: t for bucket in self.buckets.values() for name, t in bucket.items()}
        missing = sorted(set(self.expected) - set(merged))
        if missing:
            raise WeightError(f"version {self.version} lacks {len(missing)} weights, e.g. {missing[:3]}")
        self.buckets = {}
        return save(merged)
