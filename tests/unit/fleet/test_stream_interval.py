"""The stream-interval policy: a fixed setting as is; "auto" doubles the interval only after a
sustained busy window, halves it back after a longer idle window (hysteresis), and stays in
[1, maximum]."""

from __future__ import annotations

import pytest

from homing.clock import ManualClock
from homing.fleet.stream_interval import StreamIntervalPolicy

BUSY = 0.95
IDLE = 0.1
BETWEEN = 0.6


def feed(policy: StreamIntervalPolicy, clock: ManualClock, share: float, seconds: int) -> None:
    """One sample per second for `seconds` seconds, the first at the current time."""
    for _ in range(seconds):
        policy.observe(share)
        clock.advance(1.0)


def auto(clock: ManualClock, maximum: int = 8) -> StreamIntervalPolicy:
    return StreamIntervalPolicy(
        "auto", clock=clock, maximum=maximum, raise_after_s=5.0, lower_after_s=30.0
    )


def test_auto_starts_at_one() -> None:
    assert auto(ManualClock()).interval() == 1


@pytest.mark.parametrize("setting", [1, 4, 32])
def test_a_fixed_setting_is_returned_as_is_whatever_the_samples(setting: int) -> None:
    clock = ManualClock()
    policy = StreamIntervalPolicy(setting, clock=clock, maximum=8)
    assert policy.interval() == setting
    feed(policy, clock, BUSY, 60)
    assert policy.interval() == setting
    feed(policy, clock, IDLE, 120)
    assert policy.interval() == setting


def test_auto_raises_only_after_a_sustained_busy_window() -> None:
    clock = ManualClock()
    policy = auto(clock)
    feed(policy, clock, BUSY, 5)  # samples at t = 0..4: the window is 4 s old
    assert policy.interval() == 1
    policy.observe(BUSY)  # t = 5: five seconds busy
    assert policy.interval() == 2


def test_a_sample_below_the_high_mark_restarts_the_busy_window() -> None:
    clock = ManualClock()
    policy = auto(clock)
    for _ in range(6):
        feed(policy, clock, BUSY, 4)
        feed(policy, clock, BETWEEN, 1)
    assert policy.interval() == 1


def test_each_doubling_needs_a_fresh_busy_window() -> None:
    clock = ManualClock()
    policy = auto(clock)
    feed(policy, clock, BUSY, 6)  # raised at t = 5
    assert policy.interval() == 2
    feed(policy, clock, BUSY, 4)  # t = 6..9
    assert policy.interval() == 2
    policy.observe(BUSY)  # t = 10: five seconds since the raise
    assert policy.interval() == 4


def test_auto_never_exceeds_the_maximum() -> None:
    clock = ManualClock()
    policy = auto(clock, maximum=8)
    seen = set()
    for _ in range(300):
        policy.observe(1.0)
        seen.add(policy.interval())
        clock.advance(1.0)
    assert seen == {1, 2, 4, 8}


def test_a_maximum_that_is_not_a_power_of_two_is_reached_and_not_passed() -> None:
    clock = ManualClock()
    policy = auto(clock, maximum=6)
    feed(policy, clock, BUSY, 100)
    assert policy.interval() == 6


def test_auto_falls_back_only_after_a_sustained_idle_window() -> None:
    clock = ManualClock()
    policy = auto(clock)
    feed(policy, clock, BUSY, 16)  # raised at t = 5, 10, 15
    assert policy.interval() == 8
    feed(policy, clock, IDLE, 30)  # 29 s idle
    assert policy.interval() == 8
    policy.observe(IDLE)  # 30 s idle
    assert policy.interval() == 4


def test_a_share_between_the_marks_holds_the_interval() -> None:
    """Hysteresis: between the low and high marks nothing moves, either way."""
    clock = ManualClock()
    policy = auto(clock)
    feed(policy, clock, BUSY, 6)
    assert policy.interval() == 2
    feed(policy, clock, BETWEEN, 600)
    assert policy.interval() == 2


def test_a_busy_sample_restarts_the_idle_window() -> None:
    clock = ManualClock()
    policy = auto(clock)
    feed(policy, clock, BUSY, 6)
    for _ in range(10):
        feed(policy, clock, IDLE, 29)
        feed(policy, clock, BUSY, 1)
    assert policy.interval() == 2


def test_auto_never_goes_below_one() -> None:
    clock = ManualClock()
    policy = auto(clock)
    feed(policy, clock, BUSY, 6)
    feed(policy, clock, IDLE, 600)
    assert policy.interval() == 1
    feed(policy, clock, 0.0, 600)
    assert policy.interval() == 1


def test_steady_load_at_the_marks_does_not_flap() -> None:
    """A load whose loop work halves with each doubling (all per-chunk) settles: the busy
    share at interval k is `demand / k`, and with demand 1.6 the interval climbs to 2
    (share 0.8, between the marks) and stays there for ten minutes."""
    clock = ManualClock()
    policy = auto(clock)
    changes = 0
    last = policy.interval()
    for _ in range(600):
        policy.observe(min(1.0, 1.6 / policy.interval()))
        clock.advance(1.0)
        if policy.interval() != last:
            changes, last = changes + 1, policy.interval()
    assert (changes, policy.interval()) == (1, 2)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"setting": 0},
        {"setting": -3},
        {"setting": "fast"},
        {"setting": True},
        {"setting": 2.0},
        {"setting": "auto", "maximum": 0},
        {"setting": "auto", "high": 0.4, "low": 0.4},
        {"setting": "auto", "high": 1.5},
        {"setting": "auto", "low": -0.1},
        {"setting": "auto", "raise_after_s": -1.0},
    ],
)
def test_settings_out_of_range_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        StreamIntervalPolicy(clock=ManualClock(), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("share", [-0.01, 1.01, float("nan")])
def test_a_busy_share_outside_zero_to_one_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="busy share"):
        auto(ManualClock()).observe(share)
