"""Memory plan of an RLJob: the learner's peak per device and the rollout tier's KV cache, against what the
job requests. Pure arithmetic on the spec and the model's config.json (`kuberl plan`, `kuberl validate`).

What the estimate assumes, following the code that runs (trainer/kuberl_trainer/policy.py and step.py):

- The learner keeps float32 master weights, float32 gradients (alive from one backward to the next forward:
  `zero_grad` runs after the forward) and AdamW's two float32 moments; FSDP2 divides all three by the world
  size (learner.replicas). With world size > 1 the root unit (embeddings, lm_head, final norm) and two
  decoder blocks (one computing, one prefetched) are gathered whole in the compute dtype. With
  fsdp.cpuOffload those three states live in host memory instead.
- A mini-batch of a rank is ceil(trajectoriesPerStep / replicas) / miniBatches rows, trained in micro-batches
  packed by learner.microBatchTokens (`resolve_micro_batch_tokens`): a micro-batch holds at most
  max(budget, longest trajectory) padded tokens, and no more than the mini-batch's rows x the longest
  trajectory (environment.maxTokensPerTrajectory). Rows are right-padded, so attention takes the fused causal
  kernel: no [T, T] score matrix is kept.
- Saved activations of a Llama block per token (elements): two RMSNorms 2 x 2H, attention 3 x (query width)
  + 2 x (key/value width) (rotated q, k, v, the attention output and its contiguous copy for o_proj), MLP
  4 x intermediate (gate, its SiLU, up, their product), plus 2H for the final norm. With activation
  checkpointing each block keeps only its input (H) and one block is recomputed at a time in the backward.
- Log-probs are computed a chunk of `logits_chunk_tokens` tokens at a time, each chunk checkpointed: one
  chunk lives at a time, as its float32 log-softmax (the logits are freed once it exists) and, during the
  entropy and the backward, two more float32 copies (12 bytes per logit; 14 with mixed precision, the
  bfloat16 logits' gradient); one more copy when entropyCoef > 0. In the backward the chunk and the
  recomputed block do not overlap: the peak holds the larger.
- Gradient-free passes (old log-probs with miniBatches > 1 or masked importance sampling, the reference
  policy with klCoef > 0, PPO's values) keep no activations: one micro-batch's final hidden states, one
  block's temporaries and one chunk's logits. The reference model (float32, sharded like the policy) stays
  for the whole job.
- With LoRA (spec.model.lora) the base weights are frozen: they are still float32 and sharded, but have no
  gradients and no optimizer state, and serve as the reference (no copy). Gradients and AdamW's moments are
  the adapters' alone: r x (in + out) per adapted linear layer (`lora_parameters`); the adapters' own
  activations (rank-r intermediates) are left out.
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

from kuberl.api.spec import GPU_RESOURCE, DType, LoraSpec, ResourceRequirements, RLJobSpec
from kuberl.api.types import quantity_value

GIB = 1024**3
DEFAULT_GPU_MEMORY = 80 * GIB
LOGITS_CHUNK_BYTES = 256 * 2**20
"""One float32 copy of a log-prob chunk's logits takes at most this (a chunk is at least one row's position)."""
MAX_MICRO_BATCH_TOKENS = 16_777_216
MICRO_BATCH_MEMORY_FRACTION = 0.9
"""The default micro-batch budget fills at most this fraction of a learner device's memory (the rest: the
allocator's fragmentation and what the plan does not count)."""
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

    def block_linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of a decoder block's linear layers, by module path."""
        q, kv, h, inter = (
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.hidden_size,
            self.intermediate_size,
        )
        return {
            "self_attn.q_proj": (h, q),
            "self_attn.k_proj": (h, kv),
            "self_attn.v_proj": (h, kv),
            "self_attn.o_proj": (q, h),
            "mlp.gate_proj": (h, inter),
            "mlp.up_proj": (h, inter),
            "mlp.down_proj": (inter, h),
        }

    def block_activation_elements(self) -> int:
        """Elements one decoder block saves for the backward, per token."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 4 * self.hidden_size + 3 * q + 2 * kv + 4 * self.intermediate_size


def lora_parameters(shape: ModelShape, lora: LoraSpec) -> int:
    """The adapters' parameters: r x (in + out) for each adapted linear layer of every block ("all-linear":
    all of them; the output head is never adapted). A target names a module, or the end of its path."""
    targets = set(lora.target_modules)
    per_block = 0
    for path, (fan_in, fan_out) in shape.block_linears().items():
        if "all-linear" in targets or any(
            path == t or path.endswith("." + t) or t.endswith("." + path) for t in targets
        ):
            per_block += lora.rank * (fan_in + fan_out)
    return shape.layers * per_block


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


def read_model_shape(uri: str, remote: bool = True, endpoint_url: str | None = None) -> ModelShape:
    """The shape from `uri`/config.json: a local folder, file://, or (with `remote`) an s3:// prefix read with
    the environment's S3 credentials and `endpoint_url` (else AWS_ENDPOINT_URL); PlanError otherwise."""
    if uri.startswith("s3://"):
        if not remote:
            raise PlanError(f"{uri}/config.json: not read (remote)")
        return model_shape_from_config(_read_s3_config(uri, endpoint_url), f"{uri.rstrip('/')}/config.json")
    if "://" in uri and not uri.startswith("file://"):
        raise PlanError(f"{uri}/config.json: the plan reads a local folder, file:// or s3://; pass --model FOLDER")
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


