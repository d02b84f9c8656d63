"""LoRA end to end on CPU: `kuberl learner` trains adapters against a real rollout server (vLLM with LoRA) and a
real sandbox; every step's policy reaches the server as an adapter only, the rollout's and the learner's
log-probs agree on every step (mismatch KL at most 1e-3, float32), and the export is a PEFT adapter folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest
import yaml
from helpers.tiny_job import tiny_job_spec
from safetensors import safe_open

from kuberl.api.spec import LoraSpec
from kuberl.http_probes import wait_until_ready
from kuberl.modeling.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_tensor_shapes
from kuberl.tokens import bearer, new_token
from kuberl_sandbox.local import free_port
from recipes.swe_toy.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow
TOKEN = new_token()
LORA = {"rank": 8, "alpha": 16}
MAX_MISMATCH_KL = 1e-3


def lora_job(model, checkpoints) -> dict:
    spec = tiny_job_spec(
        model,
        training={"totalSteps": 3, "learningRate": 1e-2},
        limits={"maxSteps": 3},
        checkpoint={"uri": str(checkpoints), "keep": 2},
    )
    spec["model"]["lora"] = LORA
    # the tiny model solves nothing, so every advantage is 0: the entropy bonus is what moves the adapters, and a
    # policy that moves is what makes the rollout's and the learner's log-probs a test of the adapter path
    spec["algorithm"]["entropyCoef"] = 0.5
    return {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "lora-loop"}, "spec": spec}


def test_a_lora_job_trains_adapters_that_the_rollout_serves_with_the_learners_log_probs(sandbox, tmp_path):
    model = build_tiny_model(tmp_path / "model", hidden_size=64, layers=2, seed=4)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(lora_job(model, tmp_path / "ckpts")))
    env = {
        **os.environ,
        "KUBERL_SANDBOX_TOKEN": sandbox.token,
        "KUBERL_JOB_TOKEN": TOKEN,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    port = free_port()
    argv = [sys.executable, "-m", "kuberl_app.cli", "rollout-server", str(job_file), "--host", "127.0.0.1"]
    rollout = subprocess.Popen(
        [*argv, "--port", str(port), "--sandbox-url", sandbox.url],
        env=env,
        stdout=(tmp_path / "rollout.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url + "/readyz", rollout, tmp_path / "rollout.log", timeout=180)
        learner = subprocess.run(
            [
                sys.executable,
                "-m",
                "kuberl_app.cli",
                "learner",
                str(job_file),
                "--rollout-url",
                url,
                "--run-dir",
                str(tmp_path / "run"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert learner.returncode == 0, learner.stderr[-4000:]
        served = httpx.get(url + "/v1/policy", headers=bearer(TOKEN)).json()["version"]
    finally:
        os.killpg(rollout.pid, signal.SIGTERM)
        rollout.wait(timeout=30)
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3]
    # steps 2 and 3 sample with adapters the learner trained (step 1 with the base, version 0)
    assert all(s["mismatch_kl"] is not None and abs(s["mismatch_kl"]) <= MAX_MISMATCH_KL for s in steps), steps
    assert steps[-1]["entropy"] > steps[0]["entropy"] + 1e-3, steps  # the adapters moved the policy
    assert served == 3
    export = tmp_path / "run" / "policy"
    assert (export / ADAPTER_CONFIG).is_file() and not (export / "model.safetensors").exists()
    with safe_open(export / ADAPTER_WEIGHTS, framework="pt") as tensors:
        assert set(tensors.keys()) == set(adapter_tensor_shapes(model, LoraSpec(**LORA)))
    log = (tmp_path / "rollout.log").read_text()
    assert "Traceback" not in log, log[-3000:]
