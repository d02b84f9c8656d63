"""The learner's loop end to end on CPU: a real sandbox server, a real rollout server (vLLM), and
`kuberl learner` training two steps: trajectories gathered, a step trained, weights published with
their version, a checkpoint per step, a metrics line per step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest
import yaml

from kuberl.modeling.tiny import build_tiny_model
from kuberl_sandbox.local import free_port, local_sandbox, wait_until_ready
from kuberl_trainer.checkpoints.store import CheckpointStore

pytestmark = pytest.mark.slow


def test_two_sync_steps_train_publish_and_checkpoint(tmp_path):
    model = build_tiny_model(tmp_path / "model", hidden_size=64, layers=2, seed=4)
    job = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "loop-test"},
           "spec": {"model": {"uri": str(model), "dtype": "float32", "maxContextTokens": 2048},
                    "algorithm": {"groupSize": 2},
                    "training": {"totalSteps": 2, "trajectoriesPerStep": 4, "learningRate": 1e-3},
                    "environment": {"maxTurns": 2, "maxTokensPerTrajectory": 1024, "turnTimeout": "30s",
                                    "trajectoryTimeout": "2m"},
                    "rollout": {"concurrentSessions": 8, "maxTokensPerTurn": 24,
                                "engine": {"maxNumSeqs": 16, "maxModelLen": 2048}},
                    "checkpoint": {"uri": str(tmp_path / "ckpts"), "intervalSteps": 1, "keep": 5}}}  # fmt: skip
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    with local_sandbox() as sandbox:
        port = free_port()
        env = {
            **os.environ,
            "KUBERL_SANDBOX_TOKEN": sandbox.token,
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
        }
        rollout = subprocess.Popen(
            [sys.executable, "-m", "kuberl.cli", "rollout-server", str(tmp_path / "job.yaml"), "--host", "127.0.0.1",
             "--port", str(port), "--sandbox-url", sandbox.url],
            env=env, stdout=(tmp_path / "rollout.log").open("w"), stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_ready(url + "/readyz", rollout, tmp_path / "rollout.log", timeout=180)
            learner = subprocess.run(
                [sys.executable, "-m", "kuberl.cli", "learner", str(tmp_path / "job.yaml"), "--rollout-url", url,
                 "--run-dir", str(tmp_path / "run")],
                env=env, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            assert learner.returncode == 0, learner.stderr[-3000:]
            lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
            assert [line["step"] for line in lines] == [1, 2]
            assert all(line["trajectories"] == 4 and line["generated_tokens"] > 0 for line in lines)
            assert httpx.get(url + "/v1/policy").json()["version"] == 2  # both steps' weights were published
            assert [m.step for m in CheckpointStore(str(tmp_path / "ckpts")).complete()] == [1, 2]
        finally:
            os.killpg(rollout.pid, signal.SIGTERM)
            rollout.wait(timeout=30)