def _read_s3_config(uri: str, endpoint_url: str | None) -> dict:
    """config.json under an s3:// prefix, with the credentials the job's pods get from its Secret
    (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY in this environment)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    parsed = urlparse(uri)
    key = f"{parsed.path.strip('/')}/config.json".lstrip("/")
    source = f"s3://{parsed.netloc}/{key}"
    try:
        body = boto3.client("s3", endpoint_url=endpoint_url).get_object(Bucket=parsed.netloc, Key=key)["Body"].read()
    except (BotoCoreError, ClientError) as err:
        raise PlanError(
            f"{source}: cannot read it ({err}); export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the keys of "
            f"spec.checkpoint.credentialsSecret), or pass --model FOLDER"
        ) from None
    try:
        config = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PlanError(f"{source}: not JSON ({err})") from None
    if not isinstance(config, dict):
        raise PlanError(f"{source}: expected a JSON object")
    return config


def quantity_bytes(quantity: int | str) -> float:
    """A Kubernetes quantity (64Gi, 500M, 1e9, 3) as a number."""
    try:
        return quantity_value(quantity)
    except ValueError as err:
        raise PlanError(str(err)) from None


def _gpus(resources: ResourceRequirements) -> int:
    value = resources.limits.get(GPU_RESOURCE, resources.requests.get(GPU_RESOURCE, 0))
    return int(quantity_bytes(value))


def pod_memory(resources: ResourceRequirements) -> int | None:
    """A pod's memory limit, else its request, in bytes; None when it has neither."""
    value = resources.limits.get("memory", resources.requests.get("memory"))
    return None if value is None else int(quantity_bytes(value))


@dataclass(frozen=True)
class LearnerPlan:
    """Bytes on one learner device at the peak of a step (and what sits in host memory)."""

    device: str
    world_size: int
    mini_batch_rows: int
    """Rows of one mini-batch on one rank."""
    longest_trajectory: int
    token_budget: int
    """learner.microBatchTokens, or the default derived from the model and the device."""
    budget_is_default: bool
    micro_batch_tokens: int
    """Padded tokens of the largest micro-batch: min(max(budget, longest), mini-batch rows x longest)."""
    chunk_tokens: int
    """Tokens whose logits exist at once (a log-prob chunk)."""
    activation_checkpointing: bool
    weights: int
    gradients: int
    optimizer: int
    gathered: int
    """Parameters and gradients FSDP gathers whole for the units being computed (world size > 1)."""
    reference: int
    activations: int
    """Saved activations of the micro-batch with the job's activationCheckpointing setting."""
    activations_without_checkpointing: int
    activations_with_checkpointing: int
    logits: int
    """One chunk's logits, log-softmax and gradient copies at their peak."""
    gradient_free_pass: int
    """A micro-batch's forward without gradient (old log-probs, reference, values): hidden states, one block's
    temporaries and one chunk's logits; 0 when the job runs none."""
    peak: int
    host: int
    """States offloaded to host memory (fsdp.cpuOffload on GPU)."""
    budget: int | None
    """The device's memory (GPU memory, or the pod's memory on CPU); None when the spec does not say."""
    trainable_parameters: int = 0
    """Parameters with gradients and optimizer state: all, or with spec.model.lora the adapters'."""

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
                f"learner needs {gib(self.learner.peak)} per {self.learner.device} with micro-batches of "
                f"{self.learner.micro_batch_tokens} tokens, has {gib(self.learner.budget)}"
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


