"""A node agent for tests: the kubelet's part of a cluster, for the emulated API server
(tests/helpers/emulator.py). It takes every Pod (binding it to its one node), runs each container's command
as local processes and reports back what a kubelet reports. A container whose image is in local containers
storage runs from that image: its root filesystem (tests/cluster/image_store.py) under a fresh writable
layer, its Env, Entrypoint, Cmd, User and WorkingDir. The tests run the operator and sandbox pods so, from
the images images/build.py builds; the learner and rollout images carry torch and vLLM (gigabytes, long to
build on CI), so those pods keep the checkout: the project's virtual environment stands in for the image
(tests/cluster/images.py). What it models and what it does not is in docs/operator.md ("The end-to-end
suite"); in short:

- a pod: its own network namespace and IP on the node's bridge (tests/cluster/network.py) and an /etc/hosts
  with the Service, headless pod and `kubernetes.default.svc` names (no cluster DNS, no kube-proxy: a
  ClusterIP Service resolves to one ready pod's address); each container: its own mount, UTS and PID
  namespaces (PID 1 is the container's process), the pod's ConfigMap, Secret, emptyDir and service-account
  token volumes bind-mounted at their mount paths, a read-only root filesystem when asked, the container's
  uid, gid and groups (fsGroup included); from an image, also its capabilities (a runtime's default set,
  securityContext's drop and add) and no_new_privs; no seccomp, cgroups or resource limits;
- the environment: the image's ENV, `env` with `value`/`valueFrom` (fieldRef, secretKeyRef,
  configMapKeyRef) and `$(VAR)` references, `envFrom`, and the in-cluster API address; no service links;
- init containers: run one at a time, in order, each to its end before the containers start, with the pod's
  volumes and a container's isolation; a failed one starts again after a back-off (restartPolicy Never: the
  pod fails), the containers waiting in PodInitializing;
- images: one neither in local containers storage nor built by a project Dockerfile is ErrImagePull, then
  ImagePullBackOff until the next try (tests/cluster/container_status.py);
- status: phase, podIP, hostIP, container and init container states, restarts, termination messages
  (terminationMessagePath, FallbackToLogsOnError) and the Initialized and Ready conditions, with startup,
  readiness and liveness HTTP probes (startup and readiness periods capped at PROBE_PERIOD_CAP_S);
- deletion: a finalizer of its own keeps a deleted pod until its containers have stopped: preStop, then
  SIGTERM, then SIGKILL when terminationGracePeriodSeconds has passed; restartPolicy with a back-off that
  starts at 1 s and is capped at 10 s (a kubelet's: 10 s to 5 min).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from pathlib import Path
from typing import Any

from cluster.container_init import CAPABILITIES
from cluster.container_status import DEFAULT_MESSAGE_PATH, Container, ProbeState, now, termination_message
from cluster.image_store import ImageStoreError, stored_image
from cluster.images import (
    BASE_PATH,
    VENV_BIN,
    ExecutableNotFound,
    Image,
    ImageNotFound,
    container_argv,
    find_image,
    project_images,
    resolve_executable,
)
from cluster.network import NodeNetwork
from helpers.emulator import Api
from helpers.pod_security import RUNTIME_CAPABILITIES

log = logging.getLogger(__name__)

FINALIZER = "kuberl.test/node-agent"
NODE_NAME = "kuberl-test-node"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
INIT = Path(__file__).with_name("container_init.py")
PROBE_PERIOD_CAP_S = 2.0
TICK_S = 0.2
OPENMP_ENV = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")
# the venv's interpreter lives under /root (0700 here): pods running as another uid see it through a
# tmpfs over its parent in their own mount namespace (container_init.py)
INTERPRETER_HOME = Path(sys.base_prefix).parents[1]  # e.g. /root/.pyenv
# the checkout whose virtual environment stands in for the images (its scripts name it by absolute path)
CHECKOUT = Path(__file__).resolve().parents[2]


def capabilities(context: dict[str, Any]) -> list[str] | None:
    """The capabilities a container keeps by its securityContext; None: all of them (privileged)."""
    if context.get("privileged"):
        return None
    caps = context.get("capabilities") or {}
    drop = {c.upper().removeprefix("CAP_") for c in caps.get("drop") or []}
    add = {c.upper().removeprefix("CAP_") for c in caps.get("add") or []}
    if unknown := sorted((drop | add) - {"ALL", *CAPABILITIES}):
        raise ValueError(f"securityContext.capabilities: unknown {', '.join(unknown)}")
    kept = set() if "ALL" in drop else set(RUNTIME_CAPABILITIES) - drop
    return sorted(kept | add - {"ALL"})


def node_unavailable() -> str | None:
    """Why this machine cannot host the test node (None: it can): it needs root and a few system tools."""
    if os.geteuid() != 0:
        return "the node agent needs root (network and mount namespaces)"
    missing = [tool for tool in ("ip", "unshare", "nsenter", "mount", "openssl") if shutil.which(tool) is None]
    if missing:
        return f"the node agent needs {', '.join(missing)}"
    return None


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: defined names replaced, others kept, `$$` escapes a `$`."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(one, text)


def field_value(pod: dict[str, Any], path: str) -> str:
    """The downward API's fieldRef paths."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName") or NODE_NAME,
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    if path in simple:
        return simple[path] or ""
    if match := re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path):
        return (meta.get(match.group(1)) or {}).get(match.group(2), "")
    raise ValueError(f"fieldRef {path!r} is not supported by the test node")


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _probe_ok(probe: dict[str, Any], address: str, ports: dict[str, int]) -> bool:
    get = probe.get("httpGet")
    if get is None:
        raise ValueError(f"only httpGet probes are supported by the test node: {probe}")
    port = get["port"]
    number = ports[port] if isinstance(port, str) and not port.isdigit() else int(port)
    url = f"{get.get('scheme', 'HTTP').lower()}://{get.get('host') or address}:{number}{get.get('path', '/')}"
    try:
        with urllib.request.urlopen(url, timeout=probe.get("timeoutSeconds", 1)) as response:
            return 200 <= response.status < 400
    except Exception:
        return False


