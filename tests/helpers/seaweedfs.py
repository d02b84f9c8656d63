"""A real S3 server for tests: SeaweedFS `weed mini` on 127.0.0.1 with every port chosen free."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kuberl_sandbox.local import free_port

PORT_FLAGS = [
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
    "webdav.port",
    "debug.port",
    "metricsPort",
]


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str

    def client(self, access_key: str | None = None, secret_key: str | None = None):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=access_key or self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
        )


@contextmanager
def seaweedfs() -> Iterator[S3Server]:
    folder = Path(tempfile.mkdtemp(prefix="kuberl-s3-"))
    access, secret = "kuberl-test", "kuberl-test-secret"
    identities = {
        "identities": [
            {
                "name": "kuberl",
                "credentials": [{"accessKey": access, "secretKey": secret}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    (folder / "s3.json").write_text(json.dumps(identities))
    ports = {flag: free_port() for flag in PORT_FLAGS}
    argv = [
        str(Path(sys.executable).parent / "weed"),
        "mini",
        f"-dir={folder / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-s3.config={folder / 's3.json'}",
        "-admin.ui=false",
        *(f"-{k}={v}" for k, v in ports.items()),
    ]
    (folder / "data").mkdir()
    log = (folder / "weed.log").open("w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    server = S3Server(f"http://127.0.0.1:{ports['s3.port']}", access, secret)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                server.client().list_buckets()
                break
            except Exception:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "SeaweedFS did not start:\n" + (folder / "weed.log").read_text()[-3000:]
                    ) from None
                time.sleep(0.3)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        subprocess.run(["rm", "-rf", str(folder)], check=False)
