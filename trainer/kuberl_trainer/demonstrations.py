"""Demonstrations for the warm-up: a JSONL dataset (kuberl.api.demonstrations) read and rendered as tokens.

The token layout is exactly the one the rollout tier produces (the prompt, then per turn the call's text and
EOS as trainable tokens, then the tool's answer and the next assistant header as context), so a model
fine-tuned on demonstrations speaks the agent format the rollout tier parses.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from kuberl.api.demonstrations import Demonstration, Role
from kuberl.modeling.chat import ChatFormat
from kuberl.storage import local_file

FIELD = "spec.training.warmup.demonstrations"


@dataclass(frozen=True)
class DemonstrationTokens:
    token_ids: list[int]
    loss_mask: list[int]
    """1 on the trained calls (and their EOS), 0 on the prompt, the tools' answers and calls with train: false."""
    reward: float | None


def read_demonstrations(uri: str) -> list[Demonstration]:
    """Every demonstration of the JSONL file `uri` (a local path, file:// or s3://); a bad line raises
    ValueError naming the file, the line and the field."""
    with local_file(uri, f"{FIELD} file") as path:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"{FIELD}: cannot read {uri}: {error}") from None
    demos = [_parse_line(uri, number, line) for number, line in enumerate(lines, start=1) if line.strip()]
    if not demos:
        raise ValueError(f"{FIELD}: {uri} holds no demonstrations")
    return demos


def _parse_line(uri: str, number: int, line: str) -> Demonstration:
    where = f"{uri} line {number}"
    try:
        return Demonstration.model_validate(json.loads(line))
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not valid JSON: {error}") from None
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in item['loc']) or '(demonstration)'}: {item['msg']}" for item in error.errors()
        )
        raise ValueError(f"{where}: {problems} (the format: docs/warmup.md)") from None


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
