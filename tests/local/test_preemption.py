"""`kuberl run` with its rollout servers preempted one after the other (a spot reclaim's notice: SIGTERM,
then a replacement): the job finishes the same steps, each once, with every trajectory trained, and no preemption
spends the retry budget. End to end on CPU with real sandbox, vLLM rollout and learner processes."""

from __future__ import annotations

import json
import time

import pytest
import yaml
from helpers.tiny_job import tiny_job_spec

from kuberl.api.rljob import RLJob
from kuberl.local.progress import ProgressPrinter
from kuberl.local.runner import run_job
from kuberl.modeling.tiny import build_tiny_model

pytestmark = pytest.mark.slow
STEPS = 40  # enough that both servers are preempted, one after the other's replacement is back


def test_preempted_rollout_servers_cost_no_step_and_no_trajectory(tmp_path):
    model = build_tiny_model(tmp_path / "model", hidden_size=64, layers=2, seed=4)
    spec = tiny_job_spec(model, training={"totalSteps": STEPS}, rollout={"replicas": 2}, limits={"retryBudget": 0})
    manifest = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "spot"}, "spec": spec}
    path = tmp_path / "spot.yaml"
    path.write_text(yaml.safe_dump(manifest))
    preempted: dict[int, str] = {}

    def reclaim(line: dict, supervisor) -> None:
        """rollout-0 at step 2; rollout-1 at the first step after rollout-0's replacement is serving."""
        ready = sum(1 for e in supervisor.events if (e["process"], e["event"]) == ("rollout-0", "ready"))
        if not preempted and line["step"] >= 2:
            preempted[line["step"]] = "rollout-0"
        elif len(preempted) == 1 and ready == 2:
            preempted[line["step"]] = "rollout-1"
        else:
            return
        supervisor.preempt(preempted[line["step"]])

    started = time.monotonic()
    record = run_job(
        RLJob.from_manifest(manifest), path, tmp_path / "run", str(model), out=ProgressPrinter(), on_step=reclaim
    )
    assert (record.phase, record.reason, record.step) == ("Succeeded", "Completed", STEPS), record.message
    # retryBudget 0: a single restart counted as a failure would have failed the job
    assert not any(record.restarts.values()), record.restarts
    assert record.preemptions == {"rollout": 2}
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))  # every step once, none redone
    assert all(line["trajectories"] == 4 for line in lines)  # every trajectory of every step trained
    events = [(e["process"], e["event"]) for e in record.events]
    assert [p for p, e in events if e == "preempted"] == list(preempted.values()) == ["rollout-0", "rollout-1"]
    assert max(preempted) < STEPS - 1, preempted  # both while training went on
    for server in preempted.values():  # each came back
        assert events.count((server, "started")) == 2 and events.count((server, "ready")) == 2
    resubmitted = sum(line["resubmitted"] for line in lines)
    print(f"{len(preempted)} preemptions, {resubmitted} groups re-submitted, {time.monotonic() - started:.0f} s")
