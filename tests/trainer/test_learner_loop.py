"""The learner's loop end to end on CPU: a real sandbox server, a real rollout server (vLLM), and
`kuberl learner` training against them — sync in one process, async with FSDP over two torchrun
ranks, stopped by a limit, by completion and by SIGTERM, always with a final checkpoint."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import BIN
from helpers.tiny_job import tiny_job_spec

from kuberl.http_probes import wait_until_ready
from kuberl.tokens import bearer, new_token
from kuberl_sandbox.local import free_port
from kuberl_trainer.checkpoints.store import CheckpointStore
from recipes.swe_toy.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow
TOKEN = new_token()
"""The job token of the rollout server and the learners."""


def job(model, checkpoints, **spec) -> dict:
    base = tiny_job_spec(model, training={"totalSteps": 5}, checkpoint={"uri": str(checkpoints), "keep": 5})
    for name, section in spec.items():
        base.setdefault(name, {}).update(section)
    return {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "loop-test"}, "spec": base}


@pytest.fixture(scope="module")
def servers(tmp_path_factory, sandbox):
    folder = tmp_path_factory.mktemp("loop")
    model = build_tiny_model(folder / "model", hidden_size=64, layers=2, seed=4)
    (folder / "rollout.yaml").write_text(yaml.safe_dump(job(model, folder / "unused")))
    tokens = {"KUBERL_SANDBOX_TOKEN": sandbox.token, "KUBERL_JOB_TOKEN": TOKEN}  # the learners get both too
    env = {**os.environ, **tokens, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    port = free_port()
    rollout = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kuberl_app.cli",
            "rollout-server",
            str(folder / "rollout.yaml"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--sandbox-url",
            sandbox.url,
        ],
        env=env,
        stdout=(folder / "rollout.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url + "/readyz", rollout, folder / "rollout.log", timeout=180)
        yield model, url, env
    finally:
        os.killpg(rollout.pid, signal.SIGTERM)
        rollout.wait(timeout=30)


def learner_argv(job_file, url, run_dir, ranks: int = 1, metrics_port: int | None = None) -> list[str]:
    tail = ["learner", str(job_file), "--rollout-url", url, "--run-dir", str(run_dir)]
    tail += ["--metrics-port", str(metrics_port)] if metrics_port else []
    if ranks == 1:
        return [sys.executable, "-m", "kuberl_app.cli", *tail]
    return [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", str(ranks), "-m", "kuberl_app.cli", *tail]


def failure(stderr: str) -> str:
    """Every rank's error lines (torchrun interleaves them), then the end of the output."""
    errors = [line for line in stderr.splitlines() if "Error" in line]
    return "\n".join(errors[-20:]) + "\n...\n" + stderr[-2000:]


def lines(run_dir) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def served(url: str) -> int:
    return httpx.get(url + "/v1/policy", headers=bearer(TOKEN)).json()["version"]


