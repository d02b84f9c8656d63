"""Token ids of a multi-turn conversation, built incrementally and never re-encoded.

The prompt is encoded once; after every generated turn only the *new* tokens (the observation wrapped
in the model's chat template, then the next assistant header) are encoded and appended. The suffix is
found by rendering the template with and without the observation and keeping the difference, so the
same code serves any Hugging Face chat template (ChatML, Llama 3, the tiny model's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_PLACEHOLDER = "\x00KUBERL\x00"


@dataclass
class ChatFormat:
    """A tokenizer's chat template, split into the pieces an agent loop appends."""

    tokenizer: Any
    observation_role: str = "tool"
    _observation_affixes: tuple[str, str] | None = field(default=None, repr=False)

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The conversation so far plus the assistant header, as ids."""
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def observation_ids(self, observation: str) -> list[int]:
        """Ids to append after a generated turn: the observation message and the next assistant header."""
        prefix, suffix = self._affixes()
        return self.tokenizer.encode(prefix + observation + suffix, add_special_tokens=False)

    def _affixes(self) -> tuple[str, str]:
        if self._observation_affixes is None:
            base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
            before = self.tokenizer.apply_chat_template(base, tokenize=False)
            after = self.tokenizer.apply_chat_template(
                [*base, {"role": self.observation_role, "content": _PLACEHOLDER}],
                tokenize=False,
                add_generation_prompt=True,
            )
            if not after.startswith(before) or _PLACEHOLDER not in after:
                raise ValueError("the chat template does not extend a conversation by appending; cannot split it")
            prefix, _, suffix = after[len(before) :].partition(_PLACEHOLDER)
            self._observation_affixes = (prefix, suffix)
        return self._observation_affixes
