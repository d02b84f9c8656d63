"""The learner's client of the rollout servers' work API, over HTTP against servers in this process: which
servers it reports lost (their groups must be submitted again) and restarted (they need the current weights)."""

from __future__ import annotations

import itertools

import httpx
import pytest

from kuberl.api.rollout_http import AcceptedGroup, SubmitGroup, Trajectories
from kuberl_trainer.rollout_client import NoRolloutServer, RolloutClient


class Server:
    """A rollout server's work routes; `up` False refuses connections, `boot` is its boot id."""

    def __init__(self) -> None:
        self.up, self.boot, self.groups = True, "boot-1", []
        self._ids = itertools.count()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if not self.up:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/v1/groups":
            body = SubmitGroup.model_validate_json(request.content)
            self.groups.append(group_id := f"g{next(self._ids)}")
            accepted = AcceptedGroup(
                group_id=group_id,
                task_id=body.task_id,
                size=body.group_size,
                finished=0,
                failed=0,
                running=body.group_size,
                cancelled=False,
                boot_id=self.boot,
                policy_version=0,
            )
            return httpx.Response(202, json=accepted.model_dump(mode="json", by_alias=True))
        if request.url.path == "/v1/trajectories":
            return httpx.Response(
                200, json=Trajectories(boot_id=self.boot, trajectories=[]).model_dump(mode="json", by_alias=True)
            )
        return httpx.Response(404)


@pytest.fixture
def server_and_client() -> tuple[Server, RolloutClient]:
    server = Server()
    client = RolloutClient(["http://a"], "token")
    client.http = [httpx.Client(base_url="http://a", transport=httpx.MockTransport(server))]
    return server, client


def test_a_server_first_found_down_by_a_submission_is_reported_lost_once(server_and_client):
    server, client = server_and_client
    assert client.collect(wait=0).lost == []
    held = client.submit("t0", 2, seed=1)
    server.up = False  # it dies holding the group
    with pytest.raises(NoRolloutServer):
        client.submit("t1", 2, seed=2)  # the submission is what finds it down
    assert client.collect(wait=0).lost == [held.server]  # its groups are gone: the caller submits them again
    assert client.collect(wait=0).lost == []
    server.up, server.boot = True, "boot-2"  # its replacement
    back = client.collect(wait=0)
    assert (back.lost, back.restarted) == ([], [0])  # reported lost when it went, back now, needing weights


def test_a_server_found_down_by_a_collect_or_restarted_between_two_is_reported_lost(server_and_client):
    server, client = server_and_client
    client.collect(wait=0)
    server.up = False
    assert client.collect(wait=0).lost == [0]
    server.up, server.boot = True, "boot-2"
    assert client.collect(wait=0).restarted == [0]
    server.boot = "boot-3"  # restarted between two polls, never seen down
    again = client.collect(wait=0)
    assert (again.lost, again.restarted) == ([0], [0])
