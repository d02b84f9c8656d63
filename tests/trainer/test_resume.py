"""Kill the learner (SIGKILL) in the middle of an asynchronous checkpoint upload to a real S3 server:
on restart it resumes from the previous complete checkpoint and its loss curve from there is identical
to an uninterrupted run with the same seed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from conftest import BIN, REPO
from helpers.seaweedfs import seaweedfs

from kuberl_trainer.checkpoints.store import CheckpointStore
from recipes.swe_toy.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow
STEPS, EVERY = 8, 2


def launch(model, uri, out, env, slow_step=-1):
    argv = [
        str(BIN / "torchrun"),
        "--standalone",
        "--nproc_per_node",
        "1",
        "-m",
        "helpers.resume_run",
        str(model),
        uri,
        str(STEPS),
        str(EVERY),
        str(out),
    ]
    env = {**env, "SLOW_STEP": str(slow_step), "PYTHONPATH": str(REPO / "tests")}
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def losses(out):
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_sigkill_during_an_upload_resumes_from_the_previous_checkpoint_with_the_same_losses(tmp_path):
    model = build_tiny_model(tmp_path / "m", hidden_size=64, layers=2, seed=9)
    with seaweedfs() as s3:
        s3.client().create_bucket(Bucket="ckpt")
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": s3.access_key,
            "AWS_SECRET_ACCESS_KEY": s3.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
            "S3_ENDPOINT": s3.endpoint,
        }
        full = launch(model, "s3://ckpt/full", tmp_path / "full.jsonl", env)
        assert full.wait(timeout=300) == 0, full.stdout.read().decode()[-3000:]

        out = tmp_path / "killed.jsonl"
        run = launch(model, "s3://ckpt/killed", out, env, slow_step=6)
        marker = tmp_path / "killed.jsonl.uploading"
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert run.poll() is None and time.monotonic() < deadline, run.stdout.read().decode()[-3000:]
            time.sleep(0.1)
        os.killpg(run.pid, signal.SIGKILL)  # the learner dies with step 6 half uploaded
        run.wait()
        os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")})
        store = CheckpointStore("s3://ckpt/killed", endpoint_url=s3.endpoint)
        assert [m.step for m in store.complete()] == [2, 4]  # step 6 has files but no manifest

        resumed = launch(model, "s3://ckpt/killed", out, env)
        assert resumed.wait(timeout=300) == 0, resumed.stdout.read().decode()[-3000:]
        reference = {r["step"]: r["loss"] for r in losses(tmp_path / "full.jsonl")}
        after = [r for r in losses(out) if r["resumed_from"] == 4]
        assert [r["step"] for r in after] == [5, 6, 7, 8]
        for r in after:
            assert r["loss"] == pytest.approx(reference[r["step"]], abs=1e-6), (r, reference)
        assert [m.step for m in store.complete()] == [4, 6, 8]
