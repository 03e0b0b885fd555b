"""`EventChannel`: order, push-back, one waiting consumer, and producers' backpressure."""

from __future__ import annotations

import asyncio

import pytest

from homing.gateway.channel import EventChannel


async def test_items_come_out_in_order_and_a_pushed_back_item_first() -> None:
    channel: EventChannel[int] = EventChannel(limit=8)
    for item in (1, 2, 3):
        channel.put(item)
    assert await channel.get() == 1
    channel.push_front(1)
    assert [await channel.get(), channel.get_nowait(), channel.get_nowait()] == [1, 2, 3]
    assert channel.get_nowait() is None
    assert len(channel) == 0


async def test_a_waiting_consumer_wakes_on_the_next_put() -> None:
    channel: EventChannel[str] = EventChannel(limit=8)
    getter = asyncio.create_task(channel.get())
    await asyncio.sleep(0)  # the consumer is waiting on the empty channel
    assert not getter.done()
    channel.put("a")
    assert await getter == "a"


async def test_a_second_consumer_waiting_at_once_is_refused() -> None:
    channel: EventChannel[int] = EventChannel(limit=8)
    first = asyncio.create_task(channel.get())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="one consumer"):
        await channel.get()
    channel.put(7)
    assert await first == 7


async def test_a_cancelled_consumer_leaves_the_channel_usable() -> None:
    channel: EventChannel[int] = EventChannel(limit=8)
    getter = asyncio.create_task(channel.get())
    await asyncio.sleep(0)
    getter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await getter
    channel.put(5)  # nothing waits: the item stays
    assert await channel.get() == 5


async def test_a_full_channel_holds_producers_until_the_consumer_takes() -> None:
    channel: EventChannel[int] = EventChannel(limit=2)
    channel.put(1)
    channel.put(2)
    assert channel.full()
    producer = asyncio.create_task(channel.wait_for_room())
    await asyncio.sleep(0)
    assert not producer.done()
    assert channel.get_nowait() == 1
    await asyncio.wait_for(producer, timeout=5)
    assert not channel.full()


async def test_retain_keeps_the_accepted_items_in_order_and_frees_producers() -> None:
    channel: EventChannel[int] = EventChannel(limit=3)
    for item in (1, 2, 3):
        channel.put(item)
    producer = asyncio.create_task(channel.wait_for_room())
    await asyncio.sleep(0)
    channel.retain(lambda item: item != 2)
    assert list(channel) == [1, 3]
    await asyncio.wait_for(producer, timeout=5)
    channel.clear()
    assert channel.get_nowait() is None


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        EventChannel(limit=0)
