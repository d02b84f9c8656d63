"""kopf registration, nothing else: each handler hands its work to kuberl_operator.reconcile.

Run with `kuberl operator` (or `kopf run --standalone -A` on this file). Level-based: a timer per job
observes the children and drives the state machine; create/update/resume apply the desired objects.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import kopf
from pydantic import ValidationError

from kuberl.api import env_vars
from kuberl.api.status import TERMINAL_PHASES, RLJobStatus
from kuberl.crd import GROUP, PLURAL, VERSION
from kuberl.kube import Kube
from kuberl_operator import observe as observe_pods
from kuberl_operator import operator_metrics as metrics
from kuberl_operator import reconcile
from kuberl_operator.lifecycle import Event
from kuberl_operator.meta import JOB_LABEL

# Seconds between observations of a job; tests shorten it.
INTERVAL_S = float(os.environ.get(env_vars.OPERATOR_INTERVAL, "3"))
# Deletion retries before the finalizer is released anyway: a job must never be stuck deleting.
DELETE_RETRIES = 3
# `kuberl operator --metrics-port` (0: no metrics server)
METRICS_PORT = int(os.environ.get(env_vars.OPERATOR_METRICS_PORT, "0"))
# Spot detection and preemption notices read nodes: off where the operator may not list them (the node
# index must fill before any handler runs, so a forbidden list would stall the operator).
WATCH_NODES = os.environ.get(env_vars.OPERATOR_WATCH_NODES, "1") == "1"
RLJOBS = (GROUP, VERSION, PLURAL)
_kube: Kube | None = None
# kopf runs a job's timer and its event handlers concurrently; both read the phase and write children, so
# one job's work is serialised (a scale-down must not be overwritten by an apply that read the phase before).
_job_locks: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
_job_locks_guard = threading.Lock()  # two first uses of a job in two threads must not make two locks


def _lock(body: kopf.Body) -> threading.Lock:
    with _job_locks_guard:
        return _job_locks[body["metadata"]["namespace"], body["metadata"]["name"]]


def kube() -> Kube:
    global _kube
    if _kube is None:
        _kube = Kube.from_environment()
    return _kube


def _poster(body: kopf.Body, logger: kopf.Logger):
    def post(event: Event) -> None:
        try:
            reconcile.post_event(kube(), dict(body), event, _now())
        except Exception as err:  # an event is a courtesy: losing one must not fail the reconciliation
            logger.warning("could not post event %s: %s", event.reason, err)

    return post


def _now() -> datetime:
    return datetime.now(UTC)  # the only clock the operator reads


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    # a watch that silently stops delivering events is kopf's known failure mode: bound every request
    settings.watching.server_timeout = int(os.environ.get(env_vars.WATCH_SERVER_TIMEOUT, "300"))
    settings.watching.client_timeout = settings.watching.server_timeout + 30
    settings.watching.connect_timeout = 30
    # kopf's bookkeeping in annotations under our prefix, so the status holds only RLJobStatus fields
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=reconcile.KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=reconcile.KOPF_PREFIX)
    if METRICS_PORT:
        metrics.serve(METRICS_PORT)
    settings.posting.level = logging.WARNING  # events come from the state machine, not from kopf's logs
    # the handlers block on HTTP: with the default pool (cores + 4 threads) a burst of new jobs queues
    settings.execution.max_workers = int(os.environ.get(env_vars.OPERATOR_WORKERS, "32"))
    kube()


@kopf.index("pods", labels={JOB_LABEL: kopf.PRESENT})
def pods_by_job(body: kopf.Body, namespace: str, labels: kopf.Labels, **_: Any) -> dict[tuple[str, str], Any]:
    """Every job's pods, kept current by one watch: observing a thousand jobs then lists nothing."""
    return {(namespace, labels[JOB_LABEL]): observe_pods.pod_summary(dict(body))}


if WATCH_NODES:

    @kopf.index("nodes")
    def nodes_by_name(body: kopf.Body, name: str, **_: Any) -> dict[str, observe_pods.NodeCapacity]:
        """Spot or not, and preemption notices, of every node (one watch; needs list/watch on nodes)."""
        return {name: observe_pods.node_capacity(dict(body))}


@kopf.on.create(*RLJOBS)
def create(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    with metrics.timed("create"):
        _apply(body, logger, new=True)


@kopf.on.resume(*RLJOBS)
@kopf.on.update(*RLJOBS, field="spec")
def apply(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    with metrics.timed("apply"):
        _apply(body, logger, new=False)


def _apply(body: kopf.Body, logger: kopf.Logger, new: bool) -> None:
    post = _poster(body, logger)
    _export(body, reconcile.current_status(dict(body)))
    try:
        reconcile.parse_job(dict(body))
    except ValidationError as err:
        _export(body, reconcile.fail_invalid(kube(), dict(body), err, _now(), post))
        return
    with _lock(body):
        written = reconcile.apply_job(kube(), dict(body), _now(), post, new=new)
    if written:
        logger.info("applied %s", ", ".join(written))


@kopf.timer(*RLJOBS, interval=INTERVAL_S, initial_delay=0.1)
def observe(body: kopf.Body, memo: kopf.Memo, pods_by_job: kopf.Index, logger: kopf.Logger, **kwargs: Any) -> None:
    if reconcile.current_status(dict(body)).phase in TERMINAL_PHASES:
        _export(body, reconcile.current_status(dict(body)))
        return  # finished (or failed as invalid): nothing left to observe
    try:
        reconcile.parse_job(dict(body))
    except ValidationError:
        return  # the create handler fails it with InvalidSpec
    memory = memo.setdefault("job", reconcile.Memory())
    pods = list(pods_by_job.get((body["metadata"]["namespace"], body["metadata"]["name"]), []))
    with metrics.timed("observe"), _lock(body):
        nodes = {name: info for name, (info, *_) in kwargs.get("nodes_by_name", {}).items()}
        status = reconcile.drive(kube(), dict(body), pods, memory, _now(), _poster(body, logger), nodes)
        if (
            wanted := reconcile.autoscale_sandbox(
                kube(), dict(body), pods, memory, _poster(body, logger), time.monotonic()
            )
        ) is not None:
            status = status.model_copy(update={"sandbox_replicas": wanted})
    _export(body, status)


@kopf.on.delete(*RLJOBS, retries=DELETE_RETRIES, backoff=1)
def delete(body: kopf.Body, retry: int, logger: kopf.Logger, **_: Any) -> None:
    metrics.jobs.forget(body["metadata"]["namespace"], body["metadata"]["name"])
    try:
        with metrics.timed("delete"), _lock(body):
            gone = reconcile.clean_up(kube(), dict(body))
        with _job_locks_guard:
            _job_locks.pop((body["metadata"]["namespace"], body["metadata"]["name"]), None)
    except ValidationError:
        return  # never applied: nothing to clean up
    except Exception as err:
        if retry + 1 >= DELETE_RETRIES:
            logger.error("giving up cleaning up after %d tries, releasing the job: %s", retry + 1, err)
            return
        raise kopf.TemporaryError(f"cleaning up: {err}", delay=1) from err
    logger.info("deleted %s", ", ".join(gone) or "nothing")


def _export(body: kopf.Body, status: RLJobStatus) -> None:
    try:
        spec = reconcile.parse_job(dict(body)).spec
    except ValidationError:
        spec = None  # an invalid job: its status says so, its thresholds are unknown
    metrics.jobs.observe(body["metadata"]["namespace"], body["metadata"]["name"], status, spec)
