"""kopf registration, nothing else: each handler hands its work to kuberl_operator.reconcile.

`register(config)` puts the handlers on a kopf registry, bound to the operator's configuration (the
observation interval, the node watch, ...); `kuberl operator` builds that configuration and runs kopf with
the registry. Level-based: a timer per job observes the children and drives the state machine;
create/update/resume apply the desired objects.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import kopf
from pydantic import ValidationError

from kuberl.api.status import TERMINAL_PHASES, RLJobStatus
from kuberl.crd import GROUP, PLURAL, VERSION
from kuberl.kube import Kube
from kuberl_operator import observe as observe_pods
from kuberl_operator import operator_metrics as metrics
from kuberl_operator import reconcile
from kuberl_operator.config import OperatorConfig
from kuberl_operator.lifecycle import Event
from kuberl_operator.meta import JOB_LABEL

# Deletion retries before the finalizer is released anyway: a job must never be stuck deleting.
DELETE_RETRIES = 3
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


def register(config: OperatorConfig, registry: kopf.OperatorRegistry | None = None) -> kopf.OperatorRegistry:
    """Every handler on `registry` (a new one by default), those that need it bound to `config`."""
    registry = registry or kopf.OperatorRegistry()
    bound = functools.partial  # kopf names a partial's handler after its function: the ids stay the same
    # credentials as Kube.from_environment finds them (kopf adds this login only to its default registry)
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.on.startup(registry=registry)(bound(configure, config=config))
    kopf.index("pods", labels={JOB_LABEL: kopf.PRESENT}, registry=registry)(pods_by_job)
    if config.watch_nodes:
        kopf.index("nodes", registry=registry)(nodes_by_name)
    kopf.on.create(*RLJOBS, registry=registry)(bound(create, config=config))
    kopf.on.resume(*RLJOBS, registry=registry)(bound(apply, config=config))
    kopf.on.update(*RLJOBS, field="spec", registry=registry)(bound(apply, config=config))
    kopf.timer(*RLJOBS, interval=config.interval_s, initial_delay=0.1, registry=registry)(bound(observe, config=config))
    kopf.on.delete(*RLJOBS, retries=DELETE_RETRIES, backoff=1, registry=registry)(delete)
    return registry


def configure(settings: kopf.OperatorSettings, config: OperatorConfig, **_: Any) -> None:
    # a watch that silently stops delivering events is kopf's known failure mode: bound every request
    settings.watching.server_timeout = config.watch_server_timeout_s
    settings.watching.client_timeout = settings.watching.server_timeout + 30
    settings.watching.connect_timeout = 30
    # kopf's bookkeeping in annotations under our prefix, so the status holds only RLJobStatus fields
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=reconcile.KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=reconcile.KOPF_PREFIX)
    if config.metrics_port:
        metrics.serve(config.metrics_port)
    settings.posting.level = logging.WARNING  # events come from the state machine, not from kopf's logs
    settings.execution.max_workers = config.workers
    kube()


def pods_by_job(body: kopf.Body, namespace: str, labels: kopf.Labels, **_: Any) -> dict[tuple[str, str], Any]:
    """Every job's pods, kept current by one watch: observing a thousand jobs then lists nothing."""
    return {(namespace, labels[JOB_LABEL]): observe_pods.pod_summary(dict(body))}


def nodes_by_name(body: kopf.Body, name: str, **_: Any) -> dict[str, observe_pods.NodeCapacity]:
    """Spot or not, and preemption notices, of every node (one watch; needs list/watch on nodes)."""
    return {name: observe_pods.node_capacity(dict(body))}


def create(body: kopf.Body, logger: kopf.Logger, config: OperatorConfig, retry: int, **_: Any) -> None:
    with metrics.timed("create"):
        _apply(body, logger, config, new=True, first_try=retry == 0)


def apply(body: kopf.Body, logger: kopf.Logger, config: OperatorConfig, **_: Any) -> None:
    with metrics.timed("apply"):
        _apply(body, logger, config, new=False)


def _apply(body: kopf.Body, logger: kopf.Logger, config: OperatorConfig, new: bool, first_try: bool = False) -> None:
    post = _poster(body, logger)
    _export(body, reconcile.current_status(dict(body)))
    try:
        reconcile.parse_job(dict(body))
    except ValidationError as err:
        _export(body, reconcile.fail_invalid(kube(), dict(body), err, _now(), post))
        return
    with _lock(body):
        written = reconcile.apply_job(
            kube(),
            dict(body),
            _now(),
            post,
            new=new,
            security=config.sandbox_security,
            first_try=first_try,
            peers=config.network_peers,
            images=config.job_images,
        )
    if written:
        logger.info("applied %s", ", ".join(written))


def observe(
    body: kopf.Body,
    memo: kopf.Memo,
    pods_by_job: kopf.Index,
    logger: kopf.Logger,
    config: OperatorConfig,
    **kwargs: Any,
) -> None:
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
        post = _poster(body, logger)
        status = reconcile.drive(
            kube(),
            dict(body),
            pods,
            memory,
            _now(),
            post,
            nodes,
            config.sandbox_security,
            config.network_peers,
            config.job_images,
        )
        clock = time.monotonic()
        scaled = reconcile.autoscale_sandbox(
            kube(),
            dict(body),
            pods,
            memory,
            post,
            clock,
            config.autoscale_interval_s,
            config.sandbox_security,
            config.job_images,
            status,
        )
        if scaled is not None:
            pools = {"sandbox_replicas": scaled.sandbox_replicas, "sandbox_pools": scaled.sandbox_pools}
            status = status.model_copy(update=pools)
    _export(body, status)


def delete(body: kopf.Body, retry: int, logger: kopf.Logger, **_: Any) -> None:
    metrics.jobs.forget(body["metadata"]["namespace"], body["metadata"]["name"])
    metrics.pools.forget(body["metadata"]["namespace"], body["metadata"]["name"])
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
