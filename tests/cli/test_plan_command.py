"""`kuberl plan`: the memory arithmetic on a config small enough to check by hand, FSDP sharding, activation
checkpointing, the rollout KV cache, the verdict against the requested resources, the table and JSON, exit
2 on bad input; and `kuberl validate`'s warning when a job cannot fit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from helpers.kuberl_cli import kuberl, kuberl_here

from kuberl.api.spec import RLJobSpec
from kuberl.planning import PlanError, model_shape_from_config, plan_memory, quantity_bytes, read_model_shape

# hidden 8, 2 layers, 2 query heads and 1 key/value head of width 4, MLP 16, vocabulary 32, untied
CONFIG = {
    "hidden_size": 8,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
    "intermediate_size": 16,
    "vocab_size": 32,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}
SHAPE = model_shape_from_config(CONFIG)
CPU_POD = {"requests": {"cpu": 1, "memory": "1Gi"}}


def spec_doc(**overrides) -> dict:
    """A CPU job of 8 trajectories of 256 tokens per step on one learner rank, with sections overridden."""
    doc = {
        "model": {"uri": "unused", "maxContextTokens": 256},
        "environment": {"maxTokensPerTrajectory": 256},
        "algorithm": {"groupSize": 2},
        "training": {"trajectoriesPerStep": 8},
        "learner": {"replicas": 1, "resources": CPU_POD},
        "rollout": {"resources": CPU_POD},
    }
    for section, values in overrides.items():
        doc[section] = {**doc.get(section, {}), **values}
    return doc


def spec(**overrides) -> RLJobSpec:
    return RLJobSpec.model_validate(spec_doc(**overrides))


def test_parameters_of_a_known_config():
    # block: q 8x8 + k, v 8x4 each + o 8x8 + MLP 3x8x16 + two norms 8 = 592; root: 2 x 32x8 + norm 8 = 520
    assert SHAPE.block_parameters == 592 and SHAPE.root_parameters == 520
    assert SHAPE.parameters == 2 * 592 + 520 == 1704
    # saved per token and block: norms 4x8, attention 3x8 + 2x4, MLP 4x16
    assert SHAPE.block_activation_elements() == 128


def test_learner_bytes_of_a_known_config():
    learner = plan_memory(spec(), SHAPE).learner
    # the mini-batch (8 rows of 256) is within the default budget: one micro-batch of 2048 tokens, one chunk
    assert (learner.device, learner.mini_batch_rows, learner.micro_batch_tokens) == ("cpu", 8, 2048)
    assert learner.budget_is_default and learner.chunk_tokens == 2048
    assert (learner.weights, learner.gradients, learner.optimizer, learner.gathered) == (6816, 6816, 13632, 0)
    # 8 rows x 256 tokens x (2 blocks x 128 + final norm 16) x 4 bytes
    assert learner.activations_without_checkpointing == 8 * 256 * 272 * 4 == 2_228_224
    # block inputs 2 x 8 + one block recomputed 128 + final norm 16
    assert learner.activations_with_checkpointing == 8 * 256 * 160 * 4 == 1_310_720
    # one chunk (the whole micro-batch here): log-softmax, the entropy's or the backward's two copies, float32
    assert learner.logits == 8 * 256 * 32 * 12 == 786_432
    assert learner.gradient_free_pass == 0 and learner.reference == 0
    # checkpointing is on by default: block inputs and final norm (8 x 256 x 32 x 4), then the larger of the
    # chunk's copies and the one block recomputed in the backward (1_048_576 here)
    assert learner.peak == 27_264 + 262_144 + 1_048_576
    assert learner.budget == 1024**3 and learner.fits


def test_fsdp_divides_the_states_by_the_world_size_and_gathers_units():
    one = plan_memory(spec(), SHAPE).learner
    two = plan_memory(spec(learner={"replicas": 2}), SHAPE).learner
    assert (two.weights, two.gradients, two.optimizer) == (3408, 3408, 6816)
    assert two.mini_batch_rows == 4 and two.logits == one.logits // 2  # each rank trains half the rows
    # the root unit and two blocks whole, and the root's and a block's gradients until reduced, float32 on CPU
    assert two.gathered == (2 * 520 + 3 * 592) * 4


def test_activation_checkpointing_reduces_activations_and_the_peak():
    on = plan_memory(spec(), SHAPE).learner
    off = plan_memory(spec(learner={"fsdp": {"activationCheckpointing": False}}), SHAPE).learner
    assert (
        on.activations == on.activations_with_checkpointing < off.activations == off.activations_without_checkpointing
    )
    assert off.peak - on.peak == (2_228_224 + 786_432) - (262_144 + 1_048_576)
    # a wider vocabulary: the logits outweigh the recomputed block and the peak holds the logits, not both
    wide = plan_memory(spec(), model_shape_from_config({**CONFIG, "vocab_size": 64})).learner
    assert wide.logits == 2 * 786_432 and wide.peak == 4 * 4 * (2 * 592 + 1032) + 262_144 + 2 * 786_432


def test_mini_batches_and_the_reference_model_add_a_gradient_free_pass():
    plain = plan_memory(spec(), SHAPE).learner
    kl = plan_memory(spec(algorithm={"groupSize": 2, "klCoef": 0.1}), SHAPE).learner
    assert kl.reference == 6816
    # a micro-batch without gradient: its final hidden states and one block's temporaries, one chunk's logits
    assert kl.gradient_free_pass == 2048 * (128 + 16) * 4 + 786_432
    assert plain.gradient_free_pass == 0  # no mini-batches, no reference, tis: no gradient-free pass runs
    mini = plan_memory(spec(training={"trajectoriesPerStep": 8, "miniBatches": 2}), SHAPE).learner
    assert mini.mini_batch_rows == 4 and mini.logits == plain.logits // 2
    assert mini.gradient_free_pass == 1024 * (128 + 16) * 4 + 786_432 // 2


def test_gpu_learner_uses_bfloat16_activations_and_the_gpu_memory():
    gpu = {"resources": {"limits": {"nvidia.com/gpu": 1}}}
    learner = plan_memory(spec(learner=gpu), SHAPE, gpu_memory=2 * 1024**3).learner
    assert learner.device == "gpu" and learner.budget == 2 * 1024**3
    assert learner.activations_with_checkpointing == 8 * 256 * 160 * 2
    assert learner.logits == 8 * 256 * 32 * 14  # three float32 copies and the bfloat16 logits' gradient
    offloaded = plan_memory(spec(learner={**gpu, "fsdp": {"cpuOffload": True}}), SHAPE).learner
    assert offloaded.host == 6816 * 4 and offloaded.peak == learner.peak - 6816 * 4


def test_rollout_kv_cache():
    rollout = plan_memory(spec(), SHAPE).rollout
    # 2 (k, v) x 2 layers x 1 kv head x 4 wide x 4 bytes (float32 on CPU) per token
    assert rollout.kv_bytes_per_token == 64
    assert (rollout.sequences, rollout.tokens_per_sequence) == (64, 256)
    assert rollout.kv_cache == 64 * 64 * 256 and rollout.need == rollout.kv_cache + 1704 * 4
    capped = plan_memory(spec(rollout={"concurrentSessions": 500, "engine": {"maxNumSeqs": 100}}), SHAPE).rollout
    assert capped.sequences == 100  # the engine runs at most maxNumSeqs at once
    gpu = plan_memory(spec(rollout={"resources": {"limits": {"nvidia.com/gpu": 1}}}), SHAPE, 1024**3).rollout
    assert gpu.kv_bytes_per_token == 32 and gpu.budget == int(0.9 * 1024**3)  # bfloat16, gpuMemoryUtilization


def test_a_job_that_does_not_fit_says_which_tier():
    small = {"resources": {"limits": {"memory": "100Ki"}}}
    plan = plan_memory(spec(learner=small), SHAPE)
    assert plan.fits is False and plan.learner.fits is False and plan.rollout.fits is True
    assert len(plan.problems()) == 1 and plan.problems()[0].startswith("learner needs")
    unknown = plan_memory(spec(learner={"resources": {"requests": {"cpu": 1}}}), SHAPE)
    assert unknown.learner.budget is None and unknown.fits is None and unknown.problems() == []


@pytest.mark.parametrize(("text", "value"), [("64Gi", 64 * 1024**3), ("500M", 5e8), (3, 3), ("1e3", 1000.0)])
def test_quantities(text, value):
    assert quantity_bytes(text) == value


def test_config_errors_name_the_file(tmp_path):
    with pytest.raises(PlanError, match=r"config.json: no such file"):
        read_model_shape(str(tmp_path))
    with pytest.raises(PlanError, match=r"gs://m/x/config.json: the plan reads a local folder, file:// or s3://"):
        read_model_shape("gs://m/x")
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(PlanError, match=r"config.json: no 'num_attention_heads'"):
        read_model_shape(str(tmp_path))


# ------------------------------------------------------------------------------------ the commands
def job_file(tmp_path: Path, learner_memory: str = "1Gi") -> str:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(CONFIG))
    doc = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "plan"},
        "spec": spec_doc(model={"uri": str(model)}, learner={"resources": {"limits": {"memory": learner_memory}}}),
    }
    path = tmp_path / f"job-{learner_memory}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_plan_prints_a_table_and_json(tmp_path):
    path = job_file(tmp_path)
    table = kuberl_here("plan", path)
    assert table.returncode == 0, table.stderr
    assert "activations, with checkpointing" in table.stdout and "fits, headroom" in table.stdout
    as_json = kuberl_here("plan", "--json", path)
    plan = json.loads(as_json.stdout)
    assert plan["parameters"] == 1704 and plan["fits"] is True
    assert plan["learner"]["peak"] == 27_264 + 262_144 + 1_048_576


def test_plan_exits_2_with_one_line_on_bad_input(tmp_path):
    missing = kuberl_here("plan", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and missing.stderr.strip().endswith("file not found")
    remote = kuberl_here("plan", job_file(tmp_path), "--model", "gs://models/x")
    assert remote.returncode == 2 and remote.stderr.count("\n") == 1 and "config.json" in remote.stderr
    assert "Traceback" not in missing.stderr + remote.stderr


def test_validate_warns_when_the_job_cannot_fit(tmp_path):
    tight = kuberl_here("validate", job_file(tmp_path, learner_memory="100Ki"))
    assert tight.returncode == 0 and "is valid" in tight.stdout
    assert "warning: does not fit: learner needs" in tight.stderr
    roomy = kuberl_here("validate", job_file(tmp_path))
    assert roomy.returncode == 0 and "warning" not in roomy.stderr


# ------------------------------------------------------------------------------ micro-batch budget
def test_the_micro_batch_holds_the_token_budget_and_a_longer_trajectory_alone():
    budgeted = plan_memory(spec(learner={"microBatchTokens": 512}), SHAPE).learner
    assert (budgeted.token_budget, budgeted.micro_batch_tokens, budgeted.budget_is_default) == (512, 512, False)
    assert budgeted.activations_with_checkpointing == 512 * 160 * 4  # a quarter of the whole mini-batch's
    # trajectories of 1024 tokens and a budget of 256: each trajectory is a micro-batch of its own
    long = {"maxContextTokens": 1024}
    alone = plan_memory(
        spec(model=long, environment={"maxTokensPerTrajectory": 1024}, learner={"microBatchTokens": 256}), SHAPE
    ).learner
    assert (alone.longest_trajectory, alone.micro_batch_tokens) == (1024, 1024)


def test_the_default_budget_is_the_largest_that_fills_nine_tenths_of_the_device():
    rows = {"trajectoriesPerStep": 4096}  # a mini-batch far larger than the device holds
    memory = {"resources": {"limits": {"memory": "64Mi"}}}
    learner = plan_memory(spec(training=rows, learner=memory), SHAPE).learner
    assert learner.budget_is_default and learner.micro_batch_tokens == learner.token_budget > 256
    assert learner.peak <= 0.9 * learner.budget
    larger = plan_memory(spec(training=rows, learner={**memory, "microBatchTokens": learner.token_budget + 512}), SHAPE)
    assert larger.learner.peak > 0.9 * learner.budget
    unknown = plan_memory(spec(training=rows, learner={"resources": {"requests": {"cpu": 1}}}), SHAPE).learner
    assert unknown.token_budget == 256  # no memory figure: one trajectory


def test_a_chunk_of_logits_is_what_one_float32_copy_fits_in_256_mib():
    wide = model_shape_from_config({**CONFIG, "vocab_size": 151936})
    learner = plan_memory(spec(), wide).learner
    # 441 tokens a chunk; with 8 rows a chunk is 55 positions of each, 440 tokens
    assert learner.chunk_tokens == 440 and learner.logits == 440 * 151936 * 12


def test_micro_batch_tokens_is_validated():
    with pytest.raises(ValueError, match=r"microBatchTokens|micro_batch_tokens"):
        spec(learner={"microBatchTokens": 100})


# ------------------------------------------------------------------------------ --check and s3
def test_check_exits_1_and_says_what_to_change(tmp_path):
    fits = kuberl_here("plan", "--check", job_file(tmp_path))
    assert fits.returncode == 0, fits.stderr
    doc = yaml.safe_load(Path(job_file(tmp_path, learner_memory="1Mi")).read_text())
    doc["spec"]["learner"]["microBatchTokens"] = 2048
    path = tmp_path / "tight.yaml"
    path.write_text(yaml.safe_dump(doc))
    tight = kuberl_here("plan", "--check", str(path))
    assert tight.returncode == 1 and "does not fit: learner needs" in tight.stderr
    budget = plan_memory(spec(learner={"resources": {"limits": {"memory": "1Mi"}}}), SHAPE).learner.token_budget
    assert f"to fit: set spec.learner.microBatchTokens to {budget} or fewer" in tight.stderr
    assert kuberl_here("plan", str(path)).returncode == 0  # without --check the table is all


@pytest.mark.slow
def test_plan_reads_config_json_from_s3_with_the_jobs_credentials(tmp_path):
    from helpers.seaweedfs import seaweedfs

    with seaweedfs() as s3:
        client = s3.client()
        client.create_bucket(Bucket="models")
        client.put_object(Bucket="models", Key="tiny/config.json", Body=json.dumps(CONFIG).encode())
        doc = yaml.safe_load(Path(job_file(tmp_path)).read_text())
        doc["spec"]["model"]["uri"] = "s3://models/tiny"
        doc["spec"]["checkpoint"] = {"uri": "s3://models/ckpt", "endpointUrl": s3.endpoint}
        path = tmp_path / "s3.yaml"
        path.write_text(yaml.safe_dump(doc))
        env = {**os.environ, "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_DEFAULT_REGION": "us-east-1"}
        good = kuberl("plan", "--json", str(path), env={**env, "AWS_SECRET_ACCESS_KEY": s3.secret_key})
        assert good.returncode == 0, good.stderr
        assert json.loads(good.stdout)["parameters"] == 1704
        wrong = kuberl("plan", str(path), env={**env, "AWS_SECRET_ACCESS_KEY": "wrong"})
        assert wrong.returncode == 2 and "s3://models/tiny/config.json: cannot read it" in wrong.stderr
        assert "AWS_SECRET_ACCESS_KEY" in wrong.stderr and "Traceback" not in wrong.stderr


# ------------------------------------------------------------------------------ the shipped examples
# config.json of the models the examples name (the published Qwen3 configs; the demo's tiny Llama as
# `python -m recipes.swe_toy tiny-model --hidden-size 128 --layers 2` writes it, vocabulary at most 2048;
# SmolLM2-135M-Instruct)
QWEN3 = {"num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "torch_dtype": "bfloat16"}
MODELS = {
    "Qwen3-0.6B": {
        **QWEN3,
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "intermediate_size": 3072,
        "tie_word_embeddings": True,
    },
    "Qwen3-4B": {
        **QWEN3,
        "hidden_size": 2560,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "intermediate_size": 9728,
        "tie_word_embeddings": True,
    },
    "Qwen3-8B": {
        **QWEN3,
        "hidden_size": 4096,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "intermediate_size": 12288,
        "tie_word_embeddings": False,
    },
    "smollm2-135m-instruct": {  # python -m kuberl.modeling.smollm writes it
        "hidden_size": 576,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "intermediate_size": 1536,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
    "tiny-llama": {
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 512,
        "vocab_size": 2048,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    },
}
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_every_shipped_example_fits_by_its_own_plan(example, tmp_path):
    uri = yaml.safe_load(example.read_text())["spec"]["model"]["uri"]
    names = [name for name in MODELS if name in uri]
    assert len(names) == 1, f"{example.name}: no config.json known for {uri}; add it to MODELS"
    (tmp_path / "config.json").write_text(json.dumps(MODELS[names[0]]))
    result = kuberl_here("plan", "--check", str(example), "--model", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "DOES NOT FIT" not in result.stdout
