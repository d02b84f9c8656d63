"""Where checkpoints live: a local folder or an S3 prefix, behind one small interface.

Layout under the job's checkpoint URI:

    step-00000050/<files of the checkpoint>      written first
    step-00000050/MANIFEST.json                  written last: step, policyVersion, time, files (size, sha256)

A checkpoint without a manifest, or whose manifest does not parse or does not match its files, is
incomplete: resume ignores it and never deletes the complete ones around it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlparse

MANIFEST = "MANIFEST.json"
EXPORT_DIR = "policy"  # the trained policy as a Hugging Face folder, for users (not read on resume)
_STEP = re.compile(r"^step-(\d{8})$")


class CheckpointError(RuntimeError):
    """A checkpoint store that cannot be used; the message names the URI and what to do."""


@dataclass(frozen=True)
class Manifest:
    step: int
    policy_version: int
    time: float
    files: dict[str, dict[str, object]]

    def to_json(self) -> str:
        return json.dumps(
            {"step": self.step, "policyVersion": self.policy_version, "time": self.time, "files": self.files},
            indent=1,
            sort_keys=True,
        )

    @staticmethod
    def from_json(text: str) -> Manifest:
        data = json.loads(text)
        return Manifest(int(data["step"]), int(data["policyVersion"]), float(data["time"]), dict(data["files"]))


class Backend(Protocol):
    def put(self, key: str, local: Path) -> None: ...
    def get(self, key: str, local: Path) -> None: ...
    def read(self, key: str) -> bytes | None: ...
    def write(self, key: str, data: bytes) -> None: ...
    def list_dirs(self) -> list[str]: ...
    def list_files(self, directory: str) -> dict[str, int]: ...
    def delete_dir(self, directory: str) -> None: ...


class LocalBackend:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def put(self, key: str, local: Path) -> None:
        target = self.root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, target)

    def get(self, key: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.root / key, local)

    def read(self, key: str) -> bytes | None:
        path = self.root / key
        return path.read_bytes() if path.is_file() else None

    def write(self, key: str, data: bytes) -> None:
        target = self.root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        partial.write_bytes(data)
        os.replace(partial, target)  # a manifest appears whole or not at all

    def list_dirs(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())

    def list_files(self, directory: str) -> dict[str, int]:
        base = self.root / directory
        return {str(p.relative_to(base)): p.stat().st_size for p in base.rglob("*") if p.is_file()}

    def delete_dir(self, directory: str) -> None:
        shutil.rmtree(self.root / directory, ignore_errors=True)


class S3Backend:
    def __init__(self, bucket: str, prefix: str, endpoint_url: str | None = None) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig

        self.bucket, self.prefix = bucket, prefix.strip("/")
        # A session of its own: boto3's default session caches the first credentials it ever resolved.
        session = boto3.session.Session()
        self.s3 = session.client("s3", endpoint_url=endpoint_url or os.environ.get("AWS_ENDPOINT_URL"))
        self.transfer = TransferConfig(multipart_threshold=64 << 20, max_concurrency=4)

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, key: str, local: Path) -> None:
        self.s3.upload_file(str(local), self.bucket, self._key(key), Config=self.transfer)

    def get(self, key: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        self.s3.download_file(self.bucket, self._key(key), str(local), Config=self.transfer)

    def read(self, key: str) -> bytes | None:
        try:
            return self.s3.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            return None

    def write(self, key: str, data: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)  # S3 puts are atomic

    def list_dirs(self) -> list[str]:
        base = self._key("")
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base, Delimiter="/")
        return sorted(p["Prefix"][len(base) :].rstrip("/") for page in pages for p in page.get("CommonPrefixes", []))

    def list_files(self, directory: str) -> dict[str, int]:
        base = self._key(directory) + "/"
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base)
        return {o["Key"][len(base) :]: o["Size"] for page in pages for o in page.get("Contents", [])}

    def delete_dir(self, directory: str) -> None:
        keys = [{"Key": self._key(f"{directory}/{name}")} for name in self.list_files(directory)]
        for i in range(0, len(keys), 1000):
            self.s3.delete_objects(Bucket=self.bucket, Delete={"Objects": keys[i : i + 1000]})


def open_backend(uri: str, endpoint_url: str | None = None) -> Backend:
    """The backend of a storage URI: s3://bucket/prefix, file:///path or a local path."""
    if uri.startswith("s3://"):
        parsed = urlparse(uri)
        return S3Backend(parsed.netloc, parsed.path, endpoint_url)
    if "://" in uri and not uri.startswith("file://"):
        raise CheckpointError(f"storage URI {uri!r}: use s3://bucket/prefix, file:///path or a local path")
    return LocalBackend(Path(unquote(urlparse(uri).path)) if uri.startswith("file://") else Path(uri))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class CheckpointStore:
    """Checkpoints of one job under one URI."""

    def __init__(self, uri: str, endpoint_url: str | None = None) -> None:
        self.uri = uri
        self.backend = open_backend(uri, endpoint_url)

    @staticmethod
    def directory(step: int) -> str:
        return f"step-{step:08d}"

    def save(self, step: int, policy_version: int, folder: Path) -> Manifest:
        """Upload every file of `folder` under the step's prefix, then the manifest."""
        return self.commit(step, policy_version, self.upload(step, folder))

    def upload(self, step: int, folder: Path) -> dict[str, dict[str, object]]:
        """Upload every file of `folder` under the step's prefix; returns their manifest entries. On several
        machines each uploads its own shards, then one commits the union of the entries."""
        files: dict[str, dict[str, object]] = {}
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            name = str(path.relative_to(folder))
            self._guard(lambda n=name, p=path: self.backend.put(f"{self.directory(step)}/{n}", p))
            files[name] = {"size": path.stat().st_size, "sha256": _sha256(path)}
        return files

    def commit(self, step: int, policy_version: int, files: dict[str, dict[str, object]]) -> Manifest:
        """Write the manifest that makes the step's uploaded files a complete checkpoint."""
        manifest = Manifest(step, policy_version, time.time(), files)
        self._guard(lambda: self.backend.write(f"{self.directory(step)}/{MANIFEST}", manifest.to_json().encode()))
        return manifest

    def upload_export(self, folder: Path) -> str:
        """Upload a policy export (a Hugging Face folder) under `policy/`, beside the checkpoints, and return
        its URI: in a cluster the learner's run folder is an emptyDir that goes with its pod."""
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            name = str(path.relative_to(folder))
            self._guard(lambda n=name, p=path: self.backend.put(f"{EXPORT_DIR}/{n}", p))
        return f"{self.uri.rstrip('/')}/{EXPORT_DIR}"

    def complete(self) -> list[Manifest]:
        """Every complete checkpoint, oldest first."""
        found = []
        for directory in self._guard(self.backend.list_dirs):
            if not _STEP.match(directory):
                continue
            manifest = self._manifest(directory)
            if manifest is not None:
                found.append(manifest)
        return sorted(found, key=lambda m: m.step)

    def newest(self) -> Manifest | None:
        """The checkpoint to resume from, or None."""
        complete = self.complete()
        return complete[-1] if complete else None

    def download(self, manifest: Manifest, folder: Path) -> Path:
        """The checkpoint's files in `folder`, checked against the manifest's digests."""
        for name, meta in manifest.files.items():
            local = folder / name
            self._guard(lambda n=name, p=local: self.backend.get(f"{self.directory(manifest.step)}/{n}", p))
            if _sha256(local) != meta["sha256"]:
                raise CheckpointError(f"{self.uri}: {self.directory(manifest.step)}/{name} does not match its manifest")
        return folder

    def prune(self, keep: int) -> list[int]:
        """Delete all but the newest `keep` complete checkpoints, and incomplete ones older than the newest
        complete one (a newer incomplete one may still be uploading). Returns the deleted steps."""
        complete = self.complete()
        if not complete:
            return []
        newest = complete[-1].step
        kept = {m.step for m in complete[-keep:]}
        deleted = []
        for directory in self.backend.list_dirs():
            match = _STEP.match(directory)
            if match and int(match.group(1)) not in kept and int(match.group(1)) < newest:
                self.backend.delete_dir(directory)
                deleted.append(int(match.group(1)))
        return deleted

    def _manifest(self, directory: str) -> Manifest | None:
        raw = self._guard(lambda: self.backend.read(f"{directory}/{MANIFEST}"))
        if raw is None:
            return None
        try:
            manifest = Manifest.from_json(raw.decode())
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return None  # corrupt: treated as incomplete, never trusted
        present = self._guard(lambda: self.backend.list_files(directory))
        if any(present.get(name) != meta.get("size") for name, meta in manifest.files.items()):
            return None
        return manifest

    def _guard(self, action):
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        try:
            return action()
        except S3UploadFailedError as err:  # s3transfer wraps the ClientError in text only
            refused = any(c in str(err) for c in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied"))
            what = "S3 refused the credentials; check the Secret" if refused else f"upload failed: {err}"
            raise CheckpointError(f"{self.uri}: {what}") from None
        except NoCredentialsError:
            raise CheckpointError(
                f"{self.uri}: no S3 credentials (set the job's checkpoint.credentialsSecret)"
            ) from None
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchBucket",):
                raise CheckpointError(f"{self.uri}: the bucket does not exist; create it first") from None
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"):
                raise CheckpointError(f"{self.uri}: S3 refused the credentials ({code}); check the Secret") from None
            raise CheckpointError(f"{self.uri}: S3 error {code}: {err}") from None
        except (BotoCoreError, OSError) as err:
            raise CheckpointError(f"{self.uri}: {err}") from None
