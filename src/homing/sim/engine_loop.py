"""The imperative shell around the pure scheduler: runs it on a real clock as an asyncio task.

Rule of this file: all waiting and all delivery happen here; no scheduling decision does.
- Simulated time = (wall seconds since start) x `speedup`; a step of `duration_s` simulated
  seconds occupies duration_s / speedup wall seconds. Steps are paced against deadlines, so a
  busy process falls behind instead of drifting.
- The loop sleeps on an event while the scheduler has nothing to do and wakes on a new
  request, an abort or a flush.
- A step's effects become visible when its time is up: tokens and finishes go to the
  per-request queues, the step's KV events (and any an abort caused meanwhile, in the order
  the cache recorded them) to `on_kv_events`, then `on_load_changed` is called.
- `abort` takes a request out at once (its stream gets a "abort" finish); `stop` ends every
  open stream the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from homing.clock import Clock, SystemClock
from homing.sim.radix_cache import KvEvent
from homing.sim.scheduler import (
    LoadStats,
    RequestFinished,
    RequestOutput,
    Scheduler,
    SimRequest,
    StepResult,
)

log = logging.getLogger(__name__)

StreamItem = RequestOutput | RequestFinished
"""What a request's queue carries: token outputs, then exactly one `RequestFinished`."""


@dataclass(eq=False)
class RequestStream:
    """The outputs of one submitted request, in order; `RequestFinished` is always last."""

    request_id: str
    queue: asyncio.Queue[StreamItem]
    finished: bool = False

    async def items(self) -> AsyncIterator[StreamItem]:
        """Yield the request's outputs as they come; ends after its `RequestFinished`."""
        while True:
            item = await self.queue.get()
            yield item
            if isinstance(item, RequestFinished):
                return


