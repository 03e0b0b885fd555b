"""The virtual clock's waits: sleepers, timeouts and timers fall due only when the clock
is advanced to their deadline, in deadline order; the system clock waits in real time."""

from __future__ import annotations

import asyncio

import pytest

from homing.clock import EPOCH, ManualClock, SystemClock


async def test_sleep_returns_only_once_advanced_past_its_deadline() -> None:
    clock = ManualClock()
    sleeper = asyncio.create_task(clock.sleep(2.0))
    await clock.settle()
    clock.advance(1.999)
    await clock.settle()
    assert not sleeper.done()
    clock.advance(0.001)
    await clock.settle()
    assert sleeper.done() and clock.now() == 2.0
    assert clock.pending == 0


async def test_timeout_raises_when_the_block_outlasts_virtual_time() -> None:
    clock = ManualClock()
    never = asyncio.Event()

    async def waits() -> None:
        async with clock.timeout(5.0):
            await never.wait()

    task = asyncio.create_task(waits())
    await clock.settle()
    clock.advance(4.0)
    await clock.settle()
    assert not task.done()
    clock.advance(1.0)
    with pytest.raises(TimeoutError):
        await task


async def test_a_block_that_ends_in_time_cancels_its_timer() -> None:
    clock = ManualClock()
    async with clock.timeout(5.0):
        await asyncio.sleep(0)
    assert clock.pending == 0
    async with clock.timeout(None):
        pass


def test_timers_fire_in_deadline_order_and_see_their_own_time() -> None:
    clock = ManualClock(10.0)
    fired: list[tuple[str, float]] = []
    clock.call_later(3.0, lambda: fired.append(("c", clock.now())))
    clock.call_later(1.0, lambda: fired.append(("a", clock.now())))
    cancelled = clock.call_later(2.0, lambda: fired.append(("x", clock.now())))
    clock.call_later(2.0, lambda: fired.append(("b", clock.now())))
    cancelled.cancel()
    assert clock.next_deadline() == 11.0
    clock.advance(5.0)
    assert fired == [("a", 11.0), ("b", 12.0), ("c", 13.0)]
    assert clock.now() == 15.0


def test_the_clock_never_moves_backwards() -> None:
    with pytest.raises(ValueError, match="backwards"):
        ManualClock().advance(-1.0)


async def test_system_clock_waits_in_real_time() -> None:
    clock = SystemClock()
    start = clock.now()
    await clock.sleep(0.01)
    assert clock.now() - start >= 0.01
    fired = asyncio.Event()
    clock.call_later(0.0, fired.set)
    await asyncio.wait_for(fired.wait(), 1.0)
    with pytest.raises(TimeoutError):
        async with clock.timeout(0.01):
            await asyncio.Event().wait()


def test_manual_wall_time_is_its_epoch_plus_virtual_time() -> None:
    """A `ManualClock`'s Unix time starts at its epoch and moves with `advance`."""
    clock = ManualClock(epoch=1_000.0)
    assert clock.wall() == 1_000.0
    clock.advance(2.5)
    assert clock.wall() == 1_002.5
    assert ManualClock().wall() == EPOCH


def test_deadlines_list_the_pending_timers_earliest_first() -> None:
    """`deadlines` shows every pending wait, and forgets the fired and cancelled ones."""
    clock = ManualClock()
    clock.call_later(3.0, lambda: None)
    cancelled = clock.call_later(2.0, lambda: None)
    clock.call_later(1.0, lambda: None)
    assert clock.deadlines() == [1.0, 2.0, 3.0]
    cancelled.cancel()
    clock.advance(1.0)
    assert clock.deadlines() == [3.0]
    assert clock.next_deadline() == 3.0
