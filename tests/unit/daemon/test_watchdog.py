"""The watchdog pings from the event loop at half its interval, and a loop stall is logged
with the stack of the code that held the loop."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
from structlog.testing import capture_logs

from homing.clock import ManualClock, SystemClock
from homing.daemon.watchdog import StallMonitor, WatchdogPinger, watchdog_interval_s


def test_watchdog_usec_is_read_for_this_process_only() -> None:
    assert watchdog_interval_s({"WATCHDOG_USEC": "10000000"}, pid=42) == 10.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "42"}, 42) == 10.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "7"}, 42) is None
    assert watchdog_interval_s({}, 42) is None
    with pytest.raises(ValueError, match="WATCHDOG_USEC"):
        watchdog_interval_s({"WATCHDOG_USEC": "ten"}, 42)


def test_pings_come_every_half_interval_of_the_clock() -> None:
    clock = ManualClock()
    pings: list[float] = []
    pinger = WatchdogPinger(4.0, lambda: pings.append(clock.now()), clock)
    pinger.start()
    for _ in range(5):
        clock.advance(1.0)
    assert pings == [0.0, 2.0, 4.0]
    pinger.stop()
    clock.advance(10.0)
    assert pings == [0.0, 2.0, 4.0]


def _hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # what a blocking call in a coroutine does to every other task


async def test_a_stalled_loop_stops_the_pings_and_is_logged_with_its_stack() -> None:
    pings: list[float] = []
    stalls: list[tuple[float, str]] = []
    clock = SystemClock()
    pinger = WatchdogPinger(0.2, lambda: pings.append(time.monotonic()), clock)
    monitor = StallMonitor(0.3, clock, tick_s=0.05, on_stall=lambda s, st: stalls.append((s, st)))
    with capture_logs() as logs:
        pinger.start()
        monitor.start()
        await asyncio.sleep(0.3)
        _hold_the_loop(1.0)
        await asyncio.sleep(0.3)
        monitor.stop()
        pinger.stop()
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    assert max(gaps) >= 0.9  # no ping while the loop was held
    assert len(stalls) == 1
    blocked_s, stack = stalls[0]
    assert 0.3 < blocked_s < 1.0
    assert "_hold_the_loop" in stack and "time.sleep(seconds)" in stack
    events = [e["event"] for e in logs]
    assert events.count("loop_stalled") == 1 and events.count("loop_stall_ended") == 1
    ended = next(e for e in logs if e["event"] == "loop_stall_ended")
    assert 0.9 <= ended["stalled_s"] < 2.0


async def test_a_busy_but_running_loop_is_not_reported() -> None:
    stalls: list[tuple[float, str]] = []
    monitor = StallMonitor(
        0.5, SystemClock(), tick_s=0.05, on_stall=lambda s, st: stalls.append((s, st))
    )
    monitor.start()
    for _ in range(20):  # many short callbacks: busy, never held for long
        _hold_the_loop(0.01)
        await asyncio.sleep(0.01)
    monitor.stop()
    assert stalls == []