class PodRunner:
    """One pod's life on the node, in a thread of its own: set-up, containers, probes, status, deletion."""

    def __init__(self, agent: NodeAgent, pod: dict[str, Any]) -> None:
        self.agent, self.pod = agent, pod
        meta = pod["metadata"]
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}"
        self.dir = agent.pods_dir / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        self.spec = pod["spec"]
        self.init_containers = [Container(c, init=True) for c in self.spec.get("initContainers") or []]
        self.containers = [Container(c) for c in self.spec["containers"]]
        self.netns: str | None = None
        self.address: str | None = None
        self.started = now()
        self.deleting = threading.Event()
        self.gone = threading.Event()  # removed from the API without our finalizer's consent (force)
        self.done = threading.Event()
        self.last_status: dict[str, Any] | None = None
        self.failure: tuple[str, str] | None = None  # a pod-level reason it cannot start
        self.thread = threading.Thread(target=self.run, daemon=True, name=f"pod-{self.name}")

    # --- set-up

    def volume_dirs(self) -> dict[str, tuple[Path, bool]]:
        """Each volume's folder on the node (filled now) and whether it is a tmpfs."""
        out: dict[str, tuple[Path, bool]] = {}
        security = self.spec.get("securityContext") or {}
        for volume in self.spec.get("volumes") or []:
            path = self.dir / "volumes" / volume["name"]
            path.mkdir(parents=True, exist_ok=True)
            if "emptyDir" in volume:
                os.chmod(path, 0o777)
                if security.get("fsGroup") is not None:
                    os.chown(path, -1, security["fsGroup"])
                out[volume["name"]] = (path, (volume["emptyDir"] or {}).get("medium") == "Memory")
            elif "configMap" in volume or "secret" in volume:
                source = volume.get("configMap") or volume["secret"]
                files = self.agent.config_data(self.namespace, source, secret="secret" in volume)
                items = source.get("items") or [{"key": k, "path": k} for k in files]
                for item in items:
                    target = path / item["path"]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(files[item["key"]])
                    os.chmod(target, item.get("mode", source.get("defaultMode", 0o644)))
                    if security.get("fsGroup") is not None:  # as the kubelet does: the group reads a 0440 file
                        os.chown(target, -1, security["fsGroup"])
                out[volume["name"]] = (path, False)
            else:
                raise ValueError(f"volume {volume['name']}: only configMap, secret and emptyDir are supported")
        if self.spec.get("automountServiceAccountToken", True):
            path = self.dir / "volumes" / "kube-api-access"
            path.mkdir(parents=True, exist_ok=True)
            (path / "token").write_text("node-agent-test-token")
            (path / "namespace").write_text(self.namespace)
            (path / "ca.crt").write_bytes(self.agent.ca_file.read_bytes())
            out["kube-api-access"] = (path, False)
        return out

    def environment(self, container: dict[str, Any], image: Image) -> dict[str, str]:
        env = {
            "PATH": BASE_PATH if image.rootfs else f"{VENV_BIN}:{BASE_PATH}",
            "HOSTNAME": self.spec.get("hostname") or self.name,
            **image.env,
            **self.agent.extra_env,
            "KUBERNETES_SERVICE_HOST": self.agent.network.gateway,
            "KUBERNETES_SERVICE_PORT": "443",
            "KUBERNETES_SERVICE_PORT_HTTPS": "443",
        }
        for source in container.get("envFrom") or []:
            ref = source.get("configMapRef") or source.get("secretRef")
            data = self.agent.config_data(self.namespace, ref, secret="secretRef" in source)
            env.update({source.get("prefix", "") + k: v.decode() for k, v in data.items()})
        for var in container.get("env") or []:
            if "valueFrom" not in var:
                env[var["name"]] = expand(var.get("value", ""), env)
                continue
            source = var["valueFrom"]
            if "fieldRef" in source:
                known = {**(self.pod.get("status") or {}), "podIP": self.address, "hostIP": self.agent.gateway}
                env[var["name"]] = field_value({**self.pod, "status": known}, source["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in source or "configMapKeyRef" in source:
                ref = source.get("secretKeyRef") or source["configMapKeyRef"]
                data = self.agent.config_data(self.namespace, ref, secret="secretKeyRef" in source)
                env[var["name"]] = data[ref["key"]].decode()
            else:
                raise ValueError(f"env {var['name']}: {list(source)} is not supported by the test node")
        return env

    def user(self, container: dict[str, Any], image: Image) -> tuple[int, int, list[int]]:
        pod_ctx, ctx = self.spec.get("securityContext") or {}, container.get("securityContext") or {}
        image_uid, _, image_gid = (image.user or "0").partition(":")
        uid = ctx.get("runAsUser", pod_ctx.get("runAsUser", int(image_uid)))
        gid = ctx.get("runAsGroup", pod_ctx.get("runAsGroup", int(image_gid or 0)))
        if ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) and uid == 0:
            raise PermissionError("container has runAsNonRoot and image will run as root")
        groups = [gid, *pod_ctx.get("supplementalGroups", [])]
        if pod_ctx.get("fsGroup") is not None:
            groups.append(pod_ctx["fsGroup"])
        return uid, gid, sorted(set(groups))

    def start(self, c: Container) -> None:
        """Start (or restart) a container: command from the spec or the image, its env, mounts and user."""
        image = self.agent.image(c.spec["image"])
        c.env = self.environment(c.spec, image)
        argv = [expand(a, c.env) for a in container_argv(c.spec, image)]
        if not argv:
            raise ExecutableNotFound("no command specified")
        if image.rootfs is None:
            argv[0] = resolve_executable(argv[0])
        uid, gid, groups = self.user(c.spec, image)
        mounts = []
        for m in c.spec.get("volumeMounts") or []:
            source, tmpfs = self.volumes[m["name"]]
            mounts.append({"source": str(source), "target": m["mountPath"], "readOnly": m.get("readOnly", False)})
            if tmpfs:
                mounts[-1] = {"tmpfs": True, "target": m["mountPath"]}
        if "kube-api-access" in self.volumes:
            mounts.append({"source": str(self.volumes["kube-api-access"][0]), "target": SERVICE_ACCOUNT_DIR})
            mounts[-1]["readOnly"] = True
        for m in mounts:
            # those under /run are made in the container's /run; an image has its own root for them all
            if image.rootfs is None and not m["target"].startswith(("/run/", "/var/run/")):
                self.agent.mount_point(m["target"])
        if message_path := c.spec.get("terminationMessagePath", DEFAULT_MESSAGE_PATH):
            mounts.append(self.message_mount(c, message_path, image))
        expose = []
        if uid != 0 and image.rootfs is None:
            staging = self.dir / "interpreter"
            staging.mkdir(exist_ok=True)
            expose.append({"path": str(INTERPRETER_HOME), "staging": str(staging)})
        keep = []
        if image.rootfs is None and any(CHECKOUT.is_relative_to(m["target"]) for m in mounts):  # a /tmp volume
            staging = self.dir / "checkout"
            staging.mkdir(exist_ok=True)
            keep.append({"path": str(CHECKOUT), "staging": str(staging)})
        context = c.spec.get("securityContext") or {}
        spec = {
            "argv": argv,
            "env": c.env,
            "mounts": mounts,
            "expose": expose,
            "keep": keep,
            "readOnlyRoot": context.get("readOnlyRootFilesystem", False),
            "hostname": self.spec.get("hostname") or self.name,
            "workdir": c.spec.get("workingDir") or image.workdir,
            "rootfs": str(image.rootfs) if image.rootfs else None,
            # an image runs as a runtime runs it: its capabilities and no_new_privs by its securityContext
            "capabilities": capabilities(context) if image.rootfs else None,
            "noNewPrivileges": bool(image.rootfs) and context.get("allowPrivilegeEscalation") is False,
            "layer": str(self.dir / "layers" / c.name),
            "uid": uid,
            "gid": gid,
            "groups": groups,
        }
        spec_file = self.dir / f"{c.name}.json"
        spec_file.write_text(json.dumps(spec))
        namespaces = ["--mount", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private"]
        command = ["ip", "netns", "exec", str(self.netns), "unshare", *namespaces]
        command += [sys.executable, str(INIT), str(spec_file)]
        with self.logfile(c).open("ab") as out:
            out.write(f"--- {now()} start {argv}\n".encode())
            out.flush()
            c.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        c.started_at, c.waiting, c.terminated, c.restart_at = now(), None, None, None
        now_s = time.monotonic()
        for kind in ("startup", "readiness", "liveness"):
            probe = c.spec.get(f"{kind}Probe")
            period = float((probe or {}).get("periodSeconds", 10))
            if kind != "liveness":
                period = min(period, PROBE_PERIOD_CAP_S)
            delay = float((probe or {}).get("initialDelaySeconds", 0))
            c.probes[kind] = ProbeState(probe, period, now_s + delay)

    def message_mount(self, c: Container, target: str, image: Image) -> dict[str, Any]:
        """A fresh, empty file for the container's termination message, writable by any user (as the
        kubelet makes it), bound at its terminationMessagePath."""
        c.message_file = self.dir / "termination" / c.name
        c.message_file.parent.mkdir(exist_ok=True)
        c.message_file.write_bytes(b"")
        os.chmod(c.message_file, 0o666)
        if image.rootfs is None and not target.startswith(("/run/", "/var/run/")):
            self.agent.mount_point(target, file=True)
        return {"source": str(c.message_file), "target": target, "file": True}

    def logfile(self, c: Container) -> Path:
        return self.agent.workdir / "logs" / f"{self.namespace}_{self.name}_{c.name}.log"

    # --- running

    def run(self) -> None:
        try:
            self.run_pod()
        except Exception:
            log.exception("pod %s/%s", self.namespace, self.name)
        finally:
            with contextlib.suppress(Exception):
                self.stop_all(grace=0)
            if self.netns and self.address:
                self.agent.network.remove_pod(self.netns, self.address)
            self.done.set()
            if self.deleting.is_set() or self.gone.is_set():
                self.agent.release(self)

    def run_pod(self) -> None:
        self.netns, self.address = self.agent.network.add_pod(self.agent.next_index())
        self.agent.accounts[self.address] = (self.namespace, self.spec.get("serviceAccountName") or "default")
        self.report()
        while not self.deleting.is_set() and not self.gone.is_set():
            try:
                self.volumes = self.volume_dirs()
                break
            except (KeyError, FileNotFoundError) as err:  # a ConfigMap or Secret not there yet: retry
                self.failure = ("ContainerCreating", f"waiting for {err}")
                self.report()
                time.sleep(1)
        self.failure = None
        policy = self.spec.get("restartPolicy", "Always")
        # init containers: one at a time, in order, each to its end; a failed one starts again (after a
        # back-off) unless the pod's restartPolicy is Never, and the pod's containers wait for them all
        init_policy = "Never" if policy == "Never" else "OnFailure"
        while not self.deleting.is_set() and not self.gone.is_set():
            pending = next((c for c in self.init_containers if not c.completed()), None)
            if pending is not None:
                self.tend(pending, init_policy)
            else:
                for c in self.containers:
                    self.tend(c, policy)
            self.report()
            time.sleep(TICK_S)
        if self.deleting.is_set():
            meta = self.agent.api.get(self.path) or self.pod
            grace = (meta.get("metadata") or {}).get("deletionGracePeriodSeconds")
            if grace is None:
                grace = self.spec.get("terminationGracePeriodSeconds", 30)
            self.stop_all(grace=float(grace))
            self.report()

    def tend(self, c: Container, policy: str) -> None:
        monotonic = time.monotonic()
        if c.process is not None and c.process.poll() is not None:
            code = c.process.returncode
            code = 128 - code if code < 0 else code
            message = termination_message(c.spec, c.message_file, self.logfile(c), code)
            again = policy == "Always" or (policy == "OnFailure" and code != 0)
            c.exited(code, message, again, f"{self.name}_{self.namespace}({self.uid})", monotonic)
        if c.process is None and c.restart_at is not None and monotonic >= c.restart_at:
            first = c.started_at is None
            try:
                self.start(c)
                if not first:
                    c.restarts += 1
            except ImageNotFound as err:
                c.pull_failed(str(err), monotonic)
            except (ExecutableNotFound, PermissionError, ValueError, KeyError) as err:
                c.waiting, c.restart_at = ("CreateContainerConfigError", str(err)), monotonic + 5
            return
        if c.process is None:
            c.pull_backing_off()  # ErrImagePull has been reported once: back-off until the next try
        if c.running():
            self.probe(c)

    def probe(self, c: Container) -> None:
        assert self.address is not None
        ports = {p["name"]: p["containerPort"] for p in c.spec.get("ports") or [] if "name" in p}
        monotonic = time.monotonic()
        startup = c.probes["startup"]
        for kind in ("startup", "readiness", "liveness"):
            state = c.probes[kind]
            if state.spec is None or monotonic < state.next_at:
                continue
            if kind != "startup" and startup.spec is not None and not startup.passed:
                continue
            if kind == "startup" and state.passed:
                continue
            state.next_at = monotonic + state.period
            if _probe_ok(state.spec, self.address, ports):
                state.successes, state.failures = state.successes + 1, 0
                if state.successes >= state.spec.get("successThreshold", 1):
                    state.passed = True
                continue
            state.failures, state.successes = state.failures + 1, 0
            if state.failures < state.spec.get("failureThreshold", 3):
                continue
            state.passed = False
            if kind in ("startup", "liveness"):  # the kubelet kills the container; restartPolicy decides
                log.warning("pod %s container %s failed its %s probe: restarting", self.name, c.name, kind)
                self.stop_container(c, grace=float(self.spec.get("terminationGracePeriodSeconds", 30)))
                return

    # --- stopping

    def run_pre_stop(self, c: Container, deadline: float) -> None:
        hook = ((c.spec.get("lifecycle") or {}).get("preStop") or {}).get("exec")
        pid = c.pid1()
        if hook is None or pid is None:
            return
        argv = list(hook["command"])
        image = self.agent.image(c.spec["image"])
        if image.rootfs is None:
            argv[0] = resolve_executable(argv[0])
        uid, gid, _ = self.user(c.spec, image)
        command = ["nsenter", "-t", str(pid), "--mount", "--uts", "--pid", "--net", "--wd=/"]
        command += ["-S", str(uid), "-G", str(gid), *argv]
        logfile = self.agent.workdir / "logs" / f"{self.namespace}_{self.name}_{c.name}.prestop.log"
        with logfile.open("ab") as out:
            hook_process = subprocess.Popen(command, env=c.env, stdout=out, stderr=subprocess.STDOUT)
        try:
            hook_process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hook_process.kill()
            hook_process.wait()

    def stop_container(self, c: Container, grace: float) -> None:
        """preStop, SIGTERM to the container's PID 1, SIGKILL at the end of the grace period."""
        if c.process is None:
            return
        deadline = time.monotonic() + grace
        if grace > 0:
            self.run_pre_stop(c, deadline)
            if (pid := c.pid1()) is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.process.wait(max(0.0, deadline - time.monotonic()))
        if c.process.poll() is None:
            if (pid := c.pid1()) is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)  # the kernel then kills the rest of its PID namespace
            with contextlib.suppress(ProcessLookupError):
                os.killpg(c.process.pid, signal.SIGKILL)
            c.process.wait(10)

    def stop_all(self, grace: float) -> None:
        every = [*self.init_containers, *self.containers]
        threads = [threading.Thread(target=self.stop_container, args=(c, grace)) for c in every]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for c in every:
            c.restart_at = None
            if c.process is not None and c.process.poll() is not None:
                code = c.process.returncode
                c.terminated = {"exitCode": 128 - code if code < 0 else code, "reason": "Error", "finishedAt": now()}
                if message := termination_message(c.spec, c.message_file, self.logfile(c), code):
                    c.terminated["message"] = message
                c.process = None

    # --- reporting

    def initialized(self) -> bool:
        return all(c.completed() for c in self.init_containers)

    def phase(self) -> str:
        cs = self.containers
        if any(c.failed() for c in self.init_containers):
            return "Failed"
        if any(c.started_at is None for c in cs):
            return "Pending"
        if all(c.terminated is not None and c.restart_at is None for c in cs):
            return "Succeeded" if all(c.terminated and c.terminated["exitCode"] == 0 for c in cs) else "Failed"
        return "Running"

    def status(self) -> dict[str, Any]:
        initialized = self.initialized()
        ready = initialized and all(c.ready() for c in self.containers) and not self.deleting.is_set()
        flag = "True" if ready else "False"
        conditions = [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True" if initialized else "False"},
            {"type": "ContainersReady", "status": flag},
            {"type": "Ready", "status": flag},
        ]
        if not initialized:
            conditions[1]["reason"] = "ContainersNotInitialized"
        status: dict[str, Any] = {
            "phase": self.phase(),
            "hostIP": self.agent.network.gateway,
            "startTime": self.started,
            "conditions": conditions,
            "containerStatuses": [c.status_entry(waiting_for_init=not initialized) for c in self.containers],
        }
        if self.init_containers:
            status["initContainerStatuses"] = [c.status_entry() for c in self.init_containers]
        if self.address:
            status.update(podIP=self.address, podIPs=[{"ip": self.address}])
        if self.failure:
            status["reason"], status["message"] = self.failure
        return status

    def report(self) -> None:
        """Write the status when it changed (as the kubelet's status manager does)."""
        status = self.status()
        if status == self.last_status or self.gone.is_set():
            return
        try:
            self.agent.api.patch(self.path + "/status", {"status": status})
            self.last_status = status
        except Exception as err:
            log.warning("status of pod %s: %s", self.name, err)


class NodeAgent:
    """The node: watches Pods (by polling the API), runs them with PodRunner, runs the workload controllers
    (tests/cluster/controllers.py) and keeps every pod's /etc/hosts current. Use as a context manager."""

    def __init__(
        self,
        api_url: str,
        workdir: Path,
        host_ports: tuple[int, ...] = (),
        extra_env: dict[str, str] | None = None,
        local_images: dict[str, str] | None = None,
    ) -> None:
        """`local_images`: the pod image references to run from these images of local containers storage,
        every other one from the checkout; None: any reference local storage holds runs from its image."""
        from cluster.controllers import WorkloadControllers

        self.api = Api(api_url)
        self.api_port = int(api_url.rstrip("/").rsplit(":", 1)[1])
        self.workdir = workdir
        (workdir / "logs").mkdir(parents=True, exist_ok=True)
        # the pods' volumes, outside /tmp: a container's /tmp volume would hide a source folder under /tmp
        # from the mounts that follow it (removed by close)
        self.pods_dir = Path(tempfile.mkdtemp(prefix="kuberl-node-", dir="/var/tmp"))
        self.network = NodeNetwork(workdir)
        self.host_ports = host_ports
        # the machine's OpenMP settings (tests/conftest.py), as a node's container runtime would set them: the
        # pods of three test workers share two cores, where a second spinning thread per process only waits
        self.extra_env = {**{k: os.environ[k] for k in OPENMP_ENV if k in os.environ}, **(extra_env or {})}
        self.images = project_images()
        self.local_images = local_images
        self.resolved: dict[str, Image] = {}  # pod image reference -> what runs it
        self.controllers = WorkloadControllers(self.api)
        self.pods: dict[str, PodRunner] = {}
        self.lock = threading.Lock()
        self.image_lock = threading.Lock()  # one image prepared at a time; the other pods wait for it
        self.index = 0
        self.created_dirs: list[Path] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True, name="kuberl-node-agent")
        self.ca_file = Path()
        self.errors: list[str] = []
        self.accounts: dict[str, tuple[str, str]] = {}  # pod address -> (namespace, service account)

    @property
    def gateway(self) -> str:
        return self.network.gateway

    def __enter__(self) -> NodeAgent:
        try:
            self.network.open()
            context, self.ca_file = self.network.api_server_tls()
            self.network.relay(443, self.api_port, context)
            for port in self.host_ports:
                self.network.relay(port, port)
            self.register_node()
            self.thread.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(30)
        for runner in list(self.pods.values()):
            runner.gone.set()
        for runner in list(self.pods.values()):
            runner.done.wait(30)
        self.network.close()
        shutil.rmtree(self.pods_dir, ignore_errors=True)
        for path in reversed(self.created_dirs):
            with contextlib.suppress(OSError):
                path.rmdir()

    def refused_requests(self) -> list[str]:
        """The pods' API requests so far that RBAC would have refused (the emulator authorizes them all)."""
        from cluster.rbac_audit import refused

        assert self.network.relays is not None
        return refused(self.api, list(self.network.relays.requests), dict(self.accounts))

    def register_node(self) -> None:
        """The Node object a kubelet registers: ready, on-demand, addressed at the bridge."""
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE_NAME, "labels": {"kubernetes.io/hostname": NODE_NAME}},
            "status": {
                "addresses": [{"type": "InternalIP", "address": self.gateway}],
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        if self.api.get(f"/api/v1/nodes/{NODE_NAME}") is None:
            self.api.post("/api/v1/nodes", node)

    def next_index(self) -> int:
        with self.lock:
            self.index += 1
            return self.index

    def image(self, reference: str) -> Image:
        """What runs a pod's image: the image itself when it is in local containers storage (its root
        filesystem prepared on first use), else the checkout standing in for a project image."""
        with self.lock:
            if reference in self.resolved:
                return self.resolved[reference]
        mapped = self.local_images is None or reference in self.local_images
        local = (self.local_images or {}).get(reference, reference)
        stored = None
        if mapped:
            with self.image_lock:
                try:
                    stored = stored_image(local)
                except (ImageStoreError, ValueError) as err:
                    raise ImageNotFound(f"{local}: {err}") from err
        if stored is None and self.local_images is not None and mapped:
            raise ImageNotFound(f"{local} (for {reference}) is not in local containers storage")
        image = stored or find_image(reference, self.images)
        with self.lock:
            self.resolved[reference] = image
        return image

    def container_root(self, pod_name: str, index: int = 0) -> Path:
        """A running container's root filesystem as the node sees it (/proc/PID/root)."""
        runner = next(r for r in list(self.pods.values()) if r.name == pod_name and not r.deleting.is_set())
        pid = runner.containers[index].pid1()
        if pid is None:
            raise LookupError(f"pod {pod_name}: container {index} is not running")
        return Path(f"/proc/{pid}/root")

    def mount_point(self, target: str, file: bool = False) -> None:
        """Create a missing mount point on the node (an image would have it); folders are removed again by
        close. A file (a termination message's, /dev/termination-log) is kept: removing a file that is a mount
        point elsewhere detaches those mounts, and another test run's containers may have theirs on it."""
        path = Path(target)
        with self.lock:
            missing = []
            while not path.exists():
                missing.append(path)
                path = path.parent
            for directory in reversed(missing[1:] if file else missing):
                directory.mkdir(exist_ok=True)
                self.created_dirs.append(directory)
            if file and missing:
                missing[0].touch()

    def config_data(self, namespace: str, ref: dict[str, Any], secret: bool) -> dict[str, bytes]:
        """A ConfigMap's or Secret's data. The emulator keeps a Secret's stringData as written (an API
        server moves it into data), so both are read."""
        name = ref.get("name") or ref.get("secretName")
        kind = "secrets" if secret else "configmaps"
        obj = self.api.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
        if obj is None:
            if ref.get("optional"):
                return {}
            raise KeyError(f"{kind[:-1]} {namespace}/{name}")
        out = {k: v.encode() for k, v in (obj.get("stringData") or {}).items()}
        if secret:
            out.update({k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()})
        else:
            out.update({k: v.encode() for k, v in (obj.get("data") or {}).items()})
            out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        return out

    def release(self, runner: PodRunner) -> None:
        """The pod's containers are gone: drop our finalizer, so the API server removes the pod."""
        with self.lock:
            if self.pods.get(runner.uid) is runner:
                del self.pods[runner.uid]
        if runner.gone.is_set():
            return
        with contextlib.suppress(Exception):
            pod = self.api.get(runner.path)
            if pod and pod["metadata"].get("uid") == runner.uid:
                kept = [f for f in pod["metadata"].get("finalizers") or [] if f != FINALIZER]
                self.api.patch(runner.path, {"metadata": {"finalizers": kept or None}})

    def loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self.sync()
            except Exception:
                log.exception("node agent")
                self.errors.append(traceback.format_exc())
            self.stopping.wait(0.3)

    def sync(self) -> None:
        pods = self.api.items("/api/v1/pods")
        self.controllers.sync(pods)
        seen = set()
        for pod in pods:
            meta = pod["metadata"]
            uid = meta.get("uid")
            seen.add(uid)
            runner = self.pods.get(uid)
            if runner is None:
                if meta.get("deletionTimestamp"):
                    if FINALIZER in (meta.get("finalizers") or []):  # ours from before, never run
                        kept = [f for f in meta["finalizers"] if f != FINALIZER]
                        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
                        self.api.patch(path, {"metadata": {"finalizers": kept or None}})
                    continue
                finalizers = [*(meta.get("finalizers") or []), FINALIZER]
                path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
                pod = self.api.patch(path, {"metadata": {"finalizers": finalizers}, "spec": {"nodeName": NODE_NAME}})
                if pod is None:  # deleted meanwhile
                    continue
                runner = PodRunner(self, pod)
                with self.lock:
                    self.pods[uid] = runner
                runner.thread.start()
            elif meta.get("deletionTimestamp"):
                runner.deleting.set()
            runner.pod = {**runner.pod, "status": pod.get("status") or runner.pod.get("status")}
        for uid, runner in list(self.pods.items()):
            if uid not in seen and not runner.deleting.is_set():
                runner.gone.set()  # force-deleted: stop at once, nothing to report
        self.update_hosts(pods)

    def update_hosts(self, pods: list[dict[str, Any]]) -> None:
        services = self.api.items("/api/v1/services")
        lines = [
            "127.0.0.1 localhost",
            f"{self.gateway} kubernetes.default.svc.cluster.local kubernetes.default.svc kubernetes.default kubernetes",
        ]
        running = [
            p for p in pods if (p.get("status") or {}).get("podIP") and not p["metadata"].get("deletionTimestamp")
        ]
        for service in services:
            meta, spec = service["metadata"], service.get("spec") or {}
            selector = spec.get("selector") or {}
            if not selector:
                continue
            # the Service's endpoints: ready pods, or every pod when it publishes not-ready addresses
            endpoints = sorted(
                (
                    p
                    for p in running
                    if p["metadata"]["namespace"] == meta["namespace"]
                    and all((p["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())
                    and (spec.get("publishNotReadyAddresses") or _ready(p))
                ),
                key=lambda p: p["metadata"]["name"],
            )
            name = f"{meta['name']}.{meta['namespace']}"
            headless = spec.get("clusterIP") == "None"
            for pod in endpoints if headless else endpoints[:1]:  # no virtual IP: one endpoint
                lines.append(f"{pod['status']['podIP']} {name}.svc.cluster.local {name}.svc {name}")
            for pod in endpoints if headless else []:  # a headless Service's per-pod names
                pod_spec = pod.get("spec") or {}
                if pod_spec.get("hostname") and pod_spec.get("subdomain") == meta["name"]:
                    host = f"{pod_spec['hostname']}.{name}"
                    lines.append(f"{pod['status']['podIP']} {host}.svc.cluster.local {host}.svc {host}")
        for runner in list(self.pods.values()):
            if runner.netns is None:
                continue
            own = runner.spec.get("hostname") or runner.name
            if runner.spec.get("subdomain"):  # the kubelet's own entry: FQDN and hostname
                own = f"{own}.{runner.spec['subdomain']}.{runner.namespace}.svc.cluster.local {own}"
            local = [line for line in lines if line.endswith(f".{runner.namespace}")]
            short = [f"{line.split()[0]} {line.rsplit(' ', 1)[1].rsplit('.', 1)[0]}" for line in local]
            text = "\n".join([*lines, *short, f"{runner.address} {own}", ""])
            self.network.write_hosts(runner.netns, text)
