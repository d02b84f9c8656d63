"""A learner gang on two machines (two torchrun agents, each with its own staging folder, as two learner pods
have): each machine uploads its own shards, the manifest lists every rank's, and a new gang on fresh machines
resumes from it."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import BIN, REPO

from kuberl_sandbox.local import free_port
from kuberl_trainer.checkpoints.store import CheckpointStore
from recipes.swe_toy.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow


def run_gang(model, store_dir, out, staging_root, steps: int) -> None:
    port = free_port()
    agents = []
    for machine in range(2):
        argv = [
            str(BIN / "torchrun"),
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            f"gang-{port}",
            "-m",
            "helpers.resume_run",
            str(model),
            str(store_dir),
            str(steps),
            "2",
            str(out),
        ]
        env = {**os.environ, "PYTHONPATH": str(REPO / "tests"), "STAGING": str(staging_root / f"machine-{machine}")}
        agents.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for agent in agents:
        output = agent.communicate(timeout=300)[0].decode()
        assert agent.returncode == 0, output[-3000:]


def test_each_machine_uploads_its_shards_and_a_new_gang_resumes(tmp_path):
    model = build_tiny_model(tmp_path / "m", hidden_size=64, layers=2, seed=4)
    store_dir, out = tmp_path / "store", tmp_path / "losses.jsonl"
    run_gang(model, store_dir, out, tmp_path / "first", steps=4)
    newest = CheckpointStore(str(store_dir)).newest()
    assert newest is not None and newest.step == 4
    shards = sorted(name for name in newest.files if name.endswith(".distcp"))
    assert len(shards) == 2, newest.files  # one per rank, uploaded by the machine that wrote it
    assert {"rng-rank0.json", "rng-rank1.json", ".metadata"} <= set(newest.files)

    run_gang(model, store_dir, out, tmp_path / "second", steps=6)  # new machines: nothing staged locally
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["step"] for line in lines if line["resumed_from"] == 4] == [5, 6]
    assert [m.step for m in CheckpointStore(str(store_dir)).complete()] == [2, 4, 6]
