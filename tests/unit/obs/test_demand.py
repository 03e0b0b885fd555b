"""The demand meter: rates over its window on a virtual clock, TTFT's p95 to one bucket."""

from __future__ import annotations

import pytest

from homing.clock import ManualClock
from homing.obs.demand import TTFT_BUCKET_RATIO, DemandMeter


def test_rates_are_per_second_over_the_window() -> None:
    clock = ManualClock(100.0)
    meter = DemandMeter(now=clock.now, window_s=10.0)
    for _ in range(10):
        clock.advance(1.0)
        meter.arrived()
        meter.routed(500)
    d = meter.snapshot()
    assert d.arrivals_per_s == pytest.approx(1.0, rel=0.15)
    assert d.prefill_tokens_per_s == pytest.approx(500.0, rel=0.15)
    assert d.last_arrival_at == 110.0


def test_nothing_seen_gives_zeros_and_no_p95() -> None:
    meter = DemandMeter(now=ManualClock().now)
    d = meter.snapshot()
    assert (d.arrivals_per_s, d.prefill_tokens_per_s, d.ttft_p95_s, d.last_arrival_at) == (
        0.0,
        0.0,
        None,
        None,
    )


def test_old_demand_leaves_the_window() -> None:
    clock = ManualClock()
    meter = DemandMeter(now=clock.now, window_s=10.0)
    meter.arrived()
    meter.routed(1000)
    clock.advance(30.0)
    d = meter.snapshot()
    assert (d.arrivals_per_s, d.prefill_tokens_per_s) == (0.0, 0.0)
    assert d.last_arrival_at == 0.0  # the newest arrival is remembered beyond the window


def test_ttft_p95_is_within_one_bucket_of_the_true_one() -> None:
    clock = ManualClock()
    meter = DemandMeter(now=clock.now)
    for i in range(1, 101):  # 10 ms .. 1 s: the true p95 is 0.95 s
        meter.first_token(i / 100)
    p95 = meter.snapshot().ttft_p95_s
    assert p95 is not None and 0.95 <= p95 <= 0.95 * TTFT_BUCKET_RATIO


def test_routed_zero_or_negative_and_bad_ttfts_count_nothing() -> None:
    meter = DemandMeter(now=ManualClock().now)
    meter.routed(0)
    meter.routed(-5)
    meter.first_token(float("nan"))
    meter.first_token(-1.0)
    d = meter.snapshot()
    assert (d.prefill_tokens_per_s, d.ttft_p95_s) == (0.0, None)
