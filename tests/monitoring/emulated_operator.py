"""A real operator process against the emulated API server, driving one RLJob, with its metrics port: the
operator's own series and that job's job-level series exist on it. A fixture the schema and live tests import
(one process per test session)."""

from __future__ import annotations

import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from helpers.emulator import HANDLERS, Api, OperatorProcess, emulated_api_server, write_kubeconfig

from kuberl_sandbox.local import free_port

OPERATOR_JOB = ("default", "probe")  # the RLJob the operator drives: (namespace, name)


@dataclass(frozen=True)
class OperatorEndpoint:
    port: int

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as response:
            return response.read().decode()


@pytest.fixture(scope="session", name="operator")
def operator_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorEndpoint]:
    folder = tmp_path_factory.mktemp("operator")
    namespace, name = OPERATOR_JOB
    with emulated_api_server() as url:
        port = free_port()
        process = OperatorProcess(
            write_kubeconfig(folder / "kubeconfig", url, namespace),
            folder / "operator.log",
            {
                "KUBERL_OPERATOR_INTERVAL": "1",
                "KUBERL_WATCH_SERVER_TIMEOUT": "60",
                "KUBERL_OPERATOR_METRICS_PORT": str(port),
            },
        )
        process.start([sys.executable, *HANDLERS])
        try:
            Api(url).post(
                f"/apis/kuberl.io/v1alpha1/namespaces/{namespace}/rljobs",
                {
                    "apiVersion": "kuberl.io/v1alpha1",
                    "kind": "RLJob",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"model": {"uri": "s3://models/tiny"}, "checkpoint": {"uri": "s3://ckpt/jobs"}},
                },
            )
            endpoint = OperatorEndpoint(port)
            wanted = f'kuberl_job_step{{namespace="{namespace}",rljob="{name}"}}'
            deadline = time.monotonic() + 60
            while True:
                try:
                    if wanted in endpoint.metrics_text():
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline or process.process.poll() is not None:
                    raise AssertionError(f"no job metrics from the operator: {(folder / 'operator.log').read_text()}")
                time.sleep(0.3)
            yield endpoint
        finally:
            process.stop()
