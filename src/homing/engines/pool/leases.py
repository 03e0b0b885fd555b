"""Leases and the request-path circuit breakers they feed.

A request on a worker is counted in flight for the length of `in_flight` (the pool's
`track`). Each worker has a circuit breaker on the request path (`homing.engines.breaker`):
requests' transport failures (`Breakers.failure`, from the pool's `report_failure`) open it.
A lease (`open_lease` .. `close_lease`, its streams reporting through `lease_answered` /
`lease_completed` / `lease_failed`) records its own outcome in its `LeaseMark`: on a
half-open worker it is the one trial, resolved at the worker's first answer (closed) or a
transport failure (re-opened), and a trial that ended with no outcome frees the slot; a
lease that completed without a failure of its own restarts the failure run as of its
completion, whatever other leases on the worker did before (failures after its completion,
while its answer was still being delivered, still count); a lease the client left before an
answer, or that the worker aborted, counts neither way. `WorkerState.routable` is False
while the breaker admits no request. An open breaker turns half-open when its open interval
is over, timed on the pool's clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import grpc
import structlog

from homing.clock import Clock
from homing.engines import breaker as brk
from homing.engines.breaker import Breaker, BreakerConfig, BreakerState
from homing.engines.client import EngineError
from homing.engines.pool.state import LeaseMark, Worker, WorkerState

log = structlog.get_logger(__name__)


@contextlib.contextmanager
def in_flight(state: WorkerState, on_idle: Callable[[], None]) -> Iterator[None]:
    """Count one request in flight on the worker of `state` for the duration of the block,
    released exactly once, in `finally`, whatever ends the block; `on_idle()` when the last
    one ends. With other gateway processes (`state.shared`) each change is published."""
    state.in_flight += 1
    shared = state.shared
    if shared is not None:
        shared.publish(state.in_flight)
    try:
        yield
    finally:
        state.in_flight -= 1
        if shared is not None:
            shared.publish(state.in_flight)
        if state.in_flight == 0:
            on_idle()


def lease_completed(mark: LeaseMark, w: Worker | None) -> None:
    """One of the lease's streams ended with its complete message, not an abort (on `w`,
    None: a worker gone)."""
    if not mark.closed:
        mark.completed = True
        mark.failures_seen = w.failures_seen if w is not None else 0


def lease_failed(mark: LeaseMark, err: EngineError) -> None:
    """One of the lease's streams failed with `err`: a transport failure (our own deadline,
    DEADLINE_EXCEEDED, aside: it says nothing of the worker) marks the lease failed, so it
    earns no success."""
    if err.transport and err.code != grpc.StatusCode.DEADLINE_EXCEEDED and not mark.closed:
        mark.failed = True


class Breakers:
    """The breakers of one pool's workers: every change goes through `set` (mirrored on the
    worker's state, reported with `notify()`, and with `on_change(state)` when its state
    changes). `member(w)`: whether `w` is still in the pool (a timer of a worker gone does
    nothing)."""

    def __init__(
        self,
        *,
        clock: Clock,
        config: BreakerConfig,
        member: Callable[[Worker], bool],
        notify: Callable[[], None],
        on_change: Callable[[WorkerState], None] | None,
    ) -> None:
        self._clock = clock
        self._config = config
        self._member = member
        self._notify = notify
        self._on_change = on_change

    def failure(self, w: Worker) -> None:
        """A request on `w` failed on the transport."""
        w.failures_seen += 1
        self.set(w, brk.on_failure(w.breaker, self._clock.now(), self._config))

    def open_lease(self, w: Worker) -> LeaseMark:
        """A request was routed to `w`: on a half-open worker it takes the trial slot.
        ValueError when its breaker admits no request."""
        after, trial = brk.start_request(w.breaker)
        mark = LeaseMark(trial=trial)
        self.set(w, after)
        if trial:
            w.trial_lease = mark
        return mark

    def lease_answered(self, w: Worker | None, mark: LeaseMark) -> None:
        """The worker `w` (None: gone) answered one of the lease's streams: the half-open
        trial succeeds here. No-op after a failure of the lease, once closed, or for a
        worker gone."""
        if w is None or mark.closed or mark.failed or mark.answered:
            return
        mark.answered = True
        if w.trial_lease is mark:
            w.trial_lease = None
            self.set(w, brk.on_success(w.breaker, trial=True))

    def close_lease(self, w: Worker | None, mark: LeaseMark) -> None:
        """The lease `mark` came from ended (only the first call counts): a success when it
        completed without a failure of its own; an unresolved trial frees the half-open
        slot. No-op for a worker gone (`w` None)."""
        if mark.closed:
            return
        mark.closed = True
        if w is None:
            return
        if w.trial_lease is mark:
            w.trial_lease = None
            self.set(w, brk.end_trial(w.breaker))
        if mark.completed and not mark.failed:
            after = w.failures_seen - mark.failures_seen
            self.set(w, brk.on_success(w.breaker, trial=False, failures_after=after))

    def set(self, w: Worker, after: Breaker) -> None:
        """Put `after` in force for `w`: mirror it on the state, time an open interval's
        end, log and report state changes."""
        before = w.breaker
        if after == before:
            return
        s = w.state
        w.breaker = after
        if not after.trial:
            w.trial_lease = None  # re-opened or closed: the old trial resolves nothing
        s.breaker = after.state.value
        s.breaker_trial = after.trial
        self._notify()
        if after.state is before.state:
            return
        if w.breaker_timer is not None:
            w.breaker_timer.cancel()
            w.breaker_timer = None
        if after.state is BreakerState.OPEN:
            s.breaker_opens += 1
            delay = max(0.0, after.open_until - self._clock.now())
            w.breaker_timer = self._clock.call_later(delay, lambda: self._tick(w))
        log.info(
            "worker_breaker",
            worker=s.worker_id,
            url=s.url,
            state=after.state.value,
            before=before.state.value,
            open_s=round(brk.open_interval(after.opens, self._config), 3)
            if after.state is BreakerState.OPEN
            else None,
            error=s.last_error if after.state is BreakerState.OPEN else None,
        )
        if self._on_change is not None:
            self._on_change(s)

    @staticmethod
    def cancel_timer(w: Worker) -> None:
        """Cancel `w`'s open-interval timer (it leaves, or the pool stops)."""
        if w.breaker_timer is not None:
            w.breaker_timer.cancel()

    def _tick(self, w: Worker) -> None:
        """The open interval's timer: half-open when it is over (re-armed if it fired a
        hair early)."""
        w.breaker_timer = None
        if not self._member(w):
            return
        now = self._clock.now()
        after = brk.tick(w.breaker, now)
        if after.state is BreakerState.OPEN:
            remaining = max(0.001, after.open_until - now)
            w.breaker_timer = self._clock.call_later(remaining, lambda: self._tick(w))
            return
        self.set(w, after)
