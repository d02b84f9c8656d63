"""Receiving new policy weights: bucketed safetensors uploads checked against the model's own tensors.

A bucket is checked from its safetensors header alone (names, shapes, byte ranges) and kept as the bytes that
arrived: the engine's worker decodes each bucket once, so a weight update costs no decode and re-encode here.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open

# bytes per element of the safetensors dtypes a policy can be sent in
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit


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


def safetensors_header(blob: bytes) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name -> (dtype, shape) of a safetensors blob, read from its header without touching the data; raises
    ValueError when the header is malformed or its byte ranges do not tile the data exactly."""
    if len(blob) < 8:
        raise ValueError(f"{len(blob)} bytes, shorter than the 8-byte header length")
    (size,) = struct.unpack_from("<Q", blob)
    if size > MAX_HEADER_BYTES or 8 + size > len(blob):
        raise ValueError(f"header length {size} does not fit a blob of {len(blob)} bytes")
    try:
        header = json.loads(blob[8 : 8 + size])
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"header is not JSON ({err})") from None
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    header.pop("__metadata__", None)
    tensors, ranges = {}, []
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"tensor {name!r}: expected dtype, shape and data_offsets") from None
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"tensor {name!r}: dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
        offsets_ok = isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end
        if not all(isinstance(d, int) and d >= 0 for d in shape) or not offsets_ok:
            raise ValueError(f"tensor {name!r}: bad shape {list(shape)} or data_offsets {[begin, end]}")
        if end - begin != math.prod(shape) * DTYPE_BYTES[dtype]:
            raise ValueError(f"tensor {name!r}: {end - begin} bytes for {dtype} of shape {list(shape)}")
        tensors[name] = (dtype, shape)
        ranges.append((begin, end))
    covered = 0  # the ranges must tile the data: no gap, no overlap, nothing after the last tensor
    for begin, end in sorted(ranges):
        if begin != covered:
            raise ValueError(f"data_offsets leave a gap or overlap at byte {covered}")
        covered = end
    if 8 + size + covered != len(blob):
        raise ValueError(f"the tensors take {covered} bytes, the blob carries {len(blob) - 8 - size}")
    return tensors


@dataclass
class BucketAssembler:
    """Collects the buckets of one version; `complete` once every bucket arrived. Buckets are checked from their
    headers and kept as received."""

    expected: dict[str, tuple[int, ...]]
    version: int = -1
    count: int = 0
    buckets: dict[int, bytes] = field(default_factory=dict)
    names: dict[int, set[str]] = field(default_factory=dict)

    def add(self, version: int, index: int, count: int, blob: bytes, current_version: int) -> bool:
        """Check and keep one bucket; True when the version is complete."""
        if version <= current_version:
            raise WeightError(f"version {version} is not newer than the served version {current_version}")
        if count < 1 or not 0 <= index < count:
            raise WeightError(f"bucket {index} of {count} does not exist")
        if version != self.version:
            self.version, self.count, self.buckets, self.names = version, count, {}, {}
        elif count != self.count:
            raise WeightError(f"version {version} was announced with {self.count} buckets, now {count}")
        try:
            tensors = safetensors_header(blob)
        except ValueError as err:
            raise WeightError(f"bucket {index} is not a safetensors blob ({err})") from None
        for name, (_, shape) in tensors.items():
            if name not in self.expected:
                raise WeightError(f"unknown weight {name!r} in bucket {index}")
            if shape != self.expected[name]:
                raise WeightError(f"weight {name!r} has shape {list(shape)}, expected {list(self.expected[name])}")
        self.buckets[index], self.names[index] = blob, set(tensors)
        return len(self.buckets) == self.count

    def take(self) -> list[bytes]:
        """The buckets in order, as received; every expected tensor must be present."""
        present = set().union(*self.names.values())
        missing = sorted(set(self.expected) - present)
        if missing:
            raise WeightError(f"version {self.version} lacks {len(missing)} weights, e.g. {missing[:3]}")
        blobs = [self.buckets[i] for i in sorted(self.buckets)]
        self.buckets, self.names = {}, {}
        return blobs
