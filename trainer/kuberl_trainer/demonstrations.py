"""Demonstrations for the warm-up (kuberl.api.demonstrations) rendered as tokens.

The token layout is exactly the one the rollout tier produces (the prompt, then per turn the call's text and
EOS as trainable tokens, then the tool's answer and the next assistant header as context), so a model
fine-tuned on demonstrations speaks the agent format the rollout tier parses.
"""

from __future__ import annotations

from dataclasses import dataclass

from kuberl.api.demonstrations import Demonstration, Role
from kuberl.modeling.chat import ChatFormat


@dataclass(frozen=True)
class DemonstrationTokens:
    token_ids: list[int]
    loss_mask: list[int]
    """1 on the trained calls (and their EOS), 0 on the prompt, the tools' answers and calls with train: false."""
    reward: float | None


def demonstration_tokens(demo: Demonstration, chat: ChatFormat) -> DemonstrationTokens:
    """The demonstration as the rollout tier would have laid out its episode, with the trained calls masked in."""
    prompt = [m for m in demo.messages if m.role in (Role.SYSTEM, Role.USER)]
    ids = chat.prompt_ids([{"role": str(m.role), "content": m.content} for m in prompt])
    mask = [0] * len(ids)
    eos = chat.tokenizer.eos_token_id
    for message in demo.messages[len(prompt) :]:
        if message.role == Role.ASSISTANT:
            action = [*chat.tokenizer.encode(message.content, add_special_tokens=False), eos]
            ids += action
            mask += [int(message.train)] * len(action)
        else:
            answer = chat.observation_ids(message.content)
            ids += answer
            mask += [0] * len(answer)
    return DemonstrationTokens(ids, mask, demo.reward)
