"""Worker health as a pure state machine over probe outcomes.

Rule of this file: one function, `observe`, holds every health transition. A worker turns
unhealthy after `unhealthy_threshold` consecutive failures and healthy again after
`healthy_threshold` consecutive successes; a success resets the failure run and vice versa.
Outcomes come from HealthCheck probes and from requests' transport errors alike (the pool
feeds both in). No I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HealthThresholds:
    """Consecutive outcomes needed to flip (defaults: 3 failures, 2 successes)."""

    unhealthy_threshold: int = 3
    healthy_threshold: int = 2


@dataclass(frozen=True)
class HealthStatus:
    """A worker's health and its current runs of consecutive failures/successes."""

    healthy: bool
    consecutive_failures: int = 0
    consecutive_successes: int = 0


def observe(status: HealthStatus, ok: bool, thresholds: HealthThresholds) -> HealthStatus:
    """The status after one more outcome (`ok` True: success)."""
    if ok:
        successes = status.consecutive_successes + 1
        healthy = status.healthy or successes >= thresholds.healthy_threshold
        return HealthStatus(
            healthy=healthy, consecutive_failures=0, consecutive_successes=successes
        )
    failures = status.consecutive_failures + 1
    healthy = status.healthy and failures < thresholds.unhealthy_threshold
    return HealthStatus(healthy=healthy, consecutive_failures=failures, consecutive_successes=0)
