"""`kuberl plan`'s learner estimate against the measured CPU peak of real train steps: two tiny Llamas (built
here, offline, with vocabularies wide enough that the log-probs run in several chunks), two context lengths,
micro-batches of one row and of the whole mini-batch, activation checkpointing off and on, and with the
gradient-free passes (two mini-batches, a KL to a frozen reference). Goal: every estimate within +-25 % of
the measurement.

Each case runs in a fresh Python process (torch's CPU allocations are invisible to tracemalloc; torch keeps
no allocator statistics on CPU, so the kernel's resident-set high-water mark is read): it runs the whole
learner once on one row and drops it (so what a process sets up once, whatever the model, is not counted),
reads its resident set (the baseline), loads the policy with `load_policy`, makes a real AdamW and a batch of
4 rows x T tokens whose loss reads from position 1 (the plan's worst case), runs one `train_step` in
micro-batches of the case's budget (so gradients and AdamW moments exist, as in a running job), resets the
kernel's high-water mark (/proc/self/clear_refs) and runs a second step. Measured peak = the high-water
mark of the second step - the baseline. glibc's mmap threshold is fixed at 128 KiB (MALLOC below) so
freed tensors leave the resident set. Linux only.

    nice -n 19 .venv/bin/python benchmarks/bench_memory_plan.py [OUT.json]
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
ROWS = 4
BUDGETS = ("row", "mini-batch")  # micro-batches of one row each, or of the whole mini-batch
# a fixed mmap threshold (which turns off glibc's dynamic one): freed tensors go back to the kernel at once,
# so the resident set follows the live tensors instead of the heap's high-water mark
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "131072"}
# log-prob chunks of 4096 and 2048 tokens (kuberl.planning.logits_chunk_tokens): several per micro-batch
MODELS = {
    "h128-l2-v16k": {"hidden_size": 128, "layers": 2, "heads": 2, "vocab_size": 16384, "contexts": (1024, 2048)},
    "h256-l4-v32k": {"hidden_size": 256, "layers": 4, "heads": 4, "vocab_size": 32768, "contexts": (512, 1024)},
}


def build_model(path: Path, hidden_size: int, layers: int, heads: int, vocab_size: int, contexts=()) -> Path:
    """A random Llama (safetensors, float32) with no tokenizer: the learner needs config and weights only."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return path


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure_case(model_dir: str, tokens: int, checkpointing: bool, budget: int, passes: bool) -> dict[str, int]:
    """In this (fresh) process: bytes the second of two train steps takes at its peak above the baseline."""
    import torch

    from kuberl.api.spec import FsdpSpec
    from kuberl_trainer.algorithms.losses import LossConfig
    from kuberl_trainer.policy import load_policy
    from kuberl_trainer.step import TokenBatch, train_step

    torch.set_num_threads(1)
    # imported before the baseline: transformers' modules are a few hundred MB of Python, not the step's
    import transformers.models.llama.modeling_llama  # noqa: F401
    from transformers import AutoModelForCausalLM  # noqa: F401

    def learner(warm_up_rows: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, TokenBatch]:
        model = load_policy(model_dir, FsdpSpec(activation_checkpointing=checkpointing), torch.device("cpu"))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(5, model.config.vocab_size, (warm_up_rows, tokens), generator=g)
        loss_mask = torch.ones(warm_up_rows, tokens, dtype=torch.bool)
        advantages = torch.linspace(-1, 1, warm_up_rows)[:, None].expand(warm_up_rows, tokens).clone()
        batch = TokenBatch(ids, torch.ones_like(ids), loss_mask, torch.full((warm_up_rows, tokens), -6.0), advantages)
        return model, optimizer, batch

    # The whole learner once, on one row, then dropped: what a process sets up once whatever the model
    # (the modules that loading, AdamW and the step import, torch's kernels and thread pools: 14-17 MB here)
    # is in the baseline, not in the step's bytes, which are what the plan estimates.
    # with `passes`: two mini-batches (old log-probs) and a KL to a frozen reference, two gradient-free passes
    config, mini_batches = (LossConfig(kl_coef=0.1), 2) if passes else (LossConfig(), 1)

    def step(model, optimizer, batch, reference) -> None:
        train_step(model, optimizer, batch, config, 1.0, 1, mini_batches, reference, micro_batch_tokens=budget)

    def frozen():
        return load_policy(model_dir, FsdpSpec(activation_checkpointing=False), torch.device("cpu"), trainable=False)

    model, optimizer, batch = learner(2 if passes else 1)
    step(model, optimizer, batch, frozen() if passes else None)
    del model, optimizer, batch
    gc.collect()
    baseline = _status_kib("VmRSS") * 1024
    model, optimizer, batch = learner(ROWS)
    reference = frozen() if passes else None
    step(model, optimizer, batch, reference)
    settled = _status_kib("VmRSS") * 1024
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident set
    step(model, optimizer, batch, reference)
    peak = _status_kib("VmHWM") * 1024
    return {"baseline_bytes": baseline, "between_steps_bytes": settled - baseline, "measured_bytes": peak - baseline}


