"""A two-turn toy task and an in-process RL loop on the learner's own functions (a test fixture).

The task is the seed's credit-assignment episode in miniature: first *check the error* (a `run_tests`
call, always the same text), whose message names the right value and the buggy one; then *edit* (a
`replace` call of the module's file) whose `old` must copy the buggy value and `new` the right one. Reward 1
for exactly that edit. Episodes are sampled in-process with `transformers` generate and recorded as
`Trajectory` objects as the rollout tier records them; training calls the learner's `load_policy`,
`collate`, `group_advantages` (or PPO's `with_gae`), `has_signal`, `shard` and `train_step` the way
`run_learner` does. Only the transport (rollout servers, weight publishing) is left out.

The wrong demonstrations copy the buggy value into `new` (a no-op edit) rather than pick a random value:
a 64-wide tiny model learned to copy from its context only when every demonstration copied (with random
wrong values it had barely begun to after 800 supervised steps), and RL only reinforces a skill the policy has.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from kuberl.api.environment import ToolCall
from kuberl.api.rljob import RLJob
from kuberl.api.trajectory import NOT_GENERATED, FinishReason, Trajectory, Turn
from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tool_calls import CLOSE, OPEN, ParseError, format_tool_call, parse_tool_call
from kuberl_trainer.batching import (
    collate,
    filters_uniform_groups,
    group_advantages,
    has_signal,
    shard,
    uses_value_head,
    with_gae,
)
from kuberl_trainer.learner_loop import loss_config_for
from kuberl_trainer.policy import load_policy
from kuberl_trainer.step import predict, token_logprobs, train_step
from recipes.swe_toy.action_probes import CHECK, EDIT, ActionProbe

# single tokens of the tiny tokenizer, both inside the error message and inside the call's JSON
VALUES = ("total", "count", "budget", "price", "speed", "width", "score", "level")
MODULES = ("bakery", "garden", "hotel", "library", "market", "museum", "school", "theater")
MAX_TURNS = 2
MAX_TOKENS_PER_TURN = 44  # the edit call is 39 tokens with its EOS
Control = Literal["flip-advantages", "random-rewards"] | None


@dataclass(frozen=True)
class ToyTask:
    module: str
    value: str
    """The name the code should use: the edit's `new`."""
    buggy: str
    """The name the code has now: the edit's `old`."""

    @property
    def task_id(self) -> str:
        return f"{self.module}-{self.value}-{self.buggy}"

    def prompt(self) -> str:
        return f"The tests in test_{self.module}.py fail. Fix {self.module}.py."

    def error(self) -> str:
        """What checking the error shows: the failing assertion names the right value."""
        return (
            f'FAILED test_{self.module}.py::test_{self.value}: AssertionError: "{self.buggy}" != "{self.value}"\n'
            f'{self.module}.py should use "{self.value}", not "{self.buggy}"'
        )

    def edit(self, new: str | None = None) -> ToolCall:
        """The edit that writes `new` (default: the right value) in place of the buggy one."""
        new = self.value if new is None else new
        return ToolCall(name="replace", arguments={"path": f"{self.module}.py", "old": self.buggy, "new": new})

    def is_right(self, call: ToolCall) -> bool:
        """Exactly the right edit: the module's file, the buggy value out, the named one in."""
        return call.name == "replace" and call.arguments == self.edit().arguments

    def step(self, call: ToolCall | ParseError) -> tuple[str, float | None, bool]:
        """(observation, reward, done) of one action: the environment."""
        if isinstance(call, ParseError):
            return call.message, None, False
        if call.name == "run_tests":
            return self.error(), None, False
        if call.name == "replace":
            return "", float(self.is_right(call)), True
        return f"error: unknown tool {call.name!r}", None, False


CHECK_CALL = ToolCall(name="run_tests", arguments={})


def read_action(text: str) -> ToolCall | ParseError:
    """The action's one tool call. Stricter than the rollout tier: text around the call is an error, so that
    an RL-trained tiny model cannot end its turns in garbage after a right call and still be paid."""
    text = text.strip()
    if text.count(OPEN) > 1 or not (text.startswith(OPEN) and text.endswith(CLOSE)):
        return ParseError(f"error: write exactly one {OPEN}...{CLOSE} and nothing else")
    return parse_tool_call(text)


def split_tasks(held_out: int = 16, seed: int = 0) -> tuple[list[ToyTask], list[ToyTask]]:
    """(train, held-out): every (module, value, buggy value) task, the held-out (module, value) pairs never
    trained on (with one buggy value each). Every module and value appears in training, in other pairs."""
    rng = random.Random(seed)
    pairs = [(m, v) for m in MODULES for v in VALUES]
    rng.shuffle(pairs)
    train = [ToyTask(m, v, b) for m, v in pairs[held_out:] for b in VALUES if b != v]
    return train, [ToyTask(m, v, rng.choice([b for b in VALUES if b != v])) for m, v in pairs[:held_out]]


