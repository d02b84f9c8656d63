"""Sandbox pools per image (kuberl_operator.pools.plan_pools): warm-up, scale to zero, the caps and their
priorities, unusable images, lost state, determinism."""

from __future__ import annotations

import random

import pytest

from kuberl_operator.pools import ImageDemand, PoolLimits, PoolPlan, PoolsState, plan_pools

LIMITS = PoolLimits(max_replicas=100, max_warm_images=50, sessions_per_pod=8, idle_timeout_s=600.0, warm_replicas=1)


def run(
    calls: list[tuple[float, dict[str, ImageDemand]]],
    limits: PoolLimits = LIMITS,
    current: dict[str, int] | None = None,
    **options,
) -> list[PoolPlan]:
    """Call the planner at each (time, demand), applying each plan as the next call's replicas."""
    replicas, state, plans = dict(current or {}), PoolsState(), []
    for now, demand in calls:
        plan = plan_pools(demand, replicas, limits, now, state, **options)
        replicas, state = plan.replicas, plan.state
        plans.append(plan)
    return plans


def test_no_demand_no_pods():
    plan = plan_pools({}, {}, LIMITS, 0.0, PoolsState())
    assert plan.replicas == {} and plan.capped == 0 and plan.state == PoolsState()


def test_announced_episodes_get_warm_pods_before_they_are_queued():
    plan = plan_pools({"a": ImageDemand(upcoming=8)}, {}, LIMITS, 0.0, PoolsState())
    assert plan.replicas == {"a": 1} and plan.reasons["a"] == "Upcoming"


def test_warm_up_covers_all_the_announced_episodes():
    plan = plan_pools({"a": ImageDemand(upcoming=20)}, {}, LIMITS, 0.0, PoolsState())
    assert plan.replicas == {"a": 3}  # ceil(20 / 8)


def test_warm_replicas_zero_turns_warm_up_off():
    limits = PoolLimits(100, 50, 8, 600.0, warm_replicas=0)
    assert plan_pools({"a": ImageDemand(upcoming=8)}, {}, limits, 0.0, PoolsState()).replicas == {}


def test_queued_episodes_scale_like_the_single_pool_autoscaler():
    plan = plan_pools({"a": ImageDemand(queued=30)}, {}, LIMITS, 0.0, PoolsState())
    assert plan.replicas == {"a": 5}  # ceil(30 * 1.25 / 8), the autoscaler's headroom
    assert plan.reasons["a"] == "Demand"


def test_an_idle_image_keeps_a_warm_pod_then_goes_to_zero_after_the_idle_timeout():
    busy = {"a": ImageDemand(running=8)}
    calls = [(0.0, busy), (100.0, {}), (500.0, {}), (601.0, {}), (604.0, {})]
    plans = run(calls)
    assert [p.replicas.get("a", 0) for p in plans] == [2, 2, 1, 0, 0]
    assert plans[2].reasons["a"] == "Warm" and plans[3].reasons["a"] == "Idle"
    assert plans[-1].state == PoolsState()  # forgotten once its pods are gone


def test_an_idle_image_without_pods_gets_none_started():
    plan = plan_pools({}, {}, LIMITS, 10.0, run([(0.0, {"a": ImageDemand(upcoming=8)})])[0].state)
    assert plan.replicas == {}


def test_an_image_never_goes_below_what_its_running_sessions_need():
    # a long quiet spell with 17 sessions open: the pods of 17 sessions (3) stay, whatever the timeout
    calls = [(float(t), {"a": ImageDemand(running=17)}) for t in range(0, 3600, 3)]
    plans = run(calls, current={"a": 10})
    assert min(p.replicas["a"] for p in plans) >= 3


def test_the_job_wide_cap_grants_running_then_queued_then_upcoming_then_idle_warm():
    limits = PoolLimits(max_replicas=6, max_warm_images=50, sessions_per_pod=8, idle_timeout_s=600.0)
    state = run([(0.0, {"idle": ImageDemand(running=1)})], limits)[0].state
    demand = {
        "running": ImageDemand(running=24),  # 3 pods its sessions need, 4 with headroom
        "queued": ImageDemand(queued=8),
        "upcoming": ImageDemand(upcoming=8),
    }
    plan = plan_pools(demand, {"idle": 1, "running": 3}, limits, 10.0, state)
    # running's own 3 pods, then queued's 2 (8 * 1.25 / 8), then running's headroom pod: the cap is reached
    assert plan.replicas == {"running": 4, "queued": 2}
    assert plan.reasons["upcoming"] == "Cap" and plan.reasons["idle"] == "Cap"
    assert plan.capped == 2


