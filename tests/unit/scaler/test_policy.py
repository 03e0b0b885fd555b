"""The autoscaler's pure policy, tick by tick with `now` advancing in the signals: the
chain, the fast path and its start-up awareness, the scale-down guards, zero and the warm
pool."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import pytest

from homing.plan.chain import (
    SEED_DECODE_BATCH,
    SEED_MID_GENERATION,
    SEED_PREFILL_RATE,
    SEED_USERS,
    Assumptions,
    plan,
)
from homing.scaler.policy import Decision, PoolSignals, ScalerConfig, ScalingPolicy, slope

TICK = 5.0
STREAMS = 10.0  # decode streams per replica in these tests


def sig(now: float, **fields: Any) -> PoolSignals:
    """Signals of a pool with 4 ready replicas and no traffic, 10 streams per replica."""
    values: dict[str, Any] = {
        "now": now,
        "ready": 4,
        "warm": 0,
        "starting": 0,
        "draining": 0,
        "in_flight": 0,
        "queued": 0,
        "prefill_tokens_per_s": 0.0,
        "arrivals_per_s": 0.0,
        "last_arrival_at": None,
        "ttft_p95_s": None,
        "ttft_slo_s": 0.5,
        "burn_rate": None,
        "workers_waiting": 0,
        "cold_start_s": None,
        "decode_streams_per_replica": STREAMS,
        "prefill_tokens_per_s_per_replica": 1000.0,
    }
    values.update(fields)
    return PoolSignals(**values)


def cfg(**fields: Any) -> ScalerConfig:
    fields.setdefault("max_replicas", 50)
    fields.setdefault("headroom", 0.0)
    fields.setdefault("max_scale_up_replicas", 1000)  # the rate cap has its own test
    return ScalerConfig(**fields)


def finite(d: Decision) -> bool:
    return all(math.isfinite(v) for _, v in d.chain.steps())


def ramp(policy: ScalingPolicy, cold: float, ticks: int = 4) -> float:
    """Ticks at 0, 5, 10, ... with demand growing one replica per tick (0.2 replicas/s),
    ready following the chain; returns the last tick's time."""
    now = 0.0
    for i in range(ticks):
        now = i * TICK
        need = i + 1
        d = policy.decide(sig(now, ready=need, in_flight=int(need * STREAMS), cold_start_s=cold))
        assert not d.fast
    return now


def test_the_seed_chain_gives_45_replicas_from_its_demand() -> None:
    """10,000 users x 0.25 mid-generation = 2,500 streams at 96 per replica (~26 replicas),
    plus 83,333 uncached tok/s at 7,467 per replica (~37 in all), + 20% = 45, as the plan."""
    seed = plan(Assumptions())
    policy = ScalingPolicy(ScalerConfig(max_replicas=100))
    d = policy.decide(
        sig(
            0.0,
            ready=45,
            in_flight=int(SEED_USERS * SEED_MID_GENERATION),
            prefill_tokens_per_s=seed.prefill_demand_tok_s,
            decode_streams_per_replica=SEED_DECODE_BATCH,
            prefill_tokens_per_s_per_replica=SEED_PREFILL_RATE,
        )
    )
    assert d.desired_ready == 45 == seed.replicas
    assert d.reason == "steady"
    assert d.chain.decode_replicas == pytest.approx(26.04, abs=0.01)
    assert d.chain.raw == pytest.approx(37.20, abs=0.01)
    assert d.chain.prefill_share == pytest.approx(0.3)
    assert d.chain.with_headroom == pytest.approx(44.64, abs=0.01)
    assert [name for name, _ in d.chain.steps()] == [
        "demand_streams", "prefill_demand_tok_s", "decode_replicas", "prefill_replicas",
        "prefill_share", "raw", "with_headroom", "need", "floor", "current", "growth_per_s",
        "cold_start_s", "step", "window_max",
    ]  # fmt: skip