def action_ids(chat: ChatFormat, call: ToolCall) -> list[int]:
    """A call's tokens and EOS, as the rollout tier samples them."""
    return [*chat.tokenizer.encode(format_tool_call(call), add_special_tokens=False), chat.tokenizer.eos_token_id]


def prompt_ids(chat: ChatFormat, task: ToyTask) -> list[int]:
    # no system prompt: its tokens would be compute in every forward pass and teach the tiny model nothing
    return chat.prompt_ids([{"role": "user", "content": task.prompt()}])


def demonstrations(
    chat: ChatFormat, tasks: Sequence[ToyTask], count: int, expert_fraction: float, seed: int = 0
) -> list[tuple[list[int], list[int]]]:
    """Scripted episodes (check, then edit) as (token_ids, loss_mask): `expert_fraction` of them, evenly
    spread, make the right edit; the rest a wrong one (the warm-up's recipe): they copy the other value the
    message quotes, the one the code has now."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        task = tasks[rng.randrange(len(tasks))]
        expert = int((i + 1) * expert_fraction) > int(i * expert_fraction)
        ids = prompt_ids(chat, task)
        mask = [0] * len(ids)
        for segment, trained in (
            (action_ids(chat, CHECK_CALL), 1),
            (chat.observation_ids(task.error()), 0),
            (action_ids(chat, task.edit(None if expert else task.buggy)), 1),
        ):
            ids += segment
            mask += [trained] * len(segment)
        out.append((ids, mask))
    return out


def probes(chat: ChatFormat, tasks: Sequence[ToyTask]) -> list[ActionProbe]:
    """Per task: CHECK (the check call after the prompt) and EDIT (the right edit after the check and its
    observation), scored with `action_probes.action_logprob`."""
    out = []
    for task in tasks:
        prompt, check = prompt_ids(chat, task), action_ids(chat, CHECK_CALL)
        out.append(ActionProbe(task.task_id, CHECK, prompt, check))
        context = prompt + check + chat.observation_ids(task.error())
        out.append(ActionProbe(task.task_id, EDIT, context, action_ids(chat, task.edit())))
    return out


@dataclass
class _Episode:
    task: ToyTask
    group_id: str
    token_ids: list[int]
    loss_mask: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    final_reward: float = 0.0
    finish: FinishReason = FinishReason.MAX_TURNS
    done: bool = False

    def __post_init__(self) -> None:
        self.prompt_length = len(self.token_ids)
        self.loss_mask = [0] * self.prompt_length


@torch.no_grad()
def _generate(model, rows: list[list[int]], eos: int, pad: int) -> list[list[int]]:
    """One sampled turn per row (temperature 1, no top-k/top-p), cut after its EOS."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):  # left padding: every row's next token is at the same column
        ids[i, width - len(row) :] = torch.tensor(row)
        attention[i, width - len(row) :] = 1
    out = model.generate(
        input_ids=ids,
        attention_mask=attention,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=MAX_TOKENS_PER_TURN,
        eos_token_id=eos,
        pad_token_id=pad,
        use_cache=True,
    )
    result = []
    for row in out[:, width:].tolist():
        result.append(row[: row.index(eos) + 1] if eos in row else row)
    return result


