"""Worker health as a pure state machine over probe outcomes, judged by progress.

Rule of this file: one function, `observe`, holds every health transition. A worker turns
unhealthy after `unhealthy_threshold` consecutive failures and healthy again after
`healthy_threshold` consecutive successes; a success resets the failure run and vice versa.
Outcomes come from HealthCheck probes and from requests' transport errors alike (the pool
feeds both in). No I/O, no clock (times are passed in).

Progress: a HealthCheck that times out on a worker that is busy and making progress says
the probe waited behind the work (SGLang's probe is a one-token generation inside the
engine, queued behind a full batch), not that the worker is broken. `probe_verdict` turns
such a timeout into no outcome at all (`None`: neither a failure nor a success). Busy:
requests of ours in flight on it, or running/waiting requests in its latest load record.
Progress: within the last `window_s` seconds its KV-event stream delivered a batch of cache
events, or a load record that shows engine work (`shows_progress`), or a record whose
`engine_silence_ms` puts the engine's last output inside the window. A worker whose load
records stopped arriving, or stopped changing, while it has requests gets its probe
timeouts counted as failures, as does an idle worker and one without a KV-event stream. A
probe the worker answers "unhealthy", or one that cannot reach it, always counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


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


class ProbeOutcome(StrEnum):
    """How one HealthCheck probe ended: answered healthy (`ok`), answered unhealthy or could
    not reach the worker (`failed`), or got no answer within its timeout (`timed_out`)."""

    OK = "ok"
    FAILED = "failed"
    TIMED_OUT = "timed_out"


@dataclass(frozen=True)
class LoadSample:
    """The figures of one engine load record that progress is read from (one dp rank):
    requests `running` / `waiting`, `token_usage` (KV in use, 0..1), and prompt tokens
    `waiting_uncached_tokens` / `prefill_pending_tokens` (None: not reported)."""

    running: int
    waiting: int
    token_usage: float
    waiting_uncached_tokens: int | None = None
    prefill_pending_tokens: int | None = None


def shows_progress(before: LoadSample | None, after: LoadSample) -> bool:
    """Whether going from record `before` to `after` took engine work: the KV in use
    changed, the running set changed (admissions and completions happen in scheduler
    steps), or the queue / the prefill work in hand shrank. A queue that only grew is
    arrivals, which a wedged engine still accepts, so it is not progress; nor is a first
    record (`before` None)."""
    if before is None:
        return False
    if after.token_usage != before.token_usage or after.running != before.running:
        return True
    if after.waiting < before.waiting:
        return True
    for b, a in (
        (before.waiting_uncached_tokens, after.waiting_uncached_tokens),
        (before.prefill_pending_tokens, after.prefill_pending_tokens),
    ):
        if b is not None and a is not None and a < b:
            return True
    return False


def is_busy(in_flight: int, load: LoadSample | None) -> bool:
    """Whether the worker has requests: `in_flight` of ours, or running/waiting ones in its
    latest load record (all clients')."""
    return in_flight > 0 or (load is not None and load.running + load.waiting > 0)


def probe_verdict(
    outcome: ProbeOutcome,
    *,
    busy: bool,
    last_progress_at: float | None,
    now: float,
    window_s: float,
) -> bool | None:
    """The health outcome one probe contributes: True (success), False (failure), or None
    when it timed out on a `busy` worker whose last progress (clock time, s; None: none
    seen) is within `window_s` of `now` (the module docstring's rule)."""
    if outcome is ProbeOutcome.OK:
        return True
    if outcome is ProbeOutcome.FAILED:
        return False
    if busy and last_progress_at is not None and now - last_progress_at <= window_s:
        return None
    return False


def stalled(
    outcome: ProbeOutcome,
    *,
    open_streams: int,
    last_progress_at: float | None,
    now: float,
    window_s: float,
) -> bool:
    """Whether one probe proves the worker stalled, so it turns unhealthy at once instead of
    after `unhealthy_threshold` failures: it timed out while the worker has `open_streams`
    that should be producing tokens, yet its last engine progress (clock time, s) is older
    than `window_s`. Unknown progress (None) proves nothing."""
    return (
        outcome is ProbeOutcome.TIMED_OUT
        and open_streams > 0
        and last_progress_at is not None
        and now - last_progress_at > window_s
    )
