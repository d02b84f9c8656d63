"""Demonstrations: scripted tool calls played against a real sandbox, recorded as training tokens.

The token layout is exactly the one the rollout tier produces (prompt, then per turn the call's text and
EOS as trainable tokens, then the observation and next assistant header as context), so a model
fine-tuned on demonstrations speaks the agent format the rollout tier parses.
"""

from __future__ import annotations

from dataclasses import dataclass

from kuberl.api.environment import Environment, Task, ToolCall
from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tool_calls import ParseError, format_tool_call, parse_tool_call


@dataclass(frozen=True)
class Slip:
    """A failed attempt at a call, played like any call but kept out of the loss: the demonstration shows
    the error it gets and what comes next, so the model learns to recover, never to slip."""

    text: str


@dataclass(frozen=True)
class Demonstration:
    token_ids: list[int]
    loss_mask: list[int]
    """1 on the demonstrated calls (and their EOS), 0 on prompt, observations and slips."""
    final_done: bool


async def record_demonstration(
    env: Environment, chat: ChatFormat, system_prompt: str, task: Task, calls: list[ToolCall | Slip]
) -> Demonstration:
    """Play `calls` on `task` in `env` and return the conversation's tokens. A `Slip`'s text is read as the
    rollout tier reads generated text (a parse error is its observation) and is not trained on."""
    observation = await env.reset(task)
    ids = chat.prompt_ids([{"role": "system", "content": system_prompt}, {"role": "user", "content": observation}])
    mask = [0] * len(ids)
    eos = chat.tokenizer.eos_token_id
    done = False
    for call in calls:
        slip = isinstance(call, Slip)
        text = call.text if slip else format_tool_call(call)
        action = [*chat.tokenizer.encode(text, add_special_tokens=False), eos]
        ids += action
        mask += [0 if slip else 1] * len(action)
        parsed = parse_tool_call(text) if slip else call
        if isinstance(parsed, ParseError):
            observation = parsed.message
        else:
            result = await env.step(parsed)
            if result.done:
                done = True
                break
            observation = result.observation
        observation_ids = chat.observation_ids(observation)
        ids += observation_ids
        mask += [0] * len(observation_ids)
    return Demonstration(ids, mask, done)
