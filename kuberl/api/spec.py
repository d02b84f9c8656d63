"""The RLJob spec (`kuberl.io/v1alpha1`): what an RL engineer writes. One model per section.

Every field has a description (its docstring) and, where one makes sense, a default that works.
Field names are snake_case here and camelCase in manifests.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import Field, model_validator

from kuberl.api.base import ApiModel, CrossFieldRule
from kuberl.api.types import DnsLabel, DnsSubdomain, Duration, Image, Quantity, StorageUri, parse_duration

API_VERSION: Final = "kuberl.io/v1alpha1"
KIND: Final = "RLJob"
GPU_RESOURCE: Final = "nvidia.com/gpu"
"""The extended resource a pod asks GPUs by (the NVIDIA device plugin's)."""
DEFAULT_IMAGE_REGISTRY = "ghcr.io/kuberl"
"""Where KubeRL's images are published; the operator's default prefix for the images a job does not name."""


# ----------------------------------------------------------------------------------------- model
class DType(StrEnum):
    AUTO = "auto"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class ModelSpec(ApiModel):
    """The policy to train."""

    uri: StorageUri = "runs/models/tiny-llama"
    """Hugging Face model folder (safetensors + tokenizer): s3://bucket/prefix, file:///path or a local path."""
    dtype: DType = DType.AUTO
    """Weights dtype: auto (bfloat16 on GPU, float32 on CPU), float32, bfloat16 or float16."""
    max_context_tokens: int = Field(32768, ge=256, le=1_048_576)
    """Longest context (prompt + all turns) the job may build, in tokens."""
    lora: LoraSpec | None = None
    """Train low-rank adapters (LoRA) instead of every weight; unset: full fine-tuning."""


LORA_TARGET_PATTERN = r"^(all-linear|[A-Za-z_][A-Za-z0-9_.]*)$"


class LoraSpec(ApiModel):
    """Low-rank adapters (LoRA, through PEFT) on a frozen base model: the learner trains and sends only them, the
    rollout tier serves each policy version as a new adapter on the same base weights. Policy-gradient RL
    with LoRA wants a learning rate about 10x that of full fine-tuning."""

    rank: int = Field(16, ge=1, le=1024)
    """The adapters' rank r."""
    alpha: float = Field(32.0, gt=0.0, le=100_000.0)
    """Scaling: the update is alpha / rank times the adapters' product."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapters' input while training (0: the learner's log-probs match the rollout's)."""
    target_modules: list[Annotated[str, Field(max_length=128, pattern=LORA_TARGET_PATTERN)]] = Field(
        default_factory=lambda: ["all-linear"], min_length=1, max_length=64
    )
    """Module names to adapt (e.g. q_proj, v_proj), or all-linear: every linear layer but the output head."""


# ------------------------------------------------------------------------------------- algorithm
class AlgorithmName(StrEnum):
    GRPO = "grpo"
    RLOO = "rloo"
    PPO = "ppo"


class CreditAssignmentMode(StrEnum):
    OUTCOME = "outcome"
    TURN = "turn"
    PRM = "prm"
    GAE = "gae"


class GaeLevel(StrEnum):
    TOKEN = "token"
    TURN = "turn"


class CreditAssignment(ApiModel):
    """How a trajectory's rewards become per-token advantages."""

    mode: CreditAssignmentMode = CreditAssignmentMode.OUTCOME
    """outcome: every generated token gets the trajectory's advantage; turn: discounted per-turn returns
    from intermediate rewards with a per-turn group baseline; prm: a process reward scores each turn;
    gae: generalised advantage estimation with the value head (algorithm ppo)."""
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    """Discount across turns (turn, prm) or tokens (gae)."""
    lam: float = Field(0.95, ge=0.0, le=1.0, alias="lambda")
    """GAE lambda."""
    gae_level: GaeLevel = GaeLevel.TURN
    """For gae: estimate at token level or at turn level (one value per turn boundary)."""


class OffPolicyMode(StrEnum):
    NONE = "none"
    TIS = "tis"
    MIS = "mis"


class OffPolicyCorrection(ApiModel):
    """Correction for the gap between the rollout engine's sampling log-probs and the learner's."""

    mode: OffPolicyMode = OffPolicyMode.TIS
    """none; tis: truncated importance sampling (weights capped at `cap`); mis: masked importance
    sampling (tokens whose ratio exceeds `cap` are dropped from the loss)."""
    cap: float = Field(2.0, ge=1.0, le=100.0)
    """Upper bound on the learner/rollout probability ratio."""


class LossAggregation(StrEnum):
    TOKEN_MEAN = "token-mean"
    SEQ_MEAN = "seq-mean"


class AlgorithmSpec(ApiModel):
    """The RL algorithm and its loss."""

    name: AlgorithmName = AlgorithmName.GRPO
    """grpo (group-normalised outcome advantages), rloo (leave-one-out baseline) or ppo (value head)."""
    group_size: int = Field(8, ge=1, le=1024)
    """Trajectories sampled per task; advantages are baselined within a group."""
    credit_assignment: CreditAssignment = Field(default_factory=CreditAssignment)
    """How rewards are assigned to actions over many turns."""
    kl_coef: float = Field(0.0, ge=0.0, le=10.0)
    """Weight of the KL penalty to the reference (initial) policy; 0 disables the reference model."""
    clip_ratio_low: float = Field(0.2, ge=0.0, le=1.0)
    """Lower clip of the surrogate ratio: 1 - clipRatioLow."""
    clip_ratio_high: float = Field(0.28, ge=0.0, le=10.0)
    """Upper clip of the surrogate ratio: 1 + clipRatioHigh (clip-higher keeps exploration alive)."""
    entropy_coef: float = Field(0.0, ge=0.0, le=1.0)
    """Weight of the entropy bonus."""
    value_coef: float = Field(0.5, ge=0.0, le=10.0)
    """Weight of the value loss (ppo and gae only)."""
    off_policy_correction: OffPolicyCorrection = Field(default_factory=OffPolicyCorrection)
    """Importance-sampling correction from the rollout log-probs."""
    loss_aggregation: LossAggregation = LossAggregation.TOKEN_MEAN
    """token-mean: average over all generated tokens of the batch; seq-mean: average per trajectory first."""
    dynamic_sampling: bool = True
    """grpo and rloo: leave out groups whose trajectories all got the same reward (within 1e-6; with turn or
    prm credit, the same per-turn returns): their group-relative advantages are zero, so they would cost a
    step's compute and teach nothing. More groups are drawn until the batch holds trajectoriesPerStep
    trajectories of groups that disagree (DAPO's dynamic sampling); limits.maxBatchesWithoutSignal stops
    a job that finds none. ppo baselines with its value head, not the group: nothing is left out."""


# -------------------------------------------------------------------------------------- training
class TrainingMode(StrEnum):
    SYNC = "sync"
    ASYNC = "async"


class LandingMetric(StrEnum):
    DEMONSTRATION_PROBABILITY = "demonstrationProbability"
    """The mean probability, by teacher forcing, that the policy takes every trained call of a successful
    demonstration (reward above 0) from the dataset: how often a policy sampling at temperature 1 would
    reproduce it. Near 0, RL's groups all fail; near 1, they all succeed; either way they carry no signal."""


class WarmupLandingSpec(ApiModel):
    """Where the warm-up must leave the policy before RL starts: a metric on training tasks inside a range.

    After `steps`, the warm-up scores `metric` on the first `probeDemonstrations` successful demonstrations of
    the dataset. Below `min` it fine-tunes `extraSteps` more on the same demonstrations and scores again, at
    most `maxRounds` times; the warm-up then ends wherever it landed and says so (warmup.json records it).
    Above `max` more training cannot help: it says so, and RL starts."""

    metric: LandingMetric = LandingMetric.DEMONSTRATION_PROBABILITY
    """What is measured."""
    min: float = Field(0.0, ge=0.0, le=1.0)
    """The lowest value that ends the warm-up; 0 turns the check off."""
    max: float = Field(1.0, ge=0.0, le=1.0)
    """The highest value at which RL is expected to find groups that disagree (a warning above it)."""
    probe_demonstrations: int = Field(64, ge=1, le=100_000)
    """Successful demonstrations scored (the first of the dataset)."""
    extra_steps: int = Field(250, ge=1, le=1_000_000)
    """Supervised steps of each further round."""
    learning_rate: float = Field(5e-4, gt=0.0, le=1.0)
    """Peak learning rate of each further round (its own short warm-up, then cosine decay)."""
    max_rounds: int = Field(3, ge=0, le=100)
    """Further rounds at most."""

    cross_field_rules = (
        CrossFieldRule(
            field="max",
            cel="self.min <= self.max",
            message="landing.min must not exceed landing.max",
            holds=lambda t: t.min <= t.max,
            explain=lambda t: f"must be at least min ({t.min:g}), got {t.max:g}",
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _refuse_old_names(cls, data: Any) -> Any:
        return refuse_replaced_fields(data, "spec.training.warmup.landing", _REPLACED_LANDING_FIELDS)


class WarmupSpec(ApiModel):
    """Optional first stage: supervised fine-tuning on a dataset of demonstrations before RL.

    The dataset is a JSONL file of episodes as chat messages (kuberl.api.demonstrations; docs/warmup.md), made
    by any means: a recipe's scripted episodes, a stronger model's successful trajectories, people. Fine-tuned
    on a mix of episodes that solve their task and episodes that do not, the policy starts RL where sampled
    groups disagree, and RL learns which of the behaviours it has seen the reward prefers. The warm-up's time
    counts against limits.maxWallClock. With spec.model.lora it trains adapters of the same shape and merges
    them into the model (float32) that RL then adapts afresh."""

    demonstrations: StorageUri | None = None
    """The demonstrations file (JSONL; a local path, file:// or s3://); unset: no warm-up."""
    steps: int = Field(200, ge=1, le=1_000_000)
    """Supervised optimizer steps."""
    learning_rate: float = Field(3e-3, gt=0.0, le=1.0)
    """AdamW peak learning rate of the warm-up (a short linear warm-up, then cosine decay)."""
    batch_size: int = Field(8, ge=1, le=4096)
    """Demonstrations per supervised step."""
    landing: WarmupLandingSpec = Field(default_factory=WarmupLandingSpec)
    """The check that RL starts inside the learnable zone, and what the warm-up does when it does not."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_old_names(cls, data: Any) -> Any:
        count = data.get("demonstrations") if isinstance(data, dict) else None
        if isinstance(count, int) and not isinstance(count, bool):
            raise ValueError(
                "spec.training.warmup.demonstrations: now the demonstrations file (a JSONL path or s3:// URI), "
                f"not a count; {_RECIPE}"
            )
        return refuse_replaced_fields(data, "spec.training.warmup", _REPLACED_WARMUP_FIELDS)


_RECIPE = "`python -m recipes.swe_toy demonstrations` writes such a file for swe-toy (docs/warmup.md)"
_REPLACED_WARMUP_FIELDS = {
    "expertFraction": f"demonstrations are a dataset now: {_RECIPE}, with --expert-fraction",
    "wrongEdit": f"demonstrations are a dataset now: {_RECIPE}, with --wrong-edit",
    "recoveryFraction": f"demonstrations are a dataset now: {_RECIPE}, with --recovery-fraction",
}
_REPLACED_LANDING_FIELDS = {
    "minCorrectEdit": "replaced by landing.min (metric demonstrationProbability: the successful demonstrations' "
    "calls, the correct edit among them)",
    "probeTasks": "replaced by landing.probeDemonstrations (the first successful demonstrations of the dataset)",
}


def refuse_replaced_fields(data: Any, path: str, replaced: dict[str, str]) -> Any:
    """Refuse a manifest that still uses a field the API replaced, with what replaced it (the generic error
    would only say `extra inputs are not permitted`)."""
    if not isinstance(data, dict):
        return data
    found = [f"{path}.{name}: {why}" for name, why in replaced.items() if name in data]
    if found:
        raise ValueError("; ".join(found))
    return data


class TrainingSpec(ApiModel):
    """The optimisation loop."""

    total_steps: int = Field(100, ge=1, le=10_000_000)
    """Optimizer steps to run; reaching it completes the job."""
    trajectories_per_step: int = Field(64, ge=1, le=1_000_000)
    """Trajectories in one training batch; a multiple of algorithm.groupSize."""
    oversampling: float = Field(1.0, ge=1.0, le=8.0)
    """The most groups generated at once for a batch, as a multiple of trajectoriesPerStep / groupSize (DAPO's
    generation batch). With algorithm.dynamicSampling the groups without signal are then replaced from the same
    wave instead of a second one, which costs a whole episode's latency. sync: each wave is sized from the share
    of groups without signal so far (a quarter more than it predicts, at most this multiple); the batch is the
    first groups with signal in submission order, the rest are left out (groups_surplus in metrics.jsonl).
    async: this multiple of the batches is kept in flight. 1 generates exactly a batch."""
    mini_batches: int = Field(1, ge=1, le=1024)
    """Optimizer updates per batch (the batch is split into this many parts)."""
    learning_rate: float = Field(1e-6, gt=0.0, le=1.0)
    """AdamW learning rate."""
    lr_warmup_steps: int = Field(0, ge=0, le=1_000_000)
    """Steps over which the learning rate rises linearly to learningRate (step n of N trains at n/N of it).
    A fresh AdamW's first updates move every weight by about the learning rate whatever its gradient; on a
    small policy one such step at the full rate undid the warm-up (the solve rate fell 0.26 -> 0.02)."""
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    """AdamW weight decay."""
    max_grad_norm: float = Field(1.0, gt=0.0, le=1e6)
    """Gradient clipping norm."""
    mode: TrainingMode = TrainingMode.SYNC
    """sync: every batch comes from the current policy; async: generation keeps running during training."""
    max_staleness: int = Field(1, ge=0, le=64)
    """async only: the oldest policy version a trajectory may come from, in versions behind the learner."""
    seed: int = Field(0, ge=0, le=2**31 - 1)
    """Seed for sampling tasks, the learner and the rollout engines."""
    warmup: WarmupSpec = Field(default_factory=WarmupSpec)
    """Supervised warm-up on a demonstrations dataset before RL (off unless demonstrations is set)."""

    cross_field_rules = (
        CrossFieldRule(
            field="trajectoriesPerStep",
            cel="self.trajectoriesPerStep % self.miniBatches == 0",
            message="trajectoriesPerStep must be a multiple of miniBatches",
            holds=lambda t: t.trajectories_per_step % t.mini_batches == 0,
            explain=lambda t: f"must be a multiple of miniBatches ({t.mini_batches}), got {t.trajectories_per_step}",
        ),
        CrossFieldRule(
            field="maxStaleness",
            cel="self.mode != 'async' || self.maxStaleness >= 1",
            message="async mode needs maxStaleness >= 1 (0 means sync; use mode: sync)",
            holds=lambda t: t.mode != TrainingMode.ASYNC or t.max_staleness >= 1,
            explain=lambda t: "async mode needs maxStaleness >= 1; with 0 use mode: sync",
        ),
    )


# ----------------------------------------------------------------------------------- environment
class TaskSplit(StrEnum):
    TRAIN = "train"
    TEST = "test"


class TaskSource(ApiModel):
    """Where the tasks come from."""

    uri: StorageUri | None = None
    """A JSONL task file (s3://, file:// or a local path); unset: the environment's built-in suite."""
    split: TaskSplit = TaskSplit.TRAIN
    """Split trained on."""
    eval_split: TaskSplit = TaskSplit.TEST
    """Held-out split used for evaluation."""
    count: int | None = Field(None, ge=1, le=100_000)
    """Built-in suites only (tasks.uri unset): how many tasks to generate; unset: the suite's default (swe-toy:
    400, about a quarter held out). Task i is the same whatever the count, so a larger suite adds tasks to
    both splits. A policy trained for several passes over a few hundred tasks learns them by heart (its
    training tasks solved far more often than held-out ones): give it enough tasks to see each about once."""
    repos: StorageUri | None = None
    """Environment `swe-bench`: the mirror of git repositories the instances name, a folder (or `s3://` prefix)
    of `owner__name` repositories, bare or not. Episodes start from it and never reach the network. Not needed
    for instances that run in their own images (an `image` in the row, or sandbox.imageTemplate): the image
    holds the repository."""
    environments: str | None = None
    """Environment `swe-bench`: the folder of environments prepared by `kuberl tasks prepare`; unset:
    `runs/environments`."""

    cross_field_rules = (
        CrossFieldRule(
            field="count",
            cel="!has(self.count) || !has(self.uri)",
            message="tasks.count sizes a built-in suite; with tasks.uri set the file decides",
            holds=lambda t: t.count is None or t.uri is None,
            explain=lambda t: f"count ({t.count}) sizes a built-in suite; with uri set ({t.uri}) remove count",
        ),
    )


AGENT_REF_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$"
AgentRef = Annotated[str, Field(min_length=3, max_length=256, pattern=AGENT_REF_PATTERN)]


OPENENV_PREFIX = "openenv:"
SWE_BENCH = "swe-bench"
"""The environment of SWE-bench-format instances on real repositories (docs/tasks.md)."""
ENVIRONMENT_NAME_PATTERN = r"^([A-Za-z0-9][A-Za-z0-9_.\-]*|openenv:[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*)$"


def openenv_class(name: str) -> str | None:
    """The `module:Class` of an OpenEnv environment named `openenv:module:Class`, or None for a built-in name."""
    return name.removeprefix(OPENENV_PREFIX) if name.startswith(OPENENV_PREFIX) else None


class EnvironmentSpec(ApiModel):
    """The agent's world: which environment, which tasks, and how long an episode may run."""

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=ENVIRONMENT_NAME_PATTERN)] = "swe-toy"
    """A built-in environment (`swe-toy`: sandbox sessions on the swe-toy suite), or `openenv:module:Class`: an
    OpenEnv environment (a subclass of openenv's `Environment`), played in the rollout server's process, one
    instance per episode; its tasks are reset seeds (task `seed-i` resets with seed i; a task file's
    `metadata.seed` and `metadata.resetArgs` are the reset's arguments). Score it with reward `openenv-return`
    (the sum of the rewards it gave) or a function of yours."""
    tasks: TaskSource = Field(default_factory=TaskSource)
    """Task source and split."""
    max_turns: int = Field(16, ge=1, le=10_000)
    """Tool calls an episode may make before it is cut off."""
    max_tokens_per_trajectory: int = Field(8192, ge=16, le=1_048_576)
    """Prompt, generated and observation tokens of one trajectory; at most model.maxContextTokens."""
    turn_timeout: Duration = "60s"
    """Wall-clock limit of one environment step (one tool call)."""
    trajectory_timeout: Duration = "30m"
    """Wall-clock limit of one whole episode."""
    agent: AgentRef | None = None
    """An external agent, `module:function`: an async function (task, base_url, env) that plays one episode with
    any OpenAI client pointed at base_url (its calls are recorded token-in/token-out) and the sandbox through
    env (run, run_tests, submit). Unset: the built-in agent loop."""

    cross_field_rules = (
        CrossFieldRule(
            field="tasks",
            cel="self.name != 'swe-bench' || has(self.tasks.uri)",
            message="environment swe-bench needs tasks.uri (a SWE-bench-format JSONL file)",
            holds=lambda e: e.name != SWE_BENCH or e.tasks.uri is not None,
        ),
        CrossFieldRule(
            field="turnTimeout",
            cel=None,  # Kubernetes CEL's duration() does not parse days ("7d")
            message="turnTimeout must not exceed trajectoryTimeout",
            holds=lambda e: parse_duration(e.turn_timeout) <= parse_duration(e.trajectory_timeout),
            explain=lambda e: (
                f"turnTimeout ({e.turn_timeout}) must not exceed trajectoryTimeout ({e.trajectory_timeout})"
            ),
        ),
    )


# ---------------------------------------------------------------------------------------- reward
REWARD_REF_PATTERN = r"^([A-Za-z0-9_.\-]+|[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*)$"
RewardRef = Annotated[str, Field(min_length=1, max_length=256, pattern=REWARD_REF_PATTERN)]


class ProcessRewardSpec(ApiModel):
    """A process reward that scores every turn (credit assignment `prm`)."""

    enabled: bool = False
    """Score every turn with the process reward and add it as an intermediate reward."""
    function: RewardRef | None = None
    """Registered name or module:function of a process reward function."""
    model_uri: StorageUri | None = None
    """A process reward model (Hugging Face folder) instead of a function."""
    weight: float = Field(0.1, ge=0.0, le=100.0)
    """Weight of a process reward relative to the outcome reward."""

    cross_field_rules = (
        CrossFieldRule(
            field="function",
            cel="!self.enabled || (has(self.function) != has(self.modelUri))",
            message="an enabled process reward needs exactly one of function or modelUri",
            holds=lambda p: not p.enabled or ((p.function is None) != (p.model_uri is None)),
        ),
    )


class RewardSpec(ApiModel):
    """How an episode is scored: the only code most users write."""

    function: RewardRef = "swe-toy-tests"
    """Reward function: a registered name or `module:function`."""
    intermediate_rewards: bool = False
    """Let the reward function return rewards after any step, not only at the end."""
    process_reward: ProcessRewardSpec = Field(default_factory=ProcessRewardSpec)
    """Optional per-turn process reward."""


# -------------------------------------------------------------------------------- tiers, shared
class ResourceRequirements(ApiModel):
    """Kubernetes resource requests and limits of one pod of a tier (ignored by `kuberl run`)."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    """Minimum resources, e.g. {cpu: 8, memory: 64Gi}."""
    limits: dict[str, Quantity] = Field(default_factory=dict)
    """Maximum resources; GPUs go here, e.g. {nvidia.com/gpu: 1}."""


def _resources(requests: dict[str, int | str], limits: dict[str, int | str]) -> ResourceRequirements:
    return ResourceRequirements(requests=requests, limits=limits)


class ImagePullSecret(ApiModel):
    """A Secret of type kubernetes.io/dockerconfigjson in the job's namespace, as in a pod's imagePullSecrets."""

    name: DnsSubdomain
    """Name of the Secret, e.g. regcred (`kubectl create secret docker-registry regcred ...`)."""


# A tier's pull secrets; its pods get these, then the operator's defaults that are not among them.
ImagePullSecrets = Annotated[list[ImagePullSecret], Field(default_factory=list, max_length=32)]


class FsdpSpec(ApiModel):
    """FSDP2 options of the learner."""

    cpu_offload: bool = False
    """Keep parameters and optimizer state in CPU memory between uses."""
    activation_checkpointing: bool = True
    """Recompute activations in the backward pass; needed for long contexts."""
    mixed_precision: bool = True
    """bfloat16 compute with float32 master weights on GPU (ignored on CPU)."""


class LearnerSpec(ApiModel):
    """The learner tier: a StatefulSet of torchrun ranks training the policy with FSDP2."""

    replicas: int = Field(1, ge=1, le=4096)
    """Pods, one rank each: the data-parallel world size."""
    image: Image | None = None
    """Container image of the learner; unset: the operator's default when it first applies the job (kept while
    the job runs), `<prefix>/learner:<version>`: the chart's jobDefaults, ghcr.io/kuberl/learner:<KubeRL version>
    out of the box."""
    image_pull_secrets: ImagePullSecrets
    """Secrets for pulling the image from a private registry, e.g. [{name: regcred}]; merged with the operator's
    defaults (the chart's jobDefaults.imagePullSecrets)."""
    resources: ResourceRequirements = Field(
        default_factory=lambda: _resources({"cpu": 8, "memory": "64Gi"}, {GPU_RESOURCE: 1})
    )
    """Resources of one learner pod."""
    fsdp: FsdpSpec = Field(default_factory=FsdpSpec)
    """FSDP2 options."""
    micro_batch_tokens: int | None = Field(None, ge=256, le=16_777_216)
    """Token budget of one micro-batch (one forward and backward; gradients accumulate over a mini-batch's
    micro-batches): rows are packed longest first while rows x the longest row's tokens stays within it, and a
    trajectory longer than the budget gets a micro-batch of its own. Unset: the largest budget whose memory
    plan fills at most 90 % of a learner device's memory (a GPU's own memory; on CPU the pod's memory limit,
    else its request), never less than one trajectory of environment.maxTokensPerTrajectory (`kuberl plan`
    prints it)."""


class EngineSpec(ApiModel):
    """vLLM engine options of a rollout server."""

    tensor_parallel_size: int = Field(1, ge=1, le=64)
    """GPUs one engine spans."""
    gpu_memory_utilization: float = Field(0.9, gt=0.0, le=1.0)
    """Fraction of GPU memory vLLM may take (weights + KV cache)."""
    max_num_seqs: int = Field(256, ge=1, le=65536)
    """Sequences the engine batches at once."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of shared prefixes (keyed by policy version, never across versions)."""
    kv_offload: Quantity | None = None
    """CPU memory for KV-cache offload (e.g. 64Gi); unset disables offload."""
    max_model_len: int | None = Field(None, ge=256, le=1_048_576)
    """Longest sequence the engine accepts; unset: model.maxContextTokens."""


class WeightTransportKind(StrEnum):
    HTTP = "http"
    STORAGE = "storage"


class WeightSyncSpec(ApiModel):
    """How the learner hands each new policy version to the rollout servers."""

    transport: WeightTransportKind = WeightTransportKind.HTTP
    """http: every server receives the safetensors buckets over HTTP and stages them in shared memory.
    storage: the learner writes each version once under `uri` and every server loads it from there, so the
    bytes leave the learner once whatever the number of servers (large models, many servers)."""
    uri: str | None = Field(None, min_length=1)
    """storage only: s3://bucket/prefix, file:///path or a folder every server can read; unset:
    `<checkpoint.uri>/weights`. The latest two versions are kept."""

    cross_field_rules = (
        CrossFieldRule(
            field="uri",
            cel="self.transport == 'storage' || !has(self.uri)",
            message="weightSync.uri is read only with transport: storage",
            holds=lambda w: w.transport == WeightTransportKind.STORAGE or w.uri is None,
            explain=lambda w: f"weightSync.uri ({w.uri}) is read only with transport: storage; set it or drop uri",
        ),
    )


class RolloutSpec(ApiModel):
    """The rollout tier: a StatefulSet of rollout servers, each owning one vLLM engine."""

    replicas: int = Field(1, ge=1, le=4096)
    """Rollout servers."""
    image: Image | None = None
    """Container image of the rollout server; unset: the operator's default when it first applies the job,
    `<prefix>/rollout:<version>`."""
    image_pull_secrets: ImagePullSecrets
    """Secrets for pulling the image from a private registry, e.g. [{name: regcred}]; merged with the operator's
    defaults."""
    resources: ResourceRequirements = Field(
        default_factory=lambda: _resources({"cpu": 8, "memory": "64Gi"}, {GPU_RESOURCE: 1})
    )
    """Resources of one rollout pod."""
    engine: EngineSpec = Field(default_factory=EngineSpec)
    """vLLM engine options."""
    concurrent_sessions: int = Field(64, ge=1, le=100_000)
    """Agent episodes one rollout server runs at once."""
    partial_rollouts: bool = False
    """Let in-flight trajectories continue on new weights (each token keeps its policy version); async only."""
    update_drain_timeout: Duration | None = None
    """Without partial rollouts: how long a weight update waits for the episodes in flight to end on the old
    weights. Those still running then are stopped and played again from their first turn on the new weights, so
    no trajectory mixes versions and one long tool call (a minute-long test run) no longer holds every update.
    Their work so far is lost, and an episode is the likelier to be restarted the longer it runs. Unset: every
    update waits for all of them."""
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    """Sampling temperature of the agent (0 is greedy); log-probs are of this tempered distribution."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling threshold."""
    max_tokens_per_turn: int = Field(512, ge=1, le=65_536)
    """Tokens one generated turn may have."""
    weight_sync: WeightSyncSpec = Field(default_factory=WeightSyncSpec)
    """How new weights reach the servers."""

    cross_field_rules = (
        CrossFieldRule(
            field="updateDrainTimeout",
            cel="!self.partialRollouts || !has(self.updateDrainTimeout)",
            message="updateDrainTimeout is for updates that wait for the episodes in flight: not with partialRollouts",
            holds=lambda r: not r.partial_rollouts or r.update_drain_timeout is None,
            explain=lambda r: (
                f"updateDrainTimeout ({r.update_drain_timeout}) bounds the wait for episodes in flight; with "
                "partialRollouts nothing waits: drop one of them"
            ),
        ),
    )


class EgressPolicy(StrEnum):
    DENY = "deny"
    ALLOW = "allow"


class SandboxAutoscaler(StrEnum):
    OPERATOR = "operator"
    HPA = "hpa"


class SandboxPoolEngine(StrEnum):
    AUTO = "auto"
    KUBERL = "kuberl"
    AGENT_SANDBOX = "agent-sandbox"


class SandboxPoolsSpec(ApiModel):
    """Sandbox pools per environment image, for tasks that name their own image (docs/sandbox-pools.md)."""

    idle_timeout: Duration = "1m"
    """An image's pool with no running, queued or upcoming episode for this long scales to zero. Short, because
    the learner announces the images it draws next: an image it has not announced is rarely needed again soon
    (in a dataset of hundreds of images a task comes back an epoch later), so idle pods mostly wait for nothing
    (benchmarks/measured/sandbox_pools.json)."""
    warm_replicas: int = Field(1, ge=0, le=100)
    """Pods kept ready for an image whose episodes the learner will start next, or used within idleTimeout."""
    max_warm_images: int = Field(64, ge=1, le=10_000)
    """Most distinct images with pods at once (each pool's pods count against maxReplicas too)."""
    claim_timeout: Duration = "10m"
    """How long an episode waits for a session of its image before it ends as failed (masked, not scored 0)."""
    image_path: Annotated[str, Field(min_length=1, max_length=4096, pattern=r"^/[^\s]*$")] | None = None
    """The PATH of agent commands and test runs in task images; unset: the image's own. SWE-bench's images
    activate their conda environment in a shell profile rather than in PATH: give
    `/opt/miniconda3/envs/testbed/bin:/opt/miniconda3/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin`."""
    engine: SandboxPoolEngine = SandboxPoolEngine.AUTO
    """Who runs the pools: kuberl (a Deployment per image), agent-sandbox (a SandboxTemplate and SandboxWarmPool
    per image, kubernetes-sigs/agent-sandbox), or auto (agent-sandbox when its CRDs are installed)."""


class SandboxSessionSpec(ApiModel):
    """Limits of one sandbox session (one agent episode's workspace)."""

    cpu: Quantity = 1
    """CPU one session's commands may use."""
    memory: Quantity = "1Gi"
    """Memory one session's commands may use."""
    timeout: Duration = "30m"
    """Idle or total lifetime of a session before the sandbox closes it."""


class SandboxSpec(ApiModel):
    """The sandbox tier: autoscaled pods serving isolated code-execution sessions."""

    image: Image | None = None
    """Container image of the sandbox server (from env-images/); unset: the operator's default when it first
    applies the job, `<prefix>/sandbox:<version>`, the base server. Tasks on Python repositories want
    `<prefix>/sandbox-swe` (git, ripgrep, pytest)."""
    image_pull_secrets: ImagePullSecrets
    """Secrets for pulling the image from a private registry, e.g. [{name: regcred}]; merged with the operator's
    defaults."""
    min_replicas: int = Field(1, ge=0, le=10_000)
    """Fewest sandbox pods."""
    max_replicas: int = Field(8, ge=1, le=10_000)
    """Most sandbox pods."""
    sessions_per_pod: int = Field(32, ge=1, le=10_000)
    """Concurrent sessions one pod serves."""
    session: SandboxSessionSpec = Field(default_factory=SandboxSessionSpec)
    """Per-session limits."""
    resources: ResourceRequirements = Field(default_factory=lambda: _resources({"cpu": 4, "memory": "8Gi"}, {}))
    """Resources of one sandbox pod."""
    runtime_class_name: DnsLabel | None = None
    """RuntimeClass for stronger isolation, e.g. gvisor or kata."""
    egress: EgressPolicy = EgressPolicy.DENY
    """Network egress of sandbox pods: deny (default) or allow."""
    autoscaler: SandboxAutoscaler = SandboxAutoscaler.OPERATOR
    """Who scales the sandbox Deployment: the operator, or an HPA on the same metric."""
    image_template: Annotated[str, Field(min_length=1, max_length=512)] | None = None
    """The environment image of a task that names none, from its instance's fields, e.g.
    `docker.io/swebench/sweb.eval.x86_64.{swebench_id}:latest` ({swebench_id}: the instance id with `__` as
    `_1776_`, lower case); unset: such tasks run on `image`. Each image gets a pool of its own (`pools`)."""
    pools: SandboxPoolsSpec = Field(default_factory=SandboxPoolsSpec)
    """How the per-image pools are kept warm and scaled to zero."""

    cross_field_rules = (
        CrossFieldRule(
            field="maxReplicas",
            cel="self.minReplicas <= self.maxReplicas",
            message="maxReplicas must be >= minReplicas",
            holds=lambda s: s.min_replicas <= s.max_replicas,
            explain=lambda s: f"must be >= minReplicas ({s.min_replicas}), got {s.max_replicas}",
        ),
    )


# ------------------------------------------------------------------------------------ checkpoint
class CheckpointSpec(ApiModel):
    """Where and how often the learner checkpoints."""

    uri: StorageUri | None = None
    """s3://bucket/prefix, file:///path or a local path; unset: runs/<job>/checkpoints for `kuberl run`
    (the operator needs an s3:// URI)."""
    interval_steps: int = Field(50, ge=1, le=1_000_000)
    """Checkpoint every this many steps."""
    interval_minutes: float = Field(30.0, gt=0.0, le=100_000.0)
    """...and at least this often in wall-clock minutes."""
    keep: int = Field(3, ge=1, le=1000)
    """Complete checkpoints kept; older ones are deleted."""
    async_save: bool = Field(True, alias="async")
    """Write checkpoints in the background without stalling training."""
    credentials_secret: DnsLabel | None = None
    """Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for s3:// URIs."""
    endpoint_url: Annotated[str, Field(max_length=2048, pattern=r"^https?://[^\s]+$")] | None = None
    """Endpoint of an S3-compatible store (MinIO, SeaweedFS, ...)."""


# ---------------------------------------------------------------------------------------- limits
class LimitsSpec(ApiModel):
    """Circuit breakers: a runaway job stops instead of burning compute."""

    max_steps: int | None = Field(None, ge=1, le=10_000_000)
    """Hard stop after this many steps (at least training.totalSteps); unset: training.totalSteps."""
    max_wall_clock: Duration = "72h"
    """Hard stop after this much running time (suspended time does not count)."""
    max_gpu_hours: float | None = Field(None, gt=0.0)
    """Hard stop once all tiers together used this many GPU-hours; unset: no budget."""
    stop_on_non_finite_loss: bool = True
    """Stop when non-finite losses persist (each one skips its step first)."""
    max_non_finite_steps: int = Field(3, ge=1, le=1000)
    """Consecutive skipped non-finite steps that trip the breaker."""
    no_progress_timeout: Duration = "30m"
    """Stop when no training step completes for this long."""
    max_mismatch_kl: float | None = Field(None, gt=0.0)
    """Stop when the KL between rollout and learner log-probs exceeds this; unset: no limit."""
    max_batches_without_signal: int = Field(10, ge=1, le=100_000)
    """Batches in a row without learning signal that fail the job (NoLearningSignal), with
    algorithm.dynamicSampling on (grpo, rloo). A batch without signal: trajectoriesPerStep / groupSize
    groups in a row, in the order they finish, each left out because all of its trajectories got the same
    reward. A group whose rewards differ resets the count; so does a learner restart."""
    retry_budget: int = Field(5, ge=0, le=1000)
    """Learner gang restarts allowed before the job fails (spot preemptions do not count)."""


# ------------------------------------------------------------------------------------ scheduling
class Capacity(StrEnum):
    ON_DEMAND = "on-demand"
    SPOT = "spot"
    PREFER_SPOT = "prefer-spot"


class SpotPolicy(ApiModel):
    """Per tier: run on spot, on on-demand, or prefer spot with on-demand fallback."""

    learner: Capacity = Capacity.ON_DEMAND
    """Capacity type of learner pods."""
    rollout: Capacity = Capacity.ON_DEMAND
    """Capacity type of rollout pods."""
    sandbox: Capacity = Capacity.ON_DEMAND
    """Capacity type of sandbox pods."""


class Toleration(ApiModel):
    """A Kubernetes toleration."""

    key: Annotated[str, Field(max_length=316)] | None = None
    """Taint key; empty with operator Exists matches all taints."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Exists or Equal."""
    value: Annotated[str, Field(max_length=63)] | None = None
    """Taint value for operator Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches all."""
    toleration_seconds: int | None = Field(None, ge=0)
    """For NoExecute: how long the pod stays bound after the taint appears."""


class TierPlacement(ApiModel):
    """Node placement of one tier's pods."""

    node_selector: dict[str, Annotated[str, Field(max_length=63)]] = Field(default_factory=dict)
    """Node labels the pods require."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64)
    """Taints the pods tolerate."""


class SchedulingSpec(ApiModel):
    """Placement, priority, spot capacity and queueing."""

    spot: SpotPolicy = Field(default_factory=SpotPolicy)
    """Spot capacity per tier."""
    learner: TierPlacement = Field(default_factory=TierPlacement)
    """Placement of learner pods."""
    rollout: TierPlacement = Field(default_factory=TierPlacement)
    """Placement of rollout pods."""
    sandbox: TierPlacement = Field(default_factory=TierPlacement)
    """Placement of sandbox pods."""
    priority_class_name: DnsLabel | None = None
    """PriorityClass of all pods of the job."""
    queue_name: DnsLabel | None = None
    """Kueue LocalQueue; set, the job starts suspended until Kueue admits it."""


# ------------------------------------------------------------------------------------------ spec
class RLJobSpec(ApiModel):
    """Desired state of an RLJob."""

    model: ModelSpec = Field(default_factory=ModelSpec)
    """The policy to train."""
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    """The RL algorithm and its loss."""
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    """The optimisation loop."""
    environment: EnvironmentSpec = Field(default_factory=EnvironmentSpec)
    """Environment, tasks and episode limits."""
    reward: RewardSpec = Field(default_factory=RewardSpec)
    """Reward function and process rewards."""
    learner: LearnerSpec = Field(default_factory=LearnerSpec)
    """The learner tier."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """The rollout tier."""
    sandbox: SandboxSpec = Field(default_factory=SandboxSpec)
    """The sandbox tier."""
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    """Checkpoint storage and cadence."""
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    """Circuit breakers."""
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    """Placement, spot policy and queueing."""
    suspend: bool = False
    """Checkpoint and scale every tier to zero; set back to false to resume from that checkpoint."""

    cross_field_rules = (
        CrossFieldRule(
            field="training.trajectoriesPerStep",
            cel="self.training.trajectoriesPerStep % self.algorithm.groupSize == 0",
            message="training.trajectoriesPerStep must be a multiple of algorithm.groupSize",
            holds=lambda s: s.training.trajectories_per_step % s.algorithm.group_size == 0,
            explain=lambda s: (
                f"must be a multiple of algorithm.groupSize ({s.algorithm.group_size}), "
                f"got {s.training.trajectories_per_step}"
            ),
        ),
        CrossFieldRule(
            field="environment.maxTokensPerTrajectory",
            cel="self.environment.maxTokensPerTrajectory <= self.model.maxContextTokens",
            message="environment.maxTokensPerTrajectory must not exceed model.maxContextTokens",
            holds=lambda s: s.environment.max_tokens_per_trajectory <= s.model.max_context_tokens,
            explain=lambda s: (
                f"must not exceed model.maxContextTokens ({s.model.max_context_tokens}), "
                f"got {s.environment.max_tokens_per_trajectory}"
            ),
        ),
        CrossFieldRule(
            field="rollout.engine.maxModelLen",
            cel=(
                "!has(self.rollout.engine.maxModelLen)"
                " || self.rollout.engine.maxModelLen <= self.model.maxContextTokens"
            ),
            message="rollout.engine.maxModelLen must not exceed model.maxContextTokens",
            holds=lambda s: (
                s.rollout.engine.max_model_len is None or s.rollout.engine.max_model_len <= s.model.max_context_tokens
            ),
            explain=lambda s: (
                f"must not exceed model.maxContextTokens ({s.model.max_context_tokens}), "
                f"got {s.rollout.engine.max_model_len}"
            ),
        ),
        CrossFieldRule(
            field="reward.function",
            cel=f"!self.environment.name.startsWith('{OPENENV_PREFIX}') || self.reward.function != 'swe-toy-tests'",
            message="an OpenEnv environment is not scored by swe-toy-tests; use openenv-return or a function of yours",
            holds=lambda s: openenv_class(s.environment.name) is None or s.reward.function != "swe-toy-tests",
            explain=lambda s: (
                f"environment.name {s.environment.name!r} is an OpenEnv environment, which swe-toy-tests cannot score "
                "(it reads a sandbox's hidden tests); use openenv-return (the sum of the rewards the environment "
                "gave) or a function of yours"
            ),
        ),
        CrossFieldRule(
            field="reward.function",
            cel=f"self.environment.name != '{SWE_BENCH}' || self.reward.function != 'swe-toy-tests'",
            message="environment swe-bench is scored by swe-bench-resolved (or a function of yours), not swe-toy-tests",
            holds=lambda s: s.environment.name != SWE_BENCH or s.reward.function != "swe-toy-tests",
        ),
        CrossFieldRule(
            field="algorithm.creditAssignment.mode",
            cel="self.algorithm.creditAssignment.mode != 'gae' || self.algorithm.name == 'ppo'",
            message="creditAssignment gae needs algorithm.name ppo (it uses the value head)",
            holds=lambda s: (
                s.algorithm.credit_assignment.mode != CreditAssignmentMode.GAE or s.algorithm.name == AlgorithmName.PPO
            ),
            explain=lambda s: f"gae needs algorithm.name ppo (it uses the value head), got {s.algorithm.name}",
        ),
        CrossFieldRule(
            field="algorithm.creditAssignment.mode",
            cel="self.algorithm.creditAssignment.mode != 'prm' || self.reward.processReward.enabled",
            message="creditAssignment prm needs reward.processReward.enabled: true",
            holds=lambda s: (
                s.algorithm.credit_assignment.mode != CreditAssignmentMode.PRM or s.reward.process_reward.enabled
            ),
            explain=lambda s: "prm needs reward.processReward.enabled: true with a function or modelUri",
        ),
        CrossFieldRule(
            field="algorithm.groupSize",
            cel="self.algorithm.name == 'ppo' || self.algorithm.groupSize >= 2",
            message="grpo and rloo baseline within a group: algorithm.groupSize must be >= 2",
            holds=lambda s: s.algorithm.name == AlgorithmName.PPO or s.algorithm.group_size >= 2,
            explain=lambda s: (
                f"{s.algorithm.name} baselines within a group: must be >= 2, got {s.algorithm.group_size}"
            ),
        ),
        CrossFieldRule(
            field="rollout.partialRollouts",
            cel="!self.rollout.partialRollouts || self.training.mode == 'async'",
            message="partialRollouts needs training.mode async",
            holds=lambda s: not s.rollout.partial_rollouts or s.training.mode == TrainingMode.ASYNC,
            explain=lambda s: "partial rollouts mix policy versions in a trajectory: needs training.mode async",
        ),
        CrossFieldRule(
            field="limits.maxSteps",
            cel="!has(self.limits.maxSteps) || self.limits.maxSteps >= self.training.totalSteps",
            message="limits.maxSteps must be >= training.totalSteps or the job could never complete",
            holds=lambda s: s.limits.max_steps is None or s.limits.max_steps >= s.training.total_steps,
            explain=lambda s: (
                f"must be >= training.totalSteps ({s.training.total_steps}) or the job could never "
                f"complete, got {s.limits.max_steps}"
            ),
        ),
    )
