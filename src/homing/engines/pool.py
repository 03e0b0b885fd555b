"""The worker pool: discovery, health probing, live load and in-flight accounting.

Rule of this file: every change to a worker's state happens in a synchronous method of the
pool (`_observe`, `_apply_load`, `track`) on plain data, decided by the pure functions of
`homing.engines.health` and `homing.engines.kv_stream`; the background tasks only do I/O
(probe, stream) and hand the outcome to those methods. There is no await between reading
and writing a worker's state, so the event loop is the lock.

Per worker the pool runs two tasks:
- health: every `health_interval_s`, `HealthCheck` with `health_timeout_s`; consecutive
  outcomes flip health (`unhealthy_threshold` failures, `healthy_threshold` successes).
  Requests' transport errors (`report_failure`) count as failures too.
- KV events: `SubscribeKvEvents(0, load_records_before_first_batch=True)`, each batch as
  the bytes gRPC delivered, read once by the router (`decode_kv_batch`); every batch's
  `EngineLoad` updates the worker's `EngineLoadView`; event batches go to the router in
  order, with their publish-to-receive lag. A batch that is not a `KvEventBatch` ends the
  subscription as a stream error. Index lifecycle: the worker's entries are
  flushed (a new `kv_epoch`) on every (re)subscription, on a sequence gap, on a sequence
  number going backwards (the worker restarted behind a live stream), when the stream ends
  or fails, and when the worker is removed (the router flushes on `cleared` itself). After
  a stream error or end the task resubscribes with exponential backoff
  (`kv_backoff_initial_s` doubling to `kv_backoff_max_s`, cut short when the worker turns
  healthy, so a restarted worker is subscribed to again at once); a connection failure
  (UNAVAILABLE) also counts as one failed health observation, so a killed worker leaves
  rotation after a few failed resubscriptions (~0.7 s) rather than three probes. A worker
  that does not implement SubscribeKvEvents (UNIMPLEMENTED) is left in the router's
  approximate mode, retried every `kv_backoff_max_s` without further flushes.

Health is judged by progress too (`homing.engines.health.probe_verdict`): a probe that times
out on a worker that is busy and whose KV-event stream shows engine work within
`progress_window_s` counts neither way (`WorkerState.probes_excused` counts them); a busy
worker whose load records stopped arriving or changing gets its timeouts counted.

A worker that stops answering (a counted probe failure leaves it unhealthy while its
KV-event stream shows no engine work within `progress_window_s`: a frozen process whose TCP
connection stays open; a probe timeout with streams open and no progress within that window
turns it unhealthy at once, `homing.engines.health.stalled`) has its open Generate streams
cut at once (`EngineClient.sever`):
each consumer gets `EngineError(UNAVAILABLE, transport)` within one probe, rather than after
the channel's keepalive (~50 s), and can retry or migrate. A worker that answers its probes
"unhealthy" while it still visibly decodes keeps its streams (it only leaves rotation).

Each worker has a circuit breaker on the request path (`homing.engines.breaker`): requests'
transport failures (`report_failure`) open it. A lease (`open_lease` .. `close_lease`, its
streams reporting through `lease_answered` / `lease_completed` / `lease_failed`) records
its own outcome in its `LeaseMark`: on a half-open worker it is the one trial, resolved at
the worker's first answer (closed) or a transport failure (re-opened), and a trial that
ended with no outcome frees the slot; a lease that completed without a failure of its own
resets the failure run, whatever other leases on the worker did meanwhile; a lease the
client left before an answer, or that the worker aborted, counts neither way.
`WorkerState.routable` is False while the breaker admits no request.
Control loops of the pool (outlier ejection) run beside its tasks (`run_beside`), watch it
(`subscribe`) and move workers with `eject` / `readmit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import grpc
import structlog
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

from homing.clock import Clock, SystemClock, TimerHandle
from homing.config.rules import check_worker_url
from homing.engines import breaker as brk
from homing.engines.breaker import Breaker, BreakerConfig, BreakerState
from homing.engines.client import EngineClient, EngineError
from homing.engines.health import (
    HealthStatus,
    HealthThresholds,
    LoadSample,
    ProbeOutcome,
    is_busy,
    observe,
    probe_verdict,
    shows_progress,
    stalled,
)
from homing.engines.kv_stream import KvStreamCursor
from homing.engines.lifecycle import (
    Action,
    IllegalTransition,
    Phase,
    accepts_requests,
    transition,
)

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


@dataclass(frozen=True)
class PoolConfig:
    """Pool timings (seconds) and thresholds.

    Health: probe every `health_interval_s`, each probe may take `health_timeout_s`;
    `unhealthy_threshold` consecutive failures mark a worker unhealthy, `healthy_threshold`
    consecutive successes healthy again (so a dead worker leaves rotation within about
    `unhealthy_threshold * health_interval_s` = 3 s by default, less when requests fail on
    it first). `discovery_timeout_s`: per GetModelInfo/GetServerInfo call.
    KV stream: resubscribe after `kv_backoff_initial_s`, doubling to `kv_backoff_max_s`.
    `check_tokenizer`: fetch each joining worker's GetTokenizer bundle and refuse a worker
    whose bundle's sha256 differs from the pool's. `progress_window_s`: how recent the
    engine work seen on a busy worker's KV-event stream must be to excuse a probe timeout
    (5 s: five of the simulator's busy heartbeats, `heartbeat_busy_s` = 1 s; a decoding
    engine's KV usage changes with every token). `breaker`: the request-path circuit
    breaker's thresholds.
    """

    health_interval_s: float = 1.0
    health_timeout_s: float = 2.0
    unhealthy_threshold: int = 3
    healthy_threshold: int = 2
    discovery_timeout_s: float = 10.0
    kv_backoff_initial_s: float = 0.1
    kv_backoff_max_s: float = 5.0
    check_tokenizer: bool = True
    progress_window_s: float = 5.0
    breaker: BreakerConfig = field(default_factory=BreakerConfig)


@dataclass
class EngineLoadView:
    """The engine's load from its latest EngineLoad record(s), summed over dp ranks.

    `running` / `waiting`: requests. `waiting_uncached_tokens`: queued prompt tokens not
    served from cache (None when the servicer cannot tell). `token_usage`: KV utilisation in
    [0, 1] (max over ranks). `max_running_requests`: admission window (0 unknown).
    `updated_at`: pool clock time (s) of the record. `prefill_pending_tokens`: prompt tokens
    still to prefill, queued or mid chunked prefill (None when not reported).
    `active_token_usage`: KV occupancy excluding evictable prefix cache in [0, 1] (max over
    ranks; None when a rank does not report it).
    """

    running: int
    waiting: int
    waiting_uncached_tokens: int | None
    token_usage: float
    max_running_requests: int
    updated_at: float
    prefill_pending_tokens: int | None = None
    active_token_usage: float | None = None


@dataclass
class WorkerState:
    """One worker as the pool sees it (live object: read it, do not mutate it).

    `in_flight`: requests dispatched through `track` and not finished.
    `discovered`: GetModelInfo/GetServerInfo succeeded and agree with the pool's model.
    `last_error`: the latest failure seen (probe, discovery, stream), for logs and admin.
    `kv_epoch`: how many times the worker's index entries were flushed by the pool.
    `kv_stream`: "connecting", "open", "down" or "unsupported" (no SubscribeKvEvents).
    `phase`: its lifecycle phase (`homing.engines.lifecycle`); it gets new requests only
    when `ready` and healthy. `version`: the operator's label of its engine or weights
    revision. `tokenizer_sha256`: of its GetTokenizer bundle (None: not fetched).
    `breaker`: its circuit breaker's state ("closed", "open", "half_open"), `breaker_trial`
    whether the half-open trial is in flight, `breaker_opens` how often it opened.
    `last_progress_at`: pool clock time (s) its KV-event stream last showed engine work
    (None: never); `probes_excused`: probe timeouts not counted because it was busy and
    progressing. `drained_from`: while draining, the phase its drain began in.
    """

    worker_id: str
    url: str
    version: str = ""
    phase: Phase = Phase.JOINING
    healthy: bool = False
    in_flight: int = 0
    load: EngineLoadView | None = None
    consecutive_failures: int = 0
    consecutive_successes: int = 0
    discovered: bool = False
    last_error: str | None = None
    kv_epoch: int = 0
    kv_stream: str = "connecting"
    tokenizer_sha256: str | None = None
    breaker: str = BreakerState.CLOSED.value
    breaker_trial: bool = False
    breaker_opens: int = 0
    last_progress_at: float | None = None
    probes_excused: int = 0
    drained_from: Phase | None = None

    @property
    def draining(self) -> bool:
        """True while the worker drains (it takes no new requests)."""
        return self.phase is Phase.DRAINING

    @property
    def routable(self) -> bool:
        """True when new requests may be sent to it: `ready`, healthy, and its breaker
        closed (or half-open with the trial slot free)."""
        return accepts_requests(self.phase) and self.admits

    @property
    def admits(self) -> bool:
        """Healthy with its breaker closed, or half-open with the trial slot free: what
        `routable` asks beyond the phase."""
        if not self.healthy:
            return False
        return self.breaker == "closed" or (self.breaker == "half_open" and not self.breaker_trial)

    @property
    def undrainable(self) -> bool:
        """Whether `WorkerPool.undrain` takes it: draining, from `ready` or `cordoned`."""
        return self.draining and self.drained_from in (Phase.READY, Phase.CORDONED)


@dataclass
class _Worker:
    state: WorkerState
    client: EngineClient
    model_info: pb.GetModelInfoResponse | None = None
    server_info: pb.GetServerInfoResponse | None = None
    rank_loads: dict[int | None, EngineLoadView] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # Set when the worker turns healthy: its KV stream resubscribes at once, not after the
    # rest of its backoff (events it stores meanwhile would be missed).
    kv_retry: asyncio.Event = field(default_factory=asyncio.Event)
    closing: bool = False  # removed with requests in flight: the last one closes the channel
    breaker: Breaker = field(default_factory=Breaker)
    breaker_timer: TimerHandle | None = None
    trial_lease: LeaseMark | None = None  # the half-open trial's lease while it is out
    rank_samples: dict[int | None, LoadSample] = field(default_factory=dict)
    warm: bool = False  # joins cordoned (WorkerSpec.warm)


@dataclass(eq=False)
class LeaseMark:
    """One lease's breaker record, from `open_lease` to `close_lease`: `trial` (it took its
    worker's half-open trial slot), and what its streams saw: `answered` (the worker
    answered), `completed` (a stream ended with its complete message, not aborted),
    `failed` (a transport failure of its own), `closed` (`close_lease` was called)."""

    trial: bool
    answered: bool = False
    completed: bool = False
    failed: bool = False
    closed: bool = False


#: The window beyond `max_req_input_len` that SGLang serves untrimmed: max_req_len =
#: max_req_input_len + 5 and max_new_tokens <= max_req_len - prompt - 1 (sglang 0.5.23).
SGLANG_WINDOW_OVER_INPUT = 4


def served_name(info: pb.GetModelInfoResponse) -> str:
    """The model name a worker serves: `served_model_name`, else `model_path`."""
    return info.served_model_name or info.model_path


class WorkerRefused(Exception):
    """A worker that does not belong in the pool (another model or another tokenizer)."""


@dataclass(frozen=True)
class WorkerSpec:
    """A worker to add: its `grpc://host:port` URL and `version` label. `warm`: it joins
    cordoned (started and discovered, taking no requests until `uncordon`: a warm-pool
    replica)."""

    url: str
    version: str = ""
    warm: bool = False


#: Called after each lifecycle transition: (worker, phase before, action).
TransitionHook = Callable[[WorkerState, Phase, Action], None]


def _outcome(healthy: bool, timed_out: bool) -> ProbeOutcome:
    """A HealthCheck's `ProbeOutcome`: answered healthy, out of time, or else failed."""
    if healthy:
        return ProbeOutcome.OK
    return ProbeOutcome.TIMED_OUT if timed_out else ProbeOutcome.FAILED


