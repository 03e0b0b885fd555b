"""A per-worker circuit breaker on the request path, as a pure state machine.

Rule of this file: plain frozen data and functions of (state, now); no I/O, no clock of its
own (the pool passes `now` and sets the timer that ends an open interval).

    closed --`consecutive` transport failures--> open
    open --its open interval passed (`tick`)--> half_open
    half_open --the trial request's worker answered--> closed
    half_open --any transport failure--> open (interval doubled)
    half_open --the trial ended with no outcome--> half_open (trial slot free)

`closed`: every request may go. `open`: the worker gets no requests. `half_open`: exactly
one request is let through, the trial (`start_request` marks it, so concurrent routing
decisions see the slot taken); its success closes the breaker, a failure re-opens it with
the open interval doubled (`open_s * 2**(opens - 1)`, capped at `max_open_s`). Closing
resets the doubling.

Only requests' transport failures count (the worker or the path to it failed: UNAVAILABLE,
DEADLINE_EXCEEDED from the worker, INTERNAL, a cut stream; see
`homing.engines.client.TRANSPORT_CODES`). A success, for the failure run, is a request that
completed without one; for the trial it is the worker's first answer (its first token), so
the breaker closes as soon as the worker is seen to serve, not when the trial's stream ends.
A request that ended with no outcome (the client went away before an answer, the worker
aborted it, it never reached the worker) counts neither way; a trial ending so frees the
slot for the next request (`end_trial`).
Health (`homing.engines.health`) is separate and also counts those failures; the breaker
adds what health cannot: it stays open for its interval even while HealthCheck passes (a
worker that refuses every Generate but answers its probes), and lets one request test the
worker before traffic returns.

Defaults: 5 consecutive failures (Envoy outlier detection's `consecutive_5xx` and
`consecutive_gateway_failure` default, 5); first open interval 1 s doubling to 30 s (a
restarted worker is tried again within a second; a worker that keeps refusing costs at most
one failed request every 30 s, as Envoy's `max_ejection_time` bounds its backoff).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


class BreakerState(StrEnum):
    """Where a worker's breaker is (see the module docstring)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerConfig:
    """`consecutive` transport failures open the breaker; it stays open `open_s` seconds,
    doubling on each re-open without a close in between, at most `max_open_s`.
    `enabled` False: the breaker never opens. ValueError for values out of range."""

    consecutive: int = 5
    open_s: float = 1.0
    max_open_s: float = 30.0
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.consecutive < 1:
            raise ValueError("consecutive must be at least 1")
        if not 0 < self.open_s <= self.max_open_s:
            raise ValueError("need 0 < open_s <= max_open_s")


@dataclass(frozen=True)
class Breaker:
    """One worker's breaker.

    `failures`: consecutive transport failures while closed. `opens`: opens since the last
    close (the doubling exponent). `open_until`: clock time (s) the open interval ends
    (meaningful when open). `trial`: the half-open trial request is in flight.
    """

    state: BreakerState = BreakerState.CLOSED
    failures: int = 0
    opens: int = 0
    open_until: float = 0.0
    trial: bool = False

    @property
    def admits(self) -> bool:
        """Whether a new request may go to the worker now: closed, or half-open with the
        trial slot free."""
        if self.state is BreakerState.CLOSED:
            return True
        return self.state is BreakerState.HALF_OPEN and not self.trial


def open_interval(opens: int, config: BreakerConfig) -> float:
    """Seconds the `opens`-th consecutive open lasts: `open_s * 2**(opens - 1)`, capped."""
    return min(config.max_open_s, config.open_s * 2.0 ** max(0, opens - 1))


def _open(b: Breaker, now: float, config: BreakerConfig) -> Breaker:
    opens = b.opens + 1
    return Breaker(
        state=BreakerState.OPEN,
        failures=0,
        opens=opens,
        open_until=now + open_interval(opens, config),
        trial=False,
    )


def on_failure(b: Breaker, now: float, config: BreakerConfig) -> Breaker:
    """The breaker after one request's transport failure at clock time `now`.

    Closed: counts it, opening at `consecutive`. Half-open: re-opens (the trial, or a
    request still in flight from before, failed). Open: unchanged (requests sent before it
    opened may still fail; they do not extend the interval)."""
    if not config.enabled:
        return b
    if b.state is BreakerState.CLOSED:
        failures = b.failures + 1
        if failures >= config.consecutive:
            return _open(b, now, config)
        return replace(b, failures=failures)
    if b.state is BreakerState.HALF_OPEN:
        return _open(b, now, config)
    return b


def on_success(b: Breaker, *, trial: bool, failures_after: int = 0) -> Breaker:
    """The breaker after a request's success (`trial`: it was the half-open trial, whose
    worker answered). Closed: the failure run starts again at the success, so it keeps the
    `failures_after` failures recorded since the success happened (at most the run it has).
    Half-open: the trial's success closes it; another request's success (sent before it
    opened) does not."""
    if b.state is BreakerState.CLOSED:
        failures = min(b.failures, max(0, failures_after))
        return replace(b, failures=failures) if failures != b.failures else b
    if b.state is BreakerState.HALF_OPEN and trial and b.trial:
        return Breaker()
    return b


def end_trial(b: Breaker) -> Breaker:
    """The half-open trial ended with no outcome (neither an answer nor a transport
    failure): its slot is free for the next request. Any other state: unchanged."""
    if b.state is BreakerState.HALF_OPEN and b.trial:
        return replace(b, trial=False)
    return b


def tick(b: Breaker, now: float) -> Breaker:
    """Open past its interval at `now` becomes half-open (trial slot free)."""
    if b.state is BreakerState.OPEN and now >= b.open_until:
        return replace(b, state=BreakerState.HALF_OPEN, trial=False)
    return b


def start_request(b: Breaker) -> tuple[Breaker, bool]:
    """A request is dispatched to the worker: (breaker after, whether it is the trial).
    Half-open with the slot free: the slot is taken. Raises ValueError when the breaker
    does not admit a request (the caller routed to a worker it should not have)."""
    if not b.admits:
        raise ValueError(f"the breaker is {b.state.value} and admits no request")
    if b.state is BreakerState.HALF_OPEN:
        return replace(b, trial=True), True
    return b, False
