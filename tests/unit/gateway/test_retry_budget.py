"""The retry budget on a virtual clock: retries stay within a ratio of requests plus a floor
over a sliding window, and both expire with it."""

from __future__ import annotations

import pytest

from homing.clock import ManualClock
from homing.gateway.retry_budget import RetryBudget, RetryPolicy


def _budget(clock: ManualClock, **policy: float) -> RetryBudget:
    return RetryBudget(RetryPolicy(**policy), now=clock.now)  # type: ignore[arg-type]


def _spend_all(budget: RetryBudget) -> int:
    spent = 0
    while budget.try_spend():
        spent += 1
        assert spent < 10_000
    return spent


def test_retries_stay_within_the_ratio_of_requests_plus_the_floor() -> None:
    """100 requests at ratio 0.2 with a floor of 1 retry per window allow exactly 21."""
    clock = ManualClock(100.0)
    budget = _budget(clock, ratio=0.2, min_retries_per_s=0.1, window_s=10.0)
    for _ in range(100):
        budget.record_request()
    assert _spend_all(budget) == 21
    assert not budget.allows()


def test_a_quiet_pool_may_still_retry_at_the_floor_rate() -> None:
    """With no requests, 3 retries/s over a 10 s window allow 30 retries, not 31."""
    clock = ManualClock(5.0)
    budget = _budget(clock, ratio=0.2, min_retries_per_s=3.0, window_s=10.0)
    assert _spend_all(budget) == 30


def test_a_pool_that_fails_everything_gets_at_most_ratio_more_load() -> None:
    """Every request failing and asking for a retry: over 1000 requests spread across many
    windows, each window's retries stay within 0.2 of its requests plus the floor."""
    clock = ManualClock(0.0)
    budget = _budget(clock, ratio=0.2, min_retries_per_s=0.5, window_s=10.0)
    per_second: list[tuple[int, int]] = []  # (requests, retries) in each second
    for _ in range(50):
        retries = 0
        for _ in range(20):
            budget.record_request()
            retries += budget.try_spend()
            clock.advance(0.05)
        per_second.append((20, retries))
    for end in range(10, 51):
        window = per_second[end - 10 : end]
        requests = sum(r for r, _ in window)
        retries = sum(t for _, t in window)
        assert retries <= 0.2 * requests + 0.5 * 10.0
    total = sum(t for _, t in per_second)
    assert 0.19 * 1000 <= total <= 0.2 * 1000 + 0.5 * 50


def test_requests_and_retries_expire_after_the_window() -> None:
    """What was counted more than the window ago no longer counts, deposits or retries."""
    clock = ManualClock(0.0)
    budget = _budget(clock, ratio=0.5, min_retries_per_s=0.1, window_s=10.0)
    for _ in range(10):
        budget.record_request()
    assert _spend_all(budget) == 6  # 0.5 * 10 + 1
    clock.advance(11.0)
    assert _spend_all(budget) == 1  # the requests are gone: only the floor
    clock.advance(11.0)
    assert budget.balance() == pytest.approx(1.0)


def test_zero_ratio_and_zero_floor_refuse_every_retry() -> None:
    """ratio 0 and no floor: no retry, however many requests."""
    clock = ManualClock(0.0)
    budget = _budget(clock, ratio=0.0, min_retries_per_s=0.0, window_s=10.0)
    for _ in range(1000):
        budget.record_request()
    assert not budget.allows()
    assert not budget.try_spend()


def test_allows_counts_nothing_and_spend_counts_one() -> None:
    """`allows` leaves the balance as it is; `spend` lowers it by one retry."""
    clock = ManualClock(0.0)
    budget = _budget(clock, ratio=0.2, min_retries_per_s=0.2, window_s=10.0)
    before = budget.balance()
    assert budget.allows() and budget.allows()
    assert budget.balance() == before
    budget.spend()
    assert budget.balance() == pytest.approx(before - 1.0)


def test_configure_keeps_the_counts_unless_the_window_changes() -> None:
    """A new ratio applies to the requests already counted; a new window starts afresh."""
    clock = ManualClock(0.0)
    budget = _budget(clock, ratio=0.1, min_retries_per_s=0.0, window_s=10.0)
    for _ in range(20):
        budget.record_request()
    assert budget.balance() == pytest.approx(2.0)
    budget.configure(RetryPolicy(ratio=0.5, min_retries_per_s=0.0, window_s=10.0))
    assert budget.balance() == pytest.approx(10.0)
    budget.configure(RetryPolicy(ratio=0.5, min_retries_per_s=0.0, window_s=20.0))
    assert budget.balance() == pytest.approx(0.0)


@pytest.mark.parametrize(
    "policy",
    [
        {"max_retries": -1},
        {"ratio": -0.1},
        {"min_retries_per_s": -1.0},
        {"window_s": 0.5},
    ],
)
def test_a_policy_refuses_negative_values_and_windows_below_one_bucket(
    policy: dict[str, float],
) -> None:
    """Negative counts, ratios or floors and windows under 1 s are ValueErrors."""
    with pytest.raises(ValueError):
        RetryPolicy(**policy)  # type: ignore[arg-type]
