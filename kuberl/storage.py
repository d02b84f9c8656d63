"""Storage URIs (s3://bucket/prefix, file:///path, local paths) as local folders or files.

S3 credentials and endpoint come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_ENDPOINT_URL for S3-compatible stores), as the operator sets them from the job's Secret.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlparse

from kuberl.api import env_vars

DEFAULT_CACHE = Path(os.environ.get(env_vars.CACHE, "~/.cache/kuberl")).expanduser()


class LocalCopyError(ValueError):
    """A URI that cannot be read; the message names it."""


def local_copy(uri: str, cache: Path = DEFAULT_CACHE) -> Path:
    """A local path holding what `uri` names; s3:// prefixes are downloaded once into `cache`."""
    if uri.startswith("s3://"):
        return _download_prefix(uri, cache)
    path = Path(unquote(urlparse(uri).path)) if uri.startswith("file://") else Path(uri)
    if "://" in uri and not uri.startswith("file://"):
        raise LocalCopyError(f"{uri}: unsupported scheme; use s3://, file:// or a local path")
    if not path.exists():
        raise LocalCopyError(f"{uri}: no such file or folder")
    return path


@contextmanager
def local_file(uri: str, what: str = "file") -> Iterator[Path]:
    """A local path of the one file `uri` names (a local path, file:// or s3://bucket/key, downloaded to a
    temporary folder removed on exit); `what` names it in errors ("task file", "demonstrations file")."""
    if not uri.startswith("s3://"):
        path = Path(unquote(urlparse(uri).path)) if uri.startswith("file://") else Path(uri)
        if "://" in uri and not uri.startswith("file://"):
            raise LocalCopyError(f"{what} {uri!r}: use s3://bucket/key, file:///path or a local path")
        yield path
        return
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    parsed = urlparse(uri)
    with tempfile.TemporaryDirectory() as folder:
        local = Path(folder) / (Path(parsed.path).name or "download")
        try:
            boto3.client("s3").download_file(parsed.netloc, parsed.path.lstrip("/"), str(local))
        except (BotoCoreError, ClientError) as err:
            raise LocalCopyError(f"{what} {uri}: cannot download it ({err})") from None
        yield local


def _download_prefix(uri: str, cache: Path) -> Path:
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    parsed = urlparse(uri)
    bucket, prefix = parsed.netloc, parsed.path.lstrip("/").rstrip("/")
    target = cache / "s3" / hashlib.sha256(uri.encode()).hexdigest()[:16]
    done = target / ".complete"
    if done.exists():
        return target
    try:
        s3 = boto3.client("s3")
        keys = [
            obj["Key"]
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
            for obj in page.get("Contents", [])
        ]
        if not keys:
            raise LocalCopyError(f"{uri}: no objects under this prefix")
        for key in keys:
            local = target / key[len(prefix) + 1 :]
            local.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, key, str(local))
    except (BotoCoreError, ClientError) as err:
        raise LocalCopyError(f"{uri}: cannot download ({err})") from None
    done.touch()
    return target


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def check_model_folder(model_path: str | Path) -> None:
    """A clear error, naming the folder, when it is not a Hugging Face model folder with weights."""
    folder = Path(model_path)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder}: no config.json; spec.model.uri must name a Hugging Face model folder")
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise ValueError(
            f"{folder}: no model weights ({' or '.join(WEIGHT_FILES)}); "
            f"spec.model.uri must name a folder with safetensors weights"
        )
