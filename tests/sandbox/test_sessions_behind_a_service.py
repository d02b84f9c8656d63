"""Sessions behind a load-balanced Service: each server names its own address when it opens a session, and
the client sends the session's later calls there. Two real sandbox servers sit behind a round-robin TCP
proxy (a ClusterIP Service without affinity); a session's calls reach its server whichever way the next
connection would have gone."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
from collections.abc import AsyncIterator

import httpx

from kuberl.api.environment import ToolCall
from kuberl.suites.swe_toy import generate
from kuberl_rollout.sandbox_client import SandboxClient
from kuberl_sandbox.local import local_sandbox

TASKS = generate(4, seed=5)


@contextlib.asynccontextmanager
async def round_robin_proxy(ports: list[int]) -> AsyncIterator[str]:
    """Each new connection goes to the next server, as kube-proxy spreads them over a Service's pods."""
    targets = itertools.cycle(ports)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", next(targets))
        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def test_each_sessions_calls_reach_the_server_that_holds_it():
    token = secrets.token_hex(16)
    with local_sandbox(token=token) as a, local_sandbox(token=token) as b:
        ports = [int(a.url.rsplit(":", 1)[1]), int(b.url.rsplit(":", 1)[1])]

        async def scenario() -> None:
            async with round_robin_proxy(ports) as service:
                # a new connection per request, so that every call could land on either server
                http = httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_keepalive_connections=0))
                client = SandboxClient(service, token, http=http)
                opened = [await client.create_session(task) for task in TASKS]
                assert {s["endpoint"] for s in opened} == {a.url, b.url}  # both servers took sessions
                for task, session in zip(TASKS, opened, strict=True):
                    sid = session["sessionId"]
                    for _ in range(3):
                        listed = await client.step(sid, ToolCall(name="list_files", arguments={}))
                        assert task.metadata["file"] in listed.observation
                    content = await client.read_file(sid, task.metadata["file"])
                    assert task.metadata["buggy"] in content
                    await client.close(sid)
                await http.aclose()

        asyncio.run(scenario())
