"""The sandbox server's own OpenAPI spec, fuzzed with schemathesis: no request, however odd, gets a 5xx.

Every operation of the spec the server serves is fuzzed against a real `kuberl sandbox` process (started as
root, with isolation, like production). Session-scoped operations run mostly against a real, live session
holding files, links and folders, so the generated bodies reach the file layer instead of a 404. The spec is
sharpened for fuzzing only: file paths, tool calls and patches get strategies full of the inputs that break
file layers (odd unicode, lone surrogates, over-long names, `..`, NUL, deep folders, names of the session's
own files and links). Then a short deterministic list of known edge inputs, each of which must get a 4xx
(or, through `/step`, an `error:` observation), after which the session still describes, lists, snapshots
and closes; and the same for what an agent's commands can leave behind (odd names, links, deep trees, FIFOs).

The server is one of this module's own (a fuzz that wedges it, or the 500s it counts, stay here), and it logs
the traceback of every 500: failures quote the exception from that log, and the first request that caused it.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from kuberl_sandbox.local import SandboxEndpoint, local_sandbox

pytestmark = pytest.mark.slow

TASK = {
    "taskId": "fuzz",
    "prompt": "p",
    "files": {"module.py": "x = 1\n", "src/app.py": "print('hi')\n", "notes.txt": "mine\n"},
    "hiddenTests": {"hidden_test_app.py": "import unittest\n"},
}
# What a live session holds besides TASK's files: a link loop, a link out, a link in, nested folders.
SETUP = "ln -s loop loop; ln -s /etc/passwd out; ln -s module.py alias; mkdir -p d/e; echo y > d/e/f.txt"

# Every operation of the spec; test_every_operation_is_fuzzed fails when the server grows one not listed.
# (method, path, examples): `examples` bounds the run (the whole file takes about 40 s on 2 shared cores).
OPERATIONS = [
    ("POST", "/v1/sessions", 120),
    ("POST", "/v1/sessions/restore", 60),
    ("GET", "/v1/sessions/{session_id}", 20),
    ("DELETE", "/v1/sessions/{session_id}", 20),
    ("POST", "/v1/sessions/{session_id}/exec", 50),
    ("GET", "/v1/sessions/{session_id}/files", 250),
    ("POST", "/v1/sessions/{session_id}/files", 300),
    ("POST", "/v1/sessions/{session_id}/files/replace", 200),
    ("POST", "/v1/sessions/{session_id}/files/patch", 80),
    ("GET", "/v1/sessions/{session_id}/list", 200),
    ("POST", "/v1/sessions/{session_id}/tests", 15),
    ("POST", "/v1/sessions/{session_id}/step", 400),
    ("POST", "/v1/sessions/{session_id}/snapshot", 20),
]
LIVE = "live-session"  # a path parameter the test swaps for the id of a real session before the call
NO_KEEPALIVE = httpx.Limits(max_keepalive_connections=0)


# ---------------------------------------------------------------------------------------------------------
# Strategies for what file layers trip on; registered as string formats the sharpened spec refers to.

NAMES = [
    "module.py",
    "src",
    "app.py",
    "notes.txt",
    "loop",
    "out",
    "alias",
    "d",
    "e",
    "f.txt",
    "hidden",
    "..",
    ".",
    "",
    "x",
    "\n",
    " ",
    "~",
    "-rf",
    "%2e%2e",
    "\\",
    "é",
    "\u202e",
    "\ufeff",
    "\x7f",
    "\x00",
    "\udcff",
    "\ud800",
    "\udfff",
    "a" * 255,
    "a" * 256,
    "ü" * 128,
    "\t",
]
_segment = st.one_of(
    st.sampled_from(NAMES),
    st.text(st.characters(exclude_categories=()), max_size=12),  # every code point, lone surrogates included
    st.integers(200, 600).map(lambda n: "n" * n),
)
_path = st.one_of(
    st.lists(_segment, min_size=1, max_size=6).map("/".join),
    st.tuples(st.sampled_from(["/", "./", "../", "d/../", "module.py/", "loop/", "out/"]), _segment).map("".join),
    st.integers(100, 3000).map(lambda n: "d/" * n + "x"),  # deep: past Python's recursion limit, past PATH_MAX
    st.text(st.characters(exclude_categories=()), max_size=40),
)
_text = st.text(st.characters(exclude_categories=()), max_size=200)
_big = st.sampled_from([1 << 16, 1 << 20, (16 << 20) + 1]).map(lambda n: "a" * n)  # the last passes the body limit
_content = st.one_of(_text, _text, _text, _big)


def _no_surrogates(text: str) -> str:
    """A query string cannot carry a lone surrogate: the client would refuse to encode it."""
    return "".join("\ufffd" if 0xD800 <= ord(c) < 0xE000 else c for c in text)


def _diff(path: str, body: str) -> str:
    return f"--- a/{path}\n+++ b/{path}\n@@ -0,0 +1 @@\n+{body}\n"


FORMATS = {
    "kuberl-path": _path,
    "kuberl-text-path": _path.map(_no_surrogates),
    "kuberl-content": _content,
    # text to replace: mostly some that TASK's files hold, so the replacement gets written
    "kuberl-old": st.one_of(st.sampled_from(["x", "1", "i", "\n", "mine", "print"]), _text.filter(bool)),
    "kuberl-patch": st.one_of(st.tuples(_path, st.text(max_size=20)).map(lambda t: _diff(*t)), st.text(max_size=80)),
}
for _name, _strategy in FORMATS.items():
    schemathesis.openapi.format(_name, _strategy)


def _tool(name: str, **arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["name", "arguments"],
        "additionalProperties": False,
        "properties": {
            "name": {"enum": [name]},
            "arguments": {"type": "object", "required": list(arguments), "properties": arguments},
        },
    }


def sharpened(spec: dict[str, Any]) -> dict[str, Any]:
    """The server's spec with file paths, contents, patches and tool calls pointed at the fuzzing formats.

    Only what the schema leaves open is narrowed (a `string` becomes a `string` of some format, the free-form
    tool `arguments` gain the shapes of the file tools); the original ToolCall stays one of the choices."""
    spec = copy.deepcopy(spec)
    schemas = spec["components"]["schemas"]
    path, content = {"type": "string", "format": "kuberl-path"}, {"type": "string", "format": "kuberl-content"}
    old = {"type": "string", "minLength": 1, "format": "kuberl-old"}
    for model in ("WriteRequest", "ReplaceRequest"):
        schemas[model]["properties"]["path"] = path
    schemas["WriteRequest"]["properties"]["content"] = content
    schemas["ReplaceRequest"]["properties"]["old"] = old
    schemas["ReplaceRequest"]["properties"]["new"] = content
    schemas["PatchRequest"]["properties"]["patch"] = {"type": "string", "minLength": 1, "format": "kuberl-patch"}
    for name in ("files", "hiddenTests"):
        # (keys are checked by a validator that cannot take lone surrogates: they come without)
        schemas["Task"]["properties"][name]["propertyNames"] = {"format": "kuberl-text-path"}
    schemas["ToolCallAny"] = schemas["ToolCall"]
    schemas["ToolCall"] = {
        "anyOf": [
            {"$ref": "#/components/schemas/ToolCallAny"},
            _tool("read_file", path=path),
            _tool("write_file", path=path, content=content),
            _tool("replace", path=path, old=old, new=content),
            _tool("list_files", path=path),
        ]
    }
    for route in ("/v1/sessions/{session_id}/files", "/v1/sessions/{session_id}/list"):
        for parameter in spec["paths"][route]["get"]["parameters"]:
            if parameter["name"] == "path":
                parameter["schema"] = {**parameter["schema"], "format": "kuberl-text-path"}
    return spec


# ---------------------------------------------------------------------------------------------------------
# The server, its log, and what a 500 left in it.


@dataclass
class Server:
    endpoint: SandboxEndpoint
    http: httpx.Client

    @property
    def log(self):
        return self.endpoint.root.parent / "server.log"

    def log_size(self) -> int:
        return self.log.stat().st_size

    def exception_since(self, offset: int) -> str:
        """The last exception the server logged after `offset`: its line and the sandbox frame that raised it."""
        with self.log.open("rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", errors="replace")
        errors = re.findall(r"^(?:\w+\.)*\w*(?:Error|Exception|Exit)\b.*$", text, flags=re.M)
        frames = re.findall(r'^\s+File "([^"]*kuberl[^"]*)", line (\d+), in (\w+)$', text, flags=re.M)
        where = f" at {frames[-1][0].rsplit('/', 1)[-1]}:{frames[-1][1]} in {frames[-1][2]}()" if frames else ""
        return short(errors[-1] if errors else "(no traceback logged)", 400) + where

    def new_session(self, setup: str | None = SETUP) -> str:
        response = self.http.post("/v1/sessions", json={"task": TASK})
        assert response.status_code == 201, response.text
        sid = response.json()["sessionId"]
        if setup:
            assert self.http.post(f"/v1/sessions/{sid}/exec", json={"command": setup}).status_code == 200
        return sid

    def close(self, sid: str) -> str | None:
        """Close a session; what went wrong if it did not close (a session already gone is fine)."""
        offset = self.log_size()
        try:
            response = self.http.delete(f"/v1/sessions/{sid}")
        except httpx.HTTPError as err:  # the server dropped the connection
            return f"{err!r}; server log: {self.exception_since(offset)}"
        if response.status_code in (204, 404):
            return None
        return f"{response.status_code} {short(response.text, 200)}: {self.exception_since(offset)}"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """A server of its own: a fuzz that wedges or poisons it must not take the shared one down with it."""
    with (
        local_sandbox() as endpoint,
        # no connection reuse: after a 500 the server drops the connection, which would fail the next request
        httpx.Client(base_url=endpoint.url, headers=auth(endpoint), timeout=60, limits=NO_KEEPALIVE) as http,
    ):
        yield Server(endpoint, http)
        # A fuzzed session may hold folders thousands deep, which shutil.rmtree cannot remove (RecursionError).
        subprocess.run(["rm", "-rf", "--one-file-system", str(endpoint.root)], check=False)


def auth(endpoint: SandboxEndpoint) -> dict[str, str]:
    return {"authorization": f"Bearer {endpoint.token}"}


@pytest.fixture(scope="module")
def schema(server):
    spec = server.http.get("/openapi.json").json()
    return schemathesis.openapi.from_dict(sharpened(spec))


def test_every_operation_is_fuzzed(schema):
    served = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
    assert served == {(method, path) for method, path, _ in OPERATIONS}


# ---------------------------------------------------------------------------------------------------------
# The fuzz.


@dataclass
class Finding:
    operation: str
    status: int
    exception: str
    curl: str
    count: int = 1


def strategy_for(operation, token: dict[str, str]) -> st.SearchStrategy:
    """Of 10 cases: 6 positive on a live session, 2 negative on it, 1 on a random session id, 1 unsigned."""
    scoped = "{session_id}" in operation.path
    live = {"path_parameters": {"session_id": LIVE}} if scoped else {}
    positive = operation.as_strategy(GenerationMode.POSITIVE, headers=token, **live)
    negative = operation.as_strategy(GenerationMode.NEGATIVE, headers=token, **live)
    elsewhere = operation.as_strategy(GenerationMode.POSITIVE, headers=token) if scoped else positive
    unsigned = operation.as_strategy(GenerationMode.POSITIVE)  # a generated Authorization header, or none
    weighted = [positive] * 6 + [negative] * 2 + [elsewhere, unsigned]
    return st.sampled_from(range(len(weighted))).flatmap(weighted.__getitem__)


def fuzz(server: Server, schema, method: str, path: str, examples: int) -> list[Finding]:
    """Run `examples` generated cases of one operation; every distinct failure, with the first case that hit it."""
    operation = schema[path][method]
    findings: dict[tuple[Any, ...], Finding] = {}
    opened: list[str] = []  # sessions to close afterwards: the live one and any the fuzz created
    live: list[str] = []
    statuses: dict[int, int] = {}

    def record(status: int, exception: str, curl: str, operation: str = f"{method} {path}") -> None:
        key = (operation, status, exception.split(":", 1)[0], exception.rsplit(" at ", 1)[-1])
        if key in findings:
            findings[key].count += 1
        else:
            findings[key] = Finding(operation, status, exception, curl)

    def one(case) -> None:
        if (case.path_parameters or {}).get("session_id") == LIVE:
            if not live or method == "DELETE":  # DELETE gets a fresh session every time
                live.append(server.new_session())
                opened.append(live[-1])
            case.path_parameters["session_id"] = live[-1]
        if path.endswith("/exec") and isinstance(case.body, dict):
            timeout = case.body.get("timeout")
            if isinstance(timeout, int | float) and 5 < timeout <= 600:  # valid but long: keep the run short
                case.body["timeout"] = 5
        offset = server.log_size()
        try:
            response = case.call(base_url=server.endpoint.url, timeout=60)
        except requests.ConnectionError as err:  # the server dropped the connection: as bad as a 500
            record(0, f"{err!r}; server log: {server.exception_since(offset)}", case.as_curl_command())
            return
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        if response.status_code == 201:
            opened.append(response.json()["sessionId"])
        checks = [not_a_server_error]
        if 200 <= response.status_code < 300:
            checks += [response_schema_conformance, content_type_conformance]
        try:
            case.validate_response(response, checks=checks)
        except (Exception, BaseExceptionGroup) as failure:
            exception = server.exception_since(offset) if response.status_code >= 500 else short(str(failure), 600)
            record(response.status_code, exception, case.as_curl_command())

    settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,  # the same cases every run
        database=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: every distinct failure is collected instead
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )(given(case=strategy_for(operation, auth(server.endpoint)))(one))()
    print(f"{method} {path}: statuses {dict(sorted(statuses.items()))}")

    if live and method != "DELETE":  # whatever the fuzz left in the session, it still describes, lists, snapshots
        for after, route in [("GET", ""), ("GET", "/list"), ("POST", "/snapshot")]:
            offset, then = server.log_size(), f"then {after} /v1/sessions/{{session_id}}{route}"
            try:
                response = server.http.request(after, f"/v1/sessions/{live[-1]}{route}")
            except httpx.HTTPError as err:  # the server dropped the connection
                record(0, f"{err!r}; server log: {server.exception_since(offset)}", "-", then)
                continue
            if response.status_code != 200 and not refused_for_depth(response):
                text = server.exception_since(offset) if response.status_code >= 500 else short(response.text, 300)
                record(response.status_code, text, "-", then)
    for sid in opened:  # and every session it opened closes again
        if problem := server.close(sid):
            record(0, problem, sid, "then DELETE /v1/sessions/{session_id}")
    return list(findings.values())


def short(text: str, limit: int) -> str:
    """`text` with runs written as `<'d/' x2500>` and cut at `limit` characters: readable, not replayable."""
    text = re.sub(r"(.{1,3}?)\1{9,}", lambda m: f"<{m.group(1)!r} x{len(m.group(0)) // len(m.group(1))}>", text)
    return text if len(text) <= limit else text[:limit] + "..."


def describe(findings: list[Finding]) -> str:
    return "\n".join(
        f"- {f.operation} -> {f.status} (x{f.count}): {f.exception}\n    {short(f.curl, 800)}" for f in findings
    )


@pytest.mark.parametrize(("method", "path", "examples"), OPERATIONS, ids=[f"{m} {p}" for m, p, _ in OPERATIONS])
def test_fuzzed_operation_never_answers_5xx(server, schema, method, path, examples):
    started = time.monotonic()
    findings = fuzz(server, schema, method, path, examples)
    print(f"{method} {path}: {examples} examples in {time.monotonic() - started:.1f}s")
    assert not findings, describe(findings)


# ---------------------------------------------------------------------------------------------------------
# Known edge inputs, one by one.

WRITES, LISTS = {"write", "step-write_file"}, {"list", "step-list_files"}
# (id, path, the endpoints where it names something valid: there any non-5xx will do; elsewhere a refusal)
EDGE_PATHS: list[tuple[str, str, set[str]]] = [
    ("file-as-folder", "module.py/x", set()),
    ("name-300-chars", "n" * 300, set()),
    ("dotdot-escape", "a/../../x", set()),
    ("dotdot", "..", set()),
    ("absolute", "/etc/passwd", set()),
    ("lone-surrogate-high", "\ud800", set()),
    ("lone-surrogate-escape", "\udcff", set()),  # os.fsencode would make it the byte 0xff
    ("nul", "x\x00y", set()),
    ("empty", "", LISTS),  # "" lists the workspace
    ("dot", ".", LISTS),
    ("deep-5000-chars", "d/" * 2499 + "dx", set()),  # 2500 levels, past PATH_MAX
    ("deep-1200-levels", "d/" * 1199 + "dx", WRITES),  # under PATH_MAX, past Python's recursion limit
    ("newline", "new\nline.py", WRITES),
    ("link-loop", "loop", set()),  # SETUP's `ln -s loop loop`
]
EDGE_ENDPOINTS = [
    "read",
    "write",
    "replace",
    "list",
    "step-read_file",
    "step-write_file",
    "step-replace",
    "step-list_files",
]
AFTERWARDS = [("GET", ""), ("GET", "/list"), ("POST", "/snapshot"), ("DELETE", "")]


def _query(path: str) -> str:
    """`path=...` percent-encoded as bytes: a lone surrogate goes out as the bytes it stands for (`\\udcff` as the
    byte 0xff that os.fsencode would make of it, `\\ud800` as its UTF-8 form)."""
    try:
        raw = path.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:
        raw = path.encode("utf-8", errors="surrogatepass")
    return "path=" + quote(raw, safe="")


def edge_request(http: httpx.Client, sid: str, endpoint: str, path: str, timeout: float = 60) -> httpx.Response:
    base = f"/v1/sessions/{sid}"
    if endpoint in ("read", "list"):
        return http.get(f"{base}{'/files' if endpoint == 'read' else '/list'}?{_query(path)}", timeout=timeout)
    if endpoint == "write":
        route, body = "/files", {"path": path, "content": "x = 2\n"}
    elif endpoint == "replace":
        route, body = "/files/replace", {"path": path, "old": "x", "new": "y"}
    else:
        arguments = {"path": path, "content": "x = 2\n", "old": "x", "new": "y"}
        route, body = "/step", {"name": endpoint.removeprefix("step-"), "arguments": arguments}
    # Raw JSON text: json.dumps escapes a lone surrogate as \\ud800, which a client's own encoder would refuse.
    headers = {"content-type": "application/json"}
    return http.post(base + route, content=json.dumps(body), headers=headers, timeout=timeout)


def assert_session_still_works(server: Server, sid: str) -> None:
    """The session still describes, lists, snapshots and closes (DELETE last)."""
    for method, route in AFTERWARDS:
        offset = server.log_size()
        after = server.http.request(method, f"/v1/sessions/{sid}{route}")
        assert after.status_code in (200, 204) or refused_for_depth(after), (
            f"then {method} {route}: {after.text}: {server.exception_since(offset)}"
        )


def refused_for_depth(response: httpx.Response) -> bool:
    """A workspace nested deeper than the server walks (`workspace.MAX_DEPTH`: a command can make thousands
    of levels) cannot be described, listed or snapshotted: a 400 that says so, not a 500 or a hang."""
    return response.status_code == 400 and "nested deeper than" in response.text


@pytest.fixture
def session(server) -> Iterator[str]:
    sid = server.new_session()
    yield sid
    server.close(sid)  # closed already unless the test failed


@pytest.mark.parametrize("endpoint", EDGE_ENDPOINTS)
@pytest.mark.parametrize(("path", "valid"), [(p, v) for _, p, v in EDGE_PATHS], ids=[i for i, _, _ in EDGE_PATHS])
def test_edge_input_is_refused_not_a_500(server, session, endpoint, path, valid):
    offset = server.log_size()
    response = edge_request(server.http, session, endpoint, path)
    assert response.status_code < 500, f"{response.status_code} {response.text}: {server.exception_since(offset)}"
    if endpoint.startswith("step-"):
        assert response.status_code == 200, response.text
        observation = response.json()["observation"]
        assert endpoint in valid or observation.startswith("error:"), observation
    else:
        assert endpoint in valid or 400 <= response.status_code < 500, response.text
    assert_session_still_works(server, session)


# What an agent's own commands can leave in the workspace; then the file tools meet it, and the session works on.
LEFTOVERS = [
    ("non-utf8-name", "touch \"$(printf '\\377')\"", "\udcff"),
    ("link-to-environ", "ln -s /proc/self/environ env", "env"),
    ("deep-tree", 'python3 -c \'import os\nfor _ in range(1500): os.mkdir("t"); os.chdir("t")\'', "t/t/t"),
    ("fifo", "mkfifo fifo", "fifo"),  # last: were it to wedge the server, nothing after it would run
]


@pytest.mark.parametrize(("command", "path"), [(c, p) for _, c, p in LEFTOVERS], ids=[i for i, _, _ in LEFTOVERS])
def test_what_a_command_leaves_gets_no_500(server, session, command, path):
    made = server.http.post(f"/v1/sessions/{session}/exec", json={"command": command})
    assert made.status_code == 200 and made.json()["exitCode"] == 0, made.text
    for endpoint in EDGE_ENDPOINTS:
        offset = server.log_size()
        try:
            response = edge_request(server.http, session, endpoint, path, timeout=10)
        except httpx.TimeoutException:
            pytest.fail(f"{endpoint} {path!r} hung the server")
        assert response.status_code < 500, f"{endpoint}: {response.text}: {server.exception_since(offset)}"
        assert server.endpoint.token not in response.text  # a link is never followed out of the workspace
    for call in ({"name": "list_files"}, {"name": "submit"}):
        offset = server.log_size()
        response = server.http.post(f"/v1/sessions/{session}/step", json=call)
        assert response.status_code == 200, f"{call}: {response.text}: {server.exception_since(offset)}"
    assert_session_still_works(server, session)
