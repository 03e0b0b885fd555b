"""KV-event publishing of one simulated worker: sequence numbers, subscribers, load records.

Rule of this file: the wire side of `SubscribeKvEvents`, as `smg.grpc.common` defines it. The
radix cache produces plain events; this hub numbers them into batches and fans them out.

- Every published batch gets the next `sequence_number` of the worker (1, 2, 3, ... for the
  worker's life, consecutive), `dp_rank` 0, and one `KvCacheEvent` per cache event (event ids
  count up per worker), as smg-grpc-servicer 0.14.1 relays SGLang's: `stored` (a radix run of
  pages: one block per page with its hash and its `page_size` token ids, `parent_block_hash`
  unless under the root, tier DEVICE / medium "GPU" / locality LOCAL), `removed` (the
  evicted pages' hashes, tier DEVICE / medium "GPU" / locality LOCAL), `cleared`.
- A subscriber gets the batches published after it subscribed, in order, each carrying the
  engine's `EngineLoad` as it is when the batch is sent.
- `load_only` batches carry no events and repeat the last sequence number sent on that stream
  (0 before the stream's first batch). They go out when running / waiting / waiting-uncached
  changed without a KV event (coalesced per stream; KV usage and throughput ride on event
  batches and heartbeats), and as heartbeats when the stream has been quiet for
  `heartbeat_busy_s` (engine has requests) or `heartbeat_idle_s` (idle). Before the stream's
  first event batch they are sent only to a subscriber that set
  `load_records_before_first_batch` (and then one at once, on subscribing).
- Telemetry beyond the routing core (cache hit rate, used/total tokens, memory, queues) rides
  on `load_only` records and on a stream's first record, as the proto asks.
- A subscriber that falls more than `max_pending` batches behind is cut off with
  `SubscriberOverflow` (the servicer answers DATA_LOSS); it resubscribes and resyncs.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from smg_grpc_proto.generated import common_pb2

from homing.clock import Clock, SystemClock
from homing.sim.faults import FaultState
from homing.sim.radix_cache import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from homing.sim.scheduler import LoadStats

MEDIUM_GPU = "GPU"
"""SGLang's medium string for device-resident blocks (kv_events.MEDIUM_GPU)."""


class SubscriberOverflow(Exception):
    """A subscriber fell too far behind; its stream must end (DATA_LOSS)."""


@dataclass(frozen=True)
class EngineMemoryInfo:
    """Static memory figures per rank (GB) and the pool size (tokens) for telemetry."""

    weight_gb: float
    kv_cache_gb: float
    token_capacity: int


def fill_proto_event(dest: common_pb2.KvCacheEvent, event: KvEvent, event_id: int) -> None:
    """Write one cache event into `dest` (an empty wire `KvCacheEvent`, e.g. from
    `batch.events.add()`, which avoids building and copying a separate message)."""
    dest.event_id = event_id
    if isinstance(event, BlockStored):
        stored = dest.stored
        size = event.block_size
        tokens = event.token_ids
        add = stored.blocks.add
        for index, block_hash in enumerate(event.block_hashes):
            block = add()
            block.block_hash = block_hash
            block.token_ids.extend(tokens[index * size : (index + 1) * size])
            block.block_size = size
        stored.tier = common_pb2.KV_CACHE_TIER_DEVICE
        stored.medium = MEDIUM_GPU
        stored.locality = common_pb2.KV_CACHE_LOCALITY_LOCAL
        if event.parent_block_hash is not None:
            stored.parent_block_hash = event.parent_block_hash
    elif isinstance(event, BlockRemoved):
        removed = dest.removed
        removed.block_hashes.extend(event.block_hashes)
        removed.tier = common_pb2.KV_CACHE_TIER_DEVICE
        removed.medium = MEDIUM_GPU
        removed.locality = common_pb2.KV_CACHE_LOCALITY_LOCAL
    elif isinstance(event, AllBlocksCleared):
        dest.cleared.SetInParent()
    else:
        raise TypeError(f"not a KV event: {event!r}")


def to_proto_event(event: KvEvent, event_id: int) -> common_pb2.KvCacheEvent:
    """One cache event as the wire's `KvCacheEvent`."""
    message = common_pb2.KvCacheEvent()
    fill_proto_event(message, event, event_id)
    return message


@dataclass(frozen=True)
class _Published:
    """A numbered batch: `template` holds its sequence number, timestamp, dp_rank and events;
    each subscriber sends a copy with its own load record."""

    sequence_number: int
    template: common_pb2.KvEventBatch


