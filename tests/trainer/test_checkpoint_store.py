"""The checkpoint store on a local folder and on a real S3 server (SeaweedFS): a manifest written last
marks a checkpoint complete; resume takes the newest complete one; bad input gets a clear error and
never touches the checkpoints already there."""

from __future__ import annotations

import json

import pytest
from helpers.seaweedfs import seaweedfs

from kuberl_trainer.checkpoints.store import MANIFEST, CheckpointError, CheckpointStore


@pytest.fixture(scope="module")
def s3():
    with seaweedfs() as server:
        server.client().create_bucket(Bucket="ckpt")
        yield server


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path, monkeypatch):
    if request.param == "local":
        return CheckpointStore(str(tmp_path / "ckpts"))
    server = request.getfixturevalue("s3")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return CheckpointStore(f"s3://ckpt/{tmp_path.name}/job", endpoint_url=server.endpoint)


def state_folder(tmp_path, step: int):
    folder = tmp_path / f"state-{step}"
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "__0_0.distcp").write_bytes(bytes([step % 256]) * (1000 + step))
    (folder / "extra.json").write_text(json.dumps({"step": step}))
    return folder


def test_save_resume_and_prune(store, tmp_path):
    for step in (10, 20, 30):
        store.save(step, policy_version=step, folder=state_folder(tmp_path, step))
    newest = store.newest()
    assert newest.step == 30 and newest.policy_version == 30
    restored = store.download(newest, tmp_path / "restored")
    assert (restored / "model" / "__0_0.distcp").read_bytes() == bytes([30]) * 1030
    assert store.prune(keep=2) == [10]
    assert [m.step for m in store.complete()] == [20, 30]


def test_incomplete_and_corrupt_checkpoints_are_ignored_and_left_alone(store, tmp_path):
    store.save(10, 10, state_folder(tmp_path, 10))
    store.save(20, 20, state_folder(tmp_path, 20))
    # step 30: uploaded files but no manifest (the learner died mid-upload)
    store.backend.put(f"{CheckpointStore.directory(30)}/model/__0_0.distcp", state_folder(tmp_path, 30) / "extra.json")
    # step 40: a manifest that does not parse; step 50: a manifest whose file is missing
    store.backend.write(f"{CheckpointStore.directory(40)}/{MANIFEST}", b"{not json")
    manifest = store.save(50, 50, state_folder(tmp_path, 50))
    store.backend.delete_dir(CheckpointStore.directory(50))
    store.backend.write(f"{CheckpointStore.directory(50)}/{MANIFEST}", manifest.to_json().encode())
    assert store.newest().step == 20
    assert store.prune(keep=5) == []  # nothing newer than the newest complete one is deleted
    assert [m.step for m in store.complete()] == [10, 20]
    restored = store.download(store.newest(), tmp_path / "back")
    assert json.loads((restored / "extra.json").read_text()) == {"step": 20}


def test_a_file_that_does_not_match_its_manifest_is_refused(store, tmp_path):
    manifest = store.save(10, 10, state_folder(tmp_path, 10))
    tampered = tmp_path / "tampered"
    tampered.write_bytes(bytes([99]) * 1010)  # same size, other bytes
    store.backend.put(f"{CheckpointStore.directory(10)}/model/__0_0.distcp", tampered)
    with pytest.raises(CheckpointError, match="does not match its manifest"):
        store.download(manifest, tmp_path / "out")


def test_bad_uris_and_credentials_get_clear_errors(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with pytest.raises(CheckpointError, match="use s3://bucket/prefix"):
        CheckpointStore("gs://bucket/x")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
    good = CheckpointStore("s3://ckpt/creds-test", endpoint_url=s3.endpoint)
    good.save(10, 10, state_folder(tmp_path, 10))
    with pytest.raises(CheckpointError, match="the bucket does not exist"):
        CheckpointStore("s3://no-such-bucket/x", endpoint_url=s3.endpoint).newest()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    wrong = CheckpointStore("s3://ckpt/creds-test", endpoint_url=s3.endpoint)
    with pytest.raises(CheckpointError, match="refused the credentials"):
        wrong.save(20, 20, state_folder(tmp_path, 20))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
    assert [m.step for m in CheckpointStore("s3://ckpt/creds-test", endpoint_url=s3.endpoint).complete()] == [10]


def test_an_empty_store_has_nothing_to_resume(store):
    assert store.newest() is None and store.prune(keep=1) == []


def test_a_policy_export_is_stored_beside_the_checkpoints_and_never_taken_for_one(store, tmp_path):
    export = tmp_path / "policy"
    export.mkdir()
    (export / "model.safetensors").write_bytes(b"weights")
    (export / "config.json").write_text("{}")
    store.save(5, policy_version=5, folder=state_folder(tmp_path, 5))
    uri = store.upload_export(export)
    assert uri == f"{store.uri}/policy"
    assert store.backend.list_files("policy") == {"config.json": 2, "model.safetensors": 7}
    assert [m.step for m in store.complete()] == [5]
    assert store.prune(keep=1) == []
