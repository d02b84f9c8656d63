"""A session snapshotted on one server process and restored on another has the same workspace
(checksum) and the same test result: the state-mismatch guarantee of the sandbox tier."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from kuberl.api.environment import Snapshot
from kuberl.suites.swe_toy import generate
from kuberl_rollout.sandbox_client import SandboxClient, SandboxError
from kuberl_sandbox.snapshots import seal, snapshot_key

TASK = generate(3, seed=11)[2]


def test_snapshot_on_one_server_restores_on_another(sandbox, second_sandbox):
    async def scenario():
        a = SandboxClient(sandbox.url, sandbox.token)
        b = SandboxClient(second_sandbox.url, second_sandbox.token)
        sid = (await a.create_session(TASK))["sessionId"]
        # Work in progress: the fix, an extra file, a folder, an executable script, a link inside.
        await a.replace(sid, TASK.metadata["file"], TASK.metadata["buggy"], TASK.metadata["fix"])
        await a.execute(
            sid,
            "mkdir -p notes && echo draft > notes/plan.md && printf '#!/bin/sh\\necho hi\\n' > run.sh"
            " && chmod 755 run.sh && ln -s notes/plan.md plan",
        )
        before = await a.run_tests(sid)
        snapshot = await a.snapshot(sid)
        assert len(snapshot.actions) == 2 and snapshot.actions[0]["op"] == "replace"

        restored = await b.restore_session(TASK, Snapshot.model_validate_json(snapshot.model_dump_json()))
        rid = restored["sessionId"]
        assert (await b.describe(rid))["checksum"] == snapshot.checksum == (await a.describe(sid))["checksum"]
        after = await b.run_tests(rid)
        assert (after["passed"], after["total"]) == (before["passed"], before["total"]) == (before["total"], 3)
        assert (await b.execute(rid, "./run.sh && cat plan && stat -c %U run.sh"))["output"].startswith("hi\ndraft\n")
        hidden_a, hidden_b = await a.run_tests(sid, hidden=True), await b.run_tests(rid, hidden=True)
        assert hidden_a["fraction"] == hidden_b["fraction"] == 1.0
        for client, session in ((a, sid), (b, rid)):
            await client.close(session)
            await client.aclose()

    asyncio.run(scenario())


def test_a_tampered_snapshot_is_refused(sandbox, second_sandbox):
    """Only a server of the job can mint a restorable snapshot: swapped data, a recomputed checksum or a
    MAC made without the key are refused before the archive is opened; a sealed archive that is not one is a 400."""

    async def scenario():
        a, b = SandboxClient(sandbox.url, sandbox.token), SandboxClient(second_sandbox.url, second_sandbox.token)
        sid = (await a.create_session(TASK))["sessionId"]
        snapshot = await a.snapshot(sid)
        other = (await a.create_session(generate(1, seed=99)[0]))["sessionId"]
        foreign = await a.snapshot(other)
        forged_key = hashlib.sha256(b"a guess").digest()
        for tampered in (
            snapshot.model_copy(update={"data": foreign.data}),
            snapshot.model_copy(update={"data": foreign.data, "checksum": foreign.checksum}),
            snapshot.model_copy(update={"mac": seal(forged_key, snapshot.task_id, snapshot.checksum, snapshot.data)}),
        ):
            with pytest.raises(SandboxError) as err:
                await b.restore_session(TASK, tampered)
            assert err.value.status == 403 and "MAC" in err.value.detail
        garbage = "bm90IGEgdGFyYmFsbA=="
        sealed = seal(snapshot_key(sandbox.token), snapshot.task_id, snapshot.checksum, garbage)
        with pytest.raises(SandboxError) as err:
            await b.restore_session(TASK, snapshot.model_copy(update={"data": garbage, "mac": sealed}))
        assert err.value.status == 400 and "snapshot archive is unusable" in err.value.detail
        await a.aclose()
        await b.aclose()

    asyncio.run(scenario())


def test_a_snapshot_with_a_link_out_of_the_workspace_is_refused(sandbox, second_sandbox):
    async def scenario():
        a, b = SandboxClient(sandbox.url, sandbox.token), SandboxClient(second_sandbox.url, second_sandbox.token)
        sid = (await a.create_session(TASK))["sessionId"]
        await a.execute(sid, "ln -s /etc/shadow shadow")
        snapshot = await a.snapshot(sid)
        with pytest.raises(SandboxError) as err:
            await b.restore_session(TASK, snapshot)
        assert err.value.status == 400
        await a.aclose()
        await b.aclose()

    asyncio.run(scenario())
