"""Memory plan of an RLJob: the learner's peak per device and the rollout tier's KV cache, against what the
job requests. Pure arithmetic on the spec and the model's config.json (`kuberl plan`, `kuberl validate`).

What the estimate assumes, following the code that runs (trainer/kuberl_trainer/policy.py and step.py):

- The learner keeps float32 master weights, float32 gradients (alive from one backward to the next forward:
  `zero_grad` runs after the forward) and AdamW's two float32 moments; FSDP2 divides all three by the world
  size (learner.replicas). With world size > 1 the root unit (embeddings, lm_head, final norm) and two
  decoder blocks (one computing, one prefetched) are gathered whole in the compute dtype. With
  fsdp.cpuOffload those three states live in host memory instead.
- One micro-batch holds trajectoriesPerStep / miniBatches / replicas rows (rounded up), every row padded
  to model.maxContextTokens, and the loss reads from position 1 (worst case: `forward` keeps logits from the
  first position any row's loss reads, which the plan cannot know). Rows are right-padded, so attention
  takes the fused causal kernel: no [T, T] score matrix is kept.
- Saved activations of a Llama block per token (elements): two RMSNorms 2 x 2H, attention 3 x (query width)
  + 2 x (key/value width) (rotated q, k, v, the attention output and its contiguous copy for o_proj), MLP
  4 x intermediate (gate, its SiLU, up, their product), plus 2H for the final norm. With activation
  checkpointing each block keeps only its input (H) and one block is recomputed at a time in the backward,
  after the logits' copies are freed: the peak holds the larger of the two, not both.
- The logits dominate small models: [rows, T, vocab] logits and their float32 log-softmax, plus, during the
  entropy, exp(log p) and p log p: four float32 copies on CPU (bfloat16 logits and a float32 copy with
  mixed precision on GPU); one more is kept when entropyCoef > 0.
- With miniBatches > 1 (old log-probs) or klCoef > 0 (the reference model, float32, sharded like the
  policy, kept for the whole job) a gradient-free forward runs over all of the rank's rows first.
- Compute dtype: float32 on CPU; bfloat16 on GPU when fsdp.mixedPrecision. A learner pod uses one GPU.
- The rollout engine holds the weights (model.dtype; auto is bfloat16 on GPU, float32 on CPU) and a KV
  cache of 2 x layers x kv heads x head dim x dtype bytes per token for min(concurrentSessions,
  engine.maxNumSeqs) sequences of engine.maxModelLen (else model.maxContextTokens) tokens each; on GPU it
  may take gpuMemoryUtilization of the GPUs one engine spans.
- The spec does not say how much memory a GPU has: `gpu_memory` (80 GiB unless told) stands for it. A CPU
  pod's budget is its memory limit, else its memory request; without either the fit is unknown.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from kuberl.api.spec import GPU_RESOURCE, DType, ResourceRequirements, RLJobSpec
from kuberl.api.types import quantity_value

GIB = 1024**3
DEFAULT_GPU_MEMORY = 80 * GIB
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


class PlanError(ValueError):
    """The plan cannot be made (no readable config.json); the message names the file."""


@dataclass(frozen=True)
class ModelShape:
    """What the memory plan needs from a Hugging Face config.json (a Llama-style decoder)."""

    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    dtype: str

    @property
    def block_parameters(self) -> int:
        q, kv, h = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden_size
        return h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size + 2 * h

    @property
    def root_parameters(self) -> int:
        """Embeddings, lm_head (unless tied) and the final norm: FSDP's root unit."""
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2) + self.hidden_size

    @property
    def parameters(self) -> int:
        return self.layers * self.block_parameters + self.root_parameters

    def block_activation_elements(self) -> int:
        """Elements one decoder block saves for the backward, per token."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 4 * self.hidden_size + 3 * q + 2 * kv + 4 * self.intermediate_size


def model_shape_from_config(config: dict, source: str = "config.json") -> ModelShape:
    """The shape of a decoder from its config.json contents; PlanError naming `source` when a field lacks."""
    try:
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        return ModelShape(
            hidden_size=hidden,
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            dtype=str(config.get("torch_dtype") or config.get("dtype") or "float32"),
        )
    except KeyError as err:
        raise PlanError(f"{source}: no {err.args[0]!r}; expected a Llama-style decoder config") from None
    except (TypeError, ValueError) as err:
        raise PlanError(f"{source}: {err}") from None


def read_model_shape(uri: str) -> ModelShape:
    """The shape from `uri`/config.json when `uri` is a local folder (or file://); PlanError otherwise."""
    if "://" in uri and not uri.startswith("file://"):
        raise PlanError(f"{uri}/config.json: the plan reads a local model folder; pass --model FOLDER")
    folder = Path(unquote(urlparse(uri).path)) if uri.startswith("file://") else Path(uri)
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"{path}: no such file; spec.model.uri must name a Hugging Face model folder") from None
    except (OSError, json.JSONDecodeError) as err:
        raise PlanError(f"{path}: cannot read it ({err})") from None
    if not isinstance(config, dict):
        raise PlanError(f"{path}: expected a JSON object")
    return model_shape_from_config(config, str(path))


