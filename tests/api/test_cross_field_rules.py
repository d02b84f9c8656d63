"""Every cross-field rule, as a table: the manifest that breaks it is rejected by pydantic with the
field path and a message, and by the CRD's CEL rule (evaluated on the API server's defaulted object)."""

from __future__ import annotations

import pytest
from conftest import BASE_MANIFEST, with_spec
from helpers.crd_schema import apply_defaults, cel_violations

from kuberl.api.base import ApiModel
from kuberl.crd import rljob_crd
from kuberl.validation import validate_document

# (rule id, manifest breaking it, reported path, words the message must contain, has a CEL twin)
BROKEN = [
    (
        "group-divides-batch",
        with_spec(training={"trajectoriesPerStep": 12}, algorithm={"groupSize": 8}),
        "spec.training.trajectoriesPerStep",
        "multiple of algorithm.groupSize (8), got 12",
        True,
    ),
    (
        "mini-batches-divide-batch",
        with_spec(training={"trajectoriesPerStep": 64, "miniBatches": 3}),
        "spec.training.trajectoriesPerStep",
        "multiple of miniBatches (3)",
        True,
    ),
    (
        "async-needs-staleness",
        with_spec(training={"mode": "async", "maxStaleness": 0}),
        "spec.training.maxStaleness",
        "async mode needs maxStaleness >= 1",
        True,
    ),
    (
        "sandbox-min-max",
        with_spec(sandbox={"minReplicas": 5, "maxReplicas": 2}),
        "spec.sandbox.maxReplicas",
        "must be >= minReplicas (5), got 2",
        True,
    ),
    (
        "openenv-not-scored-by-swe-toy-tests",
        with_spec(environment={"name": "openenv:kuberl.integrations.openenv_guess:GuessNumberEnvironment"}),
        "spec.reward.function",
        "use openenv-return",
        True,
    ),
    (
        "swe-bench-not-scored-by-swe-toy-tests",
        with_spec(
            environment={"name": "swe-bench", "tasks": {"uri": "instances.jsonl", "repos": "mirror"}},
            reward={"function": "swe-toy-tests"},
        ),
        "spec.reward.function",
        "scored by swe-bench-resolved",
        True,
    ),
    (
        "swe-bench-needs-instances",
        with_spec(
            environment={"name": "swe-bench", "tasks": {"repos": "mirror"}},
            reward={"function": "swe-bench-resolved"},
        ),
        "spec.environment.tasks",
        "needs tasks.uri (a SWE-bench-format JSONL file)",
        True,
    ),
    (
        "weight-uri-needs-storage",
        with_spec(rollout={"weightSync": {"uri": "s3://bucket/weights"}}),
        "spec.rollout.weightSync.uri",
        "read only with transport: storage",
        True,
    ),
    (
        "trajectory-fits-context",
        with_spec(model={"maxContextTokens": 4096}, environment={"maxTokensPerTrajectory": 8192}),
        "spec.environment.maxTokensPerTrajectory",
        "must not exceed model.maxContextTokens (4096)",
        True,
    ),
    (
        "engine-fits-context",
        with_spec(
            model={"maxContextTokens": 4096},
            environment={"maxTokensPerTrajectory": 4096},
            rollout={"engine": {"maxModelLen": 8192}},
        ),
        "spec.rollout.engine.maxModelLen",
        "must not exceed model.maxContextTokens (4096), got 8192",
        True,
    ),
    (
        "gae-needs-ppo",
        with_spec(algorithm={"name": "grpo", "creditAssignment": {"mode": "gae"}}),
        "spec.algorithm.creditAssignment.mode",
        "gae needs algorithm.name ppo",
        True,
    ),
    (
        "prm-needs-process-reward",
        with_spec(algorithm={"creditAssignment": {"mode": "prm"}}),
        "spec.algorithm.creditAssignment.mode",
        "prm needs reward.processReward.enabled",
        True,
    ),
    (
        "process-reward-one-source",
        with_spec(reward={"processReward": {"enabled": True}}),
        "spec.reward.processReward.function",
        "exactly one of function or modelUri",
        True,
    ),
    (
        "group-baseline-needs-two",
        with_spec(algorithm={"name": "rloo", "groupSize": 1}, training={"trajectoriesPerStep": 4}),
        "spec.algorithm.groupSize",
        "rloo baselines within a group: must be >= 2, got 1",
        True,
    ),
    (
        "partial-rollouts-need-async",
        with_spec(rollout={"partialRollouts": True}),
        "spec.rollout.partialRollouts",
        "needs training.mode async",
        True,
    ),
    (
        "drain-timeout-not-with-partial-rollouts",
        with_spec(training={"mode": "async"}, rollout={"partialRollouts": True, "updateDrainTimeout": "5s"}),
        "spec.rollout.updateDrainTimeout",
        "with partialRollouts nothing waits",
        True,
    ),
    (
        "breaker-above-target",
        with_spec(limits={"maxSteps": 10}, training={"totalSteps": 100}),
        "spec.limits.maxSteps",
        "must be >= training.totalSteps (100)",
        True,
    ),
    (
        "task-count-sizes-builtin-suites",
        with_spec(environment={"tasks": {"uri": "s3://suites/tasks.jsonl", "count": 600}}),
        "spec.environment.tasks.count",
        "count (600) sizes a built-in suite; with uri set",
        True,
    ),
    (
        "warm-up-landing-min-max",
        with_spec(training={"warmup": {"demonstrations": "d.jsonl", "landing": {"min": 0.5, "max": 0.2}}}),
        "spec.training.warmup.landing.max",
        "must be at least min (0.5), got 0.2",
        True,
    ),
    (
        "turn-within-trajectory-timeout",
        with_spec(environment={"turnTimeout": "2h", "trajectoryTimeout": "30m"}),
        "spec.environment.turnTimeout",
        "must not exceed trajectoryTimeout (30m)",
        False,
    ),
]

OPENAPI = rljob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _all_rules() -> int:
    seen, pending, count = set(), [ApiModel], 0
    while pending:
        cls = pending.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                pending.append(sub)
                count += len(sub.__dict__.get("cross_field_rules", ()))
    return count


def test_every_rule_is_in_the_table():
    assert len(BROKEN) == _all_rules()


def test_the_valid_base_breaks_no_rule():
    assert validate_document(BASE_MANIFEST, "base").ok
    assert cel_violations(OPENAPI, apply_defaults(OPENAPI, BASE_MANIFEST)) == []


@pytest.mark.parametrize(("rule", "doc", "path", "words", "has_cel"), BROKEN, ids=[b[0] for b in BROKEN])
def test_pydantic_rejects_with_path_and_message(rule, doc, path, words, has_cel):
    result = validate_document(doc, "job.yaml")
    assert not result.ok
    assert [(p.path, words in p.message) for p in result.problems] == [(path, True)], result.problems


@pytest.mark.parametrize(("rule", "doc", "path", "words", "has_cel"), BROKEN, ids=[b[0] for b in BROKEN])
def test_cel_rejects_the_same_manifest(rule, doc, path, words, has_cel):
    violations = cel_violations(OPENAPI, apply_defaults(OPENAPI, doc))
    if not has_cel:
        assert violations == []  # enforced by kuberl validate and the operator only
        return
    assert [v[0] for v in violations] == ["." + path]
