"""Sandbox tier at 100, 500 and 1000 concurrent sessions on one server process, and what each session's own
network namespace costs: session open and trivial-command latency at 100 and 500 sessions on two servers, one
with and one without (KUBERL_SANDBOX_NETWORK_NAMESPACE=0), measured in turn in the same run.

Per level: session create latency (p50/p99, 32 creates in flight); a trivial command's round trip
(p50/p99) while every session behaves like an agent (a command, then `THINK_S` of "generation", three
times), which also gives per-session throughput (the seed's decay test: at 500 sessions it should be at
least 0.9 of that at 100); and test-run throughput (swe-toy visible tests, 8 in flight, for 8 s).
The load generator shares the machine's cores with the server, as it would on a one-machine run.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time

import httpx

from kuberl.api import env_vars
from kuberl.suites.swe_toy import generate
from kuberl_sandbox.local import SandboxEndpoint, local_sandbox

LEVELS = tuple(int(x) for x in os.environ.get("KUBERL_BENCH_LEVELS", "100,500,1000").split(","))
NETWORK_LEVELS = tuple(int(x) for x in os.environ.get("KUBERL_BENCH_NETWORK_LEVELS", "100,500").split(","))
THINK_S = 5.0  # an agent turn: ~150 generated tokens at ~30 tokens/s per sequence
COMMANDS_PER_SESSION = 3
CREATE_IN_FLIGHT = 32
TEST_RUNS_IN_FLIGHT = 8
TEST_RUN_SECONDS = 8.0


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(value: float) -> float:
    return round(value * 1000, 2)


async def measure_level(http: httpx.AsyncClient, count: int, tasks: list) -> dict[str, float]:
    gate = asyncio.Semaphore(CREATE_IN_FLIGHT)
    create_s: list[float] = []

    async def create(i: int) -> str:
        async with gate:
            started = time.perf_counter()
            response = await http.post("/v1/sessions", json={"task": tasks[i % len(tasks)].to_manifest()})
            create_s.append(time.perf_counter() - started)
            response.raise_for_status()
            return response.json()["sessionId"]

    sessions = await asyncio.gather(*(create(i) for i in range(count)))
    held = (await http.get("/readyz")).json()["sessions"]

    rtt_s: list[float] = []
    rng = random.Random(count)

    async def agent(sid: str) -> None:
        await asyncio.sleep(rng.uniform(0, THINK_S))  # agents do not start in lockstep
        for _ in range(COMMANDS_PER_SESSION):
            started = time.perf_counter()
            response = await http.post(f"/v1/sessions/{sid}/exec", json={"command": "echo ok"})
            rtt_s.append(time.perf_counter() - started)
            assert response.json()["output"] == "ok\n", response.text
            await asyncio.sleep(THINK_S)

    started = time.perf_counter()
    await asyncio.gather(*(agent(s) for s in sessions))
    agent_wall = time.perf_counter() - started
    per_session_rate = COMMANDS_PER_SESSION / agent_wall

    runs = 0
    stop_at = time.perf_counter() + TEST_RUN_SECONDS

    async def tester(offset: int) -> None:
        nonlocal runs
        i = offset
        while time.perf_counter() < stop_at:
            response = await http.post(f"/v1/sessions/{sessions[i % count]}/tests", json={})
            assert response.json()["total"] > 0, response.text
            runs += 1
            i += TEST_RUNS_IN_FLIGHT

    test_started = time.perf_counter()
    await asyncio.gather(*(tester(k) for k in range(TEST_RUNS_IN_FLIGHT)))
    test_rate = runs / (time.perf_counter() - test_started)

    await asyncio.gather(*(http.delete(f"/v1/sessions/{s}") for s in sessions))
    return {
        "sessions_held": held,
        "create_p50_ms": ms(statistics.median(create_s)),
        "create_p99_ms": ms(quantile(create_s, 0.99)),
        "command_p50_ms": ms(statistics.median(rtt_s)),
        "command_p99_ms": ms(quantile(rtt_s, 0.99)),
        "commands": len(rtt_s),
        "per_session_commands_per_s": round(per_session_rate, 4),
        "test_runs_per_s": round(test_rate, 2),
    }


def client(server: SandboxEndpoint) -> httpx.AsyncClient:
    # A rollout server keeps a bounded pool per sandbox pod; 1000 sockets would just queue in the kernel.
    limits = httpx.Limits(max_connections=128, max_keepalive_connections=128)
    headers = {"Authorization": f"Bearer {server.token}"}
    return httpx.AsyncClient(base_url=server.url, headers=headers, limits=limits, timeout=120)


async def network_namespace_cost(tasks: list) -> dict[str, object]:
    """Both servers up at once; each level measured on one, then the other, so the machine's noise falls on both."""
    out: dict[str, object] = {}
    shared = {env_vars.SANDBOX_NETWORK_NAMESPACE: "0"}
    sessions = max(NETWORK_LEVELS) + 16
    with local_sandbox(max_sessions=sessions) as own, local_sandbox(max_sessions=sessions, env=shared) as host:
        async with client(own) as with_netns, client(host) as without_netns:
            for count in NETWORK_LEVELS:
                for mode, http in (("with", with_netns), ("without", without_netns)):
                    level = await measure_level(http, count, tasks)
                    out[f"{count}_{mode}"] = {k: level[k] for k in ("create_p50_ms", "create_p99_ms")} | {
                        k: level[k] for k in ("command_p50_ms", "command_p99_ms", "commands")
                    }
                    print(f"[bench]   network namespace {mode}, {count} sessions: {out[f'{count}_{mode}']}", flush=True)
    for count in NETWORK_LEVELS:
        with_, without = out[f"{count}_with"], out[f"{count}_without"]
        out[f"{count}_command_p99_ratio"] = round(with_["command_p99_ms"] / without["command_p99_ms"], 3)  # type: ignore[index]
        out[f"{count}_create_p50_added_ms"] = round(with_["create_p50_ms"] - without["create_p50_ms"], 2)  # type: ignore[index]
    return out


async def main() -> dict[str, object]:
    tasks = generate(200, seed=3)
    out: dict[str, object] = {"think_s": THINK_S, "commands_per_session": COMMANDS_PER_SESSION}
    with local_sandbox(max_sessions=max(LEVELS) + 16) as server:
        async with client(server) as http:
            for count in LEVELS:
                out[str(count)] = await measure_level(http, count, tasks)
                print(f"[bench]   {count} sessions: {out[str(count)]}", flush=True)
    out["network_namespace"] = await network_namespace_cost(tasks)
    if set(LEVELS) != {100, 500, 1000}:
        return out
    rate = {c: out[str(c)]["per_session_commands_per_s"] for c in LEVELS}  # type: ignore[index]
    out["per_session_throughput_500_vs_100"] = round(rate[500] / rate[100], 3)
    out["goals"] = {
        "holds_1000_sessions": out["1000"]["sessions_held"] == 1000,  # type: ignore[index]
        "command_p99_under_100ms_at_500": out["500"]["command_p99_ms"] < 100,  # type: ignore[index]
        "throughput_ratio_500_vs_100_at_least_0.9": out["per_session_throughput_500_vs_100"] >= 0.9,
    }
    return out


def run() -> dict[str, object]:
    return asyncio.run(main())


if __name__ == "__main__":
    print(run())