def test_warm_up_never_takes_pods_from_running_sessions():
    limits = PoolLimits(max_replicas=4, max_warm_images=50, sessions_per_pod=8, idle_timeout_s=600.0)
    demand = {f"img{i}": ImageDemand(upcoming=8) for i in range(10)} | {"busy": ImageDemand(running=32)}
    plan = plan_pools(demand, {"busy": 4}, limits, 0.0, PoolsState())
    assert plan.replicas == {"busy": 4}
    assert plan.capped == 10 + 1  # ten warm-ups and busy's headroom pod


def test_the_distinct_image_cap_prefers_images_that_have_pods_then_larger_demand_then_name():
    limits = PoolLimits(max_replicas=100, max_warm_images=3, sessions_per_pod=8, idle_timeout_s=600.0)
    demand = {
        "d": ImageDemand(queued=1),
        "c": ImageDemand(queued=1),
        "b": ImageDemand(queued=1),
        "a": ImageDemand(queued=1),
        "big": ImageDemand(queued=16),
        "up": ImageDemand(upcoming=8),
    }
    plan = plan_pools(demand, {"d": 1}, limits, 0.0, PoolsState())
    assert set(plan.replicas) == {"d", "big", "a"}
    assert {i for i, r in plan.reasons.items() if r == "Cap"} == {"b", "c", "up"}


def test_a_lowered_max_replicas_is_obeyed_at_once():
    limits = PoolLimits(max_replicas=2, max_warm_images=50, sessions_per_pod=8, idle_timeout_s=600.0)
    plan = plan_pools({"a": ImageDemand(running=40)}, {"a": 5}, limits, 0.0, PoolsState())
    assert plan.replicas == {"a": 2} and plan.reasons["a"] == "Cap"


def test_unusable_images_get_no_pods():
    demand = {"bad": ImageDemand(queued=8, upcoming=8), "good": ImageDemand(queued=8)}
    plan = plan_pools(demand, {"bad": 2}, LIMITS, 0.0, PoolsState(), unusable=frozenset({"bad"}))
    assert plan.replicas == {"good": 2} and plan.reasons["bad"] == "Unusable"


@pytest.mark.parametrize("lost_at", [100.0, 400.0, 700.0])
def test_losing_the_state_never_scales_below_the_plan_with_it(lost_at):
    """A restart (PoolsState()) may keep pods longer, never remove pods the remembered plan keeps."""
    demand = {"a": ImageDemand(running=20), "b": ImageDemand(upcoming=8)}
    times = [float(t) for t in range(0, 1500, 3)]
    calls = [(t, demand if t < 90 else {}) for t in times]
    kept = run(calls)
    replicas, state = {}, PoolsState()
    for (now, d), with_state in zip(calls, kept, strict=True):
        if now == lost_at:
            state = PoolsState()
        plan = plan_pools(d, replicas, LIMITS, now, state)
        for image, pods in with_state.replicas.items():
            assert plan.replicas.get(image, 0) >= pods, (now, image)
        replicas, state = plan.replicas, plan.state
    assert replicas == {}  # and it still scales to zero in the end


def test_the_plan_is_deterministic_whatever_the_order_of_the_inputs():
    rng = random.Random(7)
    images = [f"repo__{i:03d}" for i in range(600)]
    demand = {
        i: ImageDemand(running=rng.choice([0, 0, 3, 9]), queued=rng.choice([0, 0, 5]), upcoming=rng.choice([0, 8]))
        for i in images
    }
    current = {i: rng.choice([0, 1, 2]) for i in images}
    limits = PoolLimits(max_replicas=300, max_warm_images=120, sessions_per_pod=8, idle_timeout_s=600.0)
    first = plan_pools(demand, current, limits, 0.0, PoolsState())
    shuffled = list(images)
    rng.shuffle(shuffled)
    second = plan_pools({i: demand[i] for i in shuffled}, {i: current[i] for i in shuffled}, limits, 0.0, PoolsState())
    assert first == second
    assert sum(first.replicas.values()) <= 300 and len(first.replicas) <= 120


def test_bad_limits_are_refused():
    with pytest.raises(ValueError):
        plan_pools({}, {}, PoolLimits(10, 5, 0, 600.0), 0.0, PoolsState())