def test_zero_traffic_scales_to_the_minimum_without_nan() -> None:
    """No traffic (and even an unusable capacity figure) gives need 0, never NaN, and the
    pool steps down to min_replicas once the window has passed."""
    policy = ScalingPolicy(cfg(min_replicas=2))
    ready = 8
    decisions = []
    for i in range(100):
        d = policy.decide(sig(i * TICK, ready=ready, decode_streams_per_replica=float("nan")))
        decisions.append(d)
        ready = d.desired_ready
    assert all(finite(d) for d in decisions)
    assert decisions[0].chain.raw == 0.0
    assert ready == 2
    assert decisions[-1].reason == "steady"


def test_demand_with_no_usable_capacity_figure_plans_for_the_cap() -> None:
    """Streams but a zero capacity figure: the chain stays finite and asks for max."""
    d = ScalingPolicy(cfg(max_replicas=12)).decide(
        sig(0.0, in_flight=30, decode_streams_per_replica=0.0)
    )
    assert finite(d)
    assert d.desired_ready == 12


def test_replicas_already_starting_are_not_asked_for_again() -> None:
    """desired_ready is a total: 4 ready + 6 starting already cover a need of 10."""
    d = ScalingPolicy(cfg()).decide(sig(0.0, ready=4, starting=6, in_flight=100))
    assert d.desired_ready == 10
    assert d.reason == "steady"


def test_the_chain_is_clamped_to_max_replicas_and_says_so() -> None:
    d = ScalingPolicy(cfg(max_replicas=8)).decide(sig(0.0, in_flight=200))
    assert (d.desired_ready, d.held_by) == (8, "max_replicas")


@pytest.mark.parametrize(("cold", "step"), [(30.0, 6), (60.0, 12)])
def test_a_step_adds_a_fast_step_sized_by_cold_start(cold: float, step: int) -> None:
    """Demand grows 0.2 replicas/s; TTFT over its SLO adds ceil(0.2 x cold start) replicas
    on top of what the chain asks."""
    policy = ScalingPolicy(cfg())
    now = ramp(policy, cold)
    d = policy.decide(sig(now + TICK, ready=5, in_flight=50, cold_start_s=cold, ttft_p95_s=0.9))
    assert d.chain.growth_per_s == pytest.approx(0.2)
    assert d.fast and d.reason == "fast_path"
    assert d.desired_ready == 5 + step


def test_without_a_measured_cold_start_the_default_sizes_the_step() -> None:
    policy = ScalingPolicy(cfg(default_cold_start_s=10.0))
    now = ramp(policy, cold=None)  # type: ignore[arg-type]
    d = policy.decide(sig(now + TICK, ready=5, in_flight=50, ttft_p95_s=0.9))
    assert d.desired_ready == 5 + 2


@pytest.mark.parametrize(
    "trigger",
    [
        {"burn_rate": 20.0},
        {"ttft_p95_s": 0.6},
    ],
)
def test_each_leading_indicator_fires_the_fast_path(trigger: dict[str, Any]) -> None:
    policy = ScalingPolicy(cfg(fast_step_min=3))
    assert not policy.decide(sig(0.0, in_flight=40)).fast
    d = policy.decide(sig(TICK, in_flight=40, **trigger))
    assert d.fast and d.desired_ready == 7


def test_waiting_queues_on_every_replica_fire_only_when_they_persist() -> None:
    """One tick of waiting queues is a request between arrival and prefill; on
    `queue_growth_ticks` (2) ticks in a row it is saturation."""
    policy = ScalingPolicy(cfg(fast_step_min=3))
    assert not policy.decide(sig(0.0, in_flight=40, workers_waiting=4)).fast
    assert not policy.decide(sig(TICK, in_flight=40)).fast  # the run breaks
    assert not policy.decide(sig(2 * TICK, in_flight=40, workers_waiting=4)).fast
    d = policy.decide(sig(3 * TICK, in_flight=40, workers_waiting=4))
    assert d.fast and d.desired_ready == 7