def test_sync_stops_at_max_steps_with_a_final_checkpoint_and_exports_metrics(servers, tmp_path):
    model, url, env = servers
    spec = job(model, tmp_path / "ckpts", training={"totalSteps": 2}, limits={"maxSteps": 2})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    port = free_port()
    learner = subprocess.Popen(
        learner_argv(tmp_path / "job.yaml", url, tmp_path / "run", metrics_port=port),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    scraped = ""
    while learner.poll() is None:  # scrape the live endpoint once a step is in (the last scrape before the end)
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
            if re.search(r"^kuberl_learner_step [12]\.0$", text, re.MULTILINE):
                scraped = text
        except httpx.HTTPError:
            pass
        # a 2-step run can end within a few tenths of a second of its first step: poll often enough to see it
        time.sleep(0.05)
    _, err = learner.communicate()
    assert learner.returncode == 0, failure(err)
    for name in (
        "kuberl_learner_loss",
        "kuberl_learner_reward_mean",
        "kuberl_learner_mismatch_kl",
        'kuberl_learner_step_phase_seconds_count{phase="train"}',
        "kuberl_learner_entropy_nats",
        "kuberl_learner_trajectory_staleness_versions_bucket",
        "kuberl_learner_tokens_per_second",
    ):
        assert name in scraped, name
    steps = lines(tmp_path / "run")
    assert [line["step"] for line in steps] == [1, 2]
    assert all(line["trajectories"] == 4 and line["generated_tokens"] > 0 for line in steps)
    # swe-toy tasks have failToPass: the binary reward is 1 exactly when the episode resolved its task
    assert all(line["resolved_rate"] == line["solve_rate"] for line in steps)
    assert all(line["staleness_max"] == 0 for line in steps)  # sync: every trajectory from the current policy
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert (status["phase"], status["reason"], status["step"]) == ("Stopped", "MaxStepsReached", 2)
    assert status["lastCheckpoint"]["step"] == 2  # the final checkpoint (the interval is 100)
    assert [m.step for m in CheckpointStore(str(tmp_path / "ckpts")).complete()] == [2]
    assert served(url) == status["policyVersion"]  # the last step's weights are what the servers sample with


def test_async_ppo_on_two_fsdp_ranks_completes_within_the_staleness_bound(servers, tmp_path):
    model, url, env = servers
    spec = job(
        model,
        tmp_path / "ckpts",
        training={"totalSteps": 3, "mode": "async", "maxStaleness": 1, "miniBatches": 2},
        algorithm={
            "name": "ppo",
            "groupSize": 2,
            "klCoef": 0.05,
            "entropyCoef": 0.01,
            "creditAssignment": {"mode": "gae", "gaeLevel": "turn"},
        },
        checkpoint={"uri": str(tmp_path / "ckpts"), "intervalSteps": 2, "keep": 5},
    )
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    start = served(url)
    result = subprocess.run(
        learner_argv(tmp_path / "job.yaml", url, tmp_path / "run", ranks=2),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, failure(result.stderr)
    steps = lines(tmp_path / "run")
    assert [line["step"] for line in steps] == [1, 2, 3]
    assert all(line["staleness_max"] <= 1 and line["skipped"] == 0 for line in steps)
    # the untrained policy earns no reward here, so only the entropy bonus moves it, away from the reference
    # (the first step's second mini-batch already sees the first update)
    assert all(line["kl_ref"] > 0 for line in steps)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert (status["phase"], status["reason"]) == ("Succeeded", "Completed")
    # a learner that finds newer weights on the servers first publishes its own above them; then one per step
    assert status["policyVersion"] == (start + 1 if start else 0) + 3 == served(url)
    assert [m.step for m in CheckpointStore(str(tmp_path / "ckpts")).complete()] == [2, 3]


def test_sigterm_stops_with_a_final_checkpoint_and_a_restart_resumes_from_it(servers, tmp_path):
    model, url, env = servers
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job(model, tmp_path / "ckpts", training={"totalSteps": 50})))
    argv = learner_argv(tmp_path / "job.yaml", url, tmp_path / "run")
    learner = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not lines(tmp_path / "run") and time.monotonic() < deadline and learner.poll() is None:
        time.sleep(0.2)
    learner.send_signal(signal.SIGTERM)
    _, err = learner.communicate(timeout=300)
    assert learner.returncode == 0, failure(err)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    stopped_at = status["step"]
    assert status["phase"] == "Stopped" and "signal" in status["message"] and stopped_at >= 1
    assert [m.step for m in CheckpointStore(str(tmp_path / "ckpts")).complete()] == [stopped_at]

    spec = job(model, tmp_path / "ckpts", training={"totalSteps": stopped_at + 1})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, failure(again.stderr)
    assert lines(tmp_path / "run")[-1]["step"] == stopped_at + 1  # resumed, not restarted from 0
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["reason"] == "Completed" and status["policyVersion"] == served(url)


def worker_pid(torchrun_pid: int, rank: int) -> int | None:
    """The pid of torchrun's worker with RANK=rank (from /proc), or None while it is not started."""
    children = " ".join(p.read_text() for p in Path(f"/proc/{torchrun_pid}/task").glob("*/children"))
    for child in children.split():
        try:
            environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return int(child)
    return None


def test_sigterm_to_one_rank_stops_the_whole_gang_with_a_final_checkpoint(servers, tmp_path):
    # a node drain or a preemption signals one learner pod, not necessarily rank 0's
    model, url, env = servers
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job(model, tmp_path / "ckpts", training={"totalSteps": 50})))
    argv = learner_argv(tmp_path / "job.yaml", url, tmp_path / "run", ranks=2)
    learner = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not lines(tmp_path / "run") and time.monotonic() < deadline and learner.poll() is None:
        time.sleep(0.2)
    rank1 = worker_pid(learner.pid, 1)
    assert rank1 is not None
    os.kill(rank1, signal.SIGTERM)
    _, err = learner.communicate(timeout=300)
    assert learner.returncode == 0, failure(err)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["phase"] == "Stopped" and "signal" in status["message"] and status["step"] < 50
    assert [m.step for m in CheckpointStore(str(tmp_path / "ckpts")).complete()][-1] == status["step"]
