"""The trajectory contract: per-token arrays aligned, observation tokens never trainable, turns ordered."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kuberl.api.trajectory import Trajectory


def trajectory(**overrides):
    # prompt [0,3), turn 0 generates [3,5) and observes [5,7), turn 1 generates [7,9)
    fields = dict(
        trajectory_id="t1",
        task_id="task-1",
        group_id="g1",
        token_ids=[1, 2, 3, 10, 11, 20, 21, 12, 13],
        loss_mask=[0, 0, 0, 1, 1, 0, 0, 1, 1],
        logprobs=[0, 0, 0, -0.1, -0.2, 0, 0, -0.3, -0.4],
        policy_versions=[-1, -1, -1, 4, 4, -1, -1, 5, 5],
        prompt_length=3,
        turns=[
            {"start": 3, "actionEnd": 5, "end": 7, "reward": 0.0, "tool": "run"},
            {"start": 7, "actionEnd": 9, "end": 9, "reward": 1.0, "tool": "submit"},
        ],
        final_reward=1.0,
        finish_reason="submitted",
    )
    fields.update(overrides)
    return Trajectory.model_validate(fields)


def test_a_well_formed_trajectory():
    t = trajectory()
    assert t.generated_tokens == 4 and t.oldest_version == 4
    assert Trajectory.model_validate_json(t.model_dump_json(by_alias=True)) == t


def test_resolved_is_optional_on_the_wire():
    assert "resolved" not in trajectory().to_manifest()  # a task without failToPass reports no verdict
    resolved = trajectory(resolved=True)
    assert resolved.to_manifest()["resolved"] is True and Trajectory.model_validate(resolved.to_manifest()) == resolved


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"logprobs": [0.0] * 8}, "logprobs has 8 entries, token_ids has 9"),
        ({"loss_mask": [0, 0, 0, 1, 1, 0, 0, 1, 2]}, "must be 0 or 1"),
        ({"policy_versions": [-1, -1, -1, 4, -1, -1, -1, 5, 5]}, "needs the policy version"),
        (
            {"loss_mask": [1, 0, 0, 1, 1, 0, 0, 1, 1], "policy_versions": [4, -1, -1, 4, 4, -1, -1, 5, 5]},
            "prompt tokens",
        ),
        ({"turns": [{"start": 7, "actionEnd": 9, "end": 9}, {"start": 3, "actionEnd": 5, "end": 7}]}, "out of order"),
        ({"finish_reason": "bored"}, "finish_reason"),
    ],
)
def test_malformed_trajectories_are_rejected(overrides, words):
    with pytest.raises(ValidationError, match=words):
        trajectory(**overrides)
