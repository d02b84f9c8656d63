"""Saving and restoring the learner's state with torch.distributed.checkpoint, without stalling training.

`save()` starts DCP `async_save` and returns at once: the shards are copied out of the live tensors by
a background stager while training goes on, and the caller calls `ready_for_update()` before the
optimizer changes the weights (the only moment training may have to wait). A background thread then
waits for the local write, uploads the step's folder to the store, writes the manifest last and prunes
old checkpoints. Every rank writes its own shards; rank 0 also writes the
training state (step, policy version, RNG states, task cursor, untrained trajectories) and uploads.
With LoRA the frozen base is left out: a checkpoint holds the adapters and their optimizer state.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from kuberl.api import env_vars
from kuberl_trainer.checkpoints.store import CheckpointStore, Manifest

TRAINING_STATE = "training_state.json"


@dataclass
class TrainingState:
    """What besides the weights a resumed run needs to continue exactly where it stopped."""

    step: int
    policy_version: int
    task_cursor: int = 0
    pending_trajectories: list[dict[str, Any]] = field(default_factory=list)
    in_flight: list[tuple[str, int]] = field(default_factory=list)
    """(task id, seed) of groups submitted but not finished: submitted again on resume."""


def _rng_state() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state().tolist(),
        "python": random.getstate()[1][:625],
        "python_version": random.getstate()[0],
        "python_gauss": random.getstate()[2],
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    random.setstate((state["python_version"], tuple(state["python"]), state["python_gauss"]))


class Checkpointer:
    """Asynchronous checkpoints of one learner into a CheckpointStore."""

    def __init__(self, store: CheckpointStore, staging: Path, keep: int, rank: int = 0) -> None:
        self.store, self.staging, self.keep, self.rank = store, staging, keep, rank
        # the ranks of one machine share its staging folder; the first of each machine prepares, uploads and
        # downloads it (in a cluster every learner pod is its own machine, with its own shards)
        self.machine_leader = int(os.environ.get("LOCAL_RANK", "0")) == 0
        self._upload: threading.Thread | None = None
        self._dcp_future: Future | None = None
        self.blocked_seconds: list[float] = []
        self.last_complete: Manifest | None = None
        self.error: BaseException | None = None
        # the background save and its barrier get their own process group: collectives of two threads
        # on one group interleave differently on each rank and deadlock
        self._group = dist.new_group(backend="gloo") if dist.is_initialized() else None
        cuda = torch.cuda.is_available()
        self._stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=cuda
            )
        )
        self._staged: Future | None = None

    def save(self, model, optimizer, state: TrainingState) -> None:
        """Start a checkpoint of this step; returns once training may continue."""
        self.wait()  # one checkpoint in flight at a time
        started = time.monotonic()
        folder = self.staging / CheckpointStore.directory(state.step)
        if self.machine_leader:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        if dist.is_initialized():
            dist.barrier(group=self._group)
        model_state, optim_state = get_state_dict(model, optimizer, options=_options(model))
        response = dcp.async_save(
            {"model": model_state, "optim": optim_state},
            checkpoint_id=str(folder),
            process_group=self._group,
            async_stager=self._stager,
        )
        self._staged, self._dcp_future = response.staging_completion, response.upload_completion
        (folder / f"rng-rank{self.rank}.json").write_text(json.dumps(_rng_state()))
        if self.rank == 0:
            (folder / TRAINING_STATE).write_text(json.dumps(state.__dict__))
        self.blocked_seconds.append(time.monotonic() - started)
        self._upload = threading.Thread(target=self._finish, args=(folder, state), daemon=True)
        self._upload.start()

    def ready_for_update(self) -> None:
        """Block until the checkpoint in flight has copied the state out; call before `optimizer.step()`.
        The wait counts as time training was blocked by the checkpoint."""
        if self._staged is None:
            return
        started = time.monotonic()
        try:
            self._staged.result()
        finally:
            self._staged = None
            self.blocked_seconds[-1] += time.monotonic() - started

    def _finish(self, folder: Path, state: TrainingState) -> None:
        try:
            assert self._dcp_future is not None
            self._dcp_future.result()
            if dist.is_initialized():
                # every rank's shards are in its machine's staging folder before that machine uploads them
                dist.barrier(group=self._group)
            files = self.store.upload(state.step, folder) if self.machine_leader else {}
            if dist.is_initialized():
                # rank 0 writes the manifest only once every machine's shards are stored, listing them all
                every: list[dict | None] = [None] * dist.get_world_size(self._group)
                dist.all_gather_object(every, files, group=self._group)
                files = {name: entry for part in every if part for name, entry in part.items()}
            if self.machine_leader:
                shutil.rmtree(folder, ignore_errors=True)
            if self.rank == 0:
                self.last_complete = self.store.commit(state.step, state.policy_version, files)
                self.store.prune(self.keep)
        except BaseException as err:  # reported to the training loop by wait()
            self.error = err

    def wait(self) -> None:
        """Block until the checkpoint in flight is complete (or raise its error)."""
        self.ready_for_update()
        if self._upload is not None:
            self._upload.join()
            self._upload = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def restore(self, model, optimizer) -> TrainingState | None:
        """Load the newest complete checkpoint into model and optimizer; None when there is none."""
        manifest = self.store.newest()
        if manifest is None:
            return None
        folder = self.staging / f"restore-{manifest.step}"
        if self.machine_leader or not dist.is_initialized():
            shutil.rmtree(folder, ignore_errors=True)
            self.store.download(manifest, folder)
        if dist.is_initialized():
            dist.barrier()
        options = _options(model)
        model_state, optim_state = get_state_dict(model, optimizer, options=options)
        loaded = {"model": model_state, "optim": optim_state}
        dcp.load(loaded, checkpoint_id=str(folder))
        set_state_dict(
            model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"], options=options
        )
        rng = folder / f"rng-rank{self.rank}.json"
        if rng.exists():
            _set_rng_state(json.loads(rng.read_text()))
        state = TrainingState(**json.loads((folder / TRAINING_STATE).read_text()))
        self.last_complete = manifest
        return state


def _options(model) -> StateDictOptions | None:
    """Frozen parameters (the base model under LoRA adapters) are neither saved nor expected on restore: they
    are the model folder's, unchanged."""
    if all(p.requires_grad for p in model.parameters()):
        return None
    return StateDictOptions(ignore_frozen_params=True, strict=False)


def staging_folder(job: str) -> Path:
    """Local staging for checkpoint shards (shared by the ranks of one machine, see Checkpointer)."""
    return Path(os.environ.get(env_vars.STAGING, f"/tmp/kuberl-staging-{job}"))
