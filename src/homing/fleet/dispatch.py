"""One served model's dispatch facade: routing a request to a replica hands out a `Lease`.

Rule of the file: the gateway asks a `ModelDispatch` for a lease (`lease`), talks to the
worker through `lease.client`, reports the worker's failures and successes through it, and
releases it exactly once (`release`, or leaving its `with` block). The facade owns the
model's pool, router, admission queue and tokenizer; the gateway touches them only through
it (the fleet's worker operations and the admin API's read-only views use them too). A lease
can be cut by the fleet (a drain that timed out): its `on_cut` callback, set by whoever holds
it, is called once with the reason.

Circuit breakers: routing sees only workers whose breaker admits a request
(`WorkerState.routable`); taking a lease on a half-open worker takes its one trial slot in
the same synchronous step as the routing decision (`WorkerPool.open_lease`), so concurrent
requests cannot all pass. The streams started through `lease.client` (a `LeaseClient`)
report their own outcome to the lease's `LeaseMark`: the worker's first answer closes a
half-open breaker at once; a lease that completed without a transport failure of its own
resets the failure run when released; a lease released with no outcome (the client left
before an answer, the worker aborted it, no stream at all) counts neither way and frees a
trial slot it held (`WorkerPool.close_lease`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from homing.engines.client import EngineApi, EngineError, EngineStreamApi, GenerateParams
from homing.engines.pool import LeaseMark, WorkerPool, WorkerState
from homing.fleet.stream_interval import StreamIntervalPolicy
from homing.obs.demand import DemandMeter
from homing.router import NoWorkerAvailable, Router, RouteRequest, snapshot_from_state
from homing.router.policies.consistent_hash import routing_key
from homing.router.ring import key_hash
from homing.router.types import RouteDecision, WorkerSnapshot
from homing.router.versions import VersionSplit
from homing.text.tokenizer import TextTokenizer


class Admitter(Protocol):
    """The model's admission queue (`homing.gateway.admission.AdmissionController`)."""

    async def admit(self, tenant: str | None, priority: int, request_id: str) -> None:
        """Return when the request may be routed; raise the refusal otherwise."""
        ...

    def dispatch(self) -> None:
        """A replica may have room: wake the next waiter."""
        ...

    @property
    def queued(self) -> int:
        """Requests waiting now."""
        ...


class NoReplica(Exception):
    """No replica of the model can take the request (none ready and healthy)."""


class LeaseClient:
    """A lease's way to its worker: `generate` as `EngineClient.generate`, each stream
    reporting its answer, completion or failure to the lease's breaker record (a
    `StreamWatcher` for the pool's `lease_answered` / `lease_completed` / `lease_failed`)."""

    __slots__ = ("_client", "_mark", "_pool", "worker_id")

    def __init__(self, pool: WorkerPool, worker_id: str, mark: LeaseMark) -> None:
        self._pool = pool
        self._client: EngineApi = pool.client(worker_id)
        self._mark = mark
        self.worker_id = worker_id

    @property
    def url(self) -> str:
        """The worker's `grpc://host:port`."""
        return self._client.url

    def generate(
        self,
        params: GenerateParams,
        *,
        timeout_s: float | None = None,
        traceparent: str | None = None,
    ) -> EngineStreamApi:
        """`EngineClient.generate` on the lease's worker, watched for the breaker."""
        return self._client.generate(
            params, timeout_s=timeout_s, traceparent=traceparent, watcher=self
        )

    def answered(self) -> None:
        """A stream's worker answered (its first token)."""
        self._pool.lease_answered(self.worker_id, self._mark)

    def completed(self) -> None:
        """A stream ended with its complete message, not an abort."""
        self._pool.lease_completed(self.worker_id, self._mark)

    def failed(self, err: EngineError) -> None:
        """A stream failed with `err`."""
        self._pool.lease_failed(self.worker_id, self._mark, err)


