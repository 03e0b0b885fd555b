"""KV events: each worker's subscription, its load records and its index lifecycle.

`SubscribeKvEvents(0, load_records_before_first_batch=True)`, each batch as the bytes gRPC
delivered, read once by the router (`decode_kv_batch`); every batch's `EngineLoad` updates
the worker's `EngineLoadView`; event batches go to the router in order, with their
publish-to-receive lag. A batch that is not a `KvEventBatch` ends the subscription as a
stream error. Index lifecycle: the worker's entries are flushed (a new `kv_epoch`) on every
(re)subscription, on a sequence gap, on a sequence number going backwards (the worker
restarted behind a live stream), when the stream ends or fails, and when the worker is
removed (the router flushes on `cleared` itself). After a stream error or end the task
resubscribes with exponential backoff (`kv_backoff_initial_s` doubling to
`kv_backoff_max_s`, cut short when the worker turns healthy, so a restarted worker is
subscribed to again at once); a connection failure (UNAVAILABLE) also counts as one failed
health observation, so a killed worker leaves rotation after a few failed resubscriptions
(~0.7 s) rather than three probes. A worker that does not implement SubscribeKvEvents
(UNIMPLEMENTED) is left in the router's approximate mode, retried every `kv_backoff_max_s`
without further flushes.

The stream also shows progress (`WorkerState.last_progress_at`): a batch of cache events, a
load record that shows engine work (`homing.engines.health.shows_progress`), or the
servicer's own `engine_silence_ms`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol, TypeVar

import grpc
import structlog
from smg_grpc_proto.generated import common_pb2

from homing.clock import Clock
from homing.engines.client import EngineError
from homing.engines.health import LoadSample, shows_progress
from homing.engines.kv_stream import KvStreamCursor
from homing.engines.pool.state import EngineLoadView, PoolConfig, Worker

log = structlog.get_logger(__name__)


class DecodedKvBatch(Protocol):
    """One KV-event batch as the sink read it (`homing.router.events.DecodedBatch` is one)."""

    @property
    def header(self) -> common_pb2.KvEventBatch:
        """The batch's fields but its events (sequence_number, timestamp, dp_rank, load)."""
        ...

    @property
    def num_events(self) -> int:
        """Events in the batch."""
        ...


_Decoded = TypeVar("_Decoded", bound=DecodedKvBatch)


class KvEventSink(Protocol[_Decoded]):
    """What the pool feeds KV events to (`homing.router.Router` is one)."""

    @property
    def block_size(self) -> int:
        """Tokens per KV block: a joining worker's KV page size must equal it."""
        ...

    def decode_kv_batch(self, data: bytes) -> _Decoded:
        """Read one serialized `KvEventBatch`, once; ValueError when it is not one."""
        ...

    def apply_kv_decoded(self, worker_id: str, batch: _Decoded, lag_s: float | None = None) -> None:
        """Apply one in-order batch of `worker_id`'s events (`lag_s`: publish to receive)."""
        ...

    def flush_worker(self, worker_id: str, reason: str = "flush") -> None:
        """Forget what is credited to `worker_id` (a new epoch), for `reason`."""
        ...

    def remove_worker(self, worker_id: str) -> None:
        """`worker_id` left the pool."""
        ...

    def set_stream(self, worker_id: str, state: str) -> None:
        """`worker_id`'s subscription is "open", "connecting", "down" or "unsupported"."""
        ...


class _MalformedBatch(Exception):
    """A KV stream delivered bytes that are not a `KvEventBatch` (the sink's ValueError)."""


