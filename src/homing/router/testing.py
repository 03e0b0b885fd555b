"""Test doubles for code that drives a `Router`. Nothing here is used by the running gateway.

- `RecordingObserver`: a `RouterObserver` that keeps, in call order, every decision, KV-event
  batch and flush the router reports; an optional `extra` hook records one more value per
  decision, computed at the moment of the decision (e.g. the chosen worker's load then).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, NamedTuple, TypeVar, overload

from homing.router.events import BatchCounts
from homing.router.types import RouteDecision

E = TypeVar("E")


class KvBatchRecord(NamedTuple):
    """One `on_kv_batch` call: the worker, its batch's counts and the publish-to-apply lag."""

    worker_id: str
    counts: BatchCounts
    lag_s: float | None


class FlushRecord(NamedTuple):
    """One `on_flush` call: the worker whose entries were flushed, and why."""

    worker_id: str
    reason: str


class RecordingObserver(Generic[E]):
    """A `homing.router.RouterObserver` that keeps what it is told, in order.

    `decisions`: every `RouteDecision`. `extras`: `extra(decision)` for each decision, computed
    before the decision is recorded (empty without `extra`; an exception from `extra`
    propagates to the router's caller and records nothing). `batches`: a `KvBatchRecord` per
    applied batch. `flushes`: a `FlushRecord` per flush. The records are named tuples, so they
    compare equal to plain `(worker_id, counts, lag_s)` / `(worker_id, reason)` tuples.
    """

    @overload
    def __init__(self: RecordingObserver[None], extra: None = None) -> None: ...

    @overload
    def __init__(self, extra: Callable[[RouteDecision], E]) -> None: ...

    def __init__(self, extra: Callable[[RouteDecision], E] | None = None) -> None:
        self._extra = extra
        self.decisions: list[RouteDecision] = []
        self.extras: list[E] = []
        self.batches: list[KvBatchRecord] = []
        self.flushes: list[FlushRecord] = []

    def on_decision(self, decision: RouteDecision) -> None:
        """Record `decision` (and its extra, when there is a hook)."""
        if self._extra is not None:
            self.extras.append(self._extra(decision))
        self.decisions.append(decision)

    def on_kv_batch(self, worker_id: str, counts: BatchCounts, lag_s: float | None) -> None:
        """Record an applied KV-event batch."""
        self.batches.append(KvBatchRecord(worker_id, counts, lag_s))

    def on_flush(self, worker_id: str, reason: str) -> None:
        """Record a flush."""
        self.flushes.append(FlushRecord(worker_id, reason))

    def decisions_with_extras(self) -> list[tuple[RouteDecision, E]]:
        """Each decision with its extra; ValueError when the observer has no `extra` hook."""
        if self._extra is None:
            raise ValueError("RecordingObserver has no extra hook")
        return list(zip(self.decisions, self.extras, strict=True))

    def batch_counts(self, worker_id: str | None = None) -> list[BatchCounts]:
        """The counts of each recorded batch, of `worker_id` only unless None."""
        return [b.counts for b in self.batches if worker_id is None or b.worker_id == worker_id]

    def flush_reasons(self, worker_id: str | None = None) -> list[str]:
        """The reason of each recorded flush, of `worker_id` only unless None."""
        return [f.reason for f in self.flushes if worker_id is None or f.worker_id == worker_id]