class EngineLoop:
    """Runs `scheduler` on `clock` x `speedup` (see the module docstring).

    on_kv_events(events): called with each non-empty list of KV events, in cache order.
    on_load_changed(): called after anything that can change the engine's load.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        speedup: float = 1.0,
        clock: Clock | None = None,
        on_kv_events: Callable[[Sequence[KvEvent]], object] | None = None,
        on_load_changed: Callable[[], object] | None = None,
    ) -> None:
        if speedup <= 0:
            raise ValueError(f"speedup must be > 0, got {speedup}")
        self.scheduler = scheduler
        self.speedup = speedup
        self._clock = clock or SystemClock()
        self._origin = self._clock.now()
        self._on_kv_events: Callable[[Sequence[KvEvent]], object] = lambda events: None
        self._on_load_changed: Callable[[], object] = lambda: None
        self.set_listeners(on_kv_events=on_kv_events, on_load_changed=on_load_changed)
        self._streams: dict[str, RequestStream] = {}
        self._pending_events: list[KvEvent] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._in_step = False
        self._stopping = False
        self.steps = 0
        self.last_step: StepResult | None = None

    def set_listeners(
        self,
        *,
        on_kv_events: Callable[[Sequence[KvEvent]], object] | None = None,
        on_load_changed: Callable[[], object] | None = None,
    ) -> None:
        """Set where KV events and load changes go (None keeps the current listener)."""
        if on_kv_events is not None:
            self._on_kv_events = on_kv_events
        if on_load_changed is not None:
            self._on_load_changed = on_load_changed

    # ---- time ----

    def sim_now(self) -> float:
        """Simulated seconds since the loop was created."""
        return (self._clock.now() - self._origin) * self.speedup

    # ---- lifecycle ----

    @property
    def running(self) -> bool:
        """True while the loop task runs."""
        return self._task is not None and not self._task.done() and not self._stopping

    def start(self) -> None:
        """Start the loop task (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="homing-sim-engine")

    async def stop(self) -> None:
        """Stop the loop and end every open stream with an "abort" finish."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for request_id in list(self._streams):
            self.abort(request_id)
        for request_id, stream in list(self._streams.items()):  # finished, not yet delivered
            self._end_stream(stream, _aborted(request_id))
        self._streams.clear()

    # ---- requests ----

    def submit(self, request: SimRequest) -> RequestStream:
        """Queue a request; its outputs arrive on the returned stream. Raises ValueError on a
        duplicate request id, RuntimeError when the loop is stopping."""
        if self._stopping:
            raise RuntimeError("the engine is shutting down")
        if request.request_id in self._streams:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        self.scheduler.add_request(request, self.sim_now())
        stream = RequestStream(request.request_id, asyncio.Queue())
        self._streams[request.request_id] = stream
        self._wake.set()
        self._on_load_changed()
        return stream

    def abort(self, request_id: str) -> bool:
        """Take a request out now; its stream gets a `RequestFinished("abort")`. Returns False
        when the request is unknown or already finished (a request whose last step is
        still running finishes normally when that step's time is up)."""
        finished, events = self.scheduler.abort(request_id, self.sim_now())
        if finished is not None:
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                self._end_stream(stream, finished)
        self._pending_events.extend(events)
        if not self._in_step:
            self._publish_pending()
        self._wake.set()
        self._on_load_changed()
        return finished is not None

    async def flush_cache(self, timeout_s: float = 0.0) -> tuple[bool, str]:
        """Drop the prefix cache once the engine is idle, waiting up to `timeout_s` wall
        seconds for that. Returns (success, message)."""
        deadline = self._clock.now() + max(timeout_s, 0.0)
        while self.scheduler.has_work or self._in_step:
            if self._clock.now() >= deadline:
                return False, "Cache not flushed: requests are running or waiting"
            await asyncio.sleep(min(0.01, max(deadline - self._clock.now(), 0.0)))
        self._pending_events.extend(self.scheduler.flush_cache())
        self._publish_pending()
        self._on_load_changed()
        return True, "Cache flushed"

    def load(self) -> LoadStats:
        """The scheduler's load now."""
        return self.scheduler.load(self.sim_now())

    @property
    def num_streams(self) -> int:
        """Requests submitted and not yet finished."""
        return len(self._streams)

    # ---- the loop ----

    async def _run(self) -> None:
        loop_deadline = self._clock.now()
        while True:
            if not self.scheduler.has_work:
                self._wake.clear()
                await self._wake.wait()
                loop_deadline = self._clock.now()
                continue
            start_wall = max(loop_deadline, self._clock.now() - 0.05)
            result = self.scheduler.step(self.sim_now())
            self.steps += 1
            self.last_step = result
            self._pending_events.extend(result.kv_events)
            if not result.did_work:
                # nothing can run until something changes (a request arrives or leaves)
                self._deliver(result)
                self._wake.clear()
                await self._wake.wait()
                loop_deadline = self._clock.now()
                continue
            self._in_step = True
            try:
                loop_deadline = start_wall + result.duration_s / self.speedup
                delay = loop_deadline - self._clock.now()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    await asyncio.sleep(0)  # let handlers run even when behind
            finally:
                self._in_step = False
            self._deliver(result)

    def _deliver(self, result: StepResult) -> None:
        for output in result.outputs:
            stream = self._streams.get(output.request_id)
            if stream is not None:
                stream.queue.put_nowait(output)
        for finished in result.finished:
            stream = self._streams.pop(finished.request_id, None)
            if stream is not None:
                self._end_stream(stream, finished)
        self._publish_pending()
        self._on_load_changed()

    @staticmethod
    def _end_stream(stream: RequestStream, finished: RequestFinished) -> None:
        if not stream.finished:
            stream.finished = True
            stream.queue.put_nowait(finished)

    def _publish_pending(self) -> None:
        if not self._pending_events:
            return
        events, self._pending_events = self._pending_events, []
        try:
            self._on_kv_events(events)
        except Exception:  # a subscriber's failure must not stop the engine
            log.exception("publishing KV events failed")


def _aborted(request_id: str) -> RequestFinished:
    return RequestFinished(
        request_id=request_id,
        finish_reason="abort",
        matched_token_id=None,
        prompt_tokens=0,
        completion_tokens=0,
        cached_tokens=0,
    )
