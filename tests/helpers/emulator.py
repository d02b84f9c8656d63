"""An emulated Kubernetes API server (kmock, from the `dev` extra) with the RLJob kind, for the operator's
integration tests and its scale benchmark: no cluster is needed to run the real operator process against it.

kmock 0.8's quirks shape what is here (see docs/operator.md): kmock registers no kind when a CRD is posted
(this emulator does, below), and the operator runs with `-A` (listing namespaces fails).

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

What the real `kubectl` needs is taught too, so that it works against the emulator as against a cluster
(tests/operator/test_kubectl.py; what works is listed in docs/operator.md):
- discovery with kinds, scopes, verbs, short names and categories, legacy and aggregated, and the OpenAPI v3
  documents kubectl reads before a write (tests/helpers/emulator_discovery.py);
- custom resource definitions: those under crds/ are installed at start, and a CRD created or applied later
  registers its kind (deleting a CRD does not unregister it); `?fieldValidation=Strict` refuses a field the
  CRD's schema does not declare (built-in kinds are not validated);
- `kind` and `apiVersion` on lists (`RLJobList`), in name order; `creationTimestamp` on create; label and
  field selectors on lists and watches (tests/helpers/emulator_selectors.py); a watch from a
  `resourceVersion` leaves out objects unchanged since and is sent the removals after it (removals get a
  version of their own); the Table that `kubectl get` asks for (tests/helpers/emulator_tables.py);
  `?dryRun=All` (nothing stored); 404 and 409 in the API server's words; protobuf bodies refused (415);
- garbage collection by owner reference: when an object is removed (not merely marked for deletion), the
  objects that name its uid in `ownerReferences` are deleted, in the background, as the garbage collector
  would (`propagationPolicy: Orphan` keeps them). An object whose owner never existed is kept; foreground
  deletion is treated as background.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import re
import signal
import subprocess
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
import jsonpatch
import yaml

from helpers import emulator_discovery as discovery
from helpers.crd_schema import undeclared_fields
from helpers.emulator_selectors import SelectorError, selected
from helpers.emulator_tables import AGE, BUILT_IN, printer_columns, table, wants_table

WORKLOAD_RESOURCE = "kueue.x-k8s.io/v1beta1/workloads"
CRD_RESOURCE = "apiextensions.k8s.io/v1/customresourcedefinitions"
CRDS = sorted((Path(__file__).resolve().parents[2] / "crds").glob("*.yaml"))  # installed at start
HANDLERS = ["-m", "kuberl_app.cli", "operator"]  # `kuberl operator`: watches every namespace, like `kopf run -A`
APPLY_PATCH = "application/apply-patch+yaml"
CRD_VERBS = {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}


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


def _header(request: Any, name: str) -> str:
    return next((v for k, v in request.headers.items() if k.lower() == name), "")


def _storage_key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def _resource_version(obj: dict[str, Any]) -> int:
    version = (obj.get("metadata") or {}).get("resourceVersion") or ""
    return int(version) if version.isdigit() else 0


def _emulator() -> Any:
    import kmock

    def refused(message: str) -> Exception:
        return kmock.KubernetesError(status=400, reason="BadRequest", message=message)

    crd_resource = kmock.resource(CRD_RESOURCE)
    writes = (kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE)

    class Emulator(kmock.KubernetesEmulator):
        """kmock without two costs a real API server does not have: the request log (above), and a scan of
        every stored object to serve one by name (a dict lookup here, with the same result). And with what
        kmock leaves out: a uid on create, a new resourceVersion on every write, and server-side apply (see
        the module docstring). kopf tells its own writes coming back through the watch from older events by
        the resourceVersion; with one that never changes, it takes a late event for a new object and runs
        the create handler again. And what the real kubectl needs (the module docstring)."""

        written = 0

        def __attrs_post_init__(self) -> None:
            super().__attrs_post_init__()
            # (group, version, plural) -> the table columns and the schema of each installed custom resource
            self.columns: dict[tuple[str, str, str], list[Any]] = {}
            self.schemas: dict[tuple[str, str, str], dict[str, Any]] = {}
            self.removals: list[tuple[int, tuple[Any, str | None, str], dict[str, Any]]] = []  # (version, key, last)
            self.last_removal: dict[Any, int] = {}  # resource -> the version of its newest removal
            self.fallback["get", re.compile(r"/openapi/v3/?")] << self._serve_openapi_root
            self.fallback["get", re.compile(r"/openapi/v3/(.+)")] << self._serve_openapi_document

        def install_crd(self, crd: dict[str, Any]) -> None:
            """Serve the kind a CustomResourceDefinition defines, as the API server does once it is created."""
            spec, names = crd["spec"], crd["spec"]["names"]
            for version in spec["versions"]:
                if not version.get("served", True):
                    continue
                key = (spec["group"], version["name"], names["plural"])
                self.resources[kmock.resource(*key)] = kmock.ResourceInfo(
                    kind=names["kind"],
                    singular=names.get("singular") or names["kind"].lower(),
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    verbs=CRD_VERBS,
                    shortnames=names.get("shortNames") or [],
                    categories=names.get("categories") or [],
                    subresources=list(version.get("subresources") or {}),
                )
                columns = version.get("additionalPrinterColumns")
                self.columns[key] = printer_columns(columns) if columns else [AGE]
                if schema := (version.get("schema") or {}).get("openAPIV3Schema"):
                    self.schemas[key] = schema

        def store_crd(self, crd: dict[str, Any]) -> None:
            """A CRD as if `kubectl apply -f crds/` had created it before the tests: stored and installed."""
            self.written += 1
            meta = {
                **crd["metadata"],
                "uid": str(uuid.uuid4()),
                "resourceVersion": str(self.written),
                "creationTimestamp": _now(),
            }
            self.objects[crd_resource, None, crd["metadata"]["name"]] = {**crd, "metadata": meta}
            self.install_crd(crd)

        def _served(self) -> dict[Any, Any]:
            """Every declared resource with its discovery information (a kind guessed where none is set)."""
            served = {}
            for resource in self.resources:
                info = self.resources[resource]
                served[resource] = info if info.kind else attrs.evolve(info, kind=resource.plural.capitalize())
            return served

        def _kind(self, resource: Any) -> str:
            # never self.resources.get(): kmock's ResourcesArray adds a missing key on a lookup
            if resource in self.resources and self.resources[resource].kind:
                return self.resources[resource].kind
            return resource.plural.capitalize()

        def _table(self, request: Any, objects: list[dict[str, Any]]) -> dict[str, Any] | None:
            """The Table of `objects` when the client asks for one (`kubectl get`), else None."""
            version = wants_table(_header(request, "accept"))
            if version is None:
                return None
            key = (request.resource.group, request.resource.version, request.resource.plural)
            columns = self.columns.get(key) or BUILT_IN.get(key[::2]) or [AGE]
            return table(objects, columns, version, request.params)

        # discovery: kmock's own answers lack the core group's name, the aggregated form and any OpenAPI

        async def _serve_api(self, request: Any) -> Any:
            if discovery.wants_aggregated(_header(request, "accept")):
                return _json(discovery.aggregated(self._served(), core=True), discovery.AGGREGATED)
            return _json(discovery.api_versions())

        async def _serve_apis(self, request: Any) -> Any:
            if discovery.wants_aggregated(_header(request, "accept")):
                return _json(discovery.aggregated(self._served(), core=False), discovery.AGGREGATED)
            return _json(discovery.api_group_list(self._served()))

        async def _serve_group(self, request: Any) -> Any:
            if (doc := discovery.api_group(self._served(), request.resource.group)) is None:
                raise kmock.KubernetesResourceNotFoundError()
            return doc

        async def _serve_version(self, request: Any) -> Any:
            doc = discovery.api_resource_list(self._served(), request.resource.group, request.resource.version)
            if doc is None:
                raise kmock.KubernetesResourceNotFoundError()
            return doc

        async def _serve_server_version(self, request: Any) -> Any:
            # kmock says 1.26 (k3s); what is served here is what kubectl 1.32 asks for, with no skew warning
            return {"major": "1", "minor": "32", "gitVersion": "v1.32.0+kmock", "platform": "linux/amd64"}

        async def _serve_openapi_root(self, request: Any) -> Any:
            return discovery.openapi_root(self._served(), self._schemas())

        async def _serve_openapi_document(self, request: Any) -> Any:
            parts = request.url.path.strip("/").split("/")[2:]  # api/v1 or apis/GROUP/VERSION
            if parts[:1] == ["api"] and len(parts) == 2:
                group, version = "", parts[1]
            elif parts[:1] == ["apis"] and len(parts) == 3:
                group, version = parts[1], parts[2]
            else:
                raise kmock.KubernetesEndpointNotFoundError()
            return discovery.openapi_document(self._served(), self._schemas(), group, version)

        def _schemas(self) -> dict[Any, dict[str, Any]]:
            return {kmock.resource(*key): schema for key, schema in self.schemas.items()}

        # reads: typed lists, selectors, tables

        async def _serve_list(self, request: Any) -> Any:
            listed = await super()._serve_list(request)
            resource, kind = request.resource, self._kind(request.resource)
            api_version = discovery.group_version(resource.group, resource.version)
            # as new as every object it shows and every removal it reflects, so that a watch from it is sent
            # what changed after it and nothing before
            shown = [_resource_version(item) for item in listed["items"]]
            version = str(max([*shown, self.last_removal.get(resource, 0)]))
            try:
                items = [
                    {"apiVersion": api_version, "kind": kind, **i}
                    for i in sorted(listed["items"], key=_storage_key)  # a real server's order (etcd keys)
                    if selected(request.params, i)
                ]
            except SelectorError as err:
                raise refused(str(err)) from None
            if (printed := self._table(request, items)) is not None:
                printed["metadata"]["resourceVersion"] = version
                return printed
            return {
                "kind": f"{kind}List",
                "apiVersion": api_version,
                "metadata": {"resourceVersion": version},
                "items": items,
            }

        async def _serve_fetch(self, request: Any) -> Any:
            obj = await super()._serve_fetch(request)
            printed = self._table(request, [obj]) if request.subresource is None else None
            return obj if printed is None else printed

        async def _serve_watch(self, request: Any) -> Any:
            # kmock streams without a content type; client-go decodes a watch only as JSON
            return kmock.Response(payload=self._watch_events(request), headers={"Content-Type": "application/json"})

        async def _watch_events(self, request: Any) -> Any:
            since = request.params.get("resourceVersion", "")
            since_version = int(since) if since.isdigit() else 0

            async def removed_then_stored() -> Any:
                yield b""  # the headers go out at once, as kmock's own stream does
                for version, (resource, namespace, name), raw in list(self.removals) if since_version else []:
                    mine = resource == request.resource and request.namespace in (None, namespace)
                    if version > since_version and mine and request.name in (None, name):
                        yield {"type": "DELETED", "object": raw}  # removed after the client's version
                async for event in kmock.KubernetesEmulator._serve_watch(self, request):
                    yield event

            async for event in removed_then_stored():
                if isinstance(event, dict):
                    obj = event.get("object") or {}
                    # unchanged since the version the client has: a real server sends nothing. kmock marks an
                    # object for deletion without a new version, so one marked is always sent
                    unchanged = event.get("type") == "ADDED" and 0 < _resource_version(obj) <= since_version
                    if unchanged and not (obj.get("metadata") or {}).get("deletionTimestamp"):
                        continue
                    try:
                        if not selected(request.params, obj):
                            continue
                    except SelectorError as err:
                        raise refused(str(err)) from None
                    if (printed := self._table(request, [obj])) is not None:
                        event = {**event, "object": printed}
                yield event

        # writes

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

        def _validate_fields(self, request: Any) -> None:
            """`?fieldValidation=Strict` (kubectl's default): a field the kind's schema lacks is refused."""
            key = (request.resource.group, request.resource.version, request.resource.plural)
            if request.params.get("fieldValidation") != "Strict" or key not in self.schemas:
                return
            if unknown := undeclared_fields(self.schemas[key], request.data):
                kind = self._kind(request.resource)
                fields = ", ".join(f'unknown field "{f.lstrip(".")}"' for f in unknown)
                raise refused(
                    f'{kind} in version "{key[1]}" cannot be handled as a {kind}: strict decoding error: {fields}'
                )

        async def _handle(self, request: Any) -> Any:
            content_type = _header(request, "content-type")
            if "protobuf" in content_type:
                raise kmock.KubernetesError(
                    status=415,
                    reason="UnsupportedMediaType",
                    message="the emulated API server reads JSON and YAML bodies only, not protobuf",
                )
            if request.action == kmock.action.UPDATE and content_type.split(";")[0].strip() == APPLY_PATCH:
                request = self._server_side_apply(request)
                _ROUTING.set(request)  # kmock routes the request it is given: the one in the log
            if request.action in (kmock.action.CREATE, kmock.action.UPDATE) and isinstance(request.data, dict):
                self._validate_fields(request)
            options = request.data if request.action == kmock.action.DELETE and isinstance(request.data, dict) else {}
            dry_run = request.params.get("dryRun") == "All" or "All" in (options.get("dryRun") or [])
            if dry_run and request.action in writes:  # a query parameter; a delete's is in its DeleteOptions
                return self._dry_run(request)
            if request.action in (kmock.action.CREATE, kmock.action.UPDATE) and isinstance(request.data, dict):
                self.written += 1
                meta = request.data.setdefault("metadata", {})
                meta["resourceVersion"] = str(self.written)
                if request.action == kmock.action.CREATE:
                    meta.setdefault("uid", str(uuid.uuid4()))
                    meta["creationTimestamp"] = _now()  # the server's, whatever the client sent
            key = (request.resource, request.namespace, request.name)
            present = request.name is not None and key in self._objects and not self._objects[key].deleted
            try:
                response = await super()._handle(request)
            except jsonpatch.JsonPatchException as err:
                # kube-apiserver answers 422 when a JSON patch does not apply (a `test` op on a resourceVersion
                # that moved on): kopf then waits for its next event, as it does on a cluster; a 500 made it
                # resend the same stale patch with back-off for most of a minute
                raise kmock.KubernetesError(
                    status=422, reason="Invalid", message=f"the JSON patch failed: {err}"
                ) from None
            if request.resource == crd_resource and request.action in (kmock.action.CREATE, kmock.action.UPDATE):
                name = request.name or request.data["metadata"]["name"]
                self.install_crd(self._objects[crd_resource, None, name].raw)
            if present and self._objects[key].deleted:  # a delete, or a patch that released the last finalizer
                options = request.data if request.action == kmock.action.DELETE else None
                orphan = isinstance(options, dict) and options.get("propagationPolicy") == "Orphan"
                await self._removed(key, collect=not orphan)
            return response

        async def _removed(self, key: tuple[Any, str | None, str], collect: bool = True) -> None:
            """Record the removal of the object at `key` under a new resourceVersion (a watch from an older
            one is sent its DELETED event) and, unless its dependents are orphaned, delete them."""
            self.written += 1
            self.removals.append((self.written, key, self._objects[key].last.raw))
            self.last_removal[key[0]] = self.written
            if collect:
                await self._collect_dependents_of(key)

        def _dry_run(self, request: Any) -> Any:
            """`?dryRun=All` (`kubectl apply --dry-run=server`): the object as the write would leave it
            (a patch merged as kmock merges it), nothing stored."""
            import aiohttp.web

            data = request.data if isinstance(request.data, dict) and request.action != kmock.action.DELETE else {}
            name = request.name or (data.get("metadata") or {}).get("name")
            key = (request.resource, request.namespace or (data.get("metadata") or {}).get("namespace"), name)
            exists = key in self._objects and not self._objects[key].deleted
            if request.action == kmock.action.CREATE:
                if exists:
                    raise kmock.KubernetesError(status=409, reason="AlreadyExists")
                meta = {**(data.get("metadata") or {}), "uid": str(uuid.uuid4()), "creationTimestamp": _now()}
                return aiohttp.web.json_response({**data, "metadata": meta}, status=201)
            if not exists:
                raise kmock.KubernetesObjectNotFoundError()
            stored = self._objects[key].raw
            return aiohttp.web.json_response(stored if request.action == kmock.action.DELETE else _merged(stored, data))

        async def _collect_dependents_of(self, key: tuple[Any, str | None, str]) -> None:
            """Delete the objects that name the removed object at `key` as their owner (the garbage collector's
            background deletion), theirs in turn."""
            uid = (self._objects[key].last.get("metadata") or {}).get("uid")
            if not uid:
                return
            gone = []
            async with self._lock:
                for dependent, obj in self._objects.items():
                    if obj.deleted:
                        continue
                    meta = obj.raw.get("metadata") or {}
                    if not any(ref.get("uid") == uid for ref in meta.get("ownerReferences") or []):
                        continue
                    if meta.get("finalizers"):
                        if not meta.get("deletionTimestamp"):
                            obj.patch({"metadata": {"deletionTimestamp": _now()}})
                            await self._buses[dependent[0]].put({"type": "MODIFIED", "object": obj.raw})
                        continue
                    raw = obj.raw
                    obj.delete()
                    await self._buses[dependent[0]].put({"type": "DELETED", "object": raw})
                    gone.append(dependent)
            for dependent in gone:
                await self._removed(dependent)

        async def _render_error(self, exc: Exception) -> Any:
            """kmock's 404 and 409 in the API server's words (`rljobs.kuberl.io "x" not found`), which kubectl
            prints as they are."""
            request = _ROUTING.get(None)
            resource = getattr(request, "resource", None)
            if isinstance(exc, kmock.KubernetesError) and resource is not None and exc.status in (404, 409):
                qualified = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
                data = request.data if isinstance(request.data, dict) else {}
                name = request.name or (data.get("metadata") or {}).get("name")
                details = {"name": name, "group": resource.group, "kind": resource.plural}
                if exc.status == 409:
                    message, reason = f'{qualified} "{name}" already exists', "AlreadyExists"
                elif isinstance(exc, kmock.KubernetesObjectNotFoundError):
                    message, reason = f'{qualified} "{name}" not found', "NotFound"
                else:
                    message, reason = "the server could not find the requested resource", "NotFound"
                exc = kmock.KubernetesError(status=exc.status, reason=reason, message=message, details=details)
            return await super()._render_error(exc)

        def _KubernetesEmulator__get_objs(self, request: Any, strict: bool) -> list[Any]:
            if strict and request.name is not None:
                key = (request.resource, request.namespace, request.name)
                return [self._objects[key]] if key in self._objects else []
            return super()._KubernetesEmulator__get_objs(request, strict)

    emulator = Emulator()
    emulator._requests = _RequestLog()
    return emulator


def _json(doc: Any, content_type: str = "application/json") -> Any:
    """A JSON response with its content type. Always explicit: kmock merges a response's headers into the
    reaction that served it, so one answer's content type would otherwise stick to the next."""
    import kmock

    return kmock.Response(payload=json.dumps(doc).encode(), headers={"Content-Type": content_type})


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@contextmanager
def emulated_api_server() -> Iterator[str]:
    """A kmock API server on 127.0.0.1 (in a thread of this process) that knows RLJobs (the CRDs under crds/)
    and the built-in kinds; yields its URL."""
    import kmock

    started, box = threading.Event(), {}

    async def serve() -> None:
        async with _emulator() as emulator, kmock.Server(emulator) as server:
            emulator.resources.load_bundled()
            for path in CRDS:  # the RLJob kind, as installed by `kubectl apply -f crds/`
                emulator.store_crd(yaml.safe_load(path.read_text()))
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
