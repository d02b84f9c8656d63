"""`kuberl run` with its rollout servers preempted one after the other (a spot reclaim's notice: SIGTERM,
then a replacement): training goes on while each replacement starts, every step is trained once with every
trajectory, and no preemption spends the retry budget. End to end on CPU with real sandbox, vLLM rollout and
learner processes."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import pytest
import yaml
from helpers.tiny_job import tiny_job_spec

from kuberl.api.rljob import RLJob
from kuberl_app.one_machine.progress import ProgressPrinter
from kuberl_app.one_machine.runner import run_job
from recipes.swe_toy.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow
AFTER_RETURN = 3  # steps trained on both replacements before the test stops the job
TOTAL_STEPS = 2_000  # a bound never reached: the test stops the job once both replacements served


def test_preempted_rollout_servers_cost_no_step_and_no_trajectory(tmp_path):
    """The job runs until both replacements are back and have served AFTER_RETURN steps, then is stopped
    as a user would (SIGTERM to `kuberl run`): how many steps a vLLM start takes depends on the machine's load,
    so the test waits for the events rather than counting on a number of steps."""
    model = build_tiny_model(tmp_path / "model", hidden_size=64, layers=2, seed=4)
    spec = tiny_job_spec(
        model,
        training={"totalSteps": TOTAL_STEPS},
        rollout={"replicas": 2},
        limits={"retryBudget": 0, "maxWallClock": "15m"},
    )
    manifest = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "spot"}, "spec": spec}
    path = tmp_path / "spot.yaml"
    path.write_text(yaml.safe_dump(manifest))
    preempted: dict[int, str] = {}
    both_back: list[int] = []

    def reclaim(line: dict, supervisor) -> None:
        """rollout-0 at step 2; rollout-1 at the first step after rollout-0's replacement is serving; a stop
        AFTER_RETURN steps after rollout-1's replacement is serving."""
        ready = Counter(e["process"] for e in supervisor.events if e["event"] == "ready")
        if not preempted and line["step"] >= 2:
            preempted[line["step"]] = "rollout-0"
            supervisor.preempt("rollout-0")
        elif len(preempted) == 1 and ready["rollout-0"] == 2:
            preempted[line["step"]] = "rollout-1"
            supervisor.preempt("rollout-1")
        elif len(preempted) == 2 and ready["rollout-1"] == 2 and not both_back:
            both_back.append(line["step"])
        elif both_back and line["step"] == both_back[0] + AFTER_RETURN:
            os.kill(os.getpid(), signal.SIGTERM)  # `kuberl run`'s handler: a final checkpoint, then stop

    started = time.monotonic()
    record = run_job(
        RLJob.from_manifest(manifest), path, tmp_path / "run", str(model), out=ProgressPrinter(), on_step=reclaim
    )
    assert record.phase == "Stopped" and "stopped by SIGTERM" in record.message, (record.phase, record.message)
    # retryBudget 0: a single restart counted as a failure would have failed the job
    assert not any(record.restarts.values()), record.restarts
    assert record.preemptions == {"rollout": 2}
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, record.step + 1))  # every step once, none redone
    assert record.step >= both_back[0] + AFTER_RETURN  # trained on both replacements
    assert all(line["trajectories"] == 4 for line in lines)  # every trajectory of every step trained
    events = [(e["process"], e["event"]) for e in record.events]
    assert [p for p, e in events if e == "preempted"] == list(preempted.values()) == ["rollout-0", "rollout-1"]
    for server in preempted.values():  # each came back
        assert events.count((server, "started")) == 2 and events.count((server, "ready")) == 2
    resubmitted = sum(line["resubmitted"] for line in lines)
    print(
        f"preempted at steps {list(preempted)}, both back by step {both_back[0]}, stopped at {record.step}; "
        f"{resubmitted} groups re-submitted, {time.monotonic() - started:.0f} s"
    )
