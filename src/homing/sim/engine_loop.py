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
- `abort` takes a request out at once (its stream gets a "abort" finish): the worker's own
  aborts and a consumer that went away. `stop` ends every open stream the same way.
- `client_abort` (an Abort RPC) takes a request out at once too, but silences its stream
  instead of ending it: nothing more reaches it (not even tokens already decided) until the
  consumer gives it up with `close_stream`, as SGLang 0.5.23's servicer marks the request
  finished and never writes to its stream again. `stop` ends silenced streams as well.
- Faults (`homing.sim.faults.FaultState`, read before every step): a slowdown K makes each
  step last K times its modelled duration; a stall holds the next step until it is over.
- Instant (`instant=True`, `SimConfig.instant`): steps take no wall time whatever their
  modelled duration; each step's effects are delivered as soon as it has run, and the loop
  yields to the event loop once per step, so handlers and new requests run between steps.
- Keeping up: each step's wall deadline is the previous deadline plus duration / speedup, so
  a step that ends late is caught up by the next ones (`stats.lag_*`: how late steps end).
  A backlog beyond CATCH_UP_WALL_S is forgiven rather than caught up: that wall time is lost
  simulated progress (`stats.slip_wall_s`). A process keeps up with its own clock while its
  slip stays a small share of the wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from homing.aio import cancel_and_wait
from homing.clock import Clock, SystemClock
from homing.sim.faults import FaultState
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
    silenced: bool = False

    async def items(self) -> AsyncIterator[StreamItem]:
        """Yield the request's outputs as they come; ends after its `RequestFinished`."""
        while True:
            item = await self.queue.get()
            yield item
            if isinstance(item, RequestFinished):
                return

    async def batches(self) -> AsyncIterator[list[StreamItem]]:
        """Like `items`, but each wake-up yields everything queued by then (a consumer that fell
        behind sends fewer, larger messages); ends after the batch with `RequestFinished`."""
        queue = self.queue
        while True:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            yield batch
            if isinstance(batch[-1], RequestFinished):
                return


CATCH_UP_WALL_S = 0.2
"""Largest backlog (wall seconds) the loop catches up; beyond it the rest is forgiven (slip).
A shared machine deschedules a process for tens of milliseconds now and then; the loop runs
the steps it owes back to back until it is on schedule again."""


@dataclass
class LoopStats:
    """How the loop kept pace (wall seconds): modelled step time at this speedup, the sum and
    maximum of how late steps ended against their deadlines, the backlog forgiven (slip), and
    steps run."""

    modeled_wall_s: float = 0.0
    lag_wall_s: float = 0.0
    max_lag_wall_s: float = 0.0
    slip_wall_s: float = 0.0
    steps: int = 0


