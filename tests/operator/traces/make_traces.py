"""Write the sandbox-demand traces that tests/operator/test_autoscale.py replays.

They are synthetic, not captures of a job: seeded random numbers shaped like the rollout loop (batches of
episode groups, each episode holding one sandbox session for as long as its agent works). Re-running this
script writes the same files. One row per second: (t, sessions_wanted, sessions_open, start_latency_s), as
the rollout tier would report them with ample sandbox capacity (open = wanted less the sessions still being
created); the test caps `sessions_open` at the capacity it simulates and adds the queueing to the latency.

    python tests/operator/traces/make_traces.py
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
Row = tuple[int, int, int, float]


def episodes_to_rows(starts_and_ends: list[tuple[int, int]], seconds: int, rng: random.Random) -> list[Row]:
    """Per-second counts from episodes (start second, end second); a session takes about a second to open,
    more when many open in the same second."""
    running = [0] * (seconds + 1)
    opening = [0] * (seconds + 1)
    for start, end in starts_and_ends:
        for t in range(start, min(end, seconds + 1)):
            running[t] += 1
        if start <= seconds:
            opening[start] += 1
    return [(t, running[t], running[t] - opening[t], latency(opening[t], rng)) for t in range(seconds + 1)]


def latency(opening: int, rng: random.Random) -> float:
    """Seconds to open a session: a log-normal base (median 0.4 s) plus contention of concurrent opens."""
    return round(rng.lognormvariate(math.log(0.4), 0.3) + 0.01 * opening, 3)


def bursty_async_grpo(rng: random.Random, seconds: int = 3600) -> list[Row]:
    """Async GRPO: every 40-90 s a batch of 8-16 groups of 8 episodes is submitted over 3 s; an episode holds
    its session 5-60 s, heavy-tailed (log-normal, median 12 s, clipped)."""
    episodes: list[tuple[int, int]] = []
    t = 5
    while t < seconds - 120:
        for _ in range(rng.randint(8, 16) * 8):
            start = t + rng.randint(0, 2)
            hold = min(60.0, max(5.0, rng.lognormvariate(math.log(12.0), 0.8)))
            episodes.append((start, start + round(hold)))
        t += rng.randint(40, 90)
    return episodes_to_rows(episodes, seconds, rng)


def from_level(level: Callable[[int], float], seconds: int, rng: random.Random) -> list[Row]:
    """Rows for a demand level given per second (already noisy); a tenth of the sessions open each second."""
    rows: list[Row] = []
    for t in range(seconds + 1):
        wanted = max(0, round(level(t)))
        opening = min(wanted, round(0.1 * wanted * rng.random()))
        rows.append((t, wanted, wanted - opening, latency(opening, rng)))
    return rows


def ramp_then_idle(rng: random.Random, seconds: int = 3000) -> list[Row]:
    """A job starting and ending: up to 240 sessions over 10 min, held (±5%) until 30 min, the stragglers
    finish over 2 min, then nothing until the end (the learner writes its last checkpoint)."""

    def level(t: int) -> float:
        if t < 600:
            plateau = 240.0 * t / 600
        elif t < 1800:
            plateau = 240.0
        elif t < 1920:
            plateau = 240.0 * (1 - (t - 1800) / 120) ** 2
        else:
            return 0.0
        return plateau * rng.gauss(1.0, 0.05)

    return from_level(level, seconds, rng)


def noisy_steady(rng: random.Random, seconds: int = 2400) -> list[Row]:
    """About 100 sessions with correlated jitter (σ ≈ 8), and a dip to 60% of 10-20 s now and then (a weight
    update pauses new episodes)."""
    noise, dip_until = 0.0, -1

    def level(t: int) -> float:
        nonlocal noise, dip_until
        noise = 0.8 * noise + rng.gauss(0.0, 4.8)  # AR(1): stationary σ = 4.8 / sqrt(1 - 0.64) = 8
        if dip_until < t and rng.random() < 1 / 240:
            dip_until = t + rng.randint(10, 20)
        return (100.0 + noise) * (0.6 if t <= dip_until else 1.0)

    return from_level(level, seconds, rng)


TRACES: dict[str, tuple[Callable[[random.Random], list[Row]], str]] = {
    "bursty_async_grpo": (bursty_async_grpo, bursty_async_grpo.__doc__ or ""),
    "ramp_then_idle": (ramp_then_idle, ramp_then_idle.__doc__ or ""),
    "noisy_steady": (noisy_steady, noisy_steady.__doc__ or ""),
}


def main() -> None:
    for seed, (name, (make, doc)) in enumerate(TRACES.items(), start=1):
        rows = make(random.Random(seed))
        trace = {
            "name": name,
            "description": "Synthetic (seeded, tests/operator/traces/make_traces.py), shaped like the rollout "
            "loop; not a capture. " + " ".join(doc.split()),
            "seed": seed,
            "columns": ["t", "sessions_wanted", "sessions_open", "start_latency_s"],
            "rows": rows,
        }
        text = json.dumps(trace, separators=(",", ":"))
        # one row per line: a diff of a regenerated trace stays readable
        text = text.replace("],[", "],\n[")
        (HERE / f"{name}.json").write_text(text + "\n")
        print(f"{name}: {len(rows)} rows, peak {max(r[1] for r in rows)} sessions wanted")


if __name__ == "__main__":
    main()
