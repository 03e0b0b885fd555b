"""The transport-free request path shared by the HTTP and gRPC APIs.

Both the HTTP API (`homing.gateway.http`) and the gRPC client API (`homing.gateway.grpc_api`)
call this module, so they share semantics and validation. A request's life:

1. `InferenceService.prepare` (`homing.gateway.prepare`) turns a validated body into a
   `PreparedRequest` (prompt token ids, limits); client mistakes raise `APIError` 4xx.
2. `InferenceService.open` returns a `Generation` (`homing.gateway.generation`); entering
   it charges the quota, waits for the model's admission and takes a lease on a replica
   from the model's dispatch facade (`homing.fleet.ModelDispatch`) with `lease`.
3. `async with generation:` runs the engine streams and yields the request's events;
   leaving the block releases everything exactly once.

Retries of failed workers are bounded twice: per request (`RetryPolicy.max_retries`) and
per model, by its `RetryBudget` (`homing.gateway.retry_budget`), which stream migrations
(`migrate_streams`) draw on as well.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from homing.clock import Clock, SystemClock
from homing.engines.pool.shared_in_flight import SharedCount, box_total
from homing.fleet import Fleet, Lease, NoReplica
from homing.gateway.admission import AdmissionController
from homing.gateway.errors import APIError, no_capacity, shutting_down
from homing.gateway.generation import Generation
from homing.gateway.metrics import GatewayMetrics
from homing.gateway.prepare import PreparedRequest, Preparer
from homing.gateway.quotas.guard import QuotaGuard
from homing.gateway.request_log import RequestLog
from homing.gateway.retry_budget import RetryBudget, RetryPolicy
from homing.obs.requests import RequestRecorder


class InferenceService:
    """Turns validated requests into routed generations over the fleet's models.

    `in_flight` counts open `Generation`s (gateway requests between `open` and the end of
    their `async with` block). `admissions`: every model's admission queue, refused
    together when the gateway drains. `recorder`: where every request reports its end (log
    line, metrics, SLO; default: log lines and SLO bookkeeping, no metrics).
    `retry`: how often a failed worker call is retried elsewhere (per request and per
    model's budget, on `clock`). `migrate_streams`: a stream whose worker fails after the
    client got its first byte resumes on another worker (once), instead of ending with an
    error event. `metrics`: where retries and migrations are counted (None: nowhere).
    `shared`: where `in_flight` is published for the box's other gateway processes
    (`in_flight_all` adds theirs; None with one process).
    """

    def __init__(
        self,
        fleet: Fleet,
        *,
        request_timeout_s: float = 600.0,
        max_messages: int | None = None,
        quotas: QuotaGuard | None = None,
        admissions: Sequence[AdmissionController] = (),
        recorder: RequestRecorder | None = None,
        retry: RetryPolicy | None = None,
        migrate_streams: bool = False,
        metrics: GatewayMetrics | None = None,
        clock: Clock | None = None,
        shared: SharedCount | None = None,
    ) -> None:
        self.fleet = fleet
        self.shared = shared
        self.clock: Clock = clock or SystemClock()
        self.recorder = recorder or RequestRecorder(now=self.clock.now, metrics=None)
        self.request_log = RequestLog(self.recorder, clock=self.clock)
        self.request_timeout_s = request_timeout_s
        self.prepare = Preparer(fleet, max_messages=max_messages, clock=self.clock)
        # Quotas are charged and admission waited for when a Generation is entered.
        self.quotas = quotas
        self.admissions = list(admissions)
        self.in_flight = 0
        # False once the gateway drains: new requests get 503 `shutting_down`.
        self.accepting = True
        self._open: set[Generation] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.retry = retry or RetryPolicy()
        self.migrate_streams = migrate_streams
        self.metrics = metrics
        self._budgets: dict[str, RetryBudget] = {}
        for model_id in fleet.models:
            self.retry_budget(model_id)

    def open(self, prepared: PreparedRequest) -> Generation:
        """A `Generation` for the request; routing happens when its block is entered."""
        return Generation(self, prepared)

    def lease(
        self, prepared: PreparedRequest, exclude: Sequence[str] = (), slots: int | None = None
    ) -> Lease:
        """A lease on a ready replica for `prepared`, not one of `exclude`, for `slots`
        requests (`lease_replica`); `APIError` 503 when none can serve."""
        return lease_replica(prepared, exclude, slots)

    def retry_budget(self, model_id: str) -> RetryBudget:
        """The retry budget of `model_id` (made on first use, its metrics at 0)."""
        budget = self._budgets.get(model_id)
        if budget is None:
            budget = self._budgets[model_id] = RetryBudget(self.retry, now=self.clock.now)
            if self.metrics is not None:
                self.metrics.start_model_at_zero(model_id)
        return budget

    def configure_retries(self, retry: RetryPolicy, *, migrate_streams: bool) -> None:
        """Apply new retry settings to requests from now on (every model's budget keeps its
        counts unless its window length changes)."""
        self.retry = retry
        self.migrate_streams = migrate_streams
        for budget in self._budgets.values():
            budget.configure(retry)

    def count_retry(self, model_id: str, outcome: str) -> None:
        """Count a retryable failure's `outcome` (`homing.gateway.metrics.RETRY_OUTCOMES`)."""
        if self.metrics is not None:
            self.metrics.retries.labels(model=model_id, outcome=outcome).inc()

    def count_migration(self, model_id: str, outcome: str) -> None:
        """Count a stream migration's `outcome` (`...metrics.MIGRATION_OUTCOMES`)."""
        if self.metrics is not None:
            self.metrics.stream_migrations.labels(model=model_id, outcome=outcome).inc()

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no request is in flight, at most `timeout_s`; True when drained."""
        try:
            async with self.clock.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def stop_accepting(self) -> None:
        """Refuse every request that has not yet reached a replica (503 `shutting_down`),
        those waiting for admission included."""
        self.accepting = False
        for admission in self.admissions:
            admission.reject_waiting(shutting_down)

    def interrupt_all(self, error: Callable[[], APIError], outcome: str) -> int:
        """End every open request now with a fresh `error()` each (logged as `outcome`),
        those waiting for admission included; returns how many were open."""
        for admission in self.admissions:
            admission.reject_waiting(error)
        for generation in list(self._open):
            generation.interrupt(error(), outcome)
        return len(self._open)

    @property
    def in_flight_all(self) -> int:
        """Requests in flight in every gateway process of the box (`shared`)."""
        return box_total(self.in_flight, self.shared)

    def track(self, generation: Generation) -> Callable[[], None]:
        """Count `generation` in flight (`in_flight`, the recorder's per-model gauge) until the
        returned callable is called; calls after the first do nothing."""
        model = generation.prepared.model
        self.recorder.started(model.model_id)
        self.in_flight += 1
        if self.shared is not None:
            self.shared.publish(self.in_flight)
        self._open.add(generation)
        self._idle.clear()
        left = False

        def leave() -> None:
            nonlocal left
            if left:
                return
            left = True
            self.recorder.ended(model.model_id)
            self.in_flight -= 1
            if self.shared is not None:
                self.shared.publish(self.in_flight)
            self._open.discard(generation)
            if self.in_flight == 0:
                self._idle.set()
            model.wake()  # a replica may have room now

        return leave


def lease_replica(
    prepared: PreparedRequest, exclude: Sequence[str] = (), slots: int | None = None
) -> Lease:
    """A lease on a ready replica of the request's model (of its pinned version, if any),
    not one of `exclude` (worker ids), for `slots` requests (default its `n` choices);
    raises `APIError` 503 `no_capacity` when none can serve."""
    try:
        return prepared.model.lease(
            prepared.prompt_ids,
            session_key=prepared.session_key,
            split_key=prepared.split_key,
            slots=prepared.n if slots is None else slots,
            exclude=exclude,
            version=prepared.version_pin,
        )
    except NoReplica:
        if prepared.version_pin is not None:
            raise no_capacity(
                f"No healthy replica of version {prepared.version_pin!r} is available "
                "for this model."
            ) from None
        raise no_capacity("No healthy replica is available for this model.") from None