def test_below_their_thresholds_the_indicators_do_not_fire() -> None:
    policy = ScalingPolicy(cfg())
    for i, quiet in enumerate(
        [{"burn_rate": 14.4}, {"workers_waiting": 3}, {"ttft_p95_s": 0.5}, {"queued": 5}]
    ):
        d = policy.decide(sig(i * TICK, in_flight=35, **quiet))
        assert not d.fast and d.desired_ready == 4


def test_a_queue_growing_two_ticks_in_a_row_fires_the_fast_path() -> None:
    policy = ScalingPolicy(cfg())
    fast = [
        policy.decide(sig(i * TICK, in_flight=30, queued=q)).fast for i, q in enumerate([1, 2, 3])
    ]
    assert fast == [False, False, True]


def test_no_second_fast_step_while_the_first_is_starting() -> None:
    """The first step's 6 replicas take up to a cold start (30 s): until then the policy
    holds at ready + starting, however long the indicator keeps firing."""
    policy = ScalingPolicy(cfg())
    now = ramp(policy, cold=30.0)
    first = policy.decide(sig(now + TICK, ready=5, in_flight=50, cold_start_s=30.0, ttft_p95_s=0.9))
    assert first.desired_ready == 11
    step_at = now + TICK
    t = step_at + TICK
    while t < step_at + 30.0:
        d = policy.decide(
            sig(t, ready=5, starting=6, in_flight=50, cold_start_s=30.0, ttft_p95_s=0.9)
        )
        assert (d.desired_ready, d.fast, d.held_by, d.reason) == (11, False, "starting", "held")
        t += TICK


def test_a_late_start_allows_one_more_step() -> None:
    """Still starting one cold start after the step: one more step, then a hold again."""
    policy = ScalingPolicy(cfg())
    now = ramp(policy, cold=30.0)
    step_at = now + TICK
    late: dict[str, Any] = dict(
        ready=5, starting=6, in_flight=50, cold_start_s=30.0, ttft_p95_s=0.9
    )
    first = policy.decide(sig(step_at, **{**late, "starting": 0}))
    assert first.fast and first.desired_ready == 11
    held = policy.decide(sig(step_at + 25.0, **late))
    assert not held.fast
    d = policy.decide(sig(step_at + 30.0, **late))
    assert d.fast and d.desired_ready > 11
    again = policy.decide(sig(step_at + 35.0, **{**late, "starting": d.desired_ready - 5}))
    assert not again.fast and again.held_by == "starting"
    assert again.desired_ready == d.desired_ready


def test_a_landed_step_settles_one_cold_start_before_the_next() -> None:
    """The step's replica is ready but the lagging indicator still fires: no new step until
    one cold start (10 s) after the last; then, still firing, one more."""
    policy = ScalingPolicy(cfg(default_cold_start_s=10.0, loaded_utilisation=0.8))
    assert policy.decide(sig(0.0, in_flight=40, ttft_p95_s=0.9)).desired_ready == 5
    d = policy.decide(sig(TICK, ready=5, in_flight=45, ttft_p95_s=0.9))
    assert (d.fast, d.desired_ready, d.held_by) == (False, 5, "starting")
    d = policy.decide(sig(2 * TICK, ready=5, in_flight=45, ttft_p95_s=0.9))
    assert d.fast and d.desired_ready == 6


