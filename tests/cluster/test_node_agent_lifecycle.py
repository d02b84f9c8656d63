"""The test node agent (tests/cluster/kubelet.py) runs a pod's init containers to completion, in order,
before its containers, with the pod's volumes shared between them; it reports what the kubelet reports
when an init container fails (Init:Error, Init:CrashLoopBackOff), when an image cannot be had
(ErrImagePull, then ImagePullBackOff) and what a container leaves in its termination message."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from cluster.container_status import Container, log_tail, termination_message
from cluster.kubelet import NodeAgent, node_unavailable
from cluster.test_node_agent import busybox_image, busybox_missing, get, pod_status, ready, run_node
from helpers.emulator import Api
from helpers.polling import wait_for

NS = "default"
PODS = f"/api/v1/namespaces/{NS}/pods"
IMAGE = "ghcr.io/kuberl/sandbox:0.1.0"  # the checkout stands in for it
MISSING = "registry.example/kuberl-test/no-such-image:1"
BUSYBOX = "registry.example/kuberl-test/busybox:1"  # mapped to a small image in local containers storage
# serves the folder /data (an emptyDir the init containers filled) on port 8080
SERVE = "import functools, http.server as h; h.ThreadingHTTPServer(('0.0.0.0', 8080), functools.partial(h.SimpleHTTPRequestHandler, directory='/data')).serve_forever()"  # noqa: E501


def python(name: str, code: str, image: str = IMAGE, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": image, "command": ["python", "-c", code], **extra}


def pod(name: str, containers: list[dict], init: list[dict] | None = None, **spec: Any) -> dict[str, Any]:
    volumes = [{"name": "data", "emptyDir": {}}, {"name": "shared", "emptyDir": {}}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "initContainers": init or [],
            "containers": containers,
            "automountServiceAccountToken": False,
            "securityContext": {"runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532},
            "volumes": volumes,
            **spec,
        },
    }


def mounts(*names: str, read_only: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    return [{"name": n, "mountPath": f"/{n}", "readOnly": n in read_only} for n in names]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, NodeAgent]]:
    with contextlib.ExitStack() as stack:
        local = {} if busybox_missing() else {BUSYBOX: stack.enter_context(busybox_image())}
        yield from run_node(tmp_path_factory, local)


def init_statuses(api: Api, name: str) -> list[dict[str, Any]]:
    return pod_status(api, name).get("initContainerStatuses") or []


def condition(api: Api, name: str, kind: str) -> str | None:
    return next((c["status"] for c in pod_status(api, name).get("conditions") or [] if c["type"] == kind), None)


# --- without a node: the container state and its termination message


def test_a_termination_message_is_the_file_or_with_fallback_the_log_tail(tmp_path):
    message, log = tmp_path / "message", tmp_path / "log"
    message.write_text("x" * 5000)
    log.write_text("--- T start ['a']\nold run\n--- T start ['a']\n" + "".join(f"line {i}\n" for i in range(100)))
    assert termination_message({}, message, log, 1) == "x" * 4096  # the kubelet keeps 4 KiB
    message.write_text("")
    assert termination_message({}, message, log, 1) == ""
    fallback = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    assert termination_message(fallback, message, log, 0) == ""  # only a failure falls back to the log
    tail = termination_message(fallback, message, log, 1)
    assert tail == log_tail(log) and tail.splitlines() == [f"line {i}" for i in range(20, 100)]
    assert "old run" not in log_tail(log)


def test_a_failed_pull_is_err_image_pull_then_image_pull_back_off():
    c = Container({"name": "main", "image": MISSING})
    c.pull_failed("not found", monotonic=100.0)
    assert c.waiting == ("ErrImagePull", f'failed to pull and unpack image "{MISSING}": not found')
    assert c.restart_at == 101.0  # the back-off starts at 1 s
    c.pull_backing_off()
    reason, message = c.waiting
    assert reason == "ImagePullBackOff"
    assert (
        message
        == f'Back-off pulling image "{MISSING}": ErrImagePull: failed to pull and unpack image "{MISSING}": not found'
    )
    c.pull_failed("not found", monotonic=200.0)
    assert c.restart_at == 201.5 and c.status_entry()["state"]["waiting"]["reason"] == "ErrImagePull"


def test_a_restarting_container_keeps_its_last_termination_and_message():
    c = Container({"name": "main", "image": IMAGE}, started_at="T0")
    c.exited(2, "bad config", again=True, pod="p_default(u)", monotonic=0.0)
    entry = c.status_entry()
    assert entry["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert entry["state"]["waiting"]["message"] == "back-off 1s restarting failed container=main pod=p_default(u)"
    assert entry["lastState"]["terminated"] == {
        "exitCode": 2,
        "reason": "Error",
        "startedAt": "T0",
        "finishedAt": entry["lastState"]["terminated"]["finishedAt"],
        "message": "bad config",
    }


# --- on the node


@pytest.mark.slow
@pytest.mark.skipif(node_unavailable() is not None, reason=str(node_unavailable()))
def test_init_containers_run_in_order_to_completion_and_share_the_pods_volumes(node):
    api, _ = node
    first = python("first", "open('/data/index.html', 'w').write('first')", volumeMounts=mounts("data"))
    second = python(
        "second",
        "import pathlib\n"
        "w = pathlib.Path('/data/index.html'); w.write_text(w.read_text() + ',second')\n"
        "try: open('/shared/x', 'w')\n"
        "except OSError as e: pathlib.Path('/data/readonly').write_text(type(e).__name__)",
        volumeMounts=mounts("data", "shared", read_only=("shared",)),
    )
    main = python("main", SERVE, volumeMounts=mounts("data"))
    main["readinessProbe"] = {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1}
    api.post(PODS, pod("inits", [main], init=[first, second]))
    wait_for("inits ready", lambda: ready(api, "inits"), 90)
    base = f"http://{pod_status(api, 'inits')['podIP']}:8080"
    assert get(f"{base}/index.html") == "first,second"  # in order, on the emptyDir the containers share
    assert get(f"{base}/readonly") == "OSError"  # a readOnly mount of an emptyDir is read-only
    statuses = init_statuses(api, "inits")
    assert [(s["name"], s["state"]["terminated"]["reason"], s["ready"]) for s in statuses] == [
        ("first", "Completed", True),
        ("second", "Completed", True),
    ]
    assert condition(api, "inits", "Initialized") == "True"


@pytest.mark.slow
@pytest.mark.skipif(node_unavailable() is not None, reason=str(node_unavailable()))
def test_a_failing_init_container_restarts_in_back_off_and_the_pods_containers_wait(node):
    api, _ = node
    failing = python("setup", "open('/dev/termination-log', 'w').write('no bundle'); raise SystemExit(3)")
    api.post(PODS, pod("init-crash", [python("main", SERVE)], init=[failing]))
    (status,) = wait_for(
        "a restart of the init container",
        lambda: [s for s in init_statuses(api, "init-crash") if s["restartCount"]],
        60,
    )
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert status["lastState"]["terminated"]["message"] == "no bundle"
    wait_for("Init:CrashLoopBackOff", lambda: "CrashLoopBackOff" in str(init_statuses(api, "init-crash")), 30)
    obj = pod_status(api, "init-crash")
    assert obj["phase"] == "Pending" and not ready(api, "init-crash")
    assert condition(api, "init-crash", "Initialized") == "False"
    assert obj["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}

    api.post(PODS, pod("init-once", [python("main", SERVE)], init=[failing], restartPolicy="Never"))
    wait_for("init-once Failed", lambda: pod_status(api, "init-once").get("phase") == "Failed", 60)
    (status,) = init_statuses(api, "init-once")
    assert (status["state"]["terminated"]["reason"], status["state"]["terminated"]["message"]) == ("Error", "no bundle")
    assert pod_status(api, "init-once")["containerStatuses"][0]["state"]["waiting"]["reason"] == "PodInitializing"


@pytest.mark.slow
@pytest.mark.skipif(node_unavailable() is not None, reason=str(node_unavailable()))
def test_an_image_the_node_cannot_have_is_err_image_pull_then_image_pull_back_off(node):
    api, agent = node
    api.post(PODS, pod("no-image", [{"name": "main", "image": MISSING}]))

    def reasons() -> set[str]:
        statuses = pod_status(api, "no-image").get("containerStatuses") or [{}]
        return {(statuses[0].get("state") or {}).get("waiting", {}).get("reason")} - {None}

    seen: set[str] = set()
    wait_for(
        "ErrImagePull and ImagePullBackOff",
        lambda: seen.update(reasons()) or {"ErrImagePull", "ImagePullBackOff"} <= seen,
        60,
        interval=0.05,
    )
    waiting = pod_status(api, "no-image")["containerStatuses"][0]["state"]["waiting"]
    assert waiting["message"].startswith(("failed to pull and unpack image", f'Back-off pulling image "{MISSING}"'))
    assert pod_status(api, "no-image")["phase"] == "Pending" and not agent.errors

    # an init container's image, likewise: the pod's containers wait
    api.post(PODS, pod("no-init-image", [python("main", SERVE)], init=[{"name": "copy", "image": MISSING}]))
    wait_for(
        "the init container's ImagePullBackOff",
        lambda: "ImagePullBackOff" in str(init_statuses(api, "no-init-image")),
        60,
    )
    assert pod_status(api, "no-init-image")["containerStatuses"][0]["state"]["waiting"]["reason"] == "PodInitializing"


@pytest.mark.slow
@pytest.mark.skipif(node_unavailable() is not None, reason=str(node_unavailable()))
def test_a_containers_termination_message_is_in_its_status(node):
    api, _ = node
    write = "open('/dev/termination-log', 'w').write('tests failed: 3'); raise SystemExit(1)"
    api.post(PODS, pod("message-once", [python("main", write)], restartPolicy="Never"))
    wait_for("message-once Failed", lambda: pod_status(api, "message-once").get("phase") == "Failed", 60)
    terminated = pod_status(api, "message-once")["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["message"]) == (1, "tests failed: 3")

    custom = python("main", write.replace("/dev/termination-log", "/data/why"), terminationMessagePath="/data/why")
    custom["volumeMounts"] = mounts("shared")
    logs = python(
        "logs", "print('the last words'); raise SystemExit(4)", terminationMessagePolicy="FallbackToLogsOnError"
    )
    api.post(PODS, pod("message-loop", [custom, logs]))

    def last(name: str) -> dict[str, Any]:
        statuses = {s["name"]: s for s in pod_status(api, "message-loop").get("containerStatuses") or []}
        return (statuses.get(name) or {}).get("lastState", {}).get("terminated") or {}

    wait_for("both restarted", lambda: last("main") and last("logs"), 60)
    assert last("main")["message"] == "tests failed: 3"  # at its own terminationMessagePath
    assert last("logs")["message"].strip() == "the last words"  # no message: its log's tail
    restarted = lambda: all(s["restartCount"] >= 1 for s in pod_status(api, "message-loop")["containerStatuses"])  # noqa: E731
    wait_for("both restarted", restarted, 30)
    wait_for("a CrashLoopBackOff", lambda: "CrashLoopBackOff" in str(pod_status(api, "message-loop")), 30)


@pytest.mark.slow
@pytest.mark.skipif(node_unavailable() is not None, reason=str(node_unavailable()))
@pytest.mark.skipif(busybox_missing() is not None, reason=str(busybox_missing()))
def test_a_container_from_an_image_runs_what_an_init_container_put_on_a_shared_volume(node):
    """KubeRL's pattern for a foreign image: an init container copies a program onto an emptyDir, the
    image's own container runs it from there (and leaves a termination message from the image's root)."""
    api, _ = node
    script = "mkdir -p /tmp/www && echo from-the-bundle > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www"
    copy = python("bundle", f"open('/kuberl/serve', 'w').write({script!r})", volumeMounts=mounts("kuberl"))
    main = {
        "name": "main",
        "image": BUSYBOX,
        "command": ["/bin/sh", "/kuberl/serve"],
        "volumeMounts": [*mounts("kuberl", read_only=("kuberl",)), {"name": "data", "mountPath": "/tmp"}],
        "readinessProbe": {"httpGet": {"path": "/index.html", "port": 8080}, "periodSeconds": 1},
    }
    spec = pod("bundled", [main], init=[copy])
    spec["spec"]["volumes"].append({"name": "kuberl", "emptyDir": {}})
    api.post(PODS, spec)
    wait_for("bundled ready", lambda: ready(api, "bundled"), 90)
    assert get(f"http://{pod_status(api, 'bundled')['podIP']}:8080/index.html") == "from-the-bundle\n"

    failing = {**main, "command": ["/bin/sh", "-c", "echo no python here > /dev/termination-log; exit 5"]}
    failing.pop("readinessProbe")
    spec = pod("bundled-fails", [failing], init=[copy], restartPolicy="Never")
    spec["spec"]["volumes"].append({"name": "kuberl", "emptyDir": {}})
    api.post(PODS, spec)
    wait_for("bundled-fails Failed", lambda: pod_status(api, "bundled-fails").get("phase") == "Failed", 90)
    terminated = pod_status(api, "bundled-fails")["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["message"]) == (5, "no python here\n")
