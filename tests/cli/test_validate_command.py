"""`kuberl validate`: exit 0 and one line per valid document; exit 2 and one line per problem naming the
document and field; never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import BASE_MANIFEST, EXAMPLES
from helpers.kuberl_cli import kuberl, kuberl_here

from recipes.swe_toy.tiny_model import build_tiny_model


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def manifest_with(**spec) -> str:
    return yaml.safe_dump({**BASE_MANIFEST, "spec": {**BASE_MANIFEST["spec"], **spec}})


def test_every_example_is_valid():
    result = kuberl_here("validate", *map(str, EXAMPLES))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("is valid") == len(EXAMPLES) >= 3


def test_version():
    result = kuberl("--version")
    assert result.returncode == 0 and result.stdout.startswith("kuberl 0.")


# (case, file content or None for a missing file, expected line fragments)
BAD = [
    ("missing-file", None, ["file not found"]),
    ("not-yaml", "spec: [unclosed\n", ["not valid YAML: line 2"]),
    ("empty", "# nothing\n", ["no YAML documents"]),
    ("not-a-mapping", "- a\n- b\n", ["expected a mapping (an RLJob manifest), got a list"]),
    (
        "wrong-kind",
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n",
        ["kind: expected 'RLJob', got 'Deployment'", "apiVersion: expected 'kuberl.io/v1alpha1', got 'apps/v1'"],
    ),
    (
        "wrong-api-version",
        yaml.safe_dump({**BASE_MANIFEST, "apiVersion": "kuberl.io/v1"}),
        ["apiVersion: expected 'kuberl.io/v1alpha1', got 'kuberl.io/v1'"],
    ),
    ("missing-name", yaml.safe_dump({**BASE_MANIFEST, "metadata": {}}), ["metadata.name: required field is missing"]),
    (
        "bad-name",
        yaml.safe_dump({**BASE_MANIFEST, "metadata": {"name": "My_Job"}}),
        ["metadata.name: must be lowercase letters, digits and '-'"],
    ),
    (
        "unknown-field",
        manifest_with(sandbox={"maxReplica": 3}),
        ["spec.sandbox.maxReplica: unknown field 'maxReplica'; did you mean 'maxReplicas'?"],
    ),
    ("unknown-section", manifest_with(trainer={}), ["spec.trainer: unknown field 'trainer'; did you mean 'training'?"]),
    (
        "wrong-type",
        manifest_with(training={"totalSteps": "many"}),
        ["spec.training.totalSteps: expected a valid integer, got 'many'"],
    ),
    ("section-not-mapping", manifest_with(limits=5), ["spec.limits: expected a mapping, got int 5"]),
    ("out-of-range", manifest_with(sandbox={"maxReplicas": 0}), ["spec.sandbox.maxReplicas: must be >= 1, got 0"]),
    (
        "bad-enum",
        manifest_with(algorithm={"name": "dpo"}),
        ["spec.algorithm.name: expected 'grpo', 'rloo' or 'ppo', got 'dpo'"],
    ),
    (
        "bad-duration",
        manifest_with(limits={"maxWallClock": "forever"}),
        ["spec.limits.maxWallClock: expected a duration such as '90s', '30m', '36h'"],
    ),
    (
        "bad-uri-scheme",
        manifest_with(model={"uri": "gs://bucket/model"}),
        ["spec.model.uri: unsupported URI scheme 'gs://'"],
    ),
    (
        "bad-quantity",
        manifest_with(learner={"resources": {"limits": {"memory": "lots"}}}),
        ["spec.learner.resources.limits.memory: expected a Kubernetes quantity"],
    ),
    (
        "float-quantity",
        manifest_with(sandbox={"session": {"cpu": 0.5}}),
        ["spec.sandbox.session.cpu: write fractional quantities as strings, such as '0.5'"],
    ),
    (
        "bad-list-item",
        manifest_with(scheduling={"learner": {"tolerations": [{"operator": "Maybe"}]}}),
        ["spec.scheduling.learner.tolerations[0].operator: expected 'Exists' or 'Equal', got 'Maybe'"],
    ),
    (
        "cross-field",
        manifest_with(sandbox={"minReplicas": 4, "maxReplicas": 2}),
        ["spec.sandbox.maxReplicas: must be >= minReplicas (4), got 2"],
    ),
    # what the schema lets through but a run would refuse: refused here, naming what is known
    (
        "unknown-reward",
        manifest_with(reward={"function": "exact-match"}),
        ["spec.reward.function: unknown reward 'exact-match': registered rewards are openenv-return, swe-bench"],
    ),
    (
        "reward-that-does-not-import",
        manifest_with(reward={"function": "my_rewards:score"}),
        ["spec.reward.function: reward 'my_rewards:score': cannot import module 'my_rewards'"],
    ),
    (
        "process-reward-model",
        manifest_with(reward={"processReward": {"enabled": True, "modelUri": "s3://models/prm"}}),
        ["spec.reward.processReward.modelUri: process reward models are not supported yet"],
    ),
    (
        "unknown-environment",
        manifest_with(environment={"name": "my-env"}),
        ["spec.environment.name: unknown environment 'my-env': built-in ones are swe-bench, swe-toy, or openenv:"],
    ),
    (
        "hub-id-model",
        manifest_with(model={"uri": "Qwen/Qwen3-8B"}),
        ["spec.model.uri: 'Qwen/Qwen3-8B' looks like a Hugging Face model id, and KubeRL reads models from a folder"],
    ),
]


@pytest.mark.parametrize(("case", "text", "expected"), BAD, ids=[b[0] for b in BAD])
def test_bad_manifest_gets_one_line_per_problem(tmp_path, case, text, expected):
    path = str(tmp_path / f"{case}.yaml") if text is None else write(tmp_path, f"{case}.yaml", text)
    result = kuberl_here("validate", path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if not line.endswith("invalid")]
    assert len(lines) == len(expected), lines
    for line, fragment in zip(lines, expected, strict=True):
        assert line.startswith(path + ": ") and fragment in line, (line, fragment)


def test_every_bad_row_of_a_local_task_file_is_named_by_line_and_field(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    good = '{"taskId": "a", "prompt": "p", "files": {"x.py": "1"}}'
    tasks.write_text(f'{good}\n{{"taskId": "b", "prompt": "p", "files": {{"../x.py": "1"}}}}\nnot json\n{good}\n')
    path = write(tmp_path, "job.yaml", manifest_with(environment={"tasks": {"uri": str(tasks)}}))
    result = kuberl_here("validate", path)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if "tasks.uri" in line]
    assert [line.split(f"{tasks} ")[1].split(":")[0] for line in lines] == ["line 2", "line 3", "line 4"], lines
    assert "files" in lines[0] and "'../x.py'" in lines[0] and "not valid JSON" in lines[1]
    assert "taskId: duplicate 'a', first on line 1" in lines[2]


def test_numbers_are_read_as_kubectl_reads_them(tmp_path):
    text = manifest_with() + "  training: {learningRate: 1e-6, totalSteps: 10}\n"
    result = kuberl_here("validate", write(tmp_path, "job.yaml", text))
    assert result.returncode == 0, result.stderr


def test_many_documents_are_reported_each_by_number(tmp_path):
    good = yaml.safe_dump(BASE_MANIFEST)
    bad = manifest_with(training={"seed": -1})
    path = write(tmp_path, "stream.yaml", f"{good}---\n{bad}---\n{good}")
    result = kuberl_here("validate", path)
    assert result.returncode == 2
    assert f"{path}#1: RLJob 'unit' is valid" in result.stdout
    assert f"{path}#3: RLJob 'unit' is valid" in result.stdout
    assert f"{path}#2: spec.training.seed: must be >= 0, got -1" in result.stderr
    assert "1 of 3 document(s) invalid" in result.stderr


def test_reads_stdin_and_quiet_prints_nothing_for_valid_documents():
    result = kuberl_here("validate", "--quiet", "-", stdin=yaml.safe_dump(BASE_MANIFEST))
    assert result.returncode == 0 and result.stdout == "" and result.stderr == ""


def test_no_arguments_is_a_usage_error():
    result = kuberl_here("validate")
    assert result.returncode == 2 and "Missing argument" in result.stderr


@pytest.mark.slow  # builds a model, then starts every entrypoint
def test_a_model_folder_without_weights_is_a_clear_error_for_every_entrypoint(tmp_path):
    build_tiny_model(tmp_path / "tiny", hidden_size=64, layers=1, heads=2)
    (tmp_path / "tiny" / "model.safetensors").unlink()
    job = tmp_path / "job.yaml"
    job.write_text(
        f"apiVersion: kuberl.io/v1alpha1\nkind: RLJob\nmetadata: {{name: w}}\n"
        f"spec: {{model: {{uri: {tmp_path / 'tiny'}}}}}\n"
    )
    for argv in (
        ["learner", str(job), "--rollout-url", "http://127.0.0.1:9", "--run-dir", str(tmp_path / "run")],
        ["run", str(job), "--run-dir", str(tmp_path / "run2")],
        ["rollout-server", str(job), "--sandbox-url", "http://127.0.0.1:9"],
    ):
        # the rollout server needs its tokens to get that far
        result = kuberl(*argv, env={"KUBERL_SANDBOX_TOKEN": "t", "KUBERL_JOB_TOKEN": "j"})
        assert result.returncode == 2, result.stderr
        assert "no model weights" in result.stderr and str(tmp_path / "tiny") in result.stderr
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "run2").exists()  # nothing was started or written


def _instance(instance_id: str, **extra: object) -> str:
    row = {
        "instance_id": instance_id,
        "repo": "octo/lib",
        "base_commit": "abcdef1",
        "test_patch": "diff --git a/t.py b/t.py\n",
        "problem_statement": "it breaks",
        "FAIL_TO_PASS": ["tests/test_a.py::test_b"],
        **extra,
    }
    return json.dumps(row) + "\n"


def test_an_image_template_naming_a_field_the_instances_lack_is_named(tmp_path):
    instances = tmp_path / "instances.jsonl"
    instances.write_text(_instance("octo__lib-1") + _instance("octo__lib-2"))
    swe = {"name": "swe-bench", "tasks": {"uri": str(instances)}}
    job = manifest_with(
        environment=swe, reward={"function": "swe-bench-resolved"}, sandbox={"imageTemplate": "reg/{image_tag}"}
    )
    result = kuberl_here("validate", write(tmp_path, "job.yaml", job))
    assert result.returncode == 2, result.stderr
    assert "spec.sandbox.imageTemplate" in result.stderr and "{image_tag}" in result.stderr, result.stderr
    assert "octo__lib-1" in result.stderr


def test_instances_without_images_need_the_mirror_and_with_images_do_not(tmp_path):
    instances = tmp_path / "instances.jsonl"
    instances.write_text(_instance("octo__lib-1") + _instance("octo__lib-2", image="reg/lib:2"))
    swe = {"name": "swe-bench", "tasks": {"uri": str(instances)}}
    without = kuberl_here(
        "validate", write(tmp_path, "a.yaml", manifest_with(environment=swe, reward={"function": "swe-bench-resolved"}))
    )
    assert without.returncode == 2 and "spec.environment.tasks.repos" in without.stderr, without.stderr
    assert "1 instance(s) name no image (octo__lib-1)" in without.stderr
    templated = manifest_with(
        environment=swe,
        reward={"function": "swe-bench-resolved"},
        sandbox={"imageTemplate": "docker.io/swebench/sweb.eval.x86_64.{swebench_id}:latest"},
    )
    result = kuberl_here("validate", write(tmp_path, "b.yaml", templated))
    assert result.returncode == 0, result.stderr