class KvLoop:
    """The KV-event job of one pool: `run` keeps one worker subscribed for its life and
    feeds its batches to `router`. From the pool it takes `observe(w, ok, source)`, where a
    connection failure counts as a failed health observation."""

    def __init__(
        self,
        *,
        router: KvEventSink,
        clock: Clock,
        wall_clock: Callable[[], float],
        config: PoolConfig,
        observe: Callable[[Worker, bool, str], None],
    ) -> None:
        self._router = router
        self._clock = clock
        self._wall_clock = wall_clock
        self._config = config
        self._observe = observe

    async def run(self, w: Worker) -> None:
        """Subscribe to `w`'s KV events, and again after every end, until cancelled."""
        cfg = self._config
        worker_id = w.state.worker_id
        backoff = cfg.kv_backoff_initial_s
        unsupported = False
        while True:
            w.kv_retry.clear()  # a worker turning healthy from here on wakes the retry
            cursor = KvStreamCursor()
            w.rank_samples.clear()  # progress compares records of one subscription only
            # A new subscription starts from the worker's current state: nothing credited
            # to it before may be trusted (it may have restarted or evicted meanwhile).
            if not unsupported:
                self._flush(w, "subscribe")
            self._set_stream(w, "connecting")
            try:
                stream = w.client.subscribe_kv_events(start_sequence_number=0)
                async with contextlib.aclosing(stream):  # cancels the call on every exit
                    async for data in stream:
                        try:
                            batch = self._router.decode_kv_batch(data)
                        except ValueError as err:  # before the backoff resets: junk backs off
                            raise _MalformedBatch(str(err)) from err
                        backoff = cfg.kv_backoff_initial_s
                        unsupported = False
                        if w.state.kv_stream != "open":
                            self._set_stream(w, "open")
                        header = batch.header
                        step = cursor.feed(header)
                        if step.load is not None:
                            self._apply_load(w, step.rank, step.load)
                        if step.reset:
                            log.warning("kv_sequence_reset", worker=worker_id, rank=step.rank)
                            self._flush(w, "restart")
                        elif step.flush:
                            log.warning("kv_sequence_gap", worker=worker_id, lost_batches=step.gap)
                            self._flush(w, "gap")
                        if step.apply and batch.num_events:
                            _note_progress(w, self._clock.now())  # its cache changed
                            self._router.apply_kv_decoded(worker_id, batch, self._batch_lag(header))
                log.info("kv_stream_ended", worker=worker_id)
                reason = "stream_end"
            except _MalformedBatch as err:
                log.warning("kv_batch_malformed", worker=worker_id, error=str(err))
                reason = "stream_error"
            except EngineError as err:
                log.info("kv_stream_failed", worker=worker_id, error=str(err))
                reason = "stream_error"
                if err.code == grpc.StatusCode.UNIMPLEMENTED:
                    unsupported = True
                    backoff = cfg.kv_backoff_max_s
                elif err.code == grpc.StatusCode.UNAVAILABLE:
                    w.state.last_error = str(err)
                    self._observe(w, False, "kv_stream")
            except Exception:  # a bug in applying events must not end the subscription
                log.exception("kv_stream_crashed", worker=worker_id)
                reason = "stream_error"
            self._set_stream(w, "unsupported" if unsupported else "down")
            if not unsupported:
                self._flush(w, reason)
            with contextlib.suppress(TimeoutError):
                async with self._clock.timeout(backoff):
                    await w.kv_retry.wait()
            backoff = min(backoff * 2, cfg.kv_backoff_max_s)

    def _set_stream(self, w: Worker, state: str) -> None:
        w.state.kv_stream = state
        self._router.set_stream(w.state.worker_id, state)

    def _flush(self, w: Worker, reason: str) -> None:
        """New epoch for `w`'s index entries: nothing credited before may be trusted."""
        w.state.kv_epoch += 1
        self._router.flush_worker(w.state.worker_id, reason)

    def _batch_lag(self, batch: common_pb2.KvEventBatch) -> float | None:
        """Seconds from the batch's publish timestamp to now (None without a timestamp)."""
        if batch.timestamp <= 0:
            return None
        return max(0.0, self._wall_clock() - batch.timestamp)

    def _apply_load(self, w: Worker, rank: int | None, load: common_pb2.EngineLoad) -> None:
        """`w`'s load record for dp `rank`: its progress, and its `EngineLoadView` summed
        over the ranks."""
        now = self._clock.now()
        sample = LoadSample(
            running=load.running_requests,
            waiting=load.waiting_requests,
            token_usage=load.token_usage,
            waiting_uncached_tokens=(
                load.waiting_uncached_tokens if load.HasField("waiting_uncached_tokens") else None
            ),
            prefill_pending_tokens=(
                load.prefill_pending_tokens if load.HasField("prefill_pending_tokens") else None
            ),
        )
        if shows_progress(w.rank_samples.get(rank), sample):
            _note_progress(w, now)
        w.rank_samples[rank] = sample
        if load.HasField("engine_silence_ms"):  # the servicer's own measure of the engine
            _note_progress(w, now - load.engine_silence_ms / 1000.0)
        w.rank_loads[rank] = EngineLoadView(
            running=load.running_requests,
            waiting=load.waiting_requests,
            waiting_uncached_tokens=(
                load.waiting_uncached_tokens if load.HasField("waiting_uncached_tokens") else None
            ),
            token_usage=load.token_usage,
            max_running_requests=load.max_running_requests,
            updated_at=now,
            prefill_pending_tokens=(
                load.prefill_pending_tokens if load.HasField("prefill_pending_tokens") else None
            ),
            active_token_usage=(
                load.active_token_usage if load.HasField("active_token_usage") else None
            ),
        )
        views = list(w.rank_loads.values())
        uncached = [v.waiting_uncached_tokens for v in views]
        pending = [v.prefill_pending_tokens for v in views]
        active = [v.active_token_usage for v in views]
        w.state.load = EngineLoadView(
            running=sum(v.running for v in views),
            waiting=sum(v.waiting for v in views),
            waiting_uncached_tokens=(
                None if any(u is None for u in uncached) else sum(u or 0 for u in uncached)
            ),
            token_usage=max(v.token_usage for v in views),
            max_running_requests=sum(v.max_running_requests for v in views),
            updated_at=now,
            prefill_pending_tokens=(
                None if any(p is None for p in pending) else sum(p or 0 for p in pending)
            ),
            active_token_usage=(
                None if any(a is None for a in active) else max(a or 0.0 for a in active)
            ),
        )


def _note_progress(w: Worker, at: float) -> None:
    """`w`'s engine was seen doing work at clock time `at`."""
    last = w.state.last_progress_at
    if last is None or at > last:
        w.state.last_progress_at = at
