"""asyncio helpers that keep cancellation honest."""

from __future__ import annotations

import asyncio


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
