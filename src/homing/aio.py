"""asyncio helpers that keep cancellation honest."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def cancel_and_wait(task: asyncio.Task[object]) -> None:
    """Cancel `task` and wait until it has ended.

    The task's own CancelledError is absorbed; a cancellation of the caller while it waits
    is raised, never swallowed. Other exceptions of the task propagate.
    """
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


async def first_done(*aws: Awaitable[object]) -> None:
    """Wait until the first of `aws` has ended (or the caller is cancelled), then cancel
    the others. What the first one returned or raised is not read: the caller looks at
    the state the awaitables watch."""
    tasks = [asyncio.ensure_future(aw) for aw in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


async def gather_or_cancel(*aws: Awaitable[T]) -> list[T]:
    """Run `aws` concurrently and return their results in order; when one fails (or the
    caller is cancelled), cancel the others, wait until all have ended, and raise that
    first error (unlike `asyncio.gather`, which leaves the others running)."""
    tasks = [asyncio.ensure_future(aw) for aw in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def off_loop_if(heavy: bool, fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)`: in a worker thread when `heavy` (so it holds no event-loop callback),
    else inline (a thread hop costs tens of microseconds)."""
    if heavy:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)
