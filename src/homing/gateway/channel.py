"""The FIFO between a request's choice tasks and its one consumer.

Rule of this file: `asyncio.Queue`'s job for exactly that shape, at the cost of a deque
append and pop per event: one consumer (so one waiter future, made only when it finds the
channel empty), any number of producers that never block except for backpressure, and the
consumer's push-back of an item it took too early.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class EventChannel(Generic[T]):
    """Items in order from `put` (any task) to `get`/`get_nowait` (one consumer task).

    `limit`: the size at which `full()` is true and `wait_for_room` holds a producer until the
    consumer has taken items below it (puts are never refused). Items must not be None
    (`get_nowait`'s "empty"). Not thread-safe: one event loop.
    """

    __slots__ = ("_getter", "_items", "_room", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self._items: deque[T] = deque()
        self._getter: asyncio.Future[None] | None = None  # the consumer, waiting on empty
        self._room = asyncio.Event()  # set while below `limit`
        self._room.set()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        """The items waiting, in order, without taking them."""
        return iter(self._items)

    def full(self) -> bool:
        """At or above `limit` items."""
        return len(self._items) >= self.limit

    def put(self, item: T) -> None:
        """Append `item` and wake the consumer if it waits."""
        self._items.append(item)
        getter = self._getter
        if getter is not None:
            self._getter = None
            if not getter.done():
                getter.set_result(None)

    def push_front(self, item: T) -> None:
        """Give an item back to the consumer's side: the next `get` returns it."""
        self._items.appendleft(item)

    async def get(self) -> T:
        """The next item, waiting while there is none. A second consumer waiting at the same
        time is a bug: RuntimeError."""
        while not self._items:
            if self._getter is not None and not self._getter.done():
                raise RuntimeError("EventChannel has one consumer")
            getter = asyncio.get_running_loop().create_future()
            self._getter = getter
            try:
                await getter
            finally:
                if self._getter is getter:
                    self._getter = None
        return self._take()

    def get_nowait(self) -> T | None:
        """The next item, or None when there is none."""
        if not self._items:
            return None
        return self._take()

    def _take(self) -> T:
        item = self._items.popleft()
        if not self._room.is_set() and len(self._items) < self.limit:
            self._room.set()
        return item

    async def wait_for_room(self) -> None:
        """Hold a producer while the channel is `full()`."""
        while len(self._items) >= self.limit:
            self._room.clear()
            await self._room.wait()

    def retain(self, keep: Callable[[T], bool]) -> None:
        """Keep only the items `keep` accepts, in order, and release waiting producers."""
        kept = [item for item in self._items if keep(item)]
        self._items.clear()
        self._items.extend(kept)
        if len(self._items) < self.limit:
            self._room.set()

    def clear(self) -> None:
        """Drop every item and release waiting producers."""
        self.retain(lambda _: False)
