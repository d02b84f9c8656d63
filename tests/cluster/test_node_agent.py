"""The test node agent (tests/cluster/kubelet.py) runs pods as a kubelet would: volumes at their mount
paths, the downward API, a pod IP on the node's bridge, Service and headless pod names, probes, restarts,
graceful deletion with preStop; and the workload controllers keep a StatefulSet's pods by ordinal."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster.image_store import STORAGE
from cluster.kubelet import FINALIZER, NodeAgent, node_unavailable
from helpers.emulator import Api, emulated_api_server
from helpers.polling import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(node_unavailable() is not None, reason=str(node_unavailable())),
]

NS = "default"
PODS = f"/api/v1/namespaces/{NS}/pods"
IMAGE = "ghcr.io/kuberl/sandbox:0.1.0"
# a small HTTP server: GET /file/NAME answers the file at NAME, /env/VAR the variable, /ready 200 once
# /tmp/ready exists; SIGTERM is logged to /log/events (an emptyDir the test reads through another pod)
SERVER = r"""
import http.server, os, signal, sys, time, pathlib
def term(*_):
    pathlib.Path('/log/events').open('a').write(f'TERM {time.time()}\n'); sys.exit(0)
signal.signal(signal.SIGTERM, term)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        kind, _, rest = self.path[1:].partition('/')
        try:
            if kind == 'file': body = pathlib.Path('/' + rest).read_bytes()
            elif kind == 'env': body = os.environ[rest].encode()
            elif kind == 'ready': body = b'ok' if pathlib.Path('/tmp/ready').exists() else 1/0
            elif kind == 'whoami': body = f'{os.getuid()} {os.getgid()} {os.getpid()}'.encode()
            elif kind == 'resolve':
                import socket; body = socket.gethostbyname(rest).encode()
            elif kind == 'write':
                pathlib.Path('/' + rest).write_text('x'); body = b'written'
            else: raise KeyError(kind)
        except Exception as err:
            self.send_response(500); self.end_headers(); self.wfile.write(repr(err).encode()); return
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(('0.0.0.0', 8080), H).serve_forever()
"""


def server_pod(name: str, **spec: Any) -> dict[str, Any]:
    container = {
        "name": "main",
        "image": IMAGE,
        "command": ["python", "-c", SERVER],
        "ports": [{"name": "http", "containerPort": 8080}],
        "env": [
            {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "greeting"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "token"}}},
            {"name": "URL", "value": "http://$(MY_IP):8080"},
        ],
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/demo", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "log", "mountPath": "/log"},
        ],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 1},
        "securityContext": {"readOnlyRootFilesystem": True},
        **spec.pop("container", {}),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": name}},
        "spec": {
            "containers": [container],
            "automountServiceAccountToken": False,
            "securityContext": {"runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532},
            "volumes": [
                {"name": "config", "configMap": {"name": "cm", "items": [{"key": "greeting", "path": "hello.txt"}]}},
                {"name": "tmp", "emptyDir": {}},
                {"name": "log", "emptyDir": {}},
            ],
            **spec,
        },
    }


# a small image's entrypoint (busybox): writes what the container sees into /tmp/www, then serves that
# folder; /ready exists only once everything else is written
ENTRYPOINT = r"""mkdir -p /tmp/www && pwd > /tmp/www/pwd && cd /tmp/www
id -u > uid; id -g > gid; id -G > groups; ls / > root
echo "$FROM_IMAGE $GREETING $PATH" > env
cat /etc/demo/hello.txt > volume; cat /etc/secret/token > secret
cat /var/run/secrets/kubernetes.io/serviceaccount/namespace > account
ln -s /etc/hosts hosts
(echo x > /written) 2>/dev/null && echo writable > rootfs || echo read-only > rootfs
grep -E "^(CapBnd|NoNewPrivs)" /proc/self/status > privileges
echo $$ > pid; touch ready
exec httpd -f -p 8080 -h /tmp/www
"""
LOCAL_IMAGE = "registry.example/kuberl-test/busybox:1"  # a pod's reference, mapped to the local image


def busybox_missing() -> str | None:
    """Why this machine cannot make the small image (None: it can)."""
    busybox = shutil.which("busybox")
    if shutil.which("buildah") is None or busybox is None:
        return "a pod from an image needs buildah and a static busybox (apt-get install buildah busybox-static)"
    linked = subprocess.run(["ldd", busybox], capture_output=True, text=True)
    if "not a dynamic executable" not in linked.stdout + linked.stderr:
        return f"{busybox} is not statically linked (apt-get install busybox-static)"
    return None


@contextlib.contextmanager
def busybox_image() -> Iterator[str]:
    """A small image in local containers storage: a static busybox, a user `app` (1234:2345), its own
    ENV, WORKDIR and ENTRYPOINT; removed (with its prepared root filesystem) afterwards."""
    reference = f"localhost/kuberl-test/busybox:{uuid.uuid4().hex[:8]}"

    def buildah(*args: str) -> str:
        return subprocess.run(["buildah", *STORAGE, *args], check=True, capture_output=True, text=True).stdout

    container = buildah("from", "scratch").strip()
    try:
        root = Path(buildah("mount", container).strip())
        for folder in ("bin", "etc", "tmp", "var", "www"):
            (root / folder).mkdir()
        shutil.copy(shutil.which("busybox") or "", root / "bin" / "busybox")
        for applet in ("sh", "httpd", "id", "cat", "ls", "mkdir", "ln", "touch", "echo", "grep"):
            (root / "bin" / applet).symlink_to("busybox")
        (root / "bin" / "serve").write_text(ENTRYPOINT)
        (root / "var" / "run").symlink_to("/run")
        (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\napp:x:1234:2345::/www:/bin/sh\n")
        (root / "etc" / "group").write_text("root:x:0:\napp:x:2345:\n")
        buildah("config", "--user", "app", "--env", "PATH=/bin", "--env", "FROM_IMAGE=yes", "--workingdir", "/www",
                "--entrypoint", '["/bin/sh", "/bin/serve"]', container)  # fmt: skip
        buildah("commit", "-q", container, reference)
    finally:
        buildah("rm", container)
    try:
        yield reference
    finally:
        subprocess.run(["buildah", *STORAGE, "rmi", "-f", reference], capture_output=True)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, NodeAgent]]:
    with contextlib.ExitStack() as stack:
        local = {} if busybox_missing() else {LOCAL_IMAGE: stack.enter_context(busybox_image())}
        yield from run_node(tmp_path_factory, local)


def run_node(tmp_path_factory: pytest.TempPathFactory, local: dict[str, str]) -> Iterator[tuple[Api, NodeAgent]]:
    with emulated_api_server() as url:
        api = Api(url)
        api.post(f"/api/v1/namespaces/{NS}/configmaps", {"metadata": meta("cm"), "data": {"greeting": "hi"}})
        api.post(f"/api/v1/namespaces/{NS}/secrets", {"metadata": meta("sec"), "stringData": {"token": "s3cr3t"}})
        workdir = tmp_path_factory.mktemp("node", numbered=True)
        with NodeAgent(url, workdir, local_images=local) as agent:
            yield api, agent
        assert not agent.errors, agent.errors


def meta(name: str) -> dict[str, str]:
    return {"name": name, "namespace": NS}


def uid_of(api: Api, name: str) -> str | None:
    return ((api.get(f"{PODS}/{name}") or {}).get("metadata") or {}).get("uid")


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def pod_status(api: Api, name: str) -> dict[str, Any]:
    return (api.get(f"{PODS}/{name}") or {}).get("status") or {}


def ready(api: Api, name: str) -> bool:
    conditions = pod_status(api, name).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_a_pod_runs_with_its_volumes_environment_user_and_address(node):
    api, agent = node
    api.post(PODS, server_pod("web"))
    ip = wait_for("web's pod IP", lambda: pod_status(api, "web").get("podIP"), 60)
    assert ip.startswith(agent.gateway.rsplit(".", 1)[0] + ".")
    base = f"http://{ip}:8080"
    wait_for("web running", lambda: pod_status(api, "web").get("phase") == "Running", 60)
    wait_for("web serving", lambda: try_get(f"{base}/env/MY_NAME"), 60)
    assert not ready(api, "web")  # its readiness probe fails until /tmp/ready exists
    assert get(f"{base}/file/etc/demo/hello.txt") == "hi"
    assert get(f"{base}/env/MY_NAME") == "web"
    assert get(f"{base}/env/MY_IP") == ip
    assert get(f"{base}/env/GREETING") == "hi"
    assert get(f"{base}/env/TOKEN") == "s3cr3t"
    assert get(f"{base}/env/URL") == f"http://{ip}:8080"
    uid, gid, pid = get(f"{base}/whoami").split()
    assert (uid, gid, pid) == ("65532", "65532", "1")  # the container's process is PID 1 of its namespace
    assert get(f"{base}/write/tmp/ready") == "written"  # an emptyDir is writable
    with pytest.raises(urllib.error.HTTPError):  # the root filesystem is read-only
        get(f"{base}/write/var/x")
    wait_for("web ready", lambda: ready(api, "web"), 30)
    status = pod_status(api, "web")["containerStatuses"][0]
    assert status["ready"] and status["restartCount"] == 0 and "running" in status["state"]


def test_pods_reach_each_other_by_service_and_headless_names(node):
    api, _ = node
    api.post(f"/api/v1/namespaces/{NS}/services", {"metadata": meta("web"), "spec": {"selector": {"app": "web"}}})
    api.post(
        f"/api/v1/namespaces/{NS}/services",
        {"metadata": meta("peers"), "spec": {"clusterIP": "None", "selector": {"app": "client"}}},
    )
    api.post(PODS, server_pod("client", hostname="client-0", subdomain="peers"))
    wait_for("client ready", lambda: pod_status(api, "client").get("podIP") and get_ok(api, "client"), 60)
    web_ip, client_ip = pod_status(api, "web")["podIP"], pod_status(api, "client")["podIP"]
    base = f"http://{client_ip}:8080"
    # a headless Service names only ready pods (it does not publish not-ready addresses)
    assert try_get(f"{base}/resolve/client-0.peers.default.svc") is None  # 500: the name does not resolve
    get(f"{base}/write/tmp/ready")
    wait_for("client ready", lambda: ready(api, "client"), 30)
    assert wait_for("web's name", lambda: try_get(f"{base}/resolve/web.default.svc"), 10) == web_ip
    assert get(f"{base}/resolve/web.default.svc.cluster.local") == web_ip
    name = "client-0.peers.default.svc"
    assert wait_for("client's own name", lambda: try_get(f"{base}/resolve/{name}"), 10) == client_ip
    assert get(f"{base}/resolve/kubernetes.default.svc") == node[1].gateway


def get_ok(api: Api, name: str) -> bool:
    return bool(try_get(f"http://{pod_status(api, name)['podIP']}:8080/env/MY_NAME"))


def try_get(url: str) -> str | None:
    try:
        return get(url)
    except Exception:
        return None


def test_a_failing_container_restarts_and_its_restarts_are_counted(node):
    api, _ = node
    api.post(PODS, server_pod("crash", container={"command": ["python", "-c", "import sys; sys.exit(3)"]}))
    status = wait_for(
        "a restart",
        lambda: [s for s in pod_status(api, "crash").get("containerStatuses") or [] if s["restartCount"] >= 1],
        30,
    )
    assert status[0]["lastState"]["terminated"]["exitCode"] == 3
    api.post(
        PODS,
        server_pod("once", restartPolicy="Never", container={"command": ["python", "-c", "import sys; sys.exit(3)"]}),
    )
    wait_for("once Failed", lambda: pod_status(api, "once").get("phase") == "Failed", 60)


def test_deletion_runs_pre_stop_then_sigterm_and_removes_the_pod(node):
    api, _ = node
    hook = {"preStop": {"exec": {"command": ["python", "-c", "open('/log/events', 'a').write('PRESTOP\\n')"]}}}
    api.post(PODS, server_pod("graceful", container={"lifecycle": hook}, terminationGracePeriodSeconds=10))
    wait_for("graceful running", lambda: get_ok(api, "graceful") if pod_status(api, "graceful").get("podIP") else 0, 60)
    assert FINALIZER in api.get(f"{PODS}/graceful")["metadata"]["finalizers"]
    api.delete(f"{PODS}/graceful")
    assert api.get(f"{PODS}/graceful")["metadata"].get("deletionTimestamp")  # terminating, not gone
    wait_for("graceful gone", lambda: api.get(f"{PODS}/graceful") is None, 60)
    # the events file lived in the pod's emptyDir: the agent's folder for it still holds it
    events = next(node[1].pods_dir.glob("default_graceful_*/volumes/log/events")).read_text().split()
    assert events[0] == "PRESTOP" and events[1] == "TERM"


def test_a_stateful_set_keeps_its_pods_by_ordinal_and_replaces_a_deleted_one(node):
    api, _ = node
    template = server_pod("unused")
    sts = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": NS},
        "spec": {
            "replicas": 2,
            "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": template["spec"]},
        },
    }
    api.post(f"/apis/apps/v1/namespaces/{NS}/statefulsets", sts)
    names = {"db-0", "db-1"}
    wait_for("two pods", lambda: {p["metadata"]["name"] for p in api.items(PODS)} >= names, 60)
    first_uid = api.get(f"{PODS}/db-1")["metadata"]["uid"]
    assert api.get(f"{PODS}/db-1")["spec"]["hostname"] == "db-1"
    api.delete(f"{PODS}/db-1")
    wait_for("db-1 replaced", lambda: uid_of(api, "db-1") not in (None, first_uid), 60)
    api.patch(f"/apis/apps/v1/namespaces/{NS}/statefulsets/db", {"spec": {"replicas": 1}})
    wait_for("db-1 gone", lambda: api.get(f"{PODS}/db-1") is None, 60)
    sts_path = f"/apis/apps/v1/namespaces/{NS}/statefulsets/db"
    wait_for("the StatefulSet's status", lambda: (api.get(sts_path).get("status") or {}).get("replicas") == 1, 30)


@pytest.mark.skipif(busybox_missing() is not None, reason=str(busybox_missing()))
def test_a_pod_from_an_image_runs_its_entrypoint_as_its_user_with_its_volumes(node):
    """The image's root filesystem, ENTRYPOINT, USER, ENV and WORKDIR, with the pod's volumes over it."""
    api, _ = node
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "from-image", "namespace": NS},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": LOCAL_IMAGE,
                    "env": [{"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "greeting"}}}],
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/demo", "readOnly": True},
                        {"name": "secret", "mountPath": "/etc/secret", "readOnly": True},
                        {"name": "tmp", "mountPath": "/tmp"},
                    ],
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 1},
                    "securityContext": {
                        "readOnlyRootFilesystem": True,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"], "add": ["KILL", "NET_BIND_SERVICE"]},
                    },
                }
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": "cm", "items": [{"key": "greeting", "path": "hello.txt"}]}},
                {"name": "secret", "secret": {"secretName": "sec"}},
                {"name": "tmp", "emptyDir": {}},
            ],
        },
    }
    api.post(PODS, pod)
    wait_for("from-image ready", lambda: ready(api, "from-image"), 60)
    base = f"http://{pod_status(api, 'from-image')['podIP']}:8080"
    seen = {name: get(f"{base}/{name}").strip() for name in ("uid", "gid", "groups", "pwd", "env", "pid")}
    assert seen == {
        "uid": "1234",  # the image's USER, by name from its /etc/passwd
        "gid": "2345",
        "groups": "2345",
        "pwd": "/www",  # its WORKDIR
        "env": "yes hi /bin",  # its ENV, the pod's env
        "pid": "1",  # the entrypoint is PID 1
    }
    assert (get(f"{base}/volume"), get(f"{base}/secret")) == ("hi", "s3cr3t")
    assert get(f"{base}/account") == NS  # the token volume, through the image's /var/run -> /run link
    wait_for("the pod's own name in its /etc/hosts", lambda: "from-image" in get(f"{base}/hosts"), 10)
    assert get(f"{base}/rootfs") == "read-only\n"
    # the bounding set holds the two capabilities kept (KILL is 5, NET_BIND_SERVICE 10): no_new_privs is set
    assert get(f"{base}/privileges").split() == ["CapBnd:", f"{1 << 5 | 1 << 10:016x}", "NoNewPrivs:", "1"]
    assert get(f"{base}/root").split() == ["bin", "dev", "etc", "proc", "run", "sys", "tmp", "var", "www"]