def quantity_bytes(quantity: int | str) -> float:
    """A Kubernetes quantity (64Gi, 500M, 1e9, 3) as a number."""
    try:
        return quantity_value(quantity)
    except ValueError as err:
        raise PlanError(str(err)) from None


def _gpus(resources: ResourceRequirements) -> int:
    value = resources.limits.get(GPU_RESOURCE, resources.requests.get(GPU_RESOURCE, 0))
    return int(quantity_bytes(value))


def _pod_memory(resources: ResourceRequirements) -> int | None:
    value = resources.limits.get("memory", resources.requests.get("memory"))
    return None if value is None else int(quantity_bytes(value))


@dataclass(frozen=True)
class LearnerPlan:
    """Bytes on one learner device at the peak of a step (and what sits in host memory)."""

    device: str
    world_size: int
    rows: int
    """Rows of one micro-batch on one rank."""
    context_tokens: int
    activation_checkpointing: bool
    weights: int
    gradients: int
    optimizer: int
    gathered: int
    """Parameters FSDP gathers whole for the units being computed (world size > 1)."""
    reference: int
    activations: int
    """Saved activations of the micro-batch with the job's activationCheckpointing setting."""
    activations_without_checkpointing: int
    activations_with_checkpointing: int
    logits: int
    """The [rows, T, vocab] logits and log-softmax copies at their peak."""
    gradient_free_pass: int
    """Logits of the gradient-free forward over all of the rank's rows (old log-probs, reference)."""
    peak: int
    host: int
    """States offloaded to host memory (fsdp.cpuOffload on GPU)."""
    budget: int | None
    """The device's memory (GPU memory, or the pod's memory on CPU); None when the spec does not say."""

    @property
    def fits(self) -> bool | None:
        return None if self.budget is None else self.peak <= self.budget


@dataclass(frozen=True)
class RolloutPlan:
    """Bytes one rollout engine needs: weights plus the KV cache of its concurrent sequences."""

    device: str
    sequences: int
    tokens_per_sequence: int
    kv_bytes_per_token: int
    weights: int
    kv_cache: int
    need: int
    budget: int | None

    @property
    def fits(self) -> bool | None:
        return None if self.budget is None else self.need <= self.budget


@dataclass(frozen=True)
class MemoryPlan:
    """The learner's and the rollout tier's memory against what the job requests."""

    parameters: int
    learner: LearnerPlan
    rollout: RolloutPlan

    @property
    def fits(self) -> bool | None:
        verdicts = [self.learner.fits, self.rollout.fits]
        if False in verdicts:
            return False
        return None if None in verdicts else True

    def problems(self) -> list[str]:
        """One line per tier that does not fit."""
        out = []
        if self.learner.fits is False:
            out.append(
                f"learner needs {gib(self.learner.peak)} per {self.learner.device} at "
                f"{self.learner.context_tokens} tokens x {self.learner.rows} rows, has {gib(self.learner.budget)}"
            )
        if self.rollout.fits is False:
            out.append(
                f"rollout needs {gib(self.rollout.need)} (KV cache {gib(self.rollout.kv_cache)} for "
                f"{self.rollout.sequences} x {self.rollout.tokens_per_sequence} tokens), has {gib(self.rollout.budget)}"
            )
        return out

    def to_json(self) -> dict:
        return {
            "parameters": self.parameters,
            "fits": self.fits,
            "learner": {**asdict(self.learner), "fits": self.learner.fits},
            "rollout": {**asdict(self.rollout), "fits": self.rollout.fits},
        }


def gib(value: float | None) -> str:
    return "unknown" if value is None else f"{value / GIB:.2f} GiB"


def activation_bytes(shape: ModelShape, rows: int, tokens: int, element_bytes: int, checkpointing: bool) -> int:
    """Saved activations of one forward over [rows, tokens] (see the module docstring)."""
    block = shape.block_activation_elements()
    # with checkpointing: every block's input, and one block recomputed at a time in the backward
    per_token = shape.layers * shape.hidden_size + block if checkpointing else shape.layers * block
    return rows * tokens * (per_token + 2 * shape.hidden_size) * element_bytes


def logits_bytes(shape: ModelShape, rows: int, tokens: int, gpu_mixed: bool, entropy_grad: bool) -> int:
    """The logits, their log-softmax and the entropy's temporaries at their peak."""
    per_element = (2 + 4 + 4 + 4 + 4) if gpu_mixed else 4 * 4
    if entropy_grad:
        per_element += 4
    return rows * tokens * shape.vocab_size * per_element