def estimate(model_dir: Path, tokens: int, checkpointing: bool, budget: int, passes: bool):
    from kuberl.api.spec import RLJobSpec
    from kuberl.planning import plan_learner, read_model_shape

    cpu = {"requests": {"cpu": 1, "memory": "1Gi"}}
    spec = RLJobSpec.model_validate(
        {
            "model": {"uri": str(model_dir), "maxContextTokens": tokens},
            "environment": {"maxTokensPerTrajectory": tokens},
            "algorithm": {"groupSize": 2, "klCoef": 0.1 if passes else 0.0},
            "training": {"trajectoriesPerStep": ROWS, "miniBatches": 2 if passes else 1},
            "learner": {
                "replicas": 1,
                "resources": cpu,
                "fsdp": {"activationCheckpointing": checkpointing},
                "microBatchTokens": budget,
            },
        }
    )
    return plan_learner(spec, read_model_shape(str(model_dir)))


def run() -> dict[str, object]:
    cases = []
    with tempfile.TemporaryDirectory(prefix="kuberl-memory-plan-") as tmp:
        for name, size in MODELS.items():
            model_dir = build_model(Path(tmp) / name, **size)
            for tokens in size["contexts"]:
                for budget_name in BUDGETS:
                    budget = tokens if budget_name == "row" else ROWS * tokens
                    for checkpointing in (False, True):
                        cases.append(measure(name, model_dir, tokens, checkpointing, budget_name, budget, False))
            # the gradient-free passes and the reference model: the longer context, a micro-batch of a mini-batch
            tokens = size["contexts"][-1]
            for checkpointing in (False, True):
                cases.append(measure(name, model_dir, tokens, checkpointing, "mini-batch", 2 * tokens, True))
    return {"cases": cases, "all_within_25_percent": all(c["within_25_percent"] for c in cases)}


def measure(
    name: str, model_dir: Path, tokens: int, checkpointing: bool, budget_name: str, budget: int, passes: bool
) -> dict:
    started = time.perf_counter()
    argv = [sys.executable, __file__, "--case", str(model_dir), str(tokens), str(int(checkpointing)), str(budget)]
    argv.append(str(int(passes)))
    child = subprocess.run(argv, capture_output=True, text=True, timeout=900, env={**os.environ, **MALLOC})
    if child.returncode != 0:
        raise RuntimeError(f"{name} T={tokens}: {child.stderr[-2000:]}")
    measured = json.loads(child.stdout.strip().splitlines()[-1])
    plan = estimate(model_dir, tokens, checkpointing, budget, passes)
    case = {
        "model": name,
        "parameters": plan.weights // 4,
        "context_tokens": tokens,
        "rows": ROWS,
        "micro_batch": budget_name,
        "gradient_free_passes": "old log-probs (2 mini-batches) and a reference (klCoef 0.1)" if passes else "none",
        "estimate_gradient_free_pass_bytes": plan.gradient_free_pass,
        "estimate_reference_bytes": plan.reference,
        "micro_batch_tokens": plan.micro_batch_tokens,
        "chunk_tokens": plan.chunk_tokens,
        "activation_checkpointing": checkpointing,
        "estimate_bytes": plan.peak,
        "estimate_states_bytes": plan.weights + plan.gradients + plan.optimizer,
        "estimate_activations_bytes": plan.activations,
        "estimate_logits_bytes": plan.logits,
        **measured,
        "ratio": round(plan.peak / measured["measured_bytes"], 3),
        "within_25_percent": abs(plan.peak / measured["measured_bytes"] - 1) <= 0.25,
        "seconds": round(time.perf_counter() - started, 1),
    }
    print(
        f"[bench]   {name} T={tokens} micro-batch={budget_name} checkpointing={checkpointing} passes={passes}: "
        f"estimate {plan.peak / 2**20:.1f} MiB, measured {measured['measured_bytes'] / 2**20:.1f} MiB, "
        f"ratio {case['ratio']}",
        flush=True,
    )
    return case


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main() -> int:
    if sys.argv[1:2] == ["--case"]:
        model_dir, tokens, checkpointing, budget = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[5])
        print(json.dumps(measure_case(model_dir, tokens, checkpointing, budget, sys.argv[6] == "1")))
        return 0
    sys.path.insert(0, str(HERE))
    from run import commit, machine

    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/bench/memory_plan.json")
    report = {
        "commit": commit(),
        "machine": {**machine(), "cpu_model": cpu_model()},
        "method": "VmHWM - VmRSS baseline of a fresh process (/proc/self/status), second of two train steps",
        **run(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