def test_latency_over_its_slo_on_a_pool_with_free_capacity_adds_nothing() -> None:
    """TTFT and burn rate over their limits fire only while the pool is loaded: 30 streams
    on 4 replicas of 10 (0.75 < 0.9 of capacity), or with one slow replica's waiting queue,
    keep 4; at 37 streams (0.925), with a waiting queue on every replica, or with a queued
    request, they step."""
    for quiet in ({"ttft_p95_s": 5.0}, {"burn_rate": 100.0}):
        for free in ({}, {"workers_waiting": 1}):
            policy = ScalingPolicy(cfg(fast_step_min=2))
            for i in range(3):
                d = policy.decide(sig(i * TICK, in_flight=30, **free, **quiet))
                assert (d.fast, d.desired_ready) == (False, 4)
        for loaded in ({"in_flight": 37}, {"workers_waiting": 4}, {"queued": 1}):
            policy = ScalingPolicy(cfg(fast_step_min=2))
            d = policy.decide(sig(0.0, **{"in_flight": 30, **loaded, **quiet}))
            assert d.fast and d.chain.step == 2
            assert d.desired_ready == max(d.chain.need, 4) + 2


def test_stale_latency_on_a_pool_with_no_replica_and_no_demand_adds_no_step() -> None:
    """At 0 ready and no demand the pool is not loaded: a stale TTFT over its SLO gives the
    floor of 1, not a fast step above it."""
    policy = ScalingPolicy(cfg(fast_step_min=2))
    d = policy.decide(sig(0.0, ready=0, ttft_p95_s=9.0, burn_rate=100.0))
    assert (d.desired_ready, d.fast) == (1, False)


def test_no_fast_step_while_a_scale_up_is_starting() -> None:
    """The chain asked for 2 more replicas; while they start, the lagging TTFT adds no step;
    a cold start (30 s) after that scale-up, with replicas still starting, one goes."""
    policy = ScalingPolicy(cfg())
    up = policy.decide(sig(0.0, in_flight=60, cold_start_s=30.0))
    assert (up.desired_ready, up.fast, up.reason) == (6, False, "scale_up")
    for t in (TICK, 2 * TICK, 25.0):
        d = policy.decide(sig(t, starting=2, in_flight=60, cold_start_s=30.0, ttft_p95_s=0.9))
        assert (d.desired_ready, d.fast, d.held_by) == (6, False, "starting")
    d = policy.decide(sig(30.0, starting=2, in_flight=60, cold_start_s=30.0, ttft_p95_s=0.9))
    assert d.fast and d.desired_ready == 7


def test_a_ramp_whose_chain_rises_every_tick_still_steps_once_a_cold_start() -> None:
    """Demand grows a replica's worth each tick while TTFT stays over its SLO; the chain
    raises the target every tick, and replicas land one cold start (30 s) after they are
    asked for, so something is always starting. The hold is timed from the scale-up that
    began them, not the latest one: a fast step goes once a cold start has passed."""
    policy = ScalingPolicy(cfg())
    asked: list[tuple[float, int]] = []  # (time, target) of each decision
    fast_at = []
    for i in range(20):
        now = i * TICK
        ready = max([4] + [target for t, target in asked if t <= now - 30.0])
        current = asked[-1][1] if asked else 4
        d = policy.decide(
            sig(
                now,
                ready=ready,
                starting=max(0, current - ready),
                in_flight=40 + 10 * i,
                cold_start_s=30.0,
                ttft_p95_s=2.0,
            )
        )
        asked.append((now, d.desired_ready))
        if d.fast:
            fast_at.append(now)
    assert fast_at[0] == 0.0
    assert len(fast_at) >= 3
    assert all(b - a >= 30.0 for a, b in itertools.pairwise(fast_at))


def test_the_warm_pool_carries_nothing_the_scale_up_rate_cap_held_back() -> None:
    """400 streams want 40 replicas; the cap holds the target at 8, and the warm pool does
    not start what the cap refused."""
    policy = ScalingPolicy(cfg(max_replicas=100, max_scale_up_replicas=4))
    d = policy.decide(sig(0.0, in_flight=400))
    assert (d.desired_ready, d.held_by, d.desired_warm) == (8, "scale_up_rate", 0)


