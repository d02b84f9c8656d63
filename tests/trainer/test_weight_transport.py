"""Which weight transport a job gets (spec.rollout.weightSync)."""

from __future__ import annotations

from kuberl.api.spec import WeightSyncSpec
from kuberl_trainer.weight_transport import HttpBuckets, StoredWeights, transport_for


def test_http_is_the_default_and_storage_defaults_to_the_checkpoint_prefix(tmp_path):
    assert isinstance(transport_for(WeightSyncSpec(), str(tmp_path)), HttpBuckets)
    stored = transport_for(WeightSyncSpec(transport="storage"), f"{tmp_path}/checkpoints/")
    assert isinstance(stored, StoredWeights) and stored.uri == f"{tmp_path}/checkpoints/weights"
    chosen = transport_for(WeightSyncSpec(transport="storage", uri=f"file://{tmp_path}/w"), "s3://unused/prefix")
    assert isinstance(chosen, StoredWeights) and chosen.uri == f"file://{tmp_path}/w"