@torch.no_grad()
def sample_groups(model, chat: ChatFormat, tasks: Sequence[ToyTask], group_size: int, version: int) -> list[Trajectory]:
    """`group_size` episodes of each task (in one batch per turn), as the rollout tier's trajectories."""
    tokenizer = chat.tokenizer
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    episodes = []
    for task in tasks:
        group_id = uuid.uuid4().hex
        episodes += [_Episode(task, group_id, prompt_ids(chat, task)) for _ in range(group_size)]
    for _ in range(MAX_TURNS):
        live = [e for e in episodes if not e.done]
        if not live:
            break
        for episode, generated in zip(live, _generate(model, [e.token_ids for e in live], eos, pad), strict=True):
            start = len(episode.token_ids)
            episode.token_ids += generated
            episode.loss_mask += [1] * len(generated)
            parsed = read_action(tokenizer.decode(generated, skip_special_tokens=True))
            observation, reward, done = episode.task.step(parsed)
            tool = None if isinstance(parsed, ParseError) else parsed.name
            if done:
                episode.turns.append(
                    Turn(start=start, action_end=len(episode.token_ids), end=len(episode.token_ids), tool=tool)
                )
                episode.final_reward, episode.finish, episode.done = reward or 0.0, FinishReason.SUBMITTED, True
                continue
            observed = chat.observation_ids(observation)
            episode.token_ids += observed
            episode.loss_mask += [0] * len(observed)
            episode.turns.append(
                Turn(
                    start=start, action_end=start + len(generated), end=len(episode.token_ids), reward=reward, tool=tool
                )
            )
    # the sampling policy's log-probs (the rollout engine reports them with each token)
    width = max(len(e.token_ids) for e in episodes)
    ids = torch.full((len(episodes), width), pad, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, e in enumerate(episodes):
        ids[i, : len(e.token_ids)], attention[i, : len(e.token_ids)] = torch.tensor(e.token_ids), 1
    logprobs = token_logprobs(model, ids, attention)
    out = []
    for i, e in enumerate(episodes):
        n = len(e.token_ids)
        out.append(
            Trajectory(
                trajectory_id=uuid.uuid4().hex,
                task_id=e.task.task_id,
                group_id=e.group_id,
                token_ids=e.token_ids,
                loss_mask=e.loss_mask,
                logprobs=[lp if m else 0.0 for lp, m in zip(logprobs[i, :n].tolist(), e.loss_mask, strict=True)],
                policy_versions=[version if m else NOT_GENERATED for m in e.loss_mask],
                prompt_length=e.prompt_length,
                turns=e.turns,
                final_reward=e.final_reward,
                finish_reason=e.finish,
            )
        )
    return out


def success_rate(model, chat: ChatFormat, tasks: Sequence[ToyTask], episodes_per_task: int) -> float:
    """The fraction of sampled episodes that make the right edit."""
    trajectories = sample_groups(model, chat, tasks, episodes_per_task, version=0)
    return sum(t.final_reward for t in trajectories) / len(trajectories)


@dataclass
class RunResult:
    model: object
    rewards: list[float]
    """Mean true reward of every step's sampled episodes (before that step's update)."""
    kept: list[int]
    """Trajectories trained on per step (groups without signal are left out)."""
    seconds: float


def rl_run(
    job: RLJob, model_path: str | Path, tasks: Sequence[ToyTask], steps: int, control: Control = None
) -> RunResult:
    """Train `model_path` with `job`'s algorithm for `steps` synchronous steps, as `run_learner` does.
    `control` breaks learning on purpose: flip the advantages' sign, or pay random rewards that ignore
    the action."""
    from transformers import AutoTokenizer

    spec = job.spec
    started = time.monotonic()
    torch.manual_seed(spec.training.seed)
    rng = random.Random(spec.training.seed)
    chat = ChatFormat(AutoTokenizer.from_pretrained(model_path))
    ppo = uses_value_head(spec.algorithm)
    model = load_policy(str(model_path), spec.learner.fsdp, torch.device("cpu"), value_head=ppo)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=spec.training.learning_rate, weight_decay=spec.training.weight_decay
    )
    loss_config = loss_config_for(job)
    group_size = spec.algorithm.group_size
    groups_per_step = spec.training.trajectories_per_step // group_size
    rewards, kept = [], []
    for step in range(steps):
        model.eval()
        batch = sample_groups(model, chat, [rng.choice(tasks) for _ in range(groups_per_step)], group_size, step)
        rewards.append(sum(t.final_reward for t in batch) / len(batch))
        if control == "random-rewards":
            batch = [t.model_copy(update={"final_reward": float(rng.random() < 0.5)}) for t in batch]
        if filters_uniform_groups(spec.algorithm):  # dynamic sampling, without drawing replacements
            groups = [batch[i : i + group_size] for i in range(0, len(batch), group_size)]
            batch = [t for g in groups if has_signal(g, spec.algorithm) for t in g]
        kept.append(len(batch))
        if not batch:
            continue
        model.train()
        collated = collate(batch, pad_id=0)
        if not ppo:
            collated.batch.advantages = group_advantages(collated, spec.algorithm)
        part = shard(collated, 0, 1, multiple=spec.training.mini_batches)
        tokens = part.batch
        if ppo:
            tokens = with_gae(part, predict(model, tokens).values, spec.algorithm)
        if control == "flip-advantages":
            tokens.advantages = -tokens.advantages
        train_step(
            model,
            optimizer,
            tokens,
            loss_config,
            spec.training.max_grad_norm,
            1,
            spec.training.mini_batches,
            None,
            spec.algorithm.value_coef,
        )
    model.eval()
    return RunResult(model, rewards, kept, time.monotonic() - started)