class KvEventHub:
    """Numbers published event lists into batches and streams them to subscribers.

    load_source: the engine's current load (called at every send).
    core_source: (running, waiting, waiting uncached tokens) now, cheaper than a whole load
        (None: taken from load_source).
    memory: static telemetry figures.
    wall_time: seconds since the epoch for batch timestamps (default `time.time`).
    clock: monotonic clock for heartbeat timing.
    faults: the worker's fault state; an injected `report_kv_usage` replaces the KV
        utilisation of every record (None: records report the engine's figures).
    """

    def __init__(
        self,
        load_source: Callable[[], LoadStats],
        memory: EngineMemoryInfo,
        *,
        heartbeat_busy_s: float = 1.0,
        heartbeat_idle_s: float = 5.0,
        max_pending: int = 100_000,
        wall_time: Callable[[], float] = time.time,
        clock: Clock | None = None,
        core_source: Callable[[], tuple[int, int, int]] | None = None,
        faults: FaultState | None = None,
    ) -> None:
        self._load_source = load_source
        self._faults = faults
        self._core_source = core_source
        self._memory = memory
        self.heartbeat_busy_s = heartbeat_busy_s
        self.heartbeat_idle_s = heartbeat_idle_s
        self._max_pending = max_pending
        self._wall_time = wall_time
        self._clock = clock or SystemClock()
        self.last_sequence_number = 0
        self._event_ids = 0
        self._subscribers: set[KvSubscription] = set()
        self._closed = False

    @property
    def num_subscribers(self) -> int:
        return len(self._subscribers)

    def publish(self, events: Sequence[KvEvent]) -> int | None:
        """Send `events` as the next batch; returns its sequence number (None when empty).
        With no subscriber the batch is numbered (and its events counted) but not built."""
        if not events:
            return None
        self.last_sequence_number += 1
        if not self._subscribers:
            self._event_ids += len(events)
            return self.last_sequence_number
        template = common_pb2.KvEventBatch(
            sequence_number=self.last_sequence_number, timestamp=self._wall_time(), dp_rank=0
        )
        add = template.events.add
        for event in events:
            self._event_ids += 1
            fill_proto_event(add(), event, self._event_ids)
        published = _Published(self.last_sequence_number, template)
        for subscriber in list(self._subscribers):
            subscriber._offer(published)
        return self.last_sequence_number

    def load_changed(self) -> None:
        """The engine's load may have changed: a stream whose last record showed other
        running / waiting / waiting-uncached figures sends a `load_only` record."""
        if not self._subscribers:
            return
        core = self._current_core()
        for subscriber in self._subscribers:
            if subscriber._last_core != core:
                subscriber._mark_load_dirty()

    def resend_load(self) -> None:
        """A reported figure changed outside the core (an injected fault): every stream
        sends a `load_only` record soon, as for a core change."""
        for subscriber in self._subscribers:
            subscriber._mark_load_dirty()

    def subscribe(self, *, load_records_before_first_batch: bool) -> KvSubscription:
        """A new stream of batches published from now on."""
        subscription = KvSubscription(self, load_records_before_first_batch)
        if self._closed:
            subscription._close()
        else:
            self._subscribers.add(subscription)
        return subscription

    def close(self) -> None:
        """End every stream (worker shutdown)."""
        self._closed = True
        for subscriber in list(self._subscribers):
            subscriber._close()
        self._subscribers.clear()

    def _unsubscribe(self, subscription: KvSubscription) -> None:
        self._subscribers.discard(subscription)

    def engine_load(
        self, stats: LoadStats, *, sample: int, load_only: bool, telemetry: bool
    ) -> common_pb2.EngineLoad:
        """The `EngineLoad` record of `stats` for one send."""
        usage = stats.token_usage
        if self._faults is not None:
            usage = self._faults.kv_usage(usage)
        load = common_pb2.EngineLoad(
            running_requests=stats.num_running,
            waiting_requests=stats.num_waiting,
            waiting_uncached_tokens=stats.waiting_uncached_tokens,
            token_usage=usage,
            # the sim's usage already excludes evictable pages (as SGLang's token_usage)
            active_token_usage=usage,
            gen_throughput=stats.gen_throughput,
            max_running_requests=stats.max_running_requests,
            age_ms=0,
            sample=sample,
            load_only=load_only,
            prefill_pending_tokens=stats.prefill_pending_tokens,
        )
        if telemetry:
            load.cache_hit_rate = stats.cache_hit_rate
            load.num_used_tokens = stats.num_used_tokens
            load.max_total_num_tokens = stats.max_total_num_tokens
            load.memory.CopyFrom(
                common_pb2.EngineMemory(
                    weight_gb=self._memory.weight_gb,
                    kv_cache_gb=self._memory.kv_cache_gb,
                    graph_gb=0.0,
                    token_capacity=self._memory.token_capacity,
                )
            )
            load.queues.CopyFrom(common_pb2.EngineQueues(waiting=stats.num_waiting))
        return load

    def _current_core(self) -> tuple[int, int, int]:
        """(running, waiting, waiting uncached tokens) now, without a full load record when
        the engine offers the cheap source."""
        if self._core_source is not None:
            return self._core_source()
        return _core(self._load_source())

    def _busy(self) -> bool:
        running, waiting, _ = self._current_core()
        return running + waiting > 0