def activation_bytes(shape: ModelShape, tokens: int, element_bytes: int, checkpointing: bool) -> int:
    """Saved activations of one forward over `tokens` (rows x padded width; see the module docstring)."""
    block = shape.block_activation_elements()
    # with checkpointing: every block's input, and one block recomputed at a time in the backward
    per_token = shape.layers * shape.hidden_size + block if checkpointing else shape.layers * block
    return tokens * (per_token + 2 * shape.hidden_size) * element_bytes


def logits_bytes(shape: ModelShape, tokens: int, gpu_mixed: bool, entropy_grad: bool) -> int:
    """The logits of `tokens` positions, their log-softmax and the entropy's and backward's copies at their peak."""
    # float32 log-softmax, and two more float32 copies (the entropy's exp and product; in the backward the
    # gather's and the log-softmax's gradients); the float32 logits are freed once the log-softmax exists,
    # bfloat16 logits' gradient (2) remain with mixed precision
    per_element = 14 if gpu_mixed else 12
    if entropy_grad:
        per_element += 4
    return tokens * shape.vocab_size * per_element


def logits_chunk_tokens(vocab_size: int) -> int:
    """Tokens (rows x positions) of one log-prob chunk: one float32 copy of its logits in LOGITS_CHUNK_BYTES."""
    return max(1, LOGITS_CHUNK_BYTES // (4 * vocab_size))


def longest_trajectory(spec: RLJobSpec) -> int:
    return min(spec.environment.max_tokens_per_trajectory, spec.model.max_context_tokens)


def _chunk(shape: ModelShape, micro_tokens: int, longest: int) -> int:
    """Tokens of one chunk for a micro-batch of `micro_tokens` in rows of `longest` (`token_scores`)."""
    rows = max(1, micro_tokens // longest)
    return min(micro_tokens, rows * max(1, logits_chunk_tokens(shape.vocab_size) // rows))


@dataclass(frozen=True)
class _Costs:
    """The step's bytes as resident states plus what a micro-batch of a given size adds."""

    spec: RLJobSpec
    shape: ModelShape
    gpu: bool

    @property
    def gpu_mixed(self) -> bool:
        return self.gpu and self.spec.learner.fsdp.mixed_precision

    @property
    def compute_bytes(self) -> int:
        return 2 if self.gpu_mixed else 4

    def states(self) -> tuple[int, int, int, int, int]:
        """weights, gradients, optimizer, reference (sharded) and FSDP's gathered units (world size > 1)."""
        world, params, trained = self.spec.learner.replicas, self.shape.parameters, self.trainable_parameters
        lora = self.spec.model.lora is not None
        weights = math.ceil((params + (trained if lora else 0)) * 4 / world)
        gradients, optimizer = (math.ceil(trained * b / world) for b in (4, 8))
        # with LoRA the reference is the frozen base itself (adapters disabled): no copy
        reference = math.ceil(params * 4 / world) if self.spec.algorithm.kl_coef > 0 and not lora else 0
        gathered = 0
        if world > 1:
            # the root unit and two blocks (one computing, one prefetched), their gradients until reduced
            root, block = self.shape.root_parameters, self.shape.block_parameters
            gathered = (2 * root + 3 * block) * self.compute_bytes
            if lora:  # frozen units have no gradients: only the adapters' (a block's share of them)
                gathered = (root + 2 * block + 3 * trained // self.shape.layers) * self.compute_bytes
        return weights, gradients, optimizer, reference, gathered

    @property
    def trainable_parameters(self) -> int:
        """Parameters with gradients and optimizer state: all of them, or with LoRA the adapters'."""
        lora = self.spec.model.lora
        return self.shape.parameters if lora is None else lora_parameters(self.shape, lora)

    def resident(self) -> int:
        weights, gradients, optimizer, reference, gathered = self.states()
        offloaded = self.gpu and self.spec.learner.fsdp.cpu_offload
        return gathered + (0 if offloaded else weights + gradients + optimizer + reference)

    def training(self, tokens: int, chunk: int) -> int:
        """A micro-batch's forward and backward: saved activations, then the larger of the chunk and the block
        recomputed in the backward (they do not overlap)."""
        checkpointing, cb = self.spec.learner.fsdp.activation_checkpointing, self.compute_bytes
        saved = activation_bytes(self.shape, tokens, cb, checkpointing)
        logits = logits_bytes(self.shape, chunk, self.gpu_mixed, self.spec.algorithm.entropy_coef > 0)
        if not checkpointing:
            return saved + logits
        recomputed = tokens * self.shape.block_activation_elements() * cb
        return saved - recomputed + max(recomputed, logits)

    def gradient_free(self, tokens: int, chunk: int) -> int:
        spec = self.spec
        if not (spec.training.mini_batches > 1 or spec.algorithm.kl_coef > 0 or _mis(spec) or _ppo(spec)):
            return 0
        block = self.shape.block_activation_elements() + 2 * self.shape.hidden_size
        return tokens * block * self.compute_bytes + logits_bytes(self.shape, chunk, self.gpu_mixed, False)

    def step(self, tokens: int, chunk: int) -> int:
        return self.resident() + max(self.training(tokens, chunk), self.gradient_free(tokens, chunk))


def _mis(spec: RLJobSpec) -> bool:
    return spec.algorithm.off_policy_correction.mode == "mis"


def _ppo(spec: RLJobSpec) -> bool:
    return spec.algorithm.name == "ppo"


def resolve_micro_batch_tokens(spec: RLJobSpec, shape: ModelShape, gpu: bool, memory: int | None) -> int:
    """learner.microBatchTokens, else the largest budget (a multiple of 256) whose step fills at most
    MICRO_BATCH_MEMORY_FRACTION of `memory` (one learner device), never less than the longest trajectory;
    the longest trajectory when `memory` is unknown."""
    if spec.learner.micro_batch_tokens is not None:
        return spec.learner.micro_batch_tokens
    longest = longest_trajectory(spec)
    if memory is None:
        return longest
    costs = _Costs(spec, shape, gpu)
    room = MICRO_BATCH_MEMORY_FRACTION * memory
    # the step's peak grows with the micro-batch's tokens: the largest multiple of 256 within the room
    low, high = 0, MAX_MICRO_BATCH_TOKENS // 256
    while low < high:
        middle = (low + high + 1) // 2
        tokens = middle * 256
        if costs.step(tokens, _chunk(shape, tokens, longest)) <= room:
            low = middle
        else:
            high = middle - 1
    return max(longest, low * 256)


def plan_learner(spec: RLJobSpec, shape: ModelShape, gpu_memory: int = DEFAULT_GPU_MEMORY) -> LearnerPlan:
    learner, fsdp = spec.learner, spec.learner.fsdp
    world = learner.replicas
    gpu = _gpus(learner.resources) > 0
    budget = gpu_memory if gpu else pod_memory(learner.resources)
    costs = _Costs(spec, shape, gpu)
    cb = costs.compute_bytes
    longest = longest_trajectory(spec)
    mini_rows = math.ceil(math.ceil(spec.training.trajectories_per_step / world) / spec.training.mini_batches)
    token_budget = resolve_micro_batch_tokens(spec, shape, gpu, budget)
    tokens = min(max(token_budget, longest), mini_rows * longest)
    chunk = _chunk(shape, tokens, longest)
    weights, gradients, optimizer, reference, gathered = costs.states()
    without = activation_bytes(shape, tokens, cb, checkpointing=False)
    with_ = activation_bytes(shape, tokens, cb, checkpointing=True)
    offloaded = gpu and fsdp.cpu_offload
    return LearnerPlan(
        device="gpu" if gpu else "cpu",
        world_size=world,
        mini_batch_rows=mini_rows,
        longest_trajectory=longest,
        token_budget=token_budget,
        budget_is_default=learner.micro_batch_tokens is None,
        micro_batch_tokens=tokens,
        chunk_tokens=chunk,
        activation_checkpointing=fsdp.activation_checkpointing,
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        gathered=gathered,
        reference=reference,
        activations=with_ if fsdp.activation_checkpointing else without,
        activations_without_checkpointing=without,
        activations_with_checkpointing=with_,
        logits=logits_bytes(shape, chunk, costs.gpu_mixed, spec.algorithm.entropy_coef > 0),
        gradient_free_pass=costs.gradient_free(tokens, chunk),
        peak=costs.step(tokens, chunk),
        host=weights + gradients + optimizer + reference if offloaded else 0,
        budget=budget,
        trainable_parameters=costs.trainable_parameters,
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
        budget = pod_memory(rollout.resources)
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


def advice(spec: RLJobSpec, shape: ModelShape, gpu_memory: int = DEFAULT_GPU_MEMORY) -> list[str]:
    """What to change so a tier that does not fit does: one line per remedy that works on its own."""
    plan = plan_memory(spec, shape, gpu_memory)
    out: list[str] = []
    if plan.learner.fits is False:
        out += _learner_advice(spec, shape, gpu_memory, plan.learner)
    if plan.rollout.fits is False:
        out += _rollout_advice(spec, shape, gpu_memory, plan.rollout)
    return out


def _with(spec: RLJobSpec, section: str, **values) -> RLJobSpec:
    return spec.model_copy(update={section: getattr(spec, section).model_copy(update=values)})


def _learner_advice(spec: RLJobSpec, shape: ModelShape, gpu_memory: int, learner: LearnerPlan) -> list[str]:
    out = []
    longest = learner.longest_trajectory
    smallest = plan_learner(_with(spec, "learner", micro_batch_tokens=max(256, longest)), shape, gpu_memory)
    if learner.micro_batch_tokens > longest and smallest.fits:
        best = resolve_micro_batch_tokens(
            _with(spec, "learner", micro_batch_tokens=None), shape, learner.device == "gpu", learner.budget
        )
        out.append(f"set spec.learner.microBatchTokens to {best} or fewer (the longest trajectory, {longest}, fits)")
    for replicas in (2**k for k in range(1, 13)):
        if replicas > spec.learner.replicas:
            wider = _with(spec, "learner", replicas=replicas)
            if plan_learner(wider, shape, gpu_memory).fits:
                out.append(f"run more learner replicas (GPUs): {replicas} shard the states enough")
                break
    if not spec.learner.fsdp.activation_checkpointing:
        fsdp = spec.learner.fsdp.model_copy(update={"activation_checkpointing": True})
        if plan_learner(_with(spec, "learner", fsdp=fsdp), shape, gpu_memory).fits:
            out.append("set spec.learner.fsdp.activationCheckpointing: true")
    if learner.device == "gpu" and not spec.learner.fsdp.cpu_offload:
        fsdp = spec.learner.fsdp.model_copy(update={"cpu_offload": True})
        if plan_learner(_with(spec, "learner", fsdp=fsdp), shape, gpu_memory).fits:
            out.append("set spec.learner.fsdp.cpuOffload: true (states in host memory, slower steps)")
    for tokens in (longest // 2**k for k in range(1, 8)):
        if tokens >= 256:
            shorter = _with(spec, "environment", max_tokens_per_trajectory=tokens)
            if plan_learner(_with(shorter, "learner", micro_batch_tokens=None), shape, gpu_memory).fits:
                out.append(f"shorten trajectories: environment.maxTokensPerTrajectory {tokens} fits")
                break
    if not out:
        out.append("no single change fits: a larger device, more replicas with checkpointing and offload together")
    return out


def _rollout_advice(spec: RLJobSpec, shape: ModelShape, gpu_memory: int, rollout: RolloutPlan) -> list[str]:
    room = (rollout.budget or 0) - rollout.weights
    per_sequence = rollout.kv_bytes_per_token * rollout.tokens_per_sequence
    sequences = int(room // per_sequence) if per_sequence else 0
    if sequences >= 1:
        return [f"lower spec.rollout.engine.maxNumSeqs (or concurrentSessions) to {sequences}"]
    return ["the rollout engine's weights or one sequence do not fit: raise engine.tensorParallelSize"]


def fit_warnings(spec: RLJobSpec, gpu_memory: int = DEFAULT_GPU_MEMORY) -> list[str]:
    """What does not fit, when the model's config.json can be read locally; nothing when it cannot (the
    plan, not validation, reads remote models)."""
    try:
        return plan_memory(spec, read_model_shape(spec.model.uri, remote=False), gpu_memory).problems()
    except PlanError:
        return []
