"""The seed's credit-assignment test, on a tiny real model.

A group of SWE-like trajectories: each first checks the error (`run_tests` in half of them,
`read_file` in the other half), then edits the code, then submits. The successful ones differ from
the failed ones in the edit, and, by chance, also in how they checked the error. One gradient step on
the loss must raise the log-prob of the successful edit. With `turn`, `prm` and `gae` credit the
"check the error" turn gets no advantage, so its log-prob stays put; with `outcome` credit it is
credited for a success it did not cause (shown below).
"""

from __future__ import annotations

import copy

import pytest
import torch

from kuberl.api.environment import ToolCall
from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tool_calls import SWE_SYSTEM_PROMPT, format_tool_call
from kuberl_trainer.algorithms.advantages import (
    gae,
    grpo,
    outcome_to_tokens,
    per_turn_baselined,
    to_tokens,
    turn_returns,
)
from kuberl_trainer.algorithms.losses import LossConfig, policy_loss
from recipes.swe_toy.tiny_model import build_tiny_model

GOOD, BAD = "x > bound", "x >= bound"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_model(tmp_path_factory.mktemp("credit") / "m", hidden_size=64, layers=2, seed=3)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    chat = ChatFormat(tokenizer)

    def action(call: ToolCall) -> list[int]:
        return [*tokenizer.encode(format_tool_call(call), add_special_tokens=False), tokenizer.eos_token_id]

    prompt = chat.prompt_ids(
        [
            {"role": "system", "content": SWE_SYSTEM_PROMPT},
            {"role": "user", "content": "The tests in test_geo.py fail. Fix geo.py."},
        ]
    )
    checks = {
        "run_tests": action(ToolCall(name="run_tests")),
        "read_file": action(ToolCall(name="read_file", arguments={"path": "test_geo.py"})),
    }
    edits = {
        e: action(ToolCall(name="replace", arguments={"path": "geo.py", "old": "x < bound", "new": e}))
        for e in (GOOD, BAD)
    }
    error = chat.observation_ids("AssertionError: [] != [7] : sizes_above should use x > bound")
    replaced = chat.observation_ids("Replaced 1 occurrence(s) in geo.py.")
    submit = action(ToolCall(name="submit"))
    rows = []  # (check, edit, success)
    for check, edit, success in [("run_tests", GOOD, 1.0), ("read_file", BAD, 0.0)] * 2:
        ids, turn_index = list(prompt), [-1] * len(prompt)
        for k, (segment, observation) in enumerate([(checks[check], error), (edits[edit], replaced), (submit, [])]):
            ids += segment + observation
            turn_index += [k] * len(segment) + [-1] * len(observation)
        rows.append((ids, turn_index, check, edit, success))
    width = max(len(r[0]) for r in rows)
    input_ids = torch.full((4, width), tokenizer.pad_token_id)
    turn_idx = torch.full((4, width), -1)
    for b, (ids, ti, *_rest) in enumerate(rows):
        input_ids[b, : len(ids)], turn_idx[b, : len(ti)] = torch.tensor(ids), torch.tensor(ti)
    success = torch.tensor([r[4] for r in rows])
    return model, input_ids, turn_idx, success


def token_logprobs(model, input_ids):
    logits = model(input_ids).logits[:, :-1]
    lp = torch.log_softmax(logits, -1).gather(-1, input_ids[:, 1:, None])[..., 0]
    return torch.cat([torch.zeros(input_ids.shape[0], 1), lp], dim=1)  # aligned: lp[t] is of token t


def advantages_for(mode: str, turn_idx, success):
    groups = torch.zeros(4, dtype=torch.long)
    valid = torch.ones(4, 3, dtype=torch.bool)
    if mode == "outcome":
        return outcome_to_tokens(grpo(success, groups), turn_idx)
    # the edit turn earns the reward (its test run passes); prm scores the same turn with a process reward
    turn_rewards = torch.stack([torch.zeros(4), success, torch.zeros(4)], dim=1)
    if mode in ("turn", "prm"):
        if mode == "prm":
            turn_rewards = turn_rewards + 0.1 * torch.stack([torch.zeros(4), success, torch.zeros(4)], dim=1)
        returns = turn_returns(turn_rewards, valid, final_reward=success, gamma=0.0)
        return to_tokens(per_turn_baselined(returns, valid, groups), turn_idx)
    # gae at turn level, TD(0) (lambda 0) with the values a trained value head converges to: V(state) is the
    # expected return; checking the error does not change it (1 either way), the edit decides it.
    rewards = torch.stack([torch.zeros(4), success, success], dim=1)  # the outcome arrives at submit
    values = torch.stack([torch.ones(4), torch.ones(4), success], dim=1)
    return to_tokens(gae(rewards, values, valid, gamma=1.0, lam=0.0), turn_idx)


def step_and_measure(setup, mode: str, lr: float = 0.01):
    """Log-prob change, after one SGD step, of each trajectory's check turn and edit turn (summed over tokens)."""
    model, input_ids, turn_idx, success = setup
    model = copy.deepcopy(model)
    mask = turn_idx >= 0
    before = token_logprobs(model, input_ids)
    advantages = advantages_for(mode, turn_idx, success)
    loss, _ = policy_loss(before, before.detach(), before.detach(), advantages, mask, LossConfig(off_policy="none"))
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
        after = token_logprobs(model, input_ids)
    delta = after - before.detach()
    return {
        name: torch.stack([delta[b][turn_idx[b] == k].sum() for b in range(4)])
        for name, k in (("check", 0), ("edit", 1))
    }


@pytest.mark.parametrize("mode", ["turn", "prm", "gae"])
def test_turn_level_credit_goes_to_the_edit_not_to_checking_the_error(setup, mode):
    change = step_and_measure(setup, mode)
    good_edit, bad_edit = change["edit"][0], change["edit"][1]
    assert good_edit > 0 and bad_edit < 0  # the successful edit is reinforced, the failed one discouraged
    # run_tests co-occurred with success, read_file with failure; neither caused it. Credit for the check would
    # move them apart; what moves both alike is drift through the tokens every tool call shares (the
    # `<tool_call>{"name": "` prefix the edit also starts with), which depends on the tokenizer, not on credit.
    spurious = change["check"][0] - change["check"][1]
    assert abs(spurious) < 0.1 * good_edit, (mode, change)


def test_outcome_credit_also_rewards_how_the_error_was_checked(setup):
    outcome, turn = step_and_measure(setup, "outcome"), step_and_measure(setup, "turn")
    # Every token of a successful trajectory is credited, so run_tests (successful by coincidence) gains
    # log-prob and read_file loses it: credit without causation, an order of magnitude above turn credit.
    assert outcome["check"][0] > 0 and outcome["check"][1] < 0
    spread = {name: float(c["check"][0] - c["check"][1]) for name, c in (("outcome", outcome), ("turn", turn))}
    assert spread["outcome"] > 10 * abs(spread["turn"]), (outcome, turn)
