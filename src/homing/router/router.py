"""The Router facade: one affinity index, one dispatch ledger and one policy for one model.

Rule of this file: composition and bookkeeping only. The router owns the `PrefixIndex` (fed
by `apply_kv_bytes` / `decode_kv_batch` + `apply_kv_decoded` with the bytes of a wire batch,
`apply_kv_batch` with a parsed one, or `apply_events` with plain events; the wire is
converted at the edge, in `homing.router.events`),
the `DispatchLedger` (its own dispatches between load records) and the policy built from
the registry by name; `select` delegates the choice to the policy, then records it: in the
ledger, in the index (an approximate-mode record, or an opt-in exact-mode booking; never for a
worker whose event stream is down) and with the observer (metrics). No I/O; the clock is
injected and read once per call. Sequence bookkeeping (gaps, resubscription, restarts)
belongs to the pool's KV-event task, which calls `flush_worker` with its reason; the router
flushes on `cleared` itself (via the index).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from smg_grpc_proto.generated import common_pb2

from homing.clock import Clock, SystemClock
from homing.router.events import (
    BatchCounts,
    DecodedBatch,
    KvEvent,
    decode_batch,
    ingest_batch,
    ingest_decoded,
    ingest_events,
)
from homing.router.index import (
    DEFAULT_APPROX_TTL_S,
    DEFAULT_BOOKING_TTL_S,
    DEFAULT_MAX_BLOCKS,
    CacheValue,
    PrefixIndex,
    WorkerMode,
)
from homing.router.ledger import DispatchLedger
from homing.router.policies import BUILTIN_POLICIES, Policy, PolicyContext, PolicyFactory
from homing.router.policies.cache_aware import CacheAwareConfig, CacheAwarePolicy
from homing.router.policies.consistent_hash import ConsistentHashConfig, ConsistentHashPolicy
from homing.router.types import RouteDecision, RouteRequest, WorkerSnapshot

#: Keys of the index's retired-slot sweep advanced per decision (bounds the added latency to
#: ~50 us; KV-event batches advance it by `DEFAULT_SWEEP_CHUNK`).
SELECT_SWEEP_STEPS = 256


class RouterObserver(Protocol):
    """What the router reports as it works (`homing.obs.metrics.RouterMetrics` is one)."""

    def on_decision(self, decision: RouteDecision) -> None:
        """A request was routed."""
        ...

    def on_kv_batch(self, worker_id: str, counts: BatchCounts, lag_s: float | None) -> None:
        """An event batch from `worker_id` was applied; `lag_s`: publish-to-apply delay."""
        ...

    def on_flush(self, worker_id: str, reason: str) -> None:
        """`worker_id`'s entries were flushed for `reason`."""
        ...


class _NullObserver:
    def on_decision(self, decision: RouteDecision) -> None:
        pass

    def on_kv_batch(self, worker_id: str, counts: BatchCounts, lag_s: float | None) -> None:
        pass

    def on_flush(self, worker_id: str, reason: str) -> None:
        pass


