"""The learner's RL loop (sync mode, one process for now): hand task groups to the rollout servers,
gather the finished trajectories, compute advantages, train one step, publish the new weights with their
version, checkpoint, and log a line of metrics per step."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import torch

from kuberl.api.rljob import RLJob
from kuberl.api.trajectory import Trajectory
from kuberl_trainer.algorithms.losses import LossConfig
from kuberl_trainer.batching import collate, token_advantages
from kuberl_trainer.checkpoints.store import CheckpointStore
from kuberl_trainer.checkpoints.writer import Checkpointer, TrainingState
from kuberl_trainer.distributed import init_distributed
from kuberl_trainer.export import policy_blob
from kuberl_trainer.policy import load_policy
from kuberl_trainer.step import train_step


class RolloutClient:
    """The work API of the rollout servers (round robin over them)."""

    def __init__(self, urls: list[str], timeout: float = 600.0) -> None:
        self.http = [httpx.Client(base_url=u, timeout=timeout) for u in urls]
        self._next = itertools.cycle(self.http)

    def submit(self, task_id: str, size: int, seed: int) -> None:
        r = next(self._next).post("/v1/groups", json={"taskId": task_id, "groupSize": size, "seed": seed})
        r.raise_for_status()

    def collect(self, wait: float) -> list[Trajectory]:
        found = []
        for http in self.http:
            body = http.get("/v1/trajectories", params={"wait": wait, "limit": 1024}).raise_for_status().json()
            found += [Trajectory.model_validate(t) for t in body["trajectories"]]
        return found

    def publish(self, version: int, blob: bytes) -> None:
        for http in self.http:
            http.put(f"/v1/weights/{version}/buckets/0", params={"of": 1}, content=blob).raise_for_status()


def run_learner(job: RLJob, rollout_urls: list[str], model_path: str, run_dir: Path, task_ids: list[str],
                log: Callable[[dict], None] = print) -> list[dict]:  # fmt: skip
    """Train until training.totalSteps (or limits.maxSteps); returns the metrics of every step."""
    spec = job.spec
    rank, world, device = init_distributed()
    if world > 1:
        raise NotImplementedError("the RL loop runs one process for now (FSDP steps themselves scale: see step.py)")
    torch.manual_seed(spec.training.seed)
    model = load_policy(model_path, spec.learner.fsdp, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.training.learning_rate,
                                  weight_decay=spec.training.weight_decay)  # fmt: skip
    store = CheckpointStore(spec.checkpoint.uri or str(run_dir / "checkpoints"), spec.checkpoint.endpoint_url)
    checkpointer = Checkpointer(store, run_dir / "staging", keep=spec.checkpoint.keep, rank=rank)
    state = checkpointer.restore(model, optimizer) or TrainingState(step=0, policy_version=0)
    rollouts = RolloutClient(rollout_urls)
    if state.policy_version:
        rollouts.publish(state.policy_version, policy_blob(model))
    loss_config = LossConfig(
        clip_low=spec.algorithm.clip_ratio_low, clip_high=spec.algorithm.clip_ratio_high,
        off_policy=str(spec.algorithm.off_policy_correction.mode), cap=spec.algorithm.off_policy_correction.cap,
        aggregation=str(spec.algorithm.loss_aggregation),
    )  # fmt: skip
    last = min(spec.training.total_steps, spec.limits.max_steps or spec.training.total_steps)
    group_size = spec.algorithm.group_size
    history = []
    metrics_file = run_dir / "metrics.jsonl"
    run_dir.mkdir(parents=True, exist_ok=True)
    while state.step < last:
        started = time.monotonic()
        for _ in range(spec.training.trajectories_per_step // group_size):
            rollouts.submit(
                task_ids[state.task_cursor % len(task_ids)], group_size, spec.training.seed + state.task_cursor
            )
            state.task_cursor += 1
        batch: list[Trajectory] = []
        while len(batch) < spec.training.trajectories_per_step:
            batch += rollouts.collect(wait=10)
        waited = time.monotonic() - started
        usable = [t for t in batch if t.error is None]
        collated = collate(usable, pad_id=0)
        collated.batch.advantages = token_advantages(usable, collated, spec.algorithm)
        report = train_step(model, optimizer, collated.batch, loss_config, spec.training.max_grad_norm, world)
        state.step += 1
        state.policy_version = state.step
        rollouts.publish(state.policy_version, policy_blob(model))
        if state.step % spec.checkpoint.interval_steps == 0 or state.step == last:
            checkpointer.save(model, optimizer, TrainingState(**state.__dict__))
        rewards = collated.rewards
        line = {"step": state.step, "loss": report["loss"], "reward_mean": float(rewards.mean()),
                "solve_rate": float((rewards >= 1.0).float().mean()), "trajectories": len(batch),
                "failed": len(batch) - len(usable), "mismatch_kl": report["mismatch_kl"],
                "grad_norm": report.get("grad_norm"), "skipped": report["skipped"],
                "generated_tokens": int(collated.batch.loss_mask.sum()), "wait_s": round(waited, 3),
                "step_s": round(time.monotonic() - started, 3), "time": time.time()}  # fmt: skip
        with metrics_file.open("a") as f:
            f.write(json.dumps(line) + "\n")
        history.append(line)
        log(line)
    checkpointer.wait()
    return history
