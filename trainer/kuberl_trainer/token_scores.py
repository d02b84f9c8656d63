"""Token log-probs and entropies computed a chunk of positions at a time: the [rows, T, vocab] logits of a
micro-batch never exist at once.

The decoder's trunk runs to its final hidden states; then, chunk by chunk, the lm_head, the log-softmax, the
gather of the input tokens and the entropy. With gradients each chunk is checkpointed: the backward recomputes
one chunk's logits at a time instead of keeping every chunk's. Under FSDP2 the scoring runs as a forward method
of the root unit (`enable_fsdp_scoring`), so the embeddings, final norm and lm_head are gathered around it.
"""

from __future__ import annotations

import types

import torch
from torch.utils.checkpoint import checkpoint

from kuberl.planning import logits_chunk_tokens

SCORE_METHOD = "kuberl_score_tokens"


def enable_fsdp_scoring(model) -> None:
    """Make the root FSDP unit gather its parameters around `score_tokens` as it does around `forward`."""
    from torch.distributed.fsdp import register_fsdp_forward_method

    setattr(model, SCORE_METHOD, types.MethodType(_score, model))
    register_fsdp_forward_method(model, SCORE_METHOD)


def score_tokens(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    from_position: int,
    temperature: float,
    entropy_grad: bool,
    value_head: torch.nn.Module | None,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(log-probs, entropies) of tokens from_position..T-1, each [B, T - from_position], and the value head's
    values [B, T] (None without one). Each chunk holds about `chunk_tokens` rows x positions (default: the
    rule of `kuberl.planning.logits_chunk_tokens`)."""
    chunk = chunk_tokens or logits_chunk_tokens(model.config.vocab_size)
    method = getattr(model, SCORE_METHOD, None)
    args = (input_ids, attention_mask, from_position, temperature, entropy_grad, value_head, chunk)
    return method(*args) if method is not None else _score(model, *args)


def _score(model, input_ids, attention_mask, from_position, temperature, entropy_grad, value_head, chunk_tokens):
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    head = model.get_output_embeddings()
    softcap = getattr(model.config, "final_logit_softcapping", None)
    rows, width = input_ids.shape
    step = max(1, chunk_tokens // max(rows, 1))
    picked, entropies = [], []
    # position p's logits predict token p + 1: positions from_position - 1 .. T - 2
    for start in range(from_position - 1, width - 1, step):
        end = min(start + step, width - 1)
        args = (head, hidden[:, start:end], input_ids[:, start + 1 : end + 1], temperature, softcap, entropy_grad)
        if torch.is_grad_enabled():
            lp, ent = checkpoint(_chunk_scores, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_scores(*args)
        picked.append(lp)
        entropies.append(ent)
    if not picked:
        empty = hidden.new_zeros((rows, 0), dtype=torch.float32)
        picked, entropies = [empty], [empty]
    values = value_head(hidden).squeeze(-1).float() if value_head is not None else None
    return torch.cat(picked, dim=1), torch.cat(entropies, dim=1), values


def _chunk_scores(head, hidden, targets, temperature, softcap, entropy_grad):
    logits = head(hidden).float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    del logits
    picked = log_probs.gather(-1, targets[..., None])[..., 0]
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        source = log_probs if entropy_grad else log_probs.detach()
        entropy = -(source.exp() * source).sum(-1)
    return picked, entropy