class KvSubscription:
    """One `SubscribeKvEvents` stream (see the module docstring); iterate `batches()`."""

    def __init__(self, hub: KvEventHub, load_records_before_first_batch: bool) -> None:
        self._hub = hub
        self._load_before_first = load_records_before_first_batch
        self._pending: deque[_Published] = deque()
        self._wake = asyncio.Event()
        self._load_dirty = False
        self._closed = False
        self._overflow = False
        self._last_sent: int | None = None
        self._sample = 0
        self._last_core: tuple[int, int, int] | None = None
        self._last_send_at = hub._clock.now()

    def _offer(self, published: _Published) -> None:
        if len(self._pending) >= self._hub._max_pending:
            self._overflow = True
        else:
            self._pending.append(published)
        self._wake.set()

    def _mark_load_dirty(self) -> None:
        self._load_dirty = True
        self._wake.set()

    def _close(self) -> None:
        self._closed = True
        self._wake.set()

    def close(self) -> None:
        """Stop this stream (the client went away)."""
        self._hub._unsubscribe(self)
        self._close()

    def _may_send_load_only(self) -> bool:
        return self._load_before_first or self._last_sent is not None

    def _record(self, batch: common_pb2.KvEventBatch, load_only: bool) -> common_pb2.KvEventBatch:
        self._sample += 1
        telemetry = load_only or self._sample == 1
        stats = self._hub._load_source()
        self._last_core = _core(stats)
        batch.load.CopyFrom(
            self._hub.engine_load(
                stats, sample=self._sample, load_only=load_only, telemetry=telemetry
            )
        )
        self._last_send_at = self._hub._clock.now()
        self._load_dirty = False
        return batch

    def _load_only(self) -> common_pb2.KvEventBatch:
        batch = common_pb2.KvEventBatch(
            sequence_number=self._last_sent or 0, timestamp=self._hub._wall_time(), dp_rank=0
        )
        return self._record(batch, load_only=True)

    async def batches(self) -> AsyncIterator[common_pb2.KvEventBatch]:
        """The stream's batches until it is closed. Raises SubscriberOverflow when the
        subscriber fell more than `max_pending` batches behind."""
        try:
            if self._load_before_first and not self._closed:
                yield self._load_only()
            while not self._closed:
                if self._overflow:
                    raise SubscriberOverflow("KV-event subscriber fell too far behind")
                if self._pending:
                    published = self._pending.popleft()
                    self._last_sent = published.sequence_number
                    batch = common_pb2.KvEventBatch()
                    batch.CopyFrom(published.template)
                    yield self._record(batch, load_only=False)
                    continue
                if self._load_dirty and self._may_send_load_only():
                    yield self._load_only()
                    continue
                interval = (
                    self._hub.heartbeat_busy_s if self._hub._busy() else self._hub.heartbeat_idle_s
                )
                wait_s = self._last_send_at + interval - self._hub._clock.now()
                if wait_s <= 0:
                    if self._may_send_load_only():
                        yield self._load_only()
                    else:
                        self._last_send_at = self._hub._clock.now()
                    continue
                self._wake.clear()
                try:
                    async with asyncio.timeout(wait_s):
                        await self._wake.wait()
                except TimeoutError:
                    pass
        finally:
            self.close()


def _core(stats: LoadStats) -> tuple[int, int, int]:
    """The figures whose change triggers a `load_only` record (admissions, completions)."""
    return (stats.num_running, stats.num_waiting, stats.waiting_uncached_tokens)
