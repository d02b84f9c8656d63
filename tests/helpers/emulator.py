"""An emulated Kubernetes API server (kmock, from the `dev` extra) with the RLJob kind, for the operator's
integration tests and its scale benchmark: no cluster is needed to run the real operator process against it.

kmock 0.8's quirks shape what is here (see docs/operator.md): the custom resource is registered directly
(posting the CRD does not register a kind), and the operator runs with `-A` (listing namespaces fails).

Server-side apply (PATCH with `application/apply-patch+yaml` and `?fieldManager=`), which kmock lacks, is
taught here as far as the operator's path needs it: an apply without a field manager, kind or matching name
is refused (400); an apply of a missing object creates it; otherwise the applied fields are merged into the
stored object (maps merged key by key, lists and scalars replaced by the applied ones, nulls ignored), and
an apply that changes nothing is not a write (no new resourceVersion, no watch event). The object records
`{manager, operation: Apply, apiVersion}` in `metadata.managedFields` for each manager that applied it.

What it does not model: which fields each manager owns (no `fieldsV1`; merge-patch writers are not recorded
as managers); conflicts between managers (every apply acts as `force=true`, never 409); the removal of a
field that a manager applied before and has stopped applying (a real API server removes or resets it when
no other manager owns it; here it stays); list merge keys (a real server merges `containers` by name,
`ports` by port, `ownerReferences` by uid; here the applied list replaces the stored one); defaulting and
`resourceVersion` preconditions in the applied object. Code under test must not depend on any of these.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import signal
import subprocess
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import yaml

RLJOB_RESOURCE = "kuberl.io/v1alpha1/rljobs"
WORKLOAD_RESOURCE = "kueue.x-k8s.io/v1beta1/workloads"
HANDLERS = ["-m", "kuberl.cli", "operator"]  # `kuberl operator`: watches every namespace, like `kopf run -A`
APPLY_PATCH = "application/apply-patch+yaml"


class Api:
    """Plain HTTP to the emulator: JSON in and out, None for 404."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data, {"Content-Type": content_type}, method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return None
            raise

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def items(self, path: str) -> list[dict[str, Any]]:
        return (self.get(path) or {}).get("items") or []

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self.call("POST", path, body)

    def patch(self, path: str, body: dict[str, Any]) -> Any:
        return self.call("PATCH", path, body, "application/merge-patch+json")

    def delete(self, path: str) -> Any:
        return self.call("DELETE", path)


# The request being routed in this asyncio task (aiohttp serves each request in its own task).
_ROUTING: contextvars.ContextVar[Any] = contextvars.ContextVar("kuberl_emulator_request")


class _RequestLog(list):
    """kmock keeps every request it has served and, to route a new one, scans that whole history once per
    candidate reaction (serving n requests costs O(n²): minutes for a thousand jobs' worth). Routing only
    asks whether the request being routed is in a reaction's view, so this log holds just that one, per
    task, and counts the rest (kmock numbers requests by the count). Tests assert through the API instead."""

    served = 0

    def append(self, request: Any) -> None:
        self.served += 1
        _ROUTING.set(request)

    def __iter__(self) -> Iterator[Any]:
        request = _ROUTING.get(None)
        return iter(() if request is None else (request,))

    def __len__(self) -> int:
        return self.served


def _merged(stored: Any, applied: Any) -> Any:
    """`applied` over `stored`: maps merged key by key, anything else replaced; nulls in `applied` ignored."""
    if isinstance(stored, dict) and isinstance(applied, dict):
        out = dict(stored)
        for key, value in applied.items():
            if value is not None:
                out[key] = _merged(stored.get(key), value)
        return out
    return applied


