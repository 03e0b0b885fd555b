"""How long each event-loop callback holds the loop's thread, in thread CPU time.

Rule of the file: a measuring instrument for tests that run the gateway in their own asyncio
event loop (the default loop, not uvloop): `asyncio.events.Handle._run`, which runs every
callback and task step of that loop, is wrapped for the duration of a `LoopWatch` block.
Thread CPU time (`time.thread_time()`) counts only the loop thread's own work, so other
processes taking the machine's cores (a loaded CI runner) do not lengthen a callback by
descheduling it; a callback that holds the loop for 10 ms of CPU delays everything queued
behind it by at least that much on any machine. One reading still has a tail on a shared VM:
a vCPU the host preempts is charged to the thread it ran (a fixed 2.4 ms loop read up to
6.7 ms on a 2-core runner; a sampler's timer callback, microseconds of work, read 12.5 ms
under a loaded CI run, in two of three readings). Noise only ever adds, while a cost the
code under test puts on the loop is in every reading, so tests judge `least_longest` of
repeated readings.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any


@dataclass
class Callbacks:
    """The loop callbacks one `recording()` block saw (times in ms of thread CPU)."""

    count: int = 0
    longest_ms: float = 0.0  # the longest callback
    longest: str = ""  # what it was (see `_describe`)
    longest_gc_ms: float = 0.0  # garbage collection inside that callback
    gc_ms: float = 0.0  # garbage collection inside all callbacks


def _describe(handle: asyncio.Handle) -> str:
    """The handle's repr, with the coroutine and line a task step stopped at, or the
    protocol a transport callback fed."""
    owner = getattr(getattr(handle, "_callback", None), "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        frame = getattr(coro, "cr_frame", None)
        where = f" at {frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""
        return f"{handle!r}: {getattr(coro, '__qualname__', coro)!r}{where}"
    protocol = getattr(owner, "_protocol", None)
    if protocol is not None:
        return f"{handle!r}: {type(protocol).__module__}.{type(protocol).__qualname__}"
    return repr(handle)


class LoopWatch:
    """Records the thread CPU time of loop callbacks run inside `recording()` blocks.

    On entry the test process's heap is collected and frozen (`gc.freeze()`), so a
    generation-2 collection, which would otherwise walk every object the test session made
    (tens of ms), walks only objects made since and does not land in a callback as a stall
    that is not the code under test's; collections still run and are timed (`gc.callbacks`).
    On exit the wrapper is removed and the heap unfrozen. Entered from a coroutine: the
    running loop must be asyncio's own (uvloop runs callbacks in C, unseen).
    """

    def __init__(self) -> None:
        self._current: Callbacks | None = None
        self._original: Any = None
        self._gc_ms = 0.0  # collection time so far
        self._gc_started = 0.0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.thread_time()
        else:
            self._gc_ms += (time.thread_time() - self._gc_started) * 1000

    def __enter__(self) -> LoopWatch:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, asyncio.BaseEventLoop), f"not asyncio's own loop: {loop!r}"
        gc.collect()
        gc.freeze()
        gc.callbacks.append(self._on_gc)
        self._original = original = asyncio.events.Handle._run
        watch = self

        def run(handle: asyncio.Handle) -> None:
            seen = watch._current
            if seen is None:
                original(handle)
                return
            gc_before, started = watch._gc_ms, time.thread_time()
            original(handle)
            spent = (time.thread_time() - started) * 1000
            collecting = watch._gc_ms - gc_before
            seen.count += 1
            seen.gc_ms += collecting
            if spent > seen.longest_ms:
                seen.longest_ms, seen.longest_gc_ms = spent, collecting
                seen.longest = _describe(handle)

        asyncio.events.Handle._run = run  # type: ignore[method-assign]
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        asyncio.events.Handle._run = self._original  # type: ignore[method-assign]
        gc.callbacks.remove(self._on_gc)
        gc.unfreeze()

    @contextmanager
    def recording(self) -> Iterator[Callbacks]:
        """Record the callbacks run inside this block into the `Callbacks` it yields."""
        self._current = seen = Callbacks()
        try:
            yield seen
        finally:
            self._current = None


def least_longest(readings: Sequence[Callbacks]) -> float:
    """The least of the readings' longest callbacks, in ms of thread CPU (see the module
    docstring). ValueError for no readings."""
    return min(c.longest_ms for c in readings)


def report(readings: Sequence[Callbacks]) -> str:
    """Each reading's longest callback and what it was, for an assertion's message."""
    return "; ".join(f"{c.longest_ms:.1f} ms: {c.longest}" for c in readings)
