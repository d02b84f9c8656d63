"""The learner's side of the rollout servers' work API: submit task groups, collect finished
trajectories, publish weights. Groups go round robin over the servers."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import httpx

from kuberl.api.trajectory import Trajectory


@dataclass(frozen=True)
class SubmittedGroup:
    group_id: str
    task_id: str
    seed: int
    size: int
    server: int


class RolloutClient:
    def __init__(self, urls: list[str], timeout: float = 600.0) -> None:
        if not urls:
            raise ValueError("the learner needs at least one rollout server URL (--rollout-url)")
        self.urls = urls
        self.http = [httpx.Client(base_url=u, timeout=timeout) for u in urls]
        self._next = itertools.cycle(range(len(urls)))

    def submit(self, task_id: str, size: int, seed: int) -> SubmittedGroup:
        server = next(self._next)
        r = self.http[server].post("/v1/groups", json={"taskId": task_id, "groupSize": size, "seed": seed})
        r.raise_for_status()
        return SubmittedGroup(r.json()["groupId"], task_id, seed, size, server)

    def collect(self, wait: float) -> list[Trajectory]:
        """Finished trajectories from every server, long-polling each up to `wait` seconds split among them."""
        found = []
        for http in self.http:
            params = {"wait": wait / len(self.http), "limit": 1024}
            body = http.get("/v1/trajectories", params=params).raise_for_status().json()
            found += [Trajectory.model_validate(t) for t in body["trajectories"]]
        return found

    def publish(self, version: int, blob: bytes) -> None:
        """Send the weights of `version` to every server (each applies it between episodes)."""
        for http in self.http:
            http.put(f"/v1/weights/{version}/buckets/0", params={"of": 1}, content=blob).raise_for_status()

    def served_versions(self) -> list[int]:
        return [http.get("/v1/policy").raise_for_status().json()["version"] for http in self.http]

    def close(self) -> None:
        for http in self.http:
            http.close()
