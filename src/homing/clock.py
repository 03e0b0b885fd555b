"""The clock protocol: code reads time and waits only through an injected `Clock`.

Live processes pass `SystemClock` (monotonic time, asyncio's timers); tests and
virtual-time simulators pass `ManualClock` and move it with `advance`, so the same policy
and shell code (health loops, admission, quota renewals, drains) runs on real or virtual
time. Every wait a `Clock` offers is cancellable like asyncio's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol


class TimerHandle(Protocol):
    """A scheduled callback (`Clock.call_later`)."""

    def cancel(self) -> None:
        """Do not run the callback (no effect once it ran)."""
        ...


class Clock(Protocol):
    """Monotonic time source in seconds, and waits measured on it."""

    def now(self) -> float:
        """Current time in seconds (monotonic, arbitrary origin)."""
        ...

    def wall(self) -> float:
        """Unix time in seconds, for timestamps shown to people and clients (never for
        measuring a span: use `now`)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return after `seconds` of this clock's time."""
        ...

    def timeout(self, seconds: float | None) -> contextlib.AbstractAsyncContextManager[None]:
        """`async with clock.timeout(s):` raises TimeoutError when the block outlasts `s`
        seconds of this clock's time (None: no limit), like `asyncio.timeout`."""
        ...

    def call_later(self, seconds: float, callback: Callable[[], object]) -> TimerHandle:
        """Run `callback()` once, `seconds` from now, in the running event loop."""
        ...


class SystemClock:
    """Real monotonic time (`time.monotonic`) and asyncio's own timers."""

    def now(self) -> float:
        """Seconds from `time.monotonic()`."""
        return time.monotonic()

    def wall(self) -> float:
        """Seconds from `time.time()`."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """`asyncio.sleep(seconds)`."""
        await asyncio.sleep(seconds)

    def timeout(self, seconds: float | None) -> contextlib.AbstractAsyncContextManager[None]:
        """`asyncio.timeout(seconds)`."""
        return asyncio.timeout(seconds)  # type: ignore[return-value]

    def call_later(self, seconds: float, callback: Callable[[], object]) -> TimerHandle:
        """`loop.call_later` on the running loop."""
        return asyncio.get_running_loop().call_later(seconds, callback)


class _ManualTimer:
    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback: Callable[[], object] | None = callback

    def cancel(self) -> None:
        self.callback = None


#: A `ManualClock`'s Unix time at virtual time 0 (2026-01-01T00:00:00Z): fixed, so runs repeat.
EPOCH = 1_767_225_600.0


class ManualClock:
    """A clock that moves only when told to; for tests and virtual-time runs.

    Waits (`sleep`, `timeout`, `call_later`) are due when `advance` moves the time to or
    past their deadline: `advance` runs the due callbacks in deadline order (ties in the
    order they were scheduled) and wakes the due sleepers, which resume when the event
    loop next runs them (`await clock.settle()` lets them).
    """

    def __init__(self, start: float = 0.0, *, epoch: float = EPOCH) -> None:
        self._now = start
        self._epoch = epoch
        self._timers: list[tuple[float, int, _ManualTimer]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        """The current virtual time in seconds."""
        return self._now

    def wall(self) -> float:
        """`epoch` (the Unix time at virtual time 0) plus the virtual time."""
        return self._epoch + self._now

    def advance(self, seconds: float) -> None:
        """Move time forward by `seconds` (>= 0), firing what falls due on the way; raises
        ValueError on a negative step."""
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards by {seconds} s")
        target = self._now + seconds
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            self._now = max(self._now, when)
            callback, timer.callback = timer.callback, None
            if callback is not None:
                callback()
        self._now = target

    @property
    def pending(self) -> int:
        """Timers scheduled and not yet fired or cancelled."""
        return sum(1 for _, _, t in self._timers if t.callback is not None)

    def next_deadline(self) -> float | None:
        """The earliest pending deadline (None when nothing waits)."""
        pending = self.deadlines()
        return pending[0] if pending else None

    def deadlines(self) -> list[float]:
        """Every pending deadline, earliest first (a test's gate: "the wait has begun")."""
        return sorted(when for when, _, timer in self._timers if timer.callback is not None)

    def call_later(self, seconds: float, callback: Callable[[], object]) -> TimerHandle:
        """Run `callback()` when the clock reaches now + `seconds`."""
        timer = _ManualTimer(callback)
        heapq.heappush(self._timers, (self._now + max(0.0, seconds), next(self._seq), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        """Return once the clock has been advanced by `seconds`."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not future.done():
                future.set_result(None)

        timer = self.call_later(seconds, wake)
        try:
            await future
        finally:
            timer.cancel()

    @contextlib.asynccontextmanager
    async def timeout(self, seconds: float | None) -> AsyncIterator[None]:
        """Raise TimeoutError when the block is still running once the clock has been
        advanced by `seconds` (None: no limit)."""
        async with asyncio.timeout(None) as scope:
            timer = None
            if seconds is not None:
                loop = asyncio.get_running_loop()
                timer = self.call_later(seconds, lambda: scope.reschedule(loop.time()))
            try:
                yield
            finally:
                if timer is not None:
                    timer.cancel()

    async def settle(self, rounds: int = 10) -> None:
        """Let the event loop run what the last `advance` woke (a few rounds of callbacks)."""
        for _ in range(rounds):
            await asyncio.sleep(0)
