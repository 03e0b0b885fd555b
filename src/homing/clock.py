"""The clock protocol: decision code reads time only through an injected `Clock`.

Live processes pass `SystemClock`; tests and virtual-time simulators pass `ManualClock`
and advance it explicitly, so the same policy code runs on real or virtual time.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time source in seconds."""

    def now(self) -> float:
        """Current time in seconds (monotonic, arbitrary origin)."""
        ...


class SystemClock:
    """Real monotonic time (`time.monotonic`)."""

    def now(self) -> float:
        """Seconds from `time.monotonic()`."""
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to; for tests and virtual-time runs."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        """The current virtual time in seconds."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward by `seconds` (>= 0); raises ValueError on a negative step."""
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards by {seconds} s")
        self._now += seconds