class WorkerPool:
    """All workers of one model. Workers get ids from `new_id` (default "w0", "w1", ... in
    order), unique for the pool's life: a URL removed and added again is a new worker.

    `workers`: URLs (or `WorkerSpec`s) to start with. `model`: the served model name every
    worker must report (None: the first discovered worker's). `router`: receives KV-event
    batches and flushes (`KvEventSink`; a `Router`). `clock`: stamps load records and times
    every wait (probes, KV backoff, `wait_ready`, `wait_gone`). `wall_clock`: seconds since
    the epoch, to measure event lag against batch timestamps (default `time.time`).
    `on_health_change`: called with a worker's state each time it turns healthy or
    unhealthy, or its breaker changes state. `on_transition`: called after each lifecycle
    transition.
    Raises ValueError for duplicate or malformed urls.
    """

    def __init__(
        self,
        workers: Sequence[str | WorkerSpec],
        *,
        router: KvEventSink,
        model: str | None = None,
        clock: Clock | None = None,
        config: PoolConfig | None = None,
        on_health_change: Callable[[WorkerState], None] | None = None,
        on_transition: TransitionHook | None = None,
        new_id: Callable[[], str] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        specs = [w if isinstance(w, WorkerSpec) else WorkerSpec(w) for w in workers]
        specs = [
            WorkerSpec(check_worker_url(spec.url), spec.version, warm=spec.warm) for spec in specs
        ]
        urls = [spec.url for spec in specs]
        if len(set(urls)) != len(urls):
            raise ValueError(f"duplicate worker urls in {urls}")
        self.config = config or PoolConfig()
        self.model = model
        self._router = router
        self._on_health_change = on_health_change
        self._on_transition = on_transition
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._wall_clock = wall_clock
        self._thresholds = HealthThresholds(
            unhealthy_threshold=self.config.unhealthy_threshold,
            healthy_threshold=self.config.healthy_threshold,
        )
        if new_id is None:
            counter = itertools.count()
            new_id = lambda: f"w{next(counter)}"  # noqa: E731
        self._new_id = new_id
        self._workers: dict[str, _Worker] = {}
        for spec in specs:
            self._register(spec)
        # The pool's model facts, from the first worker accepted; kept when it leaves.
        self._model_info: pb.GetModelInfoResponse | None = None
        self._server_info: pb.GetServerInfoResponse | None = None
        self._tokenizer_sha256: str | None = None
        self._tokenizer_bundle: bytes | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._retiring: set[asyncio.Task[None]] = set()
        self._gone: dict[str, asyncio.Event] = {}
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []
        self._started = False

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener()` after every change of a worker's health, phase, breaker or
        membership (synchronously, inside the change: it must not change the pool itself;
        set an event and act from a task). Returns the function that unsubscribes it."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return unsubscribe

    def _notify(self) -> None:
        self._changed.set()
        for listener in list(self._listeners):
            listener()

    def _register(self, spec: WorkerSpec) -> _Worker:
        worker_id = self._new_id()
        w = _Worker(
            state=WorkerState(worker_id=worker_id, url=spec.url, version=spec.version),
            client=EngineClient(spec.url, worker_id=worker_id),
            warm=spec.warm,
        )
        self._workers[worker_id] = w
        return w

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Discover every worker (concurrently), then start health and KV-event tasks.

        A worker that answers discovery joins (`ready`, healthy) at once; one that does not
        stays `joining` and joins when its probes succeed. A worker of another model or
        tokenizer than the first one accepted is refused (logged, `gone`).
        """
        if self._started:
            return
        self._started = True
        workers = list(self._workers.values())
        results = await asyncio.gather(*(self._fetch_discovery(w) for w in workers))
        for w, result in zip(workers, results, strict=True):
            if result is None:
                continue
            try:
                self._accept_discovery(w, *result)
            except WorkerRefused:
                await self._drop(w, Action.REFUSED)
        for w in workers:
            if w.state.phase is not Phase.GONE:
                self._start_tasks(w)

    def _start_tasks(self, w: _Worker) -> None:
        w.tasks = [
            asyncio.create_task(self._health_loop(w), name=f"health-{w.state.worker_id}"),
            asyncio.create_task(self._kv_loop(w), name=f"kv-{w.state.worker_id}"),
        ]
        self._tasks.extend(w.tasks)

    async def add(self, spec: WorkerSpec) -> WorkerState:
        """Add a worker while the pool serves; returns its state once discovery answered.

        It joins at once when discovery succeeds, or stays `joining` (probed until it
        answers) when the worker cannot be reached yet. Raises ValueError for a malformed
        or duplicate URL and `WorkerRefused` (nothing kept) for a worker of another model
        or tokenizer.
        """
        spec = WorkerSpec(check_worker_url(spec.url), spec.version, warm=spec.warm)
        if any(w.state.url == spec.url for w in self._workers.values()):
            raise ValueError(f"worker {spec.url} is already in the pool")
        w = self._register(spec)
        log.info("worker_added", worker=w.state.worker_id, url=spec.url, version=spec.version)
        try:
            result = await self._fetch_discovery(w)
        except BaseException:  # the caller gave up: keep no half-added worker
            await asyncio.shield(self._drop(w, Action.REMOVE))
            raise
        if self._workers.get(w.state.worker_id) is not w:
            return w.state  # removed while it was being discovered
        if result is not None:
            try:
                self._accept_discovery(w, *result)
            except WorkerRefused:
                await self._drop(w, Action.REFUSED)
                raise
        if self._started and w.state.phase is not Phase.GONE:
            self._start_tasks(w)
        return w.state

    async def wait_ready(self, timeout_s: float) -> None:
        """Return once at least one worker is routable; TimeoutError after `timeout_s`."""
        async with self._clock.timeout(timeout_s):
            while not self.routable_workers():
                self._changed.clear()
                await self._changed.wait()

    def cordon(self, worker_id: str) -> WorkerState:
        """No new requests for `worker_id`; it stays. KeyError for an unknown id,
        `IllegalTransition` when it is not ready."""
        return self._apply(self._workers[worker_id], Action.CORDON).state

    def uncordon(self, worker_id: str) -> WorkerState:
        """`worker_id` takes new requests again. KeyError, `IllegalTransition`."""
        return self._apply(self._workers[worker_id], Action.UNCORDON).state

    def eject(self, worker_id: str) -> WorkerState:
        """Take `worker_id` out of rotation as an outlier (`ejected`: no new requests, its
        open requests go on). KeyError, `IllegalTransition` when it is not ready."""
        return self._apply(self._workers[worker_id], Action.EJECT).state

    def readmit(self, worker_id: str) -> WorkerState:
        """An ejected `worker_id` takes requests again. KeyError, `IllegalTransition` when
        it is not ejected."""
        return self._apply(self._workers[worker_id], Action.READMIT).state

    def run_beside(self, coro: Coroutine[object, object, None], name: str) -> None:
        """Run `coro` (a control loop of this pool, such as outlier ejection) as a task
        that `stop` cancels with the pool's own."""
        self._tasks.append(asyncio.create_task(coro, name=name))

    def drain(self, worker_id: str) -> WorkerState:
        """No new requests for `worker_id`; it leaves the pool when its last request ends
        (at once when none is in flight). KeyError, `IllegalTransition` (already draining)."""
        w = self._workers[worker_id]
        before = w.state.phase
        self._apply(w, Action.DRAIN)
        w.state.drained_from = before
        if w.state.in_flight == 0:
            self._retire_soon(w, Action.DRAINED)
        return w.state

    def undrain(self, worker_id: str) -> WorkerState:
        """Call a drain off: `worker_id` goes back to the phase its drain began in (`ready`
        or `cordoned`) and stays, its requests in flight going on, as for a URL listed again
        while it was still finishing its streams. KeyError for an id not in the pool (one
        whose drain ended has left: add its URL again); `IllegalTransition` when it is not
        draining, or its drain began while it was joining or ejected (those return only
        through a join or a readmission probe: add it again once it has left)."""
        w = self._workers[worker_id]
        if not w.state.undrainable:
            raise IllegalTransition(w.state.phase, Action.UNDRAIN)
        back_to = w.state.drained_from
        self._apply(w, Action.UNDRAIN)
        w.state.drained_from = None
        if back_to is Phase.CORDONED:
            self._apply(w, Action.CORDON)
        return w.state

    async def wait_gone(self, worker_id: str, timeout_s: float | None = None) -> bool:
        """Wait until `worker_id` has left the pool, at most `timeout_s` (None: no limit);
        True when it has. KeyError when the pool never had it."""
        if worker_id not in self._workers and worker_id not in self._gone:
            raise KeyError(worker_id)
        event = self._gone.setdefault(worker_id, asyncio.Event())
        try:
            async with self._clock.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            return False
        return True

    async def remove(self, worker_id: str) -> None:
        """Take `worker_id` out of the pool now: stop its tasks, close its channel and flush
        its index entries (`router.remove_worker`). KeyError for an unknown id. Requests
        still in flight on it keep their channel until they end."""
        await self._drop(self._workers[worker_id], Action.REMOVE)

    async def _drop(self, w: _Worker, action: Action) -> None:
        """Take `w` out: every piece of bookkeeping first, with no await between (so a
        cancelled caller leaves nothing half done), then the tasks' end and the channel's
        close, shielded from the caller's cancellation."""
        worker_id = w.state.worker_id
        if self._workers.get(worker_id) is not w:
            return  # already gone
        if action is Action.DRAINED and w.state.phase is not Phase.DRAINING:
            return  # undrained before its retirement ran
        self._apply(w, action)
        del self._workers[worker_id]
        if w.breaker_timer is not None:
            w.breaker_timer.cancel()
        for task in w.tasks:
            task.cancel()
        self._tasks = [t for t in self._tasks if t not in w.tasks]
        self._router.remove_worker(worker_id)
        was_healthy = w.state.healthy
        w.state.healthy = False
        w.state.kv_stream = "down"
        self._gone.setdefault(worker_id, asyncio.Event()).set()
        self._notify()
        if was_healthy and self._on_health_change is not None:
            self._on_health_change(w.state)
        closing = w.state.in_flight == 0
        if not closing:
            w.closing = True  # the last request on it closes the channel
        await asyncio.shield(self._teardown(w, close=closing))

    async def _teardown(self, w: _Worker, *, close: bool) -> None:
        await asyncio.gather(*w.tasks, return_exceptions=True)
        if close:
            await w.client.close()

    def _retire_soon(self, w: _Worker, action: Action) -> None:
        task = asyncio.get_running_loop().create_task(self._drop(w, action))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def stop(self) -> None:
        """Cancel the background tasks and close every channel."""
        tasks, self._tasks = self._tasks, []
        tasks.extend(self._retiring)
        for w in self._workers.values():
            if w.breaker_timer is not None:
                w.breaker_timer.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(
            *(w.client.close() for w in self._workers.values()), return_exceptions=True
        )

    # ------------------------------------------------------------------ discovery

    @property
    def model_info(self) -> pb.GetModelInfoResponse:
        """GetModelInfo of the first accepted worker (kept after it leaves); RuntimeError
        before any discovery."""
        if self._model_info is None:
            raise RuntimeError("no worker has been discovered yet")
        return self._model_info

    @property
    def server_info(self) -> pb.GetServerInfoResponse:
        """GetServerInfo of the first accepted worker; RuntimeError before any discovery."""
        if self._server_info is None:
            raise RuntimeError("no worker has been discovered yet")
        return self._server_info

    @property
    def served_model_name(self) -> str:
        """The model id every worker serves: `model` when given, else the first accepted
        worker's (`served_model_name`, else `model_path`)."""
        if self.model is not None:
            return self.model
        return served_name(self.model_info)

    @property
    def max_context_length(self) -> int:
        """Tokens one request may span, prompt + completion, without the engine trimming it.

        SGLang's servicer reports its KV pool size as `max_context_length`; its scheduler
        caps a request at max_req_len = `max_req_input_len` + 5 (sglang tp_worker.py) and
        silently trims `max_new_tokens` to max_req_len - prompt - 1. So the window is
        `max_req_input_len` + 4 where that is the smaller (0 means unreported).
        """
        info = self.model_info
        window = int(info.max_context_length)
        if info.max_req_input_len > 0:
            window = min(window, int(info.max_req_input_len) + SGLANG_WINDOW_OVER_INPUT)
        return window

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt the engine accepts: below `max_req_input_len` (SGLang refuses a
        prompt of that length or more), else one less than the window."""
        limit = int(self.model_info.max_req_input_len)
        return limit - 1 if limit > 0 else self.max_context_length - 1

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The model's end-of-sequence token ids."""
        return tuple(self.model_info.eos_token_ids)

    @property
    def page_size(self) -> int | None:
        """KV page size in tokens from server_args (None when not reported)."""
        value = _struct_number(self.server_info.server_args, "page_size")
        return int(value) if value is not None else None

    async def tokenizer_bundle(self) -> bytes:
        """The GetTokenizer zip of the pool's model: the one fetched when the first worker
        joined, else fetched from the first routable worker that serves it.

        Raises EngineError from the last worker tried, or RuntimeError with none routable.
        """
        if self._tokenizer_bundle is not None:
            return self._tokenizer_bundle
        last: EngineError | None = None
        for state in self.routable_workers():
            try:
                return await self._workers[state.worker_id].client.tokenizer_bundle()
            except EngineError as err:
                last = err
                log.warning("tokenizer_bundle_failed", worker=state.worker_id, error=str(err))
        if last is not None:
            raise last
        raise RuntimeError("no healthy worker to fetch the tokenizer from")

    # ------------------------------------------------------------------ views

    def workers(self) -> list[WorkerState]:
        """Every worker's live state, in the order they were added."""
        return [w.state for w in self._workers.values()]

    def healthy_workers(self) -> list[WorkerState]:
        """Live states of the healthy workers (any phase), in the order they were added."""
        return [w.state for w in self._workers.values() if w.state.healthy]

    def routable_workers(self) -> list[WorkerState]:
        """Live states of the workers new requests may go to (`ready` and healthy)."""
        return [w.state for w in self._workers.values() if w.state.routable]

    def has(self, worker_id: str) -> bool:
        """Whether `worker_id` is in the pool (any phase but gone)."""
        return worker_id in self._workers

    def client(self, worker_id: str) -> EngineClient:
        """The engine client of `worker_id` (KeyError for an unknown id)."""
        return self._workers[worker_id].client

    def state(self, worker_id: str) -> WorkerState:
        """The live state of `worker_id` (KeyError for an unknown id)."""
        return self._workers[worker_id].state

    @property
    def total_in_flight(self) -> int:
        """Requests in flight over all workers."""
        return sum(w.state.in_flight for w in self._workers.values())

    # ------------------------------------------------------------------ accounting

    @contextlib.contextmanager
    def track(self, worker_id: str) -> Iterator[None]:
        """Count one request in flight on `worker_id` for the duration of the block.

        The count is released exactly once, in `finally`, whatever ends the block
        (return, exception, CancelledError, GeneratorExit). The last request on a draining
        worker retires it. KeyError for an unknown id.
        """
        w = self._workers[worker_id]
        state = w.state
        state.in_flight += 1
        try:
            yield
        finally:
            state.in_flight -= 1
            if state.in_flight == 0:
                if state.phase is Phase.DRAINING:
                    self._retire_soon(w, Action.DRAINED)
                elif w.closing:
                    task = asyncio.get_running_loop().create_task(w.client.close())
                    self._retiring.add(task)
                    task.add_done_callback(self._retiring.discard)

    def report_failure(self, worker_id: str, err: EngineError) -> None:
        """A request on `worker_id` failed; only transport errors count, toward health and
        toward its breaker."""
        if err.transport:
            w = self._workers[worker_id]
            w.state.last_error = str(err)
            self._set_breaker(w, brk.on_failure(w.breaker, self._clock.now(), self.config.breaker))
            self._observe(w, False, "request")

    def open_lease(self, worker_id: str) -> LeaseMark:
        """A request was routed to `worker_id` (call with no await since its routing
        snapshot was taken): on a half-open worker it takes the trial slot, so the next
        routing decision sees no room there. Pass the mark to `close_lease`. KeyError for
        an unknown id; ValueError when its breaker admits no request."""
        w = self._workers[worker_id]
        after, trial = brk.start_request(w.breaker)
        mark = LeaseMark(trial=trial)
        self._set_breaker(w, after)
        if trial:
            w.trial_lease = mark
        return mark

    def lease_answered(self, worker_id: str, mark: LeaseMark) -> None:
        """The worker answered one of the lease's streams (its first token, or a complete
        message that is no abort): the half-open trial succeeds here, closing the breaker
        while the stream goes on. No-op after a failure of the lease, once closed, or for a
        worker gone."""
        w = self._workers.get(worker_id)
        if w is None or mark.closed or mark.failed or mark.answered:
            return
        mark.answered = True
        if w.trial_lease is mark:
            w.trial_lease = None
            self._set_breaker(w, brk.on_success(w.breaker, trial=True))

    def lease_completed(self, worker_id: str, mark: LeaseMark) -> None:
        """One of the lease's streams ended with its complete message, not an abort."""
        if not mark.closed:
            mark.completed = True

    def lease_failed(self, worker_id: str, mark: LeaseMark, err: EngineError) -> None:
        """One of the lease's streams failed with `err`: a transport failure (our own
        deadline, DEADLINE_EXCEEDED, aside: it says nothing of the worker) marks the lease
        failed, so it earns no success. The failure is counted by `report_failure`."""
        if err.transport and err.code != grpc.StatusCode.DEADLINE_EXCEEDED and not mark.closed:
            mark.failed = True

    def close_lease(self, worker_id: str, mark: LeaseMark) -> None:
        """The lease `mark` came from ended (only the first call counts). A lease that
        completed without a failure of its own is a success: the failure run resets. A trial
        still unresolved (no answer, no counted failure: the client left, the worker aborted
        it, our deadline) frees the half-open slot. No-op for a worker gone."""
        if mark.closed:
            return
        mark.closed = True
        w = self._workers.get(worker_id)
        if w is None:
            return
        if w.trial_lease is mark:
            w.trial_lease = None
            self._set_breaker(w, brk.end_trial(w.breaker))
        if mark.completed and not mark.failed:
            self._set_breaker(w, brk.on_success(w.breaker, trial=False))

    # ------------------------------------------------------------------ state changes

    def _observe(self, w: _Worker, ok: bool, source: str) -> None:
        s = w.state
        before = HealthStatus(s.healthy, s.consecutive_failures, s.consecutive_successes)
        after = observe(before, ok, self._thresholds)
        if after.healthy and not s.discovered:
            after = HealthStatus(False, after.consecutive_failures, after.consecutive_successes)
        self._change_health(w, after, source)

    def _change_health(self, w: _Worker, after: HealthStatus, source: str) -> None:
        """Put `after` in force for `w`, logging a flip with its `source`."""
        s = w.state
        was_healthy = s.healthy
        self._set_status(w, after)
        if after.healthy != was_healthy:
            log.info(
                "worker_health_changed",
                worker=s.worker_id,
                url=s.url,
                healthy=after.healthy,
                source=source,
                error=None if after.healthy else s.last_error,
            )

    def _set_status(self, w: _Worker, status: HealthStatus) -> None:
        flipped = w.state.healthy != status.healthy
        w.state.healthy = status.healthy
        w.state.consecutive_failures = status.consecutive_failures
        w.state.consecutive_successes = status.consecutive_successes
        self._notify()
        if flipped and status.healthy:
            w.kv_retry.set()
        if flipped and self._on_health_change is not None:
            self._on_health_change(w.state)

    def _set_breaker(self, w: _Worker, after: Breaker) -> None:
        """Put `after` in force for `w`: mirror it on the state, time an open interval's
        end, log and report state changes."""
        before = w.breaker
        if after == before:
            return
        s = w.state
        w.breaker = after
        if not after.trial:
            w.trial_lease = None  # re-opened or closed: the old trial resolves nothing
        s.breaker = after.state.value
        s.breaker_trial = after.trial
        self._notify()
        if after.state is before.state:
            return
        if w.breaker_timer is not None:
            w.breaker_timer.cancel()
            w.breaker_timer = None
        if after.state is BreakerState.OPEN:
            s.breaker_opens += 1
            delay = max(0.0, after.open_until - self._clock.now())
            w.breaker_timer = self._clock.call_later(delay, lambda: self._breaker_tick(w))
        log.info(
            "worker_breaker",
            worker=s.worker_id,
            url=s.url,
            state=after.state.value,
            before=before.state.value,
            open_s=round(brk.open_interval(after.opens, self.config.breaker), 3)
            if after.state is BreakerState.OPEN
            else None,
            error=s.last_error if after.state is BreakerState.OPEN else None,
        )
        if self._on_health_change is not None:
            self._on_health_change(s)

    def _breaker_tick(self, w: _Worker) -> None:
        """The open interval's timer: half-open when it is over (re-armed if it fired a
        hair early)."""
        w.breaker_timer = None
        if self._workers.get(w.state.worker_id) is not w:
            return
        now = self._clock.now()
        after = brk.tick(w.breaker, now)
        if after.state is BreakerState.OPEN:
            remaining = max(0.001, after.open_until - now)
            w.breaker_timer = self._clock.call_later(remaining, lambda: self._breaker_tick(w))
            return
        self._set_breaker(w, after)

    def _note_progress(self, w: _Worker, at: float) -> None:
        """`w`'s engine was seen doing work at clock time `at`."""
        last = w.state.last_progress_at
        if last is None or at > last:
            w.state.last_progress_at = at

    def _apply_load(self, w: _Worker, rank: int | None, load: common_pb2.EngineLoad) -> None:
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
            self._note_progress(w, now)
        w.rank_samples[rank] = sample
        if load.HasField("engine_silence_ms"):  # the servicer's own measure of the engine
            self._note_progress(w, now - load.engine_silence_ms / 1000.0)
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

    def _apply(self, w: _Worker, action: Action) -> _Worker:
        """Move `w` by `action` (IllegalTransition when not allowed); logged and reported."""
        before = w.state.phase
        w.state.phase = transition(before, action)
        self._notify()
        log.info(
            "worker_phase",
            worker=w.state.worker_id,
            url=w.state.url,
            model=self.model or (served_name(self._model_info) if self._model_info else None),
            action=action.value,
            before=before.value,
            after=w.state.phase.value,
        )
        if self._on_transition is not None:
            self._on_transition(w.state, before, action)
        return w

    def _accept_discovery(
        self,
        w: _Worker,
        info: pb.GetModelInfoResponse,
        server: pb.GetServerInfoResponse,
        bundle: bytes | None,
    ) -> None:
        """Check a discovered worker against the pool's model and tokenizer and join it
        (healthy, `ready`); raises `WorkerRefused` (with `last_error` set and an error
        logged) when it serves another model or tokenizer."""
        expected = self.model
        if expected is None and self._model_info is not None:
            expected = served_name(self._model_info)
        sha = hashlib.sha256(bundle).hexdigest() if bundle is not None else None
        problem = None
        if expected is not None and served_name(info) != expected:
            problem = f"serves model {served_name(info)!r}, the pool serves {expected!r}"
        elif sha is not None and self._tokenizer_sha256 not in (None, sha):
            problem = (
                f"has tokenizer bundle sha256 {sha[:12]}..., the pool's is "
                f"{self._tokenizer_sha256[:12]}... (another tokenizer or revision)"
            )
        if problem is not None:
            w.state.last_error = f"worker {w.state.url} {problem}"
            log.error("worker_refused", worker=w.state.worker_id, url=w.state.url, error=problem)
            raise WorkerRefused(w.state.last_error)
        w.model_info, w.server_info = info, server
        w.state.discovered = True
        w.state.tokenizer_sha256 = sha
        if self._model_info is None:
            self._model_info, self._server_info = info, server
            if sha is not None:
                self._tokenizer_sha256, self._tokenizer_bundle = sha, bundle
            block_size = getattr(self._router, "block_size", None)
            page = _struct_number(server.server_args, "page_size")
            if block_size is not None and page is not None and int(page) != block_size:
                log.warning(
                    "page_size_mismatch",
                    worker=w.state.worker_id,
                    page_size=int(page),
                    router_block_size=block_size,
                )
        elif sha is not None and self._tokenizer_sha256 is None:
            self._tokenizer_sha256, self._tokenizer_bundle = sha, bundle
        self._set_status(w, HealthStatus(healthy=True))
        if w.state.phase is Phase.JOINING:
            self._apply(w, Action.JOINED)
            if w.warm:  # in the same step: no request can be routed to it in between
                self._apply(w, Action.CORDON)

    # ------------------------------------------------------------------ I/O tasks

    async def _fetch_discovery(
        self, w: _Worker
    ) -> tuple[pb.GetModelInfoResponse, pb.GetServerInfoResponse, bytes | None] | None:
        """A first HealthCheck, then GetModelInfo, GetServerInfo and (with `check_tokenizer`)
        the tokenizer bundle; None (`last_error` set) when the worker cannot answer. A
        worker without GetTokenizer (UNIMPLEMENTED) is not checked for its tokenizer."""
        timeout = self.config.discovery_timeout_s
        bundle: bytes | None = None
        # The first check may open the channel too: it gets the longer of the two timeouts.
        first_s = max(self.config.health_timeout_s, timeout)
        if not await w.client.health_check(timeout_s=first_s):
            w.state.last_error = "health check failed"
            return None  # a worker joins only once it can generate
        try:
            info = await w.client.model_info(timeout_s=timeout)
            server = await w.client.server_info(timeout_s=timeout)
            if self.config.check_tokenizer:
                try:
                    bundle = await w.client.tokenizer_bundle(timeout_s=timeout)
                except EngineError as err:
                    if err.code != grpc.StatusCode.UNIMPLEMENTED:
                        raise
                    log.warning("tokenizer_unchecked", worker=w.state.worker_id, error=str(err))
        except EngineError as err:
            w.state.last_error = str(err)
            log.warning(
                "worker_discovery_failed", worker=w.state.worker_id, url=w.state.url, error=str(err)
            )
            return None
        return info, server, bundle

    async def _health_loop(self, w: _Worker) -> None:
        cfg = self.config
        while True:
            await self._clock.sleep(cfg.health_interval_s)
            probe = await w.client.health_probe(timeout_s=cfg.health_timeout_s)
            ok = probe.healthy
            if not ok and w.state.discovered:
                verdict = self._probe_verdict(w, _outcome(ok, probe.timed_out))
                if verdict is None:
                    w.state.probes_excused += 1
                    log.debug("probe_excused", worker=w.state.worker_id, url=w.state.url)
                    continue
            if not ok:
                w.state.last_error = (
                    "health check timed out" if probe.timed_out else "health check failed"
                )
            elif not w.state.discovered:
                result = await self._fetch_discovery(w)
                if result is None:
                    ok = False
                else:
                    try:
                        self._accept_discovery(w, *result)
                    except WorkerRefused:
                        self._retire_soon(w, Action.REFUSED)
                        return
                    continue  # joined (healthy) by the discovery itself
            self._observe(w, ok, "probe")
            if not ok and w.state.healthy and self._stalled(w, probe.timed_out):
                after = HealthStatus(False, w.state.consecutive_failures, 0)
                self._change_health(w, after, "stalled")
            if not ok and not w.state.healthy:
                self._sever(w)

    def _stalled(self, w: _Worker, timed_out: bool) -> bool:
        """`homing.engines.health.stalled` for `w`'s probe that just failed."""
        return stalled(
            ProbeOutcome.TIMED_OUT if timed_out else ProbeOutcome.FAILED,
            open_streams=w.client.open_streams,
            last_progress_at=w.state.last_progress_at,
            now=self._clock.now(),
            window_s=self.config.progress_window_s,
        )

    def _sever(self, w: _Worker) -> None:
        """`w` failed a counted probe and is unhealthy: cut its open Generate streams
        (module docstring), unless its KV-event stream still shows engine work within
        `progress_window_s` (a worker answering "unhealthy" while it decodes keeps them)."""
        if not w.client.open_streams:
            return
        last = w.state.last_progress_at
        if last is not None and self._clock.now() - last <= self.config.progress_window_s:
            return
        cut = w.client.sever(f"worker {w.state.url} stopped answering ({w.state.last_error})")
        if cut:
            log.warning(
                "worker_streams_severed",
                worker=w.state.worker_id,
                url=w.state.url,
                streams=cut,
                error=w.state.last_error,
            )

    def _probe_verdict(self, w: _Worker, outcome: ProbeOutcome) -> bool | None:
        """What a probe's `outcome` counts for `w` now (`homing.engines.health`)."""
        s = w.state
        load = s.load
        sample = (
            LoadSample(running=load.running, waiting=load.waiting, token_usage=load.token_usage)
            if load is not None
            else None
        )
        return probe_verdict(
            outcome,
            busy=is_busy(s.in_flight, sample),
            last_progress_at=s.last_progress_at,
            now=self._clock.now(),
            window_s=self.config.progress_window_s,
        )

    def _set_stream(self, w: _Worker, state: str) -> None:
        w.state.kv_stream = state
        self._router.set_stream(w.state.worker_id, state)

    def _flush(self, w: _Worker, reason: str) -> None:
        """New epoch for `w`'s index entries: nothing credited before may be trusted."""
        w.state.kv_epoch += 1
        self._router.flush_worker(w.state.worker_id, reason)

    def _batch_lag(self, batch: common_pb2.KvEventBatch) -> float | None:
        """Seconds from the batch's publish timestamp to now (None without a timestamp)."""
        if batch.timestamp <= 0:
            return None
        return max(0.0, self._wall_clock() - batch.timestamp)

    async def _kv_loop(self, w: _Worker) -> None:
        cfg = self.config
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
                            self._note_progress(w, self._clock.now())  # its cache changed
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


class _MalformedBatch(Exception):
    """A KV stream delivered bytes that are not a `KvEventBatch` (the sink's ValueError)."""


def _struct_number(struct: object, key: str) -> float | None:
    """A numeric value from a protobuf Struct (None when absent or not a number)."""
    fields = getattr(struct, "fields", None)
    if fields is None or key not in fields:
        return None
    value = fields[key]
    if value.WhichOneof("kind") != "number_value":
        return None
    return float(value.number_value)
