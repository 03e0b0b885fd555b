"""The actuator contract: what the autoscaler asks of whatever runs its replicas.

Rule of this file: types only, no I/O. An `Actuator` (local processes, a user's exec script,
Kubernetes) starts and stops replicas of one model and reports them as `Member`s; the scaler
loop decides how many and drains a worker before it calls `stop`. A member is STARTING from
the moment it is asked for until its engine answers a HealthCheck (READY, with its
`grpc://host:port` url), and STOPPING while it is being stopped; stopped members are gone
from `members()`. A failed start (the process exited, or it never answered within its
startup timeout) removes the member, logs `scaler_start_failed` with the reason and adds one
to the actuator's `failed_starts`. Times are seconds of the actuator's injected
`homing.clock.Clock`.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, ParamSpec, Protocol

import structlog

#: Cold starts `cold_start_s` takes the median of (the most recent ones).
COLD_START_SAMPLES = 8


class MemberState(StrEnum):
    """Where a member is in its life."""

    STARTING = "starting"  # asked for, not yet answering
    READY = "ready"  # its engine answers (a worker URL the pool can add)
    STOPPING = "stopping"


@dataclass(frozen=True)
class Member:
    """One replica as its actuator sees it."""

    member_id: str  # the actuator's own name for it (process id tag, pod name, ...)
    url: str | None  # grpc://host:port once known
    state: MemberState
    asked_at: float  # clock seconds when it was asked for
    ready_at: float | None  # clock seconds when it became ready


class ActuatorError(Exception):
    """The actuator could not do what was asked; the message says why."""


class Actuator(Protocol):
    """Starts and stops the replicas of one model (see the module docstring)."""

    kind: str  # "local", "exec", "kubernetes"
    failed_starts: int  # starts that failed since construction

    async def open(self) -> None:
        """Get ready to report its members: one that watches them (Kubernetes) lists them
        and starts watching; the others have nothing to do. Idempotent."""
        ...

    def members(self) -> list[Member]:
        """What it runs now (not stopped ones)."""
        ...

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener()` (sync) whenever members change; returns the unsubscribe."""
        ...

    async def start(self, count: int) -> None:
        """Ask for `count` more replicas; returns once asked, not once ready."""
        ...

    async def stop(self, member_id: str) -> None:
        """Stop this member (the caller drained its worker first); returns once stopped."""
        ...

    def cold_start_s(self) -> float | None:
        """Median of the last (up to 8) measured cold starts, asked_at -> ready_at, in
        seconds; None before one."""
        ...

    async def close(self) -> None:
        """Stop watching; stop what it started when it owns the processes (local)."""
        ...


class ColdStarts:
    """The last `COLD_START_SAMPLES` cold starts in seconds, and their median."""

    def __init__(self, samples: Iterable[float] = ()) -> None:
        self._samples: deque[float] = deque(samples, maxlen=COLD_START_SAMPLES)

    def add(self, seconds: float) -> None:
        """Record one cold start of `seconds` (clamped at 0)."""
        self._samples.append(max(0.0, seconds))

    def median(self) -> float | None:
        """Median of the recorded cold starts; None before one."""
        return statistics.median(self._samples) if self._samples else None


P = ParamSpec("P")


class Listeners(Generic[P]):
    """A set of sync listeners, each called once per `notify(*args)` with its arguments (an
    actuator's are called with none, an elector's with `is_leader`). One that raises is
    logged as `failed_event` and does not stop the others."""

    def __init__(self, failed_event: str = "scaler_listener_failed") -> None:
        self._listeners: list[Callable[P, None]] = []
        self._failed_event = failed_event

    def subscribe(self, listener: Callable[P, None]) -> Callable[[], None]:
        """Add `listener`; returns the function that removes it (idempotent)."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    def notify(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Call every listener; one that raises is logged and does not stop the others."""
        for listener in list(self._listeners):
            try:
                listener(*args, **kwargs)
            except Exception:  # a listener's bug must not break its caller
                structlog.get_logger("homing.scaler").exception(self._failed_event)
