"""How one policy version's weights reach a rollout server: one small interface, two ways today.

- `HttpBuckets` (the default): each safetensors bucket is one PUT; the server streams it into shared memory
  and checks it from its header. The bytes travel once per server.
- `StoredWeights` (large models, many servers): the buckets are written once per version under a storage
  prefix (a folder every server can read, or s3://) and each server is told to load that version
  (`POST /v1/weights/load`) and fetches it itself: the bytes leave the learner once, whatever the number of
  servers.

An NCCL broadcast on GPUs would be a third `send` of the same shape.
"""

from __future__ import annotations

from typing import Protocol

import httpx

from kuberl.api.rollout_http import BucketQuery, LoadWeights
from kuberl.api.spec import WeightSyncSpec, WeightTransportKind
from kuberl_trainer.checkpoints.store import open_backend


class WeightTransport(Protocol):
    def send(self, http: httpx.Client, version: int, buckets: list[bytes]) -> None:
        """Give the server behind `http` (a client that presents the job token) the weights of `version`; raises
        httpx errors when it cannot."""
        ...


class HttpBuckets:
    """One PUT per bucket: `/v1/weights/{version}/buckets/{index}?of=N`."""

    def send(self, http: httpx.Client, version: int, buckets: list[bytes]) -> None:
        query = BucketQuery(of=len(buckets)).wire()
        for index, bucket in enumerate(buckets):
            http.put(f"/v1/weights/{version}/buckets/{index}", params=query, content=bucket).raise_for_status()


class StoredWeights:
    """Buckets written under `uri/v<version>/` once, then loaded by each server from there. The latest `keep`
    versions stay (a server that comes back is sent the latest); older ones are deleted."""

    def __init__(self, uri: str, endpoint_url: str | None = None, keep: int = 2) -> None:
        self.uri, self.keep = uri.rstrip("/"), keep
        self.backend = open_backend(uri, endpoint_url)
        self.written: list[int] = []

    @staticmethod
    def folder(version: int) -> str:
        return f"v{version:08d}"

    def send(self, http: httpx.Client, version: int, buckets: list[bytes]) -> None:
        if version not in self.written:
            for index, bucket in enumerate(buckets):
                name = f"model-{index + 1:05d}-of-{len(buckets):05d}.safetensors"
                self.backend.write(f"{self.folder(version)}/{name}", bucket)
            self.written.append(version)
            for old in self.written[: -self.keep]:
                self.backend.delete_dir(self.folder(old))
            del self.written[: -self.keep]
        body = LoadWeights(uri=f"{self.uri}/{self.folder(version)}", version=version).wire()
        http.post("/v1/weights/load", json=body).raise_for_status()


def transport_for(sync: WeightSyncSpec, checkpoint_uri: str, endpoint_url: str | None = None) -> WeightTransport:
    """The transport `spec.rollout.weightSync` asks for; storage defaults to `<checkpoint uri>/weights`."""
    if sync.transport == WeightTransportKind.STORAGE:
        return StoredWeights(sync.uri or f"{checkpoint_uri.rstrip('/')}/weights", endpoint_url)
    return HttpBuckets()
