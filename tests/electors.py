"""Electors (`homing.scaler.leader`) run as tasks by a test, with every change each one
reported."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


class Running:
    """Electors run as tasks, with every `is_leader` change each one reported."""

    def __init__(self) -> None:
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.changes: dict[int, list[bool]] = {}

    def start(self, elector: Any) -> Any:
        self.changes[id(elector)] = changes = []
        elector.subscribe(changes.append)
        self.tasks[id(elector)] = asyncio.get_running_loop().create_task(elector.run())
        return elector

    def of(self, elector: Any) -> list[bool]:
        return self.changes[id(elector)]

    async def stop(self, elector: Any) -> None:
        """Cancel its run(); fails the test if run() raised anything but the cancel."""
        task = self.tasks.pop(id(elector))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        for task in self.tasks.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
