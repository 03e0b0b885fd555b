"""The watchdog pings from the event loop at half its interval, and a loop stall is logged
with the stack of the code that held the loop."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
from structlog.testing import capture_logs

from homing.clock import ManualClock, SystemClock
from homing.daemon.watchdog import (
    MAX_PING_PERIOD_S,
    MIN_PING_PERIOD_S,
    StallMonitor,
    WatchdogPinger,
    watchdog_interval_s,
)


def test_watchdog_usec_is_read_for_this_process_only() -> None:
    assert watchdog_interval_s({"WATCHDOG_USEC": "10000000"}, pid=42) == 10.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "42"}, 42) == 10.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "10000000", "WATCHDOG_PID": "7"}, 42) is None
    assert watchdog_interval_s({}, 42) is None
    with pytest.raises(ValueError, match="WATCHDOG_USEC"):
        watchdog_interval_s({"WATCHDOG_USEC": "ten"}, 42)


NOT_USEC = "is not a positive number of microseconds (ASCII digits, at most 19)"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"WATCHDOG_USEC": "١٢"},
            f"WATCHDOG_USEC='١٢' {NOT_USEC}",
        ),
        (
            {"WATCHDOG_USEC": "²"},
            f"WATCHDOG_USEC='²' {NOT_USEC}",
        ),
        (
            {"WATCHDOG_USEC": "0"},
            f"WATCHDOG_USEC='0' {NOT_USEC}",
        ),
        (
            {"WATCHDOG_USEC": "+5"},
            f"WATCHDOG_USEC='+5' {NOT_USEC}",
        ),
        (
            {"WATCHDOG_USEC": "9" * 5000},
            f"WATCHDOG_USEC={'9' * 64!r} {NOT_USEC}",
        ),
        ({"WATCHDOG_USEC": "1000", "WATCHDOG_PID": "٤٢"}, "WATCHDOG_PID='٤٢' is not a process id"),
        (
            {"WATCHDOG_USEC": "1000", "WATCHDOG_PID": " 42"},
            "WATCHDOG_PID=' 42' is not a process id",
        ),
    ],
)
def test_only_ascii_decimal_watchdog_variables_are_accepted(
    env: dict[str, str], message: str
) -> None:
    """Non-ASCII digits ("١٢".isdigit() is True), signs, blanks and endless digit strings
    are refused with the variable named (the daemon logs it and sends no pings)."""
    with pytest.raises(ValueError) as err:
        watchdog_interval_s(env, 42)
    assert str(err.value) == message


def test_a_tiny_watchdog_interval_pings_no_faster_than_the_floor() -> None:
    """WATCHDOG_USEC=1 would ask for a ping every half microsecond: the loop would spin.
    The period is floored at MIN_PING_PERIOD_S and the too-short interval logged."""
    clock = ManualClock()
    pings: list[float] = []
    with capture_logs() as logs:
        pinger = WatchdogPinger(1e-6, lambda: pings.append(clock.now()), clock)
    assert pinger.period_s == MIN_PING_PERIOD_S
    assert [e["event"] for e in logs] == ["watchdog_interval_too_short"]
    pinger.start()
    clock.advance(0.1)
    pinger.stop()
    assert len(pings) == round(0.1 / MIN_PING_PERIOD_S) + 1
    assert WatchdogPinger(1e12, lambda: None, clock).period_s == MAX_PING_PERIOD_S


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