def plan_learner(spec: RLJobSpec, shape: ModelShape, gpu_memory: int = DEFAULT_GPU_MEMORY) -> LearnerPlan:
    learner, fsdp = spec.learner, spec.learner.fsdp
    world = learner.replicas
    gpu = _gpus(learner.resources) > 0
    gpu_mixed = gpu and fsdp.mixed_precision
    compute_bytes = 2 if gpu_mixed else 4
    tokens = spec.model.max_context_tokens
    rank_rows = math.ceil(spec.training.trajectories_per_step / world)
    rows = math.ceil(rank_rows / spec.training.mini_batches)
    params = shape.parameters
    weights, gradients, optimizer = (math.ceil(params * b / world) for b in (4, 4, 8))
    gathered = 0
    if world > 1:
        gathered = (shape.root_parameters + 2 * shape.block_parameters) * compute_bytes
    reference = math.ceil(params * 4 / world) if spec.algorithm.kl_coef > 0 else 0
    without = activation_bytes(shape, rows, tokens, compute_bytes, checkpointing=False)
    with_ = activation_bytes(shape, rows, tokens, compute_bytes, checkpointing=True)
    activations = with_ if fsdp.activation_checkpointing else without
    logits = logits_bytes(shape, rows, tokens, gpu_mixed, spec.algorithm.entropy_coef > 0)
    step = activations + logits
    if fsdp.activation_checkpointing:
        # the logits' copies are freed before the backward reaches the last block and recomputes it
        recomputed = rows * tokens * shape.block_activation_elements() * compute_bytes
        step = activations - recomputed + max(recomputed, logits)
    free_pass = 0
    if spec.training.mini_batches > 1 or spec.algorithm.kl_coef > 0:
        free_pass = logits_bytes(shape, rank_rows, tokens, gpu_mixed, entropy_grad=False)
        free_pass += rank_rows * tokens * shape.block_activation_elements() * compute_bytes
    offloaded = gpu and fsdp.cpu_offload
    states = weights + gradients + optimizer + reference
    resident = gathered + (0 if offloaded else states)
    peak = resident + max(step, free_pass)
    budget = gpu_memory if gpu else _pod_memory(learner.resources)
    return LearnerPlan(
        device="gpu" if gpu else "cpu",
        world_size=world,
        rows=rows,
        context_tokens=tokens,
        activation_checkpointing=fsdp.activation_checkpointing,
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        gathered=gathered,
        reference=reference,
        activations=activations,
        activations_without_checkpointing=without,
        activations_with_checkpointing=with_,
        logits=logits,
        gradient_free_pass=free_pass,
        peak=peak,
        host=states if offloaded else 0,
        budget=budget,
    )


def plan_rollout(spec: RLJobSpec, shape: ModelShape, gpu_memory: int = DEFAULT_GPU_MEMORY) -> RolloutPlan:
    rollout, engine = spec.rollout, spec.rollout.engine
    gpu = _gpus(rollout.resources) > 0
    dtype = spec.model.dtype
    element = (2 if gpu else 4) if dtype == DType.AUTO else _DTYPE_BYTES[dtype.value]
    sequences = min(rollout.concurrent_sessions, engine.max_num_seqs)
    tokens = engine.max_model_len or spec.model.max_context_tokens
    per_token = 2 * shape.layers * shape.kv_heads * shape.head_dim * element
    weights = shape.parameters * element
    kv_cache = per_token * sequences * tokens
    if gpu:
        budget: int | None = int(gpu_memory * engine.tensor_parallel_size * engine.gpu_memory_utilization)
    else:
        budget = _pod_memory(rollout.resources)
    return RolloutPlan(
        device="gpu" if gpu else "cpu",
        sequences=sequences,
        tokens_per_sequence=tokens,
        kv_bytes_per_token=per_token,
        weights=weights,
        kv_cache=kv_cache,
        need=weights + kv_cache,
        budget=budget,
    )


def plan_memory(spec: RLJobSpec, shape: ModelShape, gpu_memory: int = DEFAULT_GPU_MEMORY) -> MemoryPlan:
    """The memory plan of a job whose policy has `shape`; `gpu_memory` is one GPU's memory in bytes."""
    return MemoryPlan(shape.parameters, plan_learner(spec, shape, gpu_memory), plan_rollout(spec, shape, gpu_memory))


def fit_warnings(spec: RLJobSpec, gpu_memory: int = DEFAULT_GPU_MEMORY) -> list[str]:
    """What does not fit, when the model's config.json can be read locally; nothing when it cannot."""
    try:
        return plan_memory(spec, read_model_shape(spec.model.uri), gpu_memory).problems()
    except PlanError:
        return []