def test_growth_is_measured_in_demand_not_in_replicas() -> None:
    """A capacity estimate that halves (20 -> 10 streams per replica) at a steady 80 streams
    doubles the replicas needed but is no growth: no warm replica, no step."""
    policy = ScalingPolicy(cfg())
    for i in range(6):
        per = 20.0 if i < 3 else 10.0
        d = policy.decide(sig(i * TICK, ready=8, in_flight=80, decode_streams_per_replica=per))
    assert d.chain.growth_per_s == 0.0
    assert (d.desired_ready, d.desired_warm) == (8, 0)


def test_the_fast_step_stops_at_max_replicas() -> None:
    policy = ScalingPolicy(cfg(max_replicas=5, fast_step_min=4))
    d = policy.decide(sig(0.0, in_flight=40, burn_rate=30.0))
    assert (d.desired_ready, d.held_by) == (5, "max_replicas")


def high_then_low(policy: ScalingPolicy, high_until: float, end: float) -> list[Decision]:
    """Ready 10; need 10 up to `high_until`, need 2 after; decisions are not applied."""
    out = []
    t = 0.0
    while t <= end:
        out.append(policy.decide(sig(t, ready=10, in_flight=100 if t <= high_until else 20)))
        t += TICK
    return out


def test_scale_down_waits_for_the_stable_window() -> None:
    """The last need of 10 is at 50 s: with a 120 s window the first scale-down is at 175 s
    (by a quarter, to 8); every low tick before it is held by the window."""
    decisions = high_then_low(ScalingPolicy(cfg()), high_until=50.0, end=175.0)
    low = decisions[11:]
    assert all((d.desired_ready, d.held_by) == (10, "window") for d in low[:-1])
    assert (low[-1].desired_ready, low[-1].reason) == (8, "scale_down")


def test_a_fresh_policy_waits_a_whole_window_before_scaling_down() -> None:
    decisions = high_then_low(ScalingPolicy(cfg()), high_until=-1.0, end=120.0)
    assert all(d.held_by == "window" for d in decisions[:-1])
    assert decisions[-1].reason == "scale_down"


def test_a_firing_indicator_restarts_the_window() -> None:
    """A tick with TTFT over its SLO while a request waits counts as current being needed."""
    policy = ScalingPolicy(cfg(fast_step_min=1))
    t = 0.0
    while t <= 200.0:
        policy.decide(sig(t, ready=10, in_flight=20))
        t += TICK
    policy.decide(sig(t, ready=10, starting=1, in_flight=20, queued=1, ttft_p95_s=0.9))
    d = policy.decide(sig(t + 70.0, ready=11, in_flight=20))
    assert d.held_by == "window"


@pytest.mark.parametrize(("need_streams", "desired"), [(90, 10), (80, 8)])
def test_hysteresis_keeps_a_small_surplus(need_streams: int, desired: int) -> None:
    """At 10 ready a need of 9 is a surplus of 1, not above 10%: kept; a need of 8 goes."""
    policy = ScalingPolicy(cfg())
    d = None
    for i in range(60):
        d = policy.decide(sig(i * TICK, ready=10, in_flight=need_streams))
    assert d is not None and d.desired_ready == desired
    if desired == 10:
        assert d.held_by == "hysteresis"


def test_cooldown_after_scale_up() -> None:
    """Window 10 s, cooldown 60 s: after a scale-up at 200 s the scale-down waits to 260 s."""
    policy = ScalingPolicy(cfg(scale_down_window_s=10.0, scale_down_cooldown_s=60.0))
    t = 0.0
    while t < 200.0:
        policy.decide(sig(t, ready=4, in_flight=40))
        t += TICK
    up = policy.decide(sig(200.0, ready=4, in_flight=100))
    assert (up.desired_ready, up.reason) == (10, "scale_up")
    held = [policy.decide(sig(t, ready=10, in_flight=20)) for t in range(215, 260, 5)]
    assert all(d.held_by == "cooldown" and d.desired_ready == 10 for d in held)
    down = policy.decide(sig(260.0, ready=10, in_flight=20))
    assert (down.desired_ready, down.reason) == (8, "scale_down")


