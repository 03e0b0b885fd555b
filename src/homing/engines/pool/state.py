"""The pool's plain data: its settings (`PoolConfig`), each worker as the pool sees it
(`WorkerState`, with its latest load, `EngineLoadView`), the pool's own record of a worker
(`Worker`: its client, tasks and breaker; internal to the package), a lease's breaker
record (`LeaseMark`), and what is asked of the pool (`WorkerSpec`, `WorkerRefused`). No
logic but the `WorkerState` properties that read its fields."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

from homing.clock import TimerHandle
from homing.engines.breaker import Breaker, BreakerConfig, BreakerState
from homing.engines.client import EngineApi
from homing.engines.health import LoadSample
from homing.engines.lifecycle import Action, Phase, accepts_requests
from homing.engines.pool.shared_in_flight import SharedCount, box_total


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

    `in_flight`: requests this process dispatched through `track` and not finished;
    `in_flight_all` adds those the other gateway processes of the box have on it (`shared`,
    None with one process).
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
    shared: SharedCount | None = field(default=None, repr=False, compare=False)

    @property
    def in_flight_all(self) -> int:
        """Requests in flight on the worker from every gateway process of the box."""
        return box_total(self.in_flight, self.shared)

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
class Worker:
    """The pool's own record of one worker: its public `state`, its client, its tasks and
    breaker. Internal to `homing.engines.pool` (not re-exported)."""

    state: WorkerState
    client: EngineApi
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
    failures_seen: int = 0  # transport failures of requests on it so far (never reset)
    rank_samples: dict[int | None, LoadSample] = field(default_factory=dict)
    warm: bool = False  # joins cordoned (WorkerSpec.warm)
    drains: int = 0  # drains begun so far: a retirement waiting on the box knows its own


@dataclass(eq=False)
class LeaseMark:
    """One lease's breaker record, from `open_lease` to `close_lease`: `trial` (it took its
    worker's half-open trial slot), and what its streams saw: `answered` (the worker
    answered), `completed` (a stream ended with its complete message, not aborted; then
    `failures_seen`: its worker's `Worker.failures_seen` at the last such end), `failed` (a
    transport failure of its own), `closed` (`close_lease` was called)."""

    trial: bool
    answered: bool = False
    completed: bool = False
    failures_seen: int = 0
    failed: bool = False
    closed: bool = False


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
