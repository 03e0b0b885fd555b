"""The transport-free request path shared by the HTTP and gRPC APIs.

Both the HTTP API (`homing.gateway.http`) and the gRPC client API (`homing.gateway.grpc_api`)
call this module, so they share semantics and validation. A request's life:

1. `InferenceService.prepare` (`homing.gateway.prepare`) turns a validated body into a
   `PreparedRequest` (prompt token ids, limits); client mistakes raise `APIError` 4xx.
2. `InferenceService.open` returns a `Generation` (`homing.gateway.generation`); entering
   it charges the quota, waits for admission and routes it with `InferenceService.route`.
3. `async with generation:` runs the engine streams and yields the request's events;
   leaving the block releases everything exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from homing.gateway.admission import AdmissionController
from homing.gateway.errors import APIError, no_capacity, shutting_down
from homing.gateway.generation import Generation
from homing.gateway.prepare import ModelEntry, PreparedRequest, Preparer
from homing.gateway.quotas.guard import QuotaGuard
from homing.router import NoWorkerAvailable, RouteRequest, snapshot_from_state


class InferenceService:
    """Turns validated requests into routed generations over the worker pool.

    `in_flight` counts open `Generation`s (gateway requests between `open` and the end of
    their `async with` block).
    """

    def __init__(
        self,
        model: ModelEntry,
        *,
        request_timeout_s: float = 600.0,
        max_messages: int | None = None,
        quotas: QuotaGuard | None = None,
        admission: AdmissionController | None = None,
    ) -> None:
        self.model = model
        self.request_timeout_s = request_timeout_s
        self.prepare = Preparer(model, max_messages=max_messages)
        # Quotas are charged and admission waited for when a Generation is entered.
        self.quotas = quotas
        self.admission = admission
        self.in_flight = 0
        # False once the gateway drains: new requests get 503 `shutting_down`.
        self.accepting = True
        self._open: set[Generation] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    def open(self, prepared: PreparedRequest) -> Generation:
        """A `Generation` for the request; routing happens when its block is entered."""
        return Generation(self, prepared)

    def route(self, prepared: PreparedRequest, exclude: Sequence[str] = ()) -> str:
        """Pick a healthy worker for the request; raises `APIError` 503 when none can serve."""
        pool = prepared.model.pool
        snapshots = [
            snapshot_from_state(w) for w in pool.healthy_workers() if w.worker_id not in exclude
        ]
        try:
            decision = prepared.model.router.select(
                RouteRequest(prompt_ids=prepared.prompt_ids, session_key=prepared.session_key),
                snapshots,
            )
        except NoWorkerAvailable:
            raise no_capacity("No healthy replica is available for this model.") from None
        return decision.worker_id

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no request is in flight, at most `timeout_s`; True when drained."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def stop_accepting(self) -> None:
        """Refuse every request that has not yet reached a replica (503 `shutting_down`),
        those waiting for admission included."""
        self.accepting = False
        if self.admission is not None:
            self.admission.reject_waiting(shutting_down)

    def interrupt_all(self, error: Callable[[], APIError], outcome: str) -> int:
        """End every open request now with a fresh `error()` each (logged as `outcome`),
        those waiting for admission included; returns how many were open."""
        if self.admission is not None:
            self.admission.reject_waiting(error)
        for generation in list(self._open):
            generation.interrupt(error(), outcome)
        return len(self._open)

    def _enter(self, generation: Generation) -> None:
        self.in_flight += 1
        self._open.add(generation)
        self._idle.clear()

    def _leave(self, generation: Generation) -> None:
        self.in_flight -= 1
        self._open.discard(generation)
        if self.in_flight == 0:
            self._idle.set()
        if self.admission is not None:
            self.admission.dispatch()  # a replica may have room now
