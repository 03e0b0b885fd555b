"""Helpers shared by the test suites (importable as `helpers`; tests/ is on pythonpath)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def eventually(check: Callable[[], bool], within_s: float) -> bool:
    """Poll `check` every 10 ms until it holds or `within_s` passes; its last value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while loop.time() < deadline:
        if check():
            return True
        await asyncio.sleep(0.01)
    return check()
