"""Receiving new policy weights: bucketed safetensors uploads checked against the model's own tensors.

Each bucket streams from the request straight into a staging file (in /dev/shm, memory, where it exists) and
is checked from its safetensors header alone (names, shapes, byte ranges). The engine's worker reads the
staged files itself: a weight update costs no decode and re-encode here, and its bytes never cross the
engine's message queue (which copied and serialised them: 1.4 of 2.0 s for SmolLM2-135M).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import struct
import tempfile
import weakref
from collections.abc import AsyncIterable
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open

# bytes per element of the safetensors dtypes a policy can be sent in
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit
SHARED_MEMORY = Path("/dev/shm")


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


def safetensors_header(head: bytes, total: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name -> (dtype, shape) of a safetensors blob of `total` bytes whose first bytes are `head` (at least the
    8-byte length and the header), read without touching the data; raises ValueError when the header is
    malformed or its byte ranges do not tile the data exactly."""
    if total < 8 or len(head) < 8:
        raise ValueError(f"{total} bytes, shorter than the 8-byte header length")
    (size,) = struct.unpack_from("<Q", head)
    if size > MAX_HEADER_BYTES or 8 + size > total:
        raise ValueError(f"header length {size} does not fit a blob of {total} bytes")
    try:
        header = json.loads(head[8 : 8 + size])
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
    if 8 + size + covered != total:
        raise ValueError(f"the tensors take {covered} bytes, the blob carries {total - 8 - size}")
    return tensors


def file_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """`safetensors_header` of a staged file: only its header is read."""
    total = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) == 8:
            head += f.read(min(struct.unpack("<Q", head)[0], MAX_HEADER_BYTES + 1))
    return safetensors_header(head, total)


def staging_folder(prefix: str = "kuberl-weights-") -> Path:
    """A private folder for staged buckets: in shared memory where there is one (rollout pods mount /dev/shm
    as a memory emptyDir), else the temporary folder; removed when the process ends."""
    memory = SHARED_MEMORY.is_dir() and os.access(SHARED_MEMORY, os.W_OK)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=SHARED_MEMORY if memory else None))


@dataclass
class BucketAssembler:
    """Collects the buckets of one version as staged files; complete once every bucket arrived."""

    expected: dict[str, tuple[int, ...]]
    staging: Path = field(default_factory=staging_folder)
    version: int = -1
    count: int = 0
    buckets: dict[int, Path] = field(default_factory=dict)
    names: dict[int, set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        weakref.finalize(self, shutil.rmtree, self.staging, True)

    async def stage(self, version: int, index: int, count: int, chunks: AsyncIterable[bytes], current: int) -> bool:
        """Write one bucket's bytes to its staging file as they arrive, then check its header; True when the
        version is complete. A bucket that is refused leaves no file behind."""
        if version <= current:
            raise WeightError(f"version {version} is not newer than the served version {current}")
        if count < 1 or not 0 <= index < count:
            raise WeightError(f"bucket {index} of {count} does not exist")
        if version != self.version:
            self.discard()
            self.version, self.count = version, count
        elif count != self.count:
            raise WeightError(f"version {version} was announced with {self.count} buckets, now {count}")
        path = self.staging / f"v{version}-bucket{index}.safetensors"
        try:
            with path.open("wb") as f:
                async for chunk in chunks:
                    f.write(chunk)  # tmpfs takes a chunk in microseconds: not worth a thread hop each
            tensors = file_header(path)
        except ValueError as err:
            path.unlink(missing_ok=True)
            raise WeightError(f"bucket {index} is not a safetensors blob ({err})") from None
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        try:
            names = self._known(tensors, f"bucket {index}")
        except WeightError:
            path.unlink(missing_ok=True)
            raise
        self.buckets[index], self.names[index] = path, names
        return len(self.buckets) == self.count

    def _known(self, tensors: dict[str, tuple[str, tuple[int, ...]]], where: str) -> set[str]:
        """The names of `tensors` once each is a weight of the model with its shape."""
        for name, (_, shape) in tensors.items():
            if name not in self.expected:
                raise WeightError(f"unknown weight {name!r} in {where}")
            if shape != self.expected[name]:
                raise WeightError(f"weight {name!r} has shape {list(shape)}, expected {list(self.expected[name])}")
        return set(tensors)

    def check_folder(self, folder: Path) -> list[Path]:
        """The safetensors files of a stored version (`POST /v1/weights/load`), each checked from its header
        and together holding every weight: a wrong file is refused before the engine reads it."""
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise WeightError(f"{folder}: no safetensors files")
        present: set[str] = set()
        for file in files:
            try:
                present |= self._known(file_header(file), file.name)
            except ValueError as err:
                if isinstance(err, WeightError):
                    raise
                raise WeightError(f"{file.name} is not a safetensors file ({err})") from None
        if missing := sorted(set(self.expected) - present):
            raise WeightError(f"{folder} lacks {len(missing)} weights, e.g. {missing[:3]}")
        return files

    def take(self) -> list[Path]:
        """The staged files in bucket order; every expected tensor must be present. The caller removes them
        (`discard`) once the engine has read them."""
        present = set().union(*self.names.values())
        missing = sorted(set(self.expected) - present)
        if missing:
            self.discard()
            raise WeightError(f"version {self.version} lacks {len(missing)} weights, e.g. {missing[:3]}")
        return [self.buckets[i] for i in sorted(self.buckets)]

    def discard(self) -> None:
        """Remove every staged file of the current version."""
        for path in self.buckets.values():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self.buckets, self.names = {}, {}


async def chunks_of(blob: bytes, size: int = 1 << 20) -> AsyncIterable[bytes]:
    """`blob` as the chunks of a request body (for callers that hold the bytes already)."""
    view = memoryview(blob)
    for start in range(0, len(view), size):
        yield bytes(view[start : start + size])