class Router:
    """Routes one model's requests: `select` a worker, mirror the workers' KV events.

    `policy`: a name in `registry` (default `BUILTIN_POLICIES`: "round_robin", "least_load",
    "consistent_hash", "cache_aware"); ValueError for an unknown name.
    `block_size`: tokens per KV block; must equal the workers' page size.
    `cache_aware` / `consistent_hash`: configs of those built-in policies (None: defaults).
    `max_blocks`: the index's global budget in distinct blocks. `approx_ttl_s`: how long an
    approximate-mode record is credited; `booking_ttl_s`: how long an exact-mode worker is
    credited with a dispatched prompt before its events confirm it (None: not at all).
    `observer`: metrics sink (settable later).
    """

    def __init__(
        self,
        policy: str = "cache_aware",
        *,
        block_size: int = 16,
        clock: Clock | None = None,
        registry: Mapping[str, PolicyFactory] | None = None,
        cache_aware: CacheAwareConfig | None = None,
        consistent_hash: ConsistentHashConfig | None = None,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        approx_ttl_s: float = DEFAULT_APPROX_TTL_S,
        booking_ttl_s: float | None = DEFAULT_BOOKING_TTL_S,
        observer: RouterObserver | None = None,
    ) -> None:
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.index = PrefixIndex(
            block_size,
            max_blocks=max_blocks,
            approx_ttl_s=approx_ttl_s,
            booking_ttl_s=booking_ttl_s,
        )
        self.ledger = DispatchLedger()
        self.observer: RouterObserver = observer if observer is not None else _NullObserver()
        self._registry = registry
        self.policy: Policy = self._build_policy(policy, cache_aware, consistent_hash)
        self.decisions: Counter[str] = Counter()
        self.chosen: Counter[tuple[str, str]] = Counter()  # (worker, branch)
        self._last_event_at: dict[str, float] = {}
        self._streams_down: set[str] = set()

    def _build_policy(
        self,
        name: str,
        cache_aware: CacheAwareConfig | None,
        consistent_hash: ConsistentHashConfig | None,
    ) -> Policy:
        factories: dict[str, PolicyFactory] = dict(
            BUILTIN_POLICIES if self._registry is None else self._registry
        )
        if cache_aware is not None:
            ca = cache_aware
            factories["cache_aware"] = lambda ctx: CacheAwarePolicy(ctx.index, ca, ctx.ledger)
        if consistent_hash is not None:
            ch = consistent_hash
            factories["consistent_hash"] = lambda ctx: ConsistentHashPolicy(
                ctx.index.block_size, ch
            )
        if name not in factories:
            known = ", ".join(sorted(factories))
            raise ValueError(f"unknown routing policy {name!r} (known: {known})")
        return factories[name](
            PolicyContext(index=self.index, clock=self.clock, ledger=self.ledger)
        )

    def set_policy(
        self,
        name: str,
        *,
        cache_aware: CacheAwareConfig | None = None,
        consistent_hash: ConsistentHashConfig | None = None,
    ) -> None:
        """Replace the policy (same index and ledger); ValueError for an unknown name."""
        self.policy = self._build_policy(name, cache_aware, consistent_hash)

    @property
    def policy_name(self) -> str:
        """Name of the active policy."""
        return self.policy.name

    @property
    def block_size(self) -> int:
        """Tokens per KV block the index hashes."""
        return self.index.block_size

    # ------------------------------------------------------------------ decisions

    def select(
        self,
        request: RouteRequest,
        workers: Sequence[WorkerSnapshot],
        now: float | None = None,
    ) -> RouteDecision:
        """The worker for `request` among `workers` (healthy candidates, chosen by the caller)
        at time `now` (seconds on the router's clock; None: `clock.now()`), which expires
        index entries and stamps the dispatch.

        Raises `NoWorkerAvailable` when `workers` is empty.
        """
        if now is None:
            now = self.clock.now()
        index = self.index
        index.expire(now)
        index.maintain(SELECT_SWEEP_STEPS)
        decision = self.policy.select(request, workers)
        worker_id = decision.worker_id
        self.decisions[decision.branch] += 1
        self.chosen[(worker_id, decision.branch)] += 1
        self.ledger.record(worker_id, now, decision.uncached_tokens)
        if worker_id not in self._streams_down:
            index.record_dispatch(worker_id, request.prompt_ids, now)
        self.observer.on_decision(decision)
        return decision

    # ------------------------------------------------------------------ KV events

    def decode_kv_batch(self, data: bytes | bytearray | memoryview) -> DecodedBatch:
        """Read one serialized `KvEventBatch` (the bytes the stream delivered) once: its
        header for the caller's sequence bookkeeping, its events for `apply_kv_decoded`.
        ValueError: `data` is not a `KvEventBatch` (`homing.router.events.decode_batch`)."""
        return decode_batch(data)

    def apply_kv_decoded(
        self, worker_id: str, batch: DecodedBatch, lag_s: float | None = None
    ) -> None:
        """Apply the events of one (in-order, non-duplicate) batch from `worker_id`'s stream,
        read by `decode_kv_batch`; `lag_s`: the caller's measure of its publish-to-receive
        delay (for metrics)."""
        self._ingest(worker_id, lambda index: ingest_decoded(batch, index, worker_id), lag_s)

    def apply_kv_bytes(
        self, worker_id: str, data: bytes | bytearray | memoryview, lag_s: float | None = None
    ) -> None:
        """`apply_kv_decoded` of `decode_kv_batch(data)`; ValueError (nothing applied) when
        `data` is not a `KvEventBatch`."""
        self.apply_kv_decoded(worker_id, decode_batch(data), lag_s)

    def apply_kv_batch(
        self, worker_id: str, batch: common_pb2.KvEventBatch, lag_s: float | None = None
    ) -> None:
        """`apply_kv_decoded` for a batch already parsed (same calls on the index)."""
        self._ingest(worker_id, lambda index: ingest_batch(batch, index, worker_id), lag_s)

    def _ingest(
        self,
        worker_id: str,
        feed: Callable[[PrefixIndex], BatchCounts],
        lag_s: float | None,
    ) -> None:
        """Feed one batch of `worker_id`'s events to the index, then the bookkeeping."""
        index = self.index
        was = index.mode(worker_id)
        counts = feed(index)
        if index.has_retired():
            index.maintain()
        self._after_batch(worker_id, was, counts, lag_s)

    def apply_events(
        self, worker_id: str, events: Iterable[KvEvent], lag_s: float | None = None
    ) -> None:
        """Apply plain events (`BlocksStored`, `BlocksRemoved`, `CacheCleared` from
        `homing.router.events`; a simulator's, with no wire in between) as one in-order
        batch from `worker_id`: the index, the observer and the worker's last-event time
        see what they see for a wire batch of the same events."""
        self._ingest(worker_id, lambda index: ingest_events(events, index, worker_id), lag_s)

    def _after_batch(
        self, worker_id: str, was: WorkerMode, counts: BatchCounts, lag_s: float | None
    ) -> None:
        self._last_event_at[worker_id] = self.clock.now()
        observer = self.observer
        observer.on_kv_batch(worker_id, counts, lag_s)
        for _ in range(counts.cleared):
            observer.on_flush(worker_id, "cleared")
        if was == "approximate" and self.index.mode(worker_id) == "exact":
            observer.on_flush(worker_id, "exact_mode")

    def flush_worker(self, worker_id: str, reason: str = "flush") -> None:
        """Forget every block credited to `worker_id` (reasons: "subscribe", "gap",
        "stream_error", "stream_end", "restart", "removed", ...); it is in approximate mode
        until its stream delivers a stored event."""
        self.index.flush_worker(worker_id)
        self.observer.on_flush(worker_id, reason)

    def set_stream(self, worker_id: str, state: str) -> None:
        """The pool's view of `worker_id`'s KV-event subscription: "open", "unsupported"
        (the worker publishes no events) or "down"/"connecting" (the worker may be dead or
        restarting). Approximate credit is recorded only while the stream is not down: a
        dispatch to a worker that may be gone must not make it look warm."""
        if state in ("open", "unsupported"):
            self._streams_down.discard(worker_id)
        else:
            self._streams_down.add(worker_id)

    def remove_worker(self, worker_id: str) -> None:
        """`worker_id` left the pool: flush it and drop it from the ring and the ledger."""
        self.index.remove_worker(worker_id)
        self.policy.on_worker_removed(worker_id)
        self.ledger.forget(worker_id)
        self._last_event_at.pop(worker_id, None)
        self._streams_down.discard(worker_id)
        self.observer.on_flush(worker_id, "removed")

    # ------------------------------------------------------------------ views

    def worker_mode(self, worker_id: str) -> WorkerMode:
        """ "exact" (mirrored from KV events) or "approximate" (own records with a TTL)."""
        return self.index.mode(worker_id)

    def cache_value(self, worker_id: str) -> CacheValue:
        """What removing `worker_id` would lose of the index (`PrefixIndex.cache_value`):
        blocks only it holds, those matched recently, all its credits. O(blocks in the
        index): for a scale-down decision, not per request."""
        return self.index.cache_value(worker_id)

    def cache_values(self, worker_ids: Iterable[str]) -> dict[str, CacheValue]:
        """`cache_value` of each of `worker_ids` in one pass over the index."""
        return self.index.cache_values(worker_ids)

    def last_event_at(self, worker_id: str) -> float | None:
        """Clock time (s) of the last batch applied for `worker_id`, None if none yet."""
        return self._last_event_at.get(worker_id)
