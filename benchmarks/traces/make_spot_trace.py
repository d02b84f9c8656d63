"""Write benchmarks/traces/spot_24h.json: spot interruptions of a job's node pools over sampled 24-hour days.

Synthetic from published interruption rates, not a capture of any cloud. Seeded: re-running writes the same
file. For each scenario and each sampled day, every node slot of a pool is interrupted as a Poisson process
with a constant hazard derived from the rate below; each interruption carries the time the pool's capacity
returns (log-normal, median 20 min, σ 1.0, clipped to [2 min, 6 h]: an assumption, no published figure).

Scenarios:
- `aws-advisor`: the AWS Spot Instance Advisor's "frequency of interruption" buckets (<5%, 5-10%, 10-15%,
  15-20%, >20%), which it defines as the rate at which Spot reclaimed capacity over the trailing month. Read
  here as the chance that a node running the whole month is interrupted, the most favourable reading, at the
  bucket's midpoint (>20% taken as 25%). Which bucket a GPU type falls in varies by type, region and month;
  the buckets below are assumptions, not looked up. 2-minute notice (EC2's interruption notice).
- `daily-15pct`: a pessimistic 15% per node per day, of the order of the 5-15%-per-day preemption rate
  Google once published for preemptible VMs (quoted from memory, not re-checked here), for days when GPU
  spot capacity is tight. 30-second notice (Compute Engine's preemption notice).

    python benchmarks/traces/make_spot_trace.py
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED, DAYS, HORIZON_S = 20240, 250, 86_400.0
BUCKET_MIDPOINTS = {"<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175, ">20%": 0.25}
HOURS_PER_MONTH = 730.0
SCENARIOS: dict[str, dict] = {
    "aws-advisor": {
        "notice_s": 120.0,
        "pools": {  # name: (nodes, interruption probability, over hours, what it is)
            "rollout-gpu-1x": (16, BUCKET_MIDPOINTS["10-15%"], HOURS_PER_MONTH, "1-GPU nodes, Advisor bucket 10-15%"),
            "learner-gpu-8x": (1, BUCKET_MIDPOINTS[">20%"], HOURS_PER_MONTH, "one 8-GPU node, Advisor bucket >20%"),
        },
    },
    "daily-15pct": {
        "notice_s": 30.0,
        "pools": {
            "rollout-gpu-1x": (16, 0.15, 24.0, "1-GPU nodes, 15% per node per day"),
            "learner-gpu-8x": (1, 0.15, 24.0, "one 8-GPU node, 15% per node per day"),
        },
    },
}


def hazard_per_s(probability: float, over_hours: float) -> float:
    """Constant hazard with this chance of at least one interruption over `over_hours`."""
    return -math.log(1.0 - probability) / (over_hours * 3600.0)


def capacity_returns_after_s(rng: random.Random) -> float:
    return min(6 * 3600.0, max(120.0, rng.lognormvariate(math.log(1200.0), 1.0)))


def sample_day(pools: dict[str, tuple], rng: random.Random) -> list[dict]:
    events = []
    for pool, (nodes, probability, over_hours, _) in pools.items():
        rate = hazard_per_s(probability, over_hours)
        for slot in range(nodes):
            t = rng.expovariate(rate)
            while t < HORIZON_S:
                returns = t + capacity_returns_after_s(rng)
                events.append(
                    {"pool": pool, "slot": slot, "at_s": round(t, 1), "capacity_returns_s": round(returns, 1)}
                )
                t += rng.expovariate(rate)
    return sorted(events, key=lambda e: e["at_s"])


def main() -> None:
    rng = random.Random(SEED)
    scenarios = {}
    for name, spec in SCENARIOS.items():
        days = [sample_day(spec["pools"], rng) for _ in range(DAYS)]
        pools = {
            pool: {"nodes": n, "interruption_probability": p, "over_hours": h, "what": what}
            for pool, (n, p, h, what) in spec["pools"].items()
        }
        scenarios[name] = {"notice_s": spec["notice_s"], "pools": pools, "days": days}
        print(f"{name}: {sum(len(d) for d in days)} interruptions over {DAYS} days")
    trace = {
        "description": "Synthetic from published interruption rates, not a capture: see make_spot_trace.py "
        "(seeded). Per scenario, DAYS sampled 24-hour days; each interruption names the pool, the node slot, "
        "when the node is reclaimed and when the pool has capacity again.",
        "seed": SEED,
        "horizon_s": HORIZON_S,
        "scenarios": scenarios,
    }
    (HERE / "spot_24h.json").write_text(json.dumps(trace, indent=1) + "\n")


if __name__ == "__main__":
    main()