class EngineLoop:
    """Runs `scheduler` on `clock` x `speedup` (see the module docstring).

    on_kv_events(events): called with each non-empty list of KV events, in cache order.
    on_load_changed(): called after anything that can change the engine's load.
    faults: the worker's fault state (None: no faults).
    instant: steps take no wall time (see the module docstring).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        speedup: float = 1.0,
        clock: Clock | None = None,
        on_kv_events: Callable[[Sequence[KvEvent]], object] | None = None,
        on_load_changed: Callable[[], object] | None = None,
        faults: FaultState | None = None,
        instant: bool = False,
    ) -> None:
        if speedup <= 0:
            raise ValueError(f"speedup must be > 0, got {speedup}")
        self.scheduler = scheduler
        self.speedup = speedup
        self.instant = instant
        self._clock = clock or SystemClock()
        self._origin = self._clock.now()
        self._on_kv_events: Callable[[Sequence[KvEvent]], object] = lambda events: None
        self._on_load_changed: Callable[[], object] = lambda: None
        self.set_listeners(on_kv_events=on_kv_events, on_load_changed=on_load_changed)
        self._streams: dict[str, RequestStream] = {}
        self._silenced: set[RequestStream] = set()
        self._pending_events: list[KvEvent] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._in_step = False
        self._stopping = False
        self.faults = faults or FaultState()
        self.stats = LoopStats()

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

    def wall_now(self) -> float:
        """The loop clock's time (seconds; the base of fault stall deadlines)."""
        return self._clock.now()

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
            await cancel_and_wait(self._task)
        for request_id in list(self._streams):
            self.abort(request_id)
        for request_id, stream in list(self._streams.items()):  # finished, not yet delivered
            self._end_stream(stream, _aborted(request_id))
        self._streams.clear()
        for stream in list(self._silenced):
            stream.silenced = False
            self._end_stream(stream, _aborted(stream.request_id))
        self._silenced.clear()

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

    def open_request_ids(self) -> list[str]:
        """Ids of the requests whose streams are open and not silenced."""
        return list(self._streams)

    def client_abort(self, request_id: str) -> bool:
        """An Abort RPC: take the request out now (as `abort`) and silence its stream: it gets
        nothing more, its queued outputs are dropped, and it stays open until `close_stream`
        or `stop`. Returns False when no open stream has that id (a request whose last step is
        still running is silenced too, and that step's outputs are dropped)."""
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.silenced = True
            while not stream.queue.empty():
                stream.queue.get_nowait()
            self._silenced.add(stream)
        self.abort(request_id)
        return stream is not None

    def close_stream(self, stream: RequestStream) -> None:
        """The consumer of `stream` went away: abort its request if the stream is still that
        request's open stream, and forget it if it was silenced (an id reused after an Abort
        RPC belongs to the new request)."""
        if stream.silenced:
            self._silenced.discard(stream)
        elif not stream.finished and self._streams.get(stream.request_id) is stream:
            self.abort(stream.request_id)

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

    @property
    def num_silenced_streams(self) -> int:
        """Streams silenced by an Abort RPC whose consumer has not let go of them yet."""
        return len(self._silenced)

    # ---- the loop ----

    def fault_changed(self) -> None:
        """Wake the loop so it re-reads the fault state (a stall was lifted)."""
        self._wake.set()

    async def _wait_stall(self) -> bool:
        """Hold while a stall is in force; True when the loop waited."""
        waited = False
        while self.faults.stalled(self._clock.now()):
            waited = True
            self._wake.clear()
            remaining = self.faults.stall_until - self._clock.now()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(remaining, 0.0)):
                    await self._wake.wait()
        return waited

    async def _run(self) -> None:
        loop_deadline = self._clock.now()
        while True:
            if not self.scheduler.has_work:
                self._wake.clear()
                await self._wake.wait()
                loop_deadline = self._clock.now()
                continue
            if await self._wait_stall():
                loop_deadline = self._clock.now()
                continue
            if self.instant:
                await self._instant_step()
                continue
            now_wall = self._clock.now()
            start_wall = loop_deadline
            if now_wall - loop_deadline > CATCH_UP_WALL_S:
                start_wall = now_wall - CATCH_UP_WALL_S
                self.stats.slip_wall_s += start_wall - loop_deadline
            result = self.scheduler.step(self.sim_now())
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
                wall = result.duration_s * self.faults.slowdown / self.speedup
                loop_deadline = start_wall + wall
                delay = loop_deadline - self._clock.now()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    await asyncio.sleep(0)  # let handlers run even when behind
            finally:
                self._in_step = False
            lag = max(self._clock.now() - loop_deadline, 0.0)
            self.stats.steps += 1
            self.stats.modeled_wall_s += wall
            self.stats.lag_wall_s += lag
            self.stats.max_lag_wall_s = max(self.stats.max_lag_wall_s, lag)
            self._deliver(result)

    async def _instant_step(self) -> None:
        """One step of zero wall time: run it, deliver its effects, let the event loop run."""
        result = self.scheduler.step(self.sim_now())
        self._pending_events.extend(result.kv_events)
        self._deliver(result)
        if not result.did_work:
            # nothing can run until something changes (a request arrives or leaves)
            self._wake.clear()
            await self._wake.wait()
            return
        self.stats.steps += 1
        await asyncio.sleep(0)  # handlers and arrivals run between steps

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
