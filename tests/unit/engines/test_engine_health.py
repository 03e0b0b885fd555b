"""Health flips only after consecutive runs of outcomes (pure state machine)."""

from __future__ import annotations

from homing.engines.health import HealthStatus, HealthThresholds, observe

T = HealthThresholds(unhealthy_threshold=3, healthy_threshold=2)


def run(status: HealthStatus, outcomes: list[bool]) -> HealthStatus:
    """Feed outcomes in order."""
    for ok in outcomes:
        status = observe(status, ok, T)
    return status


def test_three_consecutive_failures_mark_unhealthy() -> None:
    """Two failures keep a healthy worker healthy; the third flips it."""
    s = run(HealthStatus(healthy=True), [False, False])
    assert s.healthy and s.consecutive_failures == 2
    assert not observe(s, False, T).healthy


def test_a_success_resets_the_failure_run() -> None:
    """Failures interrupted by a success never reach the threshold."""
    s = run(HealthStatus(healthy=True), [False, False, True, False, False])
    assert s.healthy
    assert s.consecutive_failures == 2


def test_two_consecutive_successes_mark_healthy_again() -> None:
    """An unhealthy worker needs two successes in a row to return."""
    s = run(HealthStatus(healthy=False), [True])
    assert not s.healthy
    s = run(s, [False, True, True])
    assert s.healthy and s.consecutive_successes == 2 and s.consecutive_failures == 0