@dataclass(eq=False)
class Lease:
    """`slots` requests of one routing decision, counted in flight on `worker_id` until
    `release` (idempotent). `on_cut(reason)`: called once if the fleet cuts the lease.
    `version`: the worker's version label. `decision`: the routing decision that chose it
    (None for a lease not made by routing)."""

    worker_id: str
    client: LeaseClient
    slots: int
    _release: Callable[[Lease], None]
    version: str = ""
    decision: RouteDecision | None = None
    on_cut: Callable[[str], None] | None = None
    released: bool = False
    cut_reason: str | None = None

    def release(self) -> None:
        """Give the slots back (only the first call counts)."""
        if not self.released:
            self.released = True
            self._release(self)

    def cut(self, reason: str) -> None:
        """Ask the holder to end its request now (only the first call counts)."""
        if self.cut_reason is None and not self.released:
            self.cut_reason = reason
            if self.on_cut is not None:
                self.on_cut(reason)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(eq=False)
class ModelDispatch:
    """One served model: `model_id`, its tokenizer, pool, router and (optional) admission.

    `intervals`: how many tokens the engine packs per streamed chunk (None: the worker's).
    `max_context_length` / `max_prompt_tokens` (tokens) come from the pool's discovery and
    stay known after the last worker leaves; `created`: Unix seconds, for `/v1/models`
    (from its builder's clock; 0 when not given).
    `demand`: gets each routing decision's uncached prompt tokens (None: not metered).
    `scales_from_zero`: its autoscaler starts a replica for a request that arrives at none
    (the request waits in admission), so the model can serve with no replica running.
    `split`: the weights of its versions (`homing.router.versions`); None routes over every
    ready worker whatever its version. `tool_call_parser` / `reasoning_parser`: the names
    (`homing.text.parsers`) its answers are parsed with; None: not parsed.
    `system_fingerprint`: the hash of its served configuration that answers carry.
    """

    model_id: str
    tokenizer: TextTokenizer
    pool: WorkerPool
    router: Router
    admission: Admitter | None = None
    intervals: StreamIntervalPolicy | None = None
    demand: DemandMeter | None = None
    scales_from_zero: bool = False
    split: VersionSplit | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    system_fingerprint: str = ""
    created: int = field(default=0, kw_only=True)
    _leases: dict[str, set[Lease]] = field(default_factory=dict)

    @property
    def max_context_length(self) -> int:
        """Prompt + completion tokens one request may span."""
        return self.pool.max_context_length

    @property
    def max_prompt_tokens(self) -> int:
        """The longest prompt a worker accepts, in tokens."""
        return self.pool.max_prompt_tokens

    def stream_interval(self) -> int | None:
        """Tokens per chunk to ask of the worker for the next streamed request, from
        `intervals`; None (the worker's own `--stream-interval`) for 1 or no policy."""
        if self.intervals is None:
            return None
        interval = self.intervals.interval()
        return None if interval == 1 else interval

    # -- routing --

    def snapshots(
        self, exclude: Sequence[str] = (), version: str | None = None
    ) -> Iterator[WorkerSnapshot]:
        """Routing snapshots of the ready, healthy workers (lazily built), only those of
        `version` unless it is None."""
        return (
            snapshot_from_state(w)
            for w in self.pool.routable_workers()
            if w.worker_id not in exclude and (version is None or w.version == version)
        )

    def versions(self) -> list[str]:
        """Every version label of the model: its workers' (any phase) and its split's, sorted."""
        found = {w.version for w in self.pool.workers()}
        if self.split is not None:
            found.update(self.split.weights)
        return sorted(found)

    def choose_version(
        self, request: RouteRequest, exclude: Sequence[str] = (), split_key: str | None = None
    ) -> str | None:
        """The version `request` goes to under the split, among the versions with a ready
        worker not in `exclude`: by `split_key` when given, else by the request's routing
        key (its session key, else its first prompt block); None without a split. Raises
        `NoReplica` when no weighted version has a ready worker."""
        split = self.split
        if split is None:
            return None
        available = {w.version for w in self.pool.routable_workers() if w.worker_id not in exclude}
        if split_key is not None:
            key = key_hash("session:" + split_key)
        else:
            key = routing_key(request, self.router.block_size)
        version = split.choose(key, available)
        if version is None:
            raise NoReplica(self.model_id)
        return version

    def lease(
        self,
        prompt_ids: Sequence[int],
        *,
        session_key: str | None = None,
        slots: int = 1,
        exclude: Sequence[str] = (),
        version: str | None = None,
        split_key: str | None = None,
    ) -> Lease:
        """Route the request and count `slots` requests in flight on the chosen worker
        before returning (so the next decision sees them); on a half-open worker the lease
        is its breaker's trial (module docstring). `version`: a version the client pinned
        (None: the split's choice, `choose_version`, by `split_key`); routing works within
        it. Raises `NoReplica`."""
        request = RouteRequest(prompt_ids=prompt_ids, session_key=session_key)
        if version is None:
            version = self.choose_version(request, exclude, split_key)
        try:
            decision = self.router.select(request, list(self.snapshots(exclude, version)))
        except NoWorkerAvailable:
            raise NoReplica(self.model_id) from None
        worker_id = decision.worker_id
        if self.demand is not None:
            self.demand.routed(decision.uncached_tokens)
        mark = self.pool.open_lease(worker_id)
        slots_cm = contextlib.ExitStack()
        for _ in range(slots):
            slots_cm.enter_context(self.pool.track(worker_id))

        def release(lease: Lease) -> None:
            held = self._leases.get(lease.worker_id)
            if held is not None:
                held.discard(lease)
                if not held:
                    del self._leases[lease.worker_id]
            try:
                self.pool.close_lease(lease.worker_id, mark)
            finally:
                slots_cm.close()  # the holder wakes admission when its request ends (`wake`)

        version = self.pool.state(worker_id).version
        client = LeaseClient(self.pool, worker_id, mark)
        lease = Lease(worker_id, client, slots, release, version=version, decision=decision)
        self._leases.setdefault(worker_id, set()).add(lease)
        return lease

    async def admit(self, tenant: str | None, priority: int, request_id: str) -> None:
        """Wait for the admission queue when every replica is overloaded (no-op without
        one); raises the queue's refusal."""
        if self.admission is not None:
            await self.admission.admit(tenant, priority, request_id)

    def wake(self) -> None:
        """A request of this model ended: an admission waiter may go now."""
        if self.admission is not None:
            self.admission.dispatch()

    def report_failure(self, worker_id: str, err: EngineError) -> None:
        """A request on `worker_id` failed (transport errors count toward its health)."""
        if self.pool.has(worker_id):
            self.pool.report_failure(worker_id, err)

    # -- fleet operations --

    def cut(self, worker_id: str, reason: str) -> int:
        """Cut every open lease on `worker_id` (`Lease.cut`); returns how many."""
        leases = list(self._leases.get(worker_id, ()))
        for lease in leases:
            lease.cut(reason)
        return len(leases)

    def open_leases(self, worker_id: str) -> int:
        """Leases on `worker_id` not yet released."""
        return len(self._leases.get(worker_id, ()))

    def workers(self) -> list[WorkerState]:
        """Every worker of the model (live states)."""
        return self.pool.workers()

    @property
    def queued(self) -> int:
        """Requests waiting in the admission queue (0 without one)."""
        return self.admission.queued if self.admission is not None else 0

    @property
    def ready_workers(self) -> int:
        """Workers new requests may go to now."""
        return len(self.pool.routable_workers())

    @property
    def can_serve(self) -> bool:
        """A request may be served: a worker is ready, or one is started for it."""
        return self.scales_from_zero or self.ready_workers > 0
