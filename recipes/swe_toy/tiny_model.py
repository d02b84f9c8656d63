"""A tiny random Llama and a tokenizer trained offline: for tests and the CPU demo (no hub access).

Built in about a second. The tokenizer is byte-level BPE (any text encodes) trained on swe-toy tasks
and tool calls, with a small chat template; `<|end|>` ends every message and is the EOS token.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from recipes.swe_toy.copy_pretraining import RANKING

ROLES = ("system", "user", "assistant", "tool")
END, PAD = "<|end|>", "<|pad|>"
SPECIAL_TOKENS = [PAD, END, *(f"<|{role}|>" for role in ROLES)]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _corpus(tasks: int, seed: int) -> list[str]:
    from kuberl.modeling.tool_calls import SWE_SYSTEM_PROMPT
    from kuberl.suites.swe_toy import generate

    texts = [SWE_SYSTEM_PROMPT]
    for task in generate(tasks, seed=seed):
        texts.append(task.prompt)
        texts.extend(task.files.values())
        meta = task.metadata
        call = {"name": "replace", "arguments": {"path": meta["file"], "old": meta["buggy"], "new": meta["fix"]}}
        texts.append("<tool_call>" + json.dumps(call) + "</tool_call>")
    texts.append('<tool_call>{"name": "run_tests", "arguments": {}}</tool_call> Ran 3 tests in 0.001s OK FAILED')
    # unittest's report frames every failure with 70-character rules: without merges for them each rule
    # was 70 tokens, over half of an episode's tokens
    rules = ("=" * 70, "-" * 70)
    texts += [
        f"{rules[0]}\nFAIL: test_x (test_m.TestM.test_x)\n{rules[1]}\nTraceback (most recent call last):\n"
        f"\n{rules[1]}\nRan 3 tests\n\nFAILED (failures=1)\n[2/3 tests passed]"
    ] * 50
    return texts


def build_tokenizer(vocab_size: int = 2048, tasks: int = 200, seed: int = 0):
    """A PreTrainedTokenizerFast with the tiny chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(tasks, seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=END, pad_token=PAD)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(
    path: str | Path,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 2,  # head_dim 32: vLLM's CPU attention has no kernel for 16
    vocab_size: int = 2048,
    max_positions: int = 4096,
    seed: int = 0,
) -> Path:
    """Write a random Llama (safetensors, float32) and its tokenizer to `path`; returns the path."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    path = Path(path)
    tokenizer = build_tokenizer(vocab_size=vocab_size, seed=seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    # which tokens the training text uses, most used first: copy pretraining draws from them
    (path / RANKING).write_text(json.dumps(corpus_token_ranking(tokenizer, seed=seed)))
    return path


def corpus_token_ranking(tokenizer, tasks: int = 200, seed: int = 0) -> list[int]:
    """The ordinary tokens that the tokenizer's training text uses, most used first."""
    special = set(tokenizer.all_special_ids)
    counts = Counter(t for text in _corpus(tasks, seed) for t in tokenizer.encode(text, add_special_tokens=False))
    return [token for token, _ in counts.most_common() if token not in special]