def test_scale_down_at_most_a_fraction() -> None:
    """From 20 to 1, each decision removes at most max(1, floor(0.25 x ready))."""
    policy = ScalingPolicy(cfg(scale_down_window_s=0.0, scale_down_cooldown_s=0.0))
    ready = 20
    seen = [ready]
    for i in range(15):
        ready = policy.decide(sig(i * TICK, ready=ready)).desired_ready
        seen.append(ready)
    assert seen[:11] == [20, 15, 12, 9, 7, 6, 5, 4, 3, 2, 1]
    assert seen[-1] == 1


def test_above_max_replicas_goes_to_max_at_once() -> None:
    d = ScalingPolicy(cfg(max_replicas=6)).decide(sig(0.0, ready=9, in_flight=60))
    assert (d.desired_ready, d.reason) == (6, "bounds")


def test_below_min_replicas_goes_to_min_at_once() -> None:
    d = ScalingPolicy(cfg(min_replicas=3)).decide(sig(0.0, ready=1))
    assert (d.desired_ready, d.reason) == (3, "bounds")


def test_scale_to_zero_after_idle_and_back_at_once() -> None:
    """Idle for 300 s after the last arrival: 0 replicas; an arrival at zero: 1 at once."""
    policy = ScalingPolicy(cfg(min_replicas=0, scale_to_zero=True, idle_to_zero_s=300.0))
    ready = 2
    t = 0.0
    while t < 300.0:
        d = policy.decide(sig(t, ready=ready, last_arrival_at=0.0))
        assert d.desired_ready >= 1
        ready = d.desired_ready
        t += TICK
    d = policy.decide(sig(300.0, ready=ready, last_arrival_at=0.0))
    assert (d.desired_ready, d.desired_warm, d.reason) == (0, 0, "to_zero")
    d = policy.decide(sig(305.0, ready=0, last_arrival_at=0.0))
    assert (d.desired_ready, d.reason) == (0, "steady")
    d = policy.decide(sig(310.0, ready=0, queued=1, arrivals_per_s=0.2, last_arrival_at=309.0))
    assert (d.desired_ready, d.reason) == (1, "from_zero")


def test_without_scale_to_zero_min_zero_keeps_one() -> None:
    policy = ScalingPolicy(cfg(min_replicas=0))
    for i in range(200):
        d = policy.decide(sig(i * TICK, ready=1, last_arrival_at=0.0))
        assert d.desired_ready == 1


def test_a_pool_left_with_no_ready_replica_asks_for_one_at_once() -> None:
    d = ScalingPolicy(cfg()).decide(sig(0.0, ready=0, queued=3))
    assert d.desired_ready >= 1 and d.reason == "from_zero"


def test_warm_pool_follows_growth_times_cold_start() -> None:
    """Steady load keeps no warm replica; 0.2 replicas/s x 5 s cold start keeps 1 beyond the
    target; x 60 s would be 12, capped at max_warm_replicas 2; a configured number is kept as
    it is, within max_replicas."""
    steady = ScalingPolicy(cfg())
    for i in range(5):
        d = steady.decide(sig(i * TICK, in_flight=40))
    assert d.desired_warm == 0
    for cold, warm in ((5.0, 1), (60.0, 2)):
        policy = ScalingPolicy(cfg())
        ramp(policy, cold)
        d = policy.decide(sig(4 * TICK, ready=5, in_flight=50, cold_start_s=cold))
        assert d.desired_warm == warm
    fixed = ScalingPolicy(cfg(warm_replicas=3, max_replicas=6))
    assert fixed.decide(sig(0.0, in_flight=40)).desired_warm == 2


def test_config_values_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError):
        ScalerConfig(min_replicas=5, max_replicas=4)
    with pytest.raises(ValueError):
        ScalerConfig(max_scale_down_fraction=0.0)
    assert dataclasses.replace(ScalerConfig(), max_replicas=9).max_replicas == 9