def _emulator() -> Any:
    import kmock

    def refused(message: str) -> Exception:
        return kmock.KubernetesError(status=400, reason="BadRequest", message=message)

    class Emulator(kmock.KubernetesEmulator):
        """kmock without two costs a real API server does not have: the request log (above), and a scan of
        every stored object to serve one by name (a dict lookup here, with the same result). And with what
        kmock leaves out: a uid on create, a new resourceVersion on every write, and server-side apply (see
        the module docstring). kopf tells its own writes coming back through the watch from older events by
        the resourceVersion; with one that never changes, it takes a late event for a new object and runs
        the create handler again."""

        written = 0

        def _server_side_apply(self, request: Any) -> Any:
            """The apply as the request kmock serves: a create, a merge of the applied fields, or (when it
            changes nothing) a read of the stored object."""
            manager = request.params.get("fieldManager")
            applied = request.data if isinstance(request.data, dict) else yaml.safe_load(request.text or "null")
            if not manager:
                raise refused("fieldManager is required for apply requests")
            if not isinstance(applied, dict) or not applied.get("apiVersion") or not applied.get("kind"):
                raise refused("an applied object needs apiVersion and kind")
            if (applied.get("metadata") or {}).get("name") != request.name:
                raise refused(f"the name of the applied object does not match the name on the URL ({request.name})")
            entry = {"manager": manager, "operation": "Apply", "apiVersion": applied["apiVersion"]}
            key = (request.resource, request.namespace, request.name)
            if key not in self._objects or self._objects[key].deleted:
                meta = {**applied["metadata"], "managedFields": [entry]}
                if request.namespace is not None:
                    meta["namespace"] = request.namespace
                return attrs.evolve(request, action=kmock.action.CREATE, data={**applied, "metadata": meta})
            stored = self._objects[key].raw
            merged = _merged(stored, applied)
            fields = stored["metadata"].get("managedFields") or []
            mine = [(m.get("manager"), m.get("operation")) == (manager, "Apply") for m in fields]
            fields = [entry if own else m for m, own in zip(fields, mine, strict=True)]
            merged["metadata"]["managedFields"] = fields if any(mine) else [*fields, entry]
            if merged == stored:
                return attrs.evolve(request, action=kmock.action.FETCH)  # a real API server writes nothing either
            return attrs.evolve(request, data=merged)

        async def _handle(self, request: Any) -> Any:
            content_type = next((v for k, v in request.headers.items() if k.lower() == "content-type"), "")
            if request.action == kmock.action.UPDATE and content_type.split(";")[0].strip() == APPLY_PATCH:
                request = self._server_side_apply(request)
                _ROUTING.set(request)  # kmock routes the request it is given: the one in the log
            if request.action in (kmock.action.CREATE, kmock.action.UPDATE) and isinstance(request.data, dict):
                self.written += 1
                meta = request.data.setdefault("metadata", {})
                meta["resourceVersion"] = str(self.written)
                if request.action == kmock.action.CREATE:
                    meta.setdefault("uid", str(uuid.uuid4()))
            return await super()._handle(request)

        def _KubernetesEmulator__get_objs(self, request: Any, strict: bool) -> list[Any]:
            if strict and request.name is not None:
                key = (request.resource, request.namespace, request.name)
                return [self._objects[key]] if key in self._objects else []
            return super()._KubernetesEmulator__get_objs(request, strict)

    emulator = Emulator()
    emulator._requests = _RequestLog()
    return emulator


@contextmanager
def emulated_api_server() -> Iterator[str]:
    """A kmock API server on 127.0.0.1 (in a thread of this process) that knows RLJobs; yields its URL."""
    import kmock

    started, box = threading.Event(), {}

    async def serve() -> None:
        async with _emulator() as emulator, kmock.Server(emulator) as server:
            emulator.resources.load_bundled()
            emulator.resources[RLJOB_RESOURCE] = kmock.ResourceInfo(
                kind="RLJob",
                namespaced=True,
                subresources={"status"},
                verbs={"get", "list", "watch", "create", "patch", "update", "delete"},
            )
            # Kueue's Workload, for queued jobs (the tests play Kueue, admitting and evicting)
            emulator.resources[WORKLOAD_RESOURCE] = kmock.ResourceInfo(
                kind="Workload",
                namespaced=True,
                subresources={"status"},
                verbs={"get", "list", "watch", "create", "patch", "update", "delete"},
            )
            box["url"], box["stop"], box["loop"] = str(server.url), asyncio.Event(), asyncio.get_running_loop()
            started.set()
            await box["stop"].wait()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("the emulated API server did not start within 10 s")
    try:
        yield box["url"]
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(10)


def write_kubeconfig(path: Path, url: str, namespace: str = "default") -> Path:
    """A kubeconfig for `url` (the emulator accepts any token)."""
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "kmock",
                "clusters": [{"name": "kmock", "cluster": {"server": url.rstrip("/")}}],
                "users": [{"name": "kmock", "user": {"token": "test"}}],
                "contexts": [
                    {"name": "kmock", "context": {"cluster": "kmock", "user": "kmock", "namespace": namespace}}
                ],
            }
        )
    )
    return path


class OperatorProcess:
    """The real operator (`kopf run` over kuberl_operator.handlers) as a subprocess, stopped by its pid."""

    def __init__(self, kubeconfig: Path, log: Path, env: dict[str, str] | None = None) -> None:
        self.kubeconfig, self.log, self.env, self.process = kubeconfig, log, env or {}, None

    def start(self, command: list[str]) -> None:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.env}
        self.process = subprocess.Popen(command, env=env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT)

    def peak_rss_bytes(self) -> int | None:
        """The process's peak resident memory (VmHWM), while it runs."""
        if self.process is None:
            return None
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def cpu_seconds(self) -> float:
        """User + system CPU seconds the process has used."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)  # a crash, not a clean shutdown: the worst case
            self.process.wait(10)
