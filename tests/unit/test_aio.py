"""cancel_and_wait ends the task and never swallows a cancellation of its caller; first_done
returns at the first awaitable to end and cancels the others."""

from __future__ import annotations

import asyncio

import pytest

from homing.aio import cancel_and_wait, first_done


async def _stubborn(release: asyncio.Event) -> None:
    """Absorbs one cancellation, then waits for `release`."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        await release.wait()


async def test_cancel_and_wait_ends_the_task() -> None:
    """The task is cancelled and awaited; its own CancelledError does not escape."""
    task = asyncio.create_task(asyncio.Event().wait())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.cancelled()


async def test_a_cancelled_caller_is_cancelled_while_the_task_lingers() -> None:
    """The caller's own cancellation, arriving while the task is still ending, is raised
    (contextlib.suppress(CancelledError) around the await would swallow it)."""
    release = asyncio.Event()
    task = asyncio.create_task(_stubborn(release))
    await asyncio.sleep(0)
    stopper = asyncio.create_task(cancel_and_wait(task))
    for _ in range(3):  # the stopper cancels the task, which absorbs it and waits
        await asyncio.sleep(0)
    assert not task.done()
    stopper.cancel()  # reaches the task too; it ends, and the stopper must say it was cancelled
    with pytest.raises(asyncio.CancelledError):
        await stopper
    assert task.cancelled()
    assert not release.is_set()


async def test_a_task_failure_propagates() -> None:
    """An exception the task raises while ending reaches the caller."""

    async def failing() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    task = asyncio.create_task(failing())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="cleanup failed"):
        await cancel_and_wait(task)


async def test_first_done_returns_at_the_first_and_cancels_the_rest() -> None:
    """The event that fires ends the wait; the other waiter is cancelled, not left pending."""
    fired, never = asyncio.Event(), asyncio.Event()
    waiters: list[asyncio.Future[object]] = []

    async def watched(event: asyncio.Event) -> None:
        waiters.append(asyncio.current_task())  # type: ignore[arg-type]
        await event.wait()

    asyncio.get_running_loop().call_soon(fired.set)
    await first_done(watched(fired), watched(never))
    await asyncio.sleep(0)
    assert fired.is_set() and not never.is_set()
    assert [w.done() for w in waiters] == [True, True]
    assert waiters[1].cancelled()