def test_slope_is_the_least_squares_fit() -> None:
    assert slope([(0.0, 1.0), (5.0, 2.0), (10.0, 3.0)]) == pytest.approx(0.2)
    assert slope([(0.0, 1.0)]) == 0.0


def test_a_burst_scales_up_at_most_the_rate_cap_a_tick() -> None:
    """400 streams at 10 per replica want 40 replicas; from 4 ready one tick adds at most
    max(4, 100% of 4) = 4, the next (8 ready) 8: a burst never starts a cluster at once."""
    policy = ScalingPolicy(cfg(max_replicas=100, max_scale_up_replicas=4))
    d = policy.decide(sig(0.0, in_flight=400))
    assert (d.desired_ready, d.held_by) == (8, "scale_up_rate")
    d = policy.decide(sig(TICK, ready=8, in_flight=400))
    assert (d.desired_ready, d.held_by) == (16, "scale_up_rate")
    few = ScalingPolicy(cfg(max_replicas=100, max_scale_up_replicas=1, max_scale_up_fraction=0.25))
    assert few.decide(sig(0.0, in_flight=400)).desired_ready == 5


def test_the_warm_pool_falls_only_after_the_stable_window() -> None:
    """Growth asks for warm replicas at once; when it flattens the 2 held (warm or starting
    for it) are kept for the window (a warm replica costs a cold start to bring back), then
    released."""
    policy = ScalingPolicy(cfg(scale_down_window_s=30.0, max_warm_replicas=2, growth_ticks=4))
    now = ramp(policy, cold=10.0)
    grown = policy.decide(sig(now + TICK, ready=5, in_flight=50, cold_start_s=10.0))
    assert grown.desired_warm == 2
    flat = [
        policy.decide(
            sig(
                now + TICK * (2 + i),
                ready=5,
                in_flight=50,
                cold_start_s=10.0,
                warm=1,
                warm_starting=1,
            )
        )
        for i in range(10)
    ]
    assert [d.desired_warm for d in flat[:4]] == [2, 2, 2, 2]  # within 30 s of the growth
    assert flat[-1].desired_warm == 0


def test_a_promoted_warm_replica_is_replaced_only_while_growth_asks() -> None:
    """A ramp asked for 2 warm replicas; both were promoted (none held now): with the demand
    flat, the window's figure starts no new one."""
    policy = ScalingPolicy(cfg(scale_down_window_s=30.0, max_warm_replicas=2, growth_ticks=4))
    now = ramp(policy, cold=10.0)
    assert policy.decide(sig(now + TICK, ready=5, in_flight=50, cold_start_s=10.0)).desired_warm
    flat = [
        policy.decide(sig(now + TICK * (2 + i), ready=7, in_flight=50, cold_start_s=10.0))
        for i in range(4)
    ]
    assert [d.desired_warm for d in flat] == [0, 0, 0, 0]


def test_warm_replicas_promoted_by_this_tick_are_not_held_for_replacement() -> None:
    """A ramp asked for 2 warm replicas and both are warm; the demand goes flat and 2 ready
    replicas are lost (3 ready, need 5): the target promotes both, and with growth gone the
    held figure does not start 2 more."""
    policy = ScalingPolicy(cfg(scale_down_window_s=30.0, max_warm_replicas=2, growth_ticks=4))
    now = ramp(policy, cold=10.0)
    assert policy.decide(sig(now + TICK, ready=5, in_flight=50, cold_start_s=10.0)).desired_warm
    for i in range(4):  # flat: growth falls to 0, the 2 warm ones held
        d = policy.decide(
            sig(now + TICK * (2 + i), ready=5, warm=2, in_flight=50, cold_start_s=10.0)
        )
    assert d.chain.growth_per_s == 0.0 and d.desired_warm == 2
    lost = policy.decide(sig(now + TICK * 6, ready=3, warm=2, in_flight=50, cold_start_s=10.0))
    assert (lost.desired_ready, lost.desired_warm) == (5, 0)
