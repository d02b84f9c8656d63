"""A real rollout server (vLLM on CPU, a tiny random Llama like the demo's) whose job names an external agent
(`helpers.openai_agent:solve`), against a real sandbox: the recorded-session and external-agent tests share
one (the `agent_server` fixture of tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from kuberl.http_probes import wait_until_ready
from kuberl.tokens import bearer, new_token
from kuberl_sandbox.local import free_port
from recipes.swe_toy.tiny_model import build_tiny_model

REPO = Path(__file__).resolve().parents[2]
JOB_TOKEN = new_token()
"""The job token of every server started here."""
AUTH = bearer(JOB_TOKEN)
"""The header that presents it."""


@contextmanager
def agent_server(
    sandbox: Any,
    folder: Path,
    agent: str | None = "helpers.openai_agent:solve",
    max_turns: int = 6,
    extra_env: dict[str, str] | None = None,
    model: Path | None = None,
    spec: dict[str, dict[str, Any]] | None = None,
) -> Iterator[dict[str, Any]]:
    """{url, model, job, log}: a rollout server running `agent`'s episodes (None: the built-in agent loop) and
    serving recorded sessions to callers with JOB_TOKEN; `model` in place of a fresh tiny one, `spec` sections
    merged in one level deep."""
    # its own copy: `make demo` may rebuild runs/models/tiny-llama meanwhile
    model = model or build_tiny_model(folder / "model", hidden_size=64, layers=2, seed=3)
    job = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "external-agent"},
        "spec": {
            "model": {"uri": str(model), "dtype": "float32", "maxContextTokens": 2048},
            "environment": {
                "agent": agent,
                "maxTurns": max_turns,
                "maxTokensPerTrajectory": 2048,
                "turnTimeout": "30s",
                "trajectoryTimeout": "2m",
            },
            "rollout": {
                "concurrentSessions": 4,
                "maxTokensPerTurn": 24,
                "engine": {"maxNumSeqs": 8, "maxModelLen": 2048},
            },
        },
    }
    if agent is None:
        del job["spec"]["environment"]["agent"]
    for name, section in (spec or {}).items():
        job["spec"].setdefault(name, {}).update(section)
    (folder / "job.yaml").write_text(yaml.safe_dump(job))
    port = free_port()
    path = os.pathsep.join(p for p in (str(REPO / "tests"), os.environ.get("PYTHONPATH", "")) if p)
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "KUBERL_SANDBOX_TOKEN": sandbox.token,
        "KUBERL_JOB_TOKEN": JOB_TOKEN,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        **(extra_env or {}),
    }
    argv = [sys.executable, "-m", "kuberl_app.cli", "rollout-server", str(folder / "job.yaml")]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--sandbox-url", sandbox.url]
    log = (folder / "rollout.log").open("w")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url + "/readyz", proc, folder / "rollout.log", timeout=240)
        yield {"url": url, "model": model, "job": job, "log": folder / "rollout.log"}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
