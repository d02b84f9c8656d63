"""Demonstrations: scripted tool calls played against a real sandbox, recorded as training tokens.

The token layout is exactly the one the rollout tier produces (prompt, then per turn the call's text and
EOS as trainable tokens, then the observation and next assistant header as context), so a model
fine-tuned on demonstrations speaks the agent format the rollout tier parses.
"""

from __future__ import annotations

from dataclasses import dataclass

from kuberl.api.environment import Environment, Task, ToolCall
from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tool_calls import format_tool_call


@dataclass(frozen=True)
class Demonstration:
    token_ids: list[int]
    loss_mask: list[int]
    """1 on the demonstrated calls (and their EOS), 0 on prompt and observations."""
    final_done: bool


async def record_demonstration(
    env: Environment, chat: ChatFormat, system_prompt: str, task: Task, calls: list[ToolCall]
) -> Demonstration:
    """Play `calls` on `task` in `env` and return the conversation's tokens."""
    observation = await env.reset(task)
    ids = chat.prompt_ids([{"role": "system", "content": system_prompt}, {"role": "user", "content": observation}])
    mask = [0] * len(ids)
    eos = chat.tokenizer.eos_token_id
    done = False
    for call in calls:
        action = [*chat.tokenizer.encode(format_tool_call(call), add_special_tokens=False), eos]
        ids += action
        mask += [1] * len(action)
        result = await env.step(call)
        if result.done:
            done = True
            break
        observation_ids = chat.observation_ids(result.observation)
        ids += observation_ids
        mask += [0] * len(observation_ids)
    return Demonstration(ids, mask, done)
