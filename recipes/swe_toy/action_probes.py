"""Action probes: how likely a policy is to take a given action at a given point of a real episode.

The seed's credit-assignment check, on swe-toy: after RL, the probability of the *correct edit*
(`replace` of the buggy expression by the fix) should have risen, and that of *checking the error*
(`run_tests` as the first move) should not have been inflated by a reward it did not earn. A probe
plays the scripted prefix of an episode in a real sandbox (so observations are the real ones), then
scores the action's tokens under a model by teacher forcing. Probes only measure: nothing trains on them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kuberl.api.environment import Environment, Environments, Task, ToolCall
from kuberl.modeling.chat import ChatFormat
from kuberl_trainer.demonstrations import demonstration_tokens
from recipes.swe_toy.demonstrations import record_demonstration
from recipes.swe_toy.scripted_episodes import scripted_calls

CHECK, EDIT = "check the error", "correct edit"


@dataclass(frozen=True)
class ActionProbe:
    task_id: str
    action: str
    """CHECK or EDIT."""
    context_ids: list[int]
    action_ids: list[int]
    """The call's tokens and EOS, exactly as the rollout tier would sample them."""


def swe_toy_calls(task: Task) -> list[ToolCall]:
    """The demonstrations' expert workflow up to and including the correct edit."""
    calls = scripted_calls(task, random.Random(0), expert=True)
    return calls[: [c.name for c in calls].index("replace") + 1]


async def swe_toy_probes(env: Environment, chat: ChatFormat, system_prompt: str, task: Task) -> list[ActionProbe]:
    """The CHECK probe (first move) and the EDIT probe (after running the tests): spans of the trained tokens
    of the expert workflow's demonstration, played up to the edit, laid out as the warm-up lays it out."""
    played = await record_demonstration(env, system_prompt, task, swe_toy_calls(task))
    tokens = demonstration_tokens(played.demonstration, chat)
    spans = _masked_spans(tokens.loss_mask)
    probes = []
    for action, (start, end) in ((CHECK, spans[0]), (EDIT, spans[-1])):
        probes.append(ActionProbe(task.task_id, action, tokens.token_ids[:start], tokens.token_ids[start:end]))
    return probes


def _masked_spans(mask: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s."""
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(mask):
        if m and (i == 0 or not mask[i - 1]):
            spans.append((i, i))
        if m:
            spans[-1] = (spans[-1][0], i + 1)
    return spans


def action_logprob(model, probe: ActionProbe) -> float:
    """log P(action | context) under `model`: the sum of its tokens' log-probabilities."""
    import torch

    ids = torch.tensor([probe.context_ids + probe.action_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(probe.context_ids) - 1 : -1].float()
    targets = ids[0, len(probe.context_ids) :]
    return torch.log_softmax(logits, -1).gather(-1, targets[:, None]).sum().item()


def mean_probability(model, probes: Sequence[ActionProbe], action: str = EDIT) -> float:
    """The mean probability of `action` over the probes of that kind (how often a policy sampling at
    temperature 1 would take it there)."""
    values = [math.exp(action_logprob(model, p)) for p in probes if p.action == action]
    if not values:
        raise ValueError(f"no '{action}' probes to score")
    return sum(values) / len(values)


async def play_probes(
    tasks: Sequence[Task], environments: Callable[[], Environments], chat: ChatFormat, system_prompt: str
) -> list[ActionProbe]:
    """Both probes of every task, played one task at a time in environments from `environments()`."""
    opened = environments()
    probes: list[ActionProbe] = []
    try:
        for task in tasks:
            env = opened.open()
            try:
                probes += await swe_toy_probes(env, chat, system_prompt, task)
            finally:
                await env.close()
    finally:
        await opened.aclose()
    return probes


def mean_logprobs(model, probes: Sequence[ActionProbe]) -> dict[str, float]:
    """The mean log-probability of each kind of action over `probes`."""
    out: dict[str, list[float]] = {}
    for probe in probes:
        out.setdefault(probe.action, []).append(action_logprob(model, probe))
    return {action: sum(values) / len(values) for action, values in out.items()}


def credit_report(
    before: str, after: str, tasks: Sequence[Task], environments: Callable[[], Environments], system_prompt: str
) -> dict[str, dict[str, float]]:
    """The seed's credit-assignment test on two policy folders (before and after RL) over `tasks`, played in
    environments from `environments()`: the mean log-probability of the correct edit and of the first check,
    under each, and the change. RL that credits the right action raises the edit's clearly and the check's
    much less."""
    import asyncio

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    chat = ChatFormat(AutoTokenizer.from_pretrained(before))
    probes = asyncio.run(play_probes(tasks, environments, chat, system_prompt))
    means = {}
    for name, folder in (("before", before), ("after", after)):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        means[name] = mean_logprobs(model, probes)
    return {
        action: {
            "before": round(means["before"][action], 3),
            "after": round(means["after"][action], 3),
            "change": round(means["after"][action] - means["before"][action], 3),
        }
        for action in (EDIT, CHECK)
    }
