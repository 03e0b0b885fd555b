"""`WorkerPool`: the pool's public face, and its membership.

The pool holds its workers and moves them through their lifecycle (`homing.engines.
lifecycle`): it registers, adds (discovery, then join), cordons, ejects, drains and removes
them, and tells its subscribers of every change. Its other jobs live beside it and are
wired in here: discovery and the model facts (`discovery`), the health loop (`health_loop`),
the KV-event loop (`kv_loop`), and leases with the breakers (`leases`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence

import structlog
from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

from homing.clock import Clock, SystemClock
from homing.config.rules import check_worker_url
from homing.engines.client import EngineApi, EngineClient, EngineError
from homing.engines.health import HealthStatus
from homing.engines.lifecycle import Action, IllegalTransition, Phase, transition
from homing.engines.pool import leases
from homing.engines.pool.discovery import (
    Discovered,
    ModelFacts,
    fetch_discovery,
    served_name,
)
from homing.engines.pool.health_loop import HealthLoop
from homing.engines.pool.kv_loop import KvEventSink, KvLoop
from homing.engines.pool.shared_in_flight import InFlightBoard, SharedCount
from homing.engines.pool.state import (
    LeaseMark,
    PoolConfig,
    TransitionHook,
    Worker,
    WorkerRefused,
    WorkerSpec,
    WorkerState,
)

log = structlog.get_logger(__name__)

#: A drained worker other gateway processes serve too: seconds before its retirement looks
#: at their requests (two polls of their mirror of the leader's workers), then how often.
SHARED_DRAIN_SETTLE_S = 2.0
SHARED_DRAIN_POLL_S = 0.2


def _engine_client(url: str, worker_id: str) -> EngineApi:
    """The default `client_factory`: an `EngineClient` of the worker at `url`."""
    return EngineClient(url, worker_id=worker_id)


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
    transition. `client_factory(url, worker_id)`: the client of each worker added (default
    an `EngineClient`; tests pass one that gives `homing.engines.testing.FakeEngine`s).
    `shared`: (board, this process's row) when several gateway processes serve the same
    workers: each worker's requests in flight are published there, and read back from the
    others (`WorkerState.in_flight_all`). Raises ValueError for duplicate or malformed urls.
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
        client_factory: Callable[[str, str], EngineApi] | None = None,
        shared: tuple[InFlightBoard, int] | None = None,
    ) -> None:
        specs = [w if isinstance(w, WorkerSpec) else WorkerSpec(w) for w in workers]
        specs = [
            WorkerSpec(check_worker_url(spec.url), spec.version, warm=spec.warm) for spec in specs
        ]
        urls = [spec.url for spec in specs]
        if len(set(urls)) != len(urls):
            raise ValueError(f"duplicate worker urls in {urls}")
        self._config = config or PoolConfig()
        self.model = model
        self._router = router
        self._on_health_change = on_health_change
        self._on_transition = on_transition
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._client_factory = client_factory or _engine_client
        self._shared = shared
        if new_id is None:
            counter = itertools.count()
            new_id = lambda: f"w{next(counter)}"  # noqa: E731
        self._new_id = new_id
        self._workers: dict[str, Worker] = {}
        for spec in specs:
            self._register(spec)
        # The pool's model facts, from the first worker accepted; kept when it leaves.
        self._facts = ModelFacts()
        self._health = HealthLoop(
            clock=self._clock,
            config=self._config,
            notify=self._notify,
            on_change=on_health_change,
            join=self._accept_discovery,
            refuse=lambda w: self._retire_soon(w, Action.REFUSED),
        )
        self._kv = KvLoop(
            router=router,
            clock=self._clock,
            wall_clock=wall_clock,
            config=self._config,
            observe=self._health.observe,
        )
        self._breakers = leases.Breakers(
            clock=self._clock,
            config=self._config.breaker,
            member=lambda w: self._workers.get(w.state.worker_id) is w,
            notify=self._notify,
            on_change=on_health_change,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._retiring: set[asyncio.Task[None]] = set()
        self._gone: dict[str, asyncio.Event] = {}
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []
        self._started = False

    @property
    def config(self) -> PoolConfig:
        """The pool's settings (read-only: the health loop, the KV loop and the breakers
        hold the same object, so it is never replaced)."""
        return self._config

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

    def _register(self, spec: WorkerSpec) -> Worker:
        worker_id = self._new_id()
        state = WorkerState(worker_id=worker_id, url=spec.url, version=spec.version)
        if self._shared is not None:
            board, process = self._shared
            slot = board.slot(spec.url)
            if slot is not None:
                state.shared = SharedCount(board, process, slot)
                state.shared.publish(0)  # a URL added again starts from none of ours
        w = Worker(
            state=state,
            client=self._client_factory(spec.url, worker_id),
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
        results = await asyncio.gather(*(fetch_discovery(w, self._config) for w in workers))
        for w, result in zip(workers, results, strict=True):
            if result is None:
                continue
            try:
                self._accept_discovery(w, result)
            except WorkerRefused:
                await self._drop(w, Action.REFUSED)
        for w in workers:
            if w.state.phase is not Phase.GONE:
                self._start_tasks(w)

    def _start_tasks(self, w: Worker) -> None:
        w.tasks = [
            asyncio.create_task(self._health.run(w), name=f"health-{w.state.worker_id}"),
            asyncio.create_task(self._kv.run(w), name=f"kv-{w.state.worker_id}"),
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
            result = await fetch_discovery(w, self._config)
        except BaseException:  # the caller gave up: keep no half-added worker
            await asyncio.shield(self._drop(w, Action.REMOVE))
            raise
        if self._workers.get(w.state.worker_id) is not w:
            return w.state  # removed while it was being discovered
        if result is not None:
            try:
                self._accept_discovery(w, result)
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
        (at once when none is in flight; with other gateway processes, when the box's last
        one ends). KeyError, `IllegalTransition` (already draining)."""
        w = self._workers[worker_id]
        before = w.state.phase
        self._apply(w, Action.DRAIN)
        w.drains += 1
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

    async def _drop(self, w: Worker, action: Action) -> None:
        """Take `w` out: every piece of bookkeeping first, with no await between (so a
        cancelled caller leaves nothing half done), then the tasks' end and the channel's
        close, shielded from the caller's cancellation. A drained worker that other gateway
        processes also serve (`state.shared`) leaves once the whole box has nothing on it
        (`_until_box_idle`)."""
        worker_id = w.state.worker_id
        if action is Action.DRAINED and w.state.shared is not None:
            drains = w.drains
            await self._until_box_idle(w)
            if w.drains != drains:
                return  # undrained and drained again meanwhile: that drain's retirement waits
        if self._workers.get(worker_id) is not w:
            return  # already gone
        if action is Action.DRAINED and w.state.phase is not Phase.DRAINING:
            return  # undrained before its retirement ran
        self._apply(w, action)
        del self._workers[worker_id]
        leases.Breakers.cancel_timer(w)
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

    async def _teardown(self, w: Worker, *, close: bool) -> None:
        await asyncio.gather(*w.tasks, return_exceptions=True)
        if close:
            await w.client.close()

    async def _until_box_idle(self, w: Worker) -> None:
        """Return once no gateway process of the box has a request on draining `w`: after
        `SHARED_DRAIN_SETTLE_S` (the other processes learn of the drain from the leader's
        admin API, polled every second, and route to `w` until then), then every
        `SHARED_DRAIN_POLL_S` (their releases wake nothing here). Returns at once when `w`
        is no longer draining."""
        await self._clock.sleep(SHARED_DRAIN_SETTLE_S)
        while w.state.phase is Phase.DRAINING and w.state.in_flight_all > 0:
            await self._clock.sleep(SHARED_DRAIN_POLL_S)

    def _retire_soon(self, w: Worker, action: Action) -> None:
        task = asyncio.get_running_loop().create_task(self._drop(w, action))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def stop(self) -> None:
        """Cancel the background tasks and close every channel."""
        tasks, self._tasks = self._tasks, []
        tasks.extend(self._retiring)
        for w in self._workers.values():
            leases.Breakers.cancel_timer(w)
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
        return self._facts.model_info

    @property
    def server_info(self) -> pb.GetServerInfoResponse:
        """GetServerInfo of the first accepted worker; RuntimeError before any discovery."""
        return self._facts.server_info

    @property
    def served_model_name(self) -> str:
        """The model id every worker serves: `model` when given, else the first accepted
        worker's (`served_model_name`, else `model_path`)."""
        if self.model is not None:
            return self.model
        return served_name(self.model_info)

    @property
    def max_context_length(self) -> int:
        """Tokens one request may span, prompt + completion, without the engine trimming it
        (`ModelFacts.max_context_length`)."""
        return self._facts.max_context_length

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt the engine accepts (`ModelFacts.max_prompt_tokens`)."""
        return self._facts.max_prompt_tokens

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The model's end-of-sequence token ids."""
        return self._facts.eos_token_ids

    @property
    def page_size(self) -> int | None:
        """KV page size in tokens from server_args (None when not reported)."""
        return self._facts.page_size

    async def tokenizer_bundle(self) -> bytes:
        """The GetTokenizer zip of the pool's model: the one fetched when the first worker
        joined, else fetched from the first routable worker that serves it.

        Raises EngineError from the last worker tried, or RuntimeError with none routable.
        """
        return await self._facts.tokenizer_bundle(self.routable_workers(), self.client)

    def _accept_discovery(self, w: Worker, discovered: Discovered) -> None:
        """Check a discovered worker against the pool's model and tokenizer and join it
        (healthy, `ready`); raises `WorkerRefused` (with `last_error` set and an error
        logged) when it serves another model or tokenizer."""
        self._facts.admit(w, self.model, discovered, router_block_size=self._router.block_size)
        self._health.set_status(w, HealthStatus(healthy=True))
        if w.state.phase is Phase.JOINING:
            self._apply(w, Action.JOINED)
            if w.warm:  # in the same step: no request can be routed to it in between
                self._apply(w, Action.CORDON)

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

    def client(self, worker_id: str) -> EngineApi:
        """The engine client of `worker_id` (KeyError for an unknown id)."""
        return self._workers[worker_id].client

    def state(self, worker_id: str) -> WorkerState:
        """The live state of `worker_id` (KeyError for an unknown id)."""
        return self._workers[worker_id].state

    @property
    def total_in_flight(self) -> int:
        """Requests in flight over all workers, from every gateway process of the box."""
        return sum(w.state.in_flight_all for w in self._workers.values())

    # ------------------------------------------------------------------ leases

    @contextlib.contextmanager
    def track(self, worker_id: str) -> Iterator[None]:
        """Count one request in flight on `worker_id` for the duration of the block.

        The count is released exactly once, in `finally`, whatever ends the block
        (return, exception, CancelledError, GeneratorExit). The last request on a draining
        worker retires it. KeyError for an unknown id.
        """
        w = self._workers[worker_id]
        with leases.in_flight(w.state, lambda: self._idle(w)):
            yield

    def _idle(self, w: Worker) -> None:
        """The last request on `w` ended: a draining worker retires, a removed one closes
        its channel."""
        if w.state.phase is Phase.DRAINING:
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
            self._breakers.failure(w)
            self._health.observe(w, False, "request")

    def open_lease(self, worker_id: str) -> LeaseMark:
        """A request was routed to `worker_id` (call with no await since its routing
        snapshot was taken): on a half-open worker it takes the trial slot, so the next
        routing decision sees no room there. Pass the mark to `close_lease`. KeyError for
        an unknown id; ValueError when its breaker admits no request."""
        return self._breakers.open_lease(self._workers[worker_id])

    def lease_answered(self, worker_id: str, mark: LeaseMark) -> None:
        """The worker answered one of the lease's streams (its first token, or a complete
        message that is no abort): the half-open trial succeeds here, closing the breaker
        while the stream goes on. No-op after a failure of the lease, once closed, or for a
        worker gone."""
        self._breakers.lease_answered(self._workers.get(worker_id), mark)

    def lease_completed(self, worker_id: str, mark: LeaseMark) -> None:
        """One of the lease's streams ended with its complete message, not an abort."""
        leases.lease_completed(mark, self._workers.get(worker_id))

    def lease_failed(self, worker_id: str, mark: LeaseMark, err: EngineError) -> None:
        """One of the lease's streams failed with `err`: a transport failure (our own
        deadline, DEADLINE_EXCEEDED, aside: it says nothing of the worker) marks the lease
        failed, so it earns no success. The failure is counted by `report_failure`."""
        leases.lease_failed(mark, err)

    def close_lease(self, worker_id: str, mark: LeaseMark) -> None:
        """The lease `mark` came from ended (only the first call counts). A lease that
        completed without a failure of its own is a success: the failure run starts again
        at its completion. A trial
        still unresolved (no answer, no counted failure: the client left, the worker aborted
        it, our deadline) frees the half-open slot. No-op for a worker gone."""
        self._breakers.close_lease(self._workers.get(worker_id), mark)

    # ------------------------------------------------------------------ phase changes

    def _apply(self, w: Worker, action: Action) -> Worker:
        """Move `w` by `action` (IllegalTransition when not allowed); logged and reported."""
        before = w.state.phase
        w.state.phase = transition(before, action)
        self._notify()
        log.info(
            "worker_phase",
            worker=w.state.worker_id,
            url=w.state.url,
            model=self.model or self._facts.name,
            action=action.value,
            before=before.value,
            after=w.state.phase.value,
        )
        if self._on_transition is not None:
            self._on_transition(w.state, before, action)
        return w
