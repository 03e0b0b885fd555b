"""Composition root: builds the subsystems from the config, runs them, and stops them in order.

Start order: homing's own workers (embedded default only: simulated, or real SGLang with
`engines.launch = "sglang"`) -> worker pool (discovery, health, KV-event subscriptions
feeding the router) -> tokenizer (local directory or the worker's GetTokenizer bundle) ->
inference service -> HTTP and gRPC listeners -> admin API (`homing.admin.server`, on its
Unix socket and optional TCP port, when `admin.enabled`).
Stop order (SIGINT/SIGTERM): close the admin API, stop accepting (listeners closed, health
NOT_SERVING), let in-flight requests finish up to `gateway.drain_timeout_s`, end those still
open with a 503 `drained` error (a stream as its last event), then stop the pool and
homing's own workers. `reload` applies a new configuration in place (`homing.daemon.reload`
says what may change); signals and systemd's notifications are `homing.daemon.runner`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, get_args

import structlog
from aiohttp import web

from homing.admin.server import AdminServer, prepare_socket
from homing.aio import gather_or_cancel
from homing.clock import Clock, SystemClock
from homing.config import (
    AdminSettings,
    HomingConfig,
    ModelSettings,
    RouterModelSettings,
    RouterSettings,
    ScalerSettings,
    SloSettings,
    TenantSettings,
    gpus_per_replica,
)
from homing.daemon.reload import ReloadPlan, plan_reload
from homing.daemon.reload import refusal as reload_refusal
from homing.embedded import SglangLauncher, SimLauncher
from homing.engines.breaker import BreakerConfig
from homing.engines.ejector import OutlierEjector
from homing.engines.lifecycle import Action, Phase
from homing.engines.metrics import EngineMetrics
from homing.engines.outliers import OutlierConfig
from homing.engines.pool import PoolConfig, WorkerPool, WorkerSpec, WorkerState
from homing.fleet import Fleet, ModelDispatch
from homing.fleet.fleet import CUT_GRACE_S, FleetError, WorkerIds
from homing.fleet.stream_interval import StreamIntervalPolicy
from homing.gateway.admission import AdmissionController
from homing.gateway.auth import KeyRing
from homing.gateway.errors import drained
from homing.gateway.grpc_api import GrpcApi
from homing.gateway.http import HttpApi
from homing.gateway.http_server import GatewayRunner
from homing.gateway.metrics import GatewayMetrics
from homing.gateway.quotas import QuotaGuard, QuotaStoreError, build_store
from homing.gateway.quotas.types import QuotaKind
from homing.gateway.retry_budget import RetryPolicy
from homing.gateway.service import InferenceService
from homing.gateway.tls import read_pem_pair, server_ssl_context
from homing.obs.demand import DemandMeter
from homing.obs.loop_busy import LoopBusySampler
from homing.obs.metrics import FleetMetrics, RouterMetrics
from homing.obs.requests import RequestMetrics, RequestRecorder
from homing.obs.slo import Slo
from homing.rollout.build import build_controller
from homing.rollout.build import build_store as build_rollout_store
from homing.rollout.controller import RolloutController
from homing.rollout.store import RolloutStoreError
from homing.router import Router
from homing.router.settings import apply_model_settings, policy_configs, router_from_settings
from homing.scaler.actuators.base import Actuator
from homing.scaler.build import build_actuator, start_members
from homing.scaler.capacity import CapacityEstimator
from homing.scaler.leader import (
    Elector,
    KubernetesElector,
    RedisElector,
    SingleElector,
    lease_name,
)
from homing.scaler.loop import PoolScaler, Scaler
from homing.scaler.metrics import ScalerMetrics
from homing.scaler.settings import scaler_config, seed_capacity
from homing.text.parsers import detect_reasoning_parser, detect_tool_parser
from homing.text.tokenizer import TextTokenizer

log = structlog.get_logger("homing.app")

#: The SLO burn-rate window the autoscaler's fast path reads (seconds): the shortest of
#: `homing.obs.slo.BURN_WINDOWS`, the one a traffic step moves first.
SCALER_BURN_WINDOW_S = 300.0


class App:
    """One `homing serve` process. Use `async with App(config) as app:` or start()/stop().

    After `start`: `fleet` (every served model's `ModelDispatch`), `model` / `pool` /
    `router` (the first model's, for single-model deployments), the bound `http_port` and
    `grpc_port`, and `admin` (the admin API server with its `socket_path` and `tcp_port`;
    None when `admin.enabled` is False).

    `listen_sockets`: listening sockets handed over by socket activation, by name; "http"
    is served instead of binding `gateway.host:port` (gRPC binds its own port: grpcio
    cannot adopt a listening descriptor). `clock`: the one clock every component reads and
    waits on (default `SystemClock`; a `ManualClock` runs the gateway on virtual time, its
    workers' own processes on theirs). `state_dir`: where the admin socket and the rollout
    file store live when `admin` names neither (default `default_state_dir()`).
    """

    def __init__(
        self,
        config: HomingConfig,
        *,
        listen_sockets: Mapping[str, socket.socket] | None = None,
        clock: Clock | None = None,
        state_dir: str | None = None,
    ) -> None:
        self.config = config
        self.state_dir = state_dir
        self.listen_sockets = dict(listen_sockets or {})
        self.keyring: KeyRing | None = None
        self.launchers: list[SimLauncher | SglangLauncher] = []
        self.fleet: Fleet | None = None
        self.service: InferenceService | None = None
        self.http: HttpApi | None = None
        self.grpc: GrpcApi | None = None
        self.gateway_metrics = GatewayMetrics()
        self.fleet_metrics = FleetMetrics(self.gateway_metrics.registry)
        self.router_metrics: dict[str, RouterMetrics] = {}
        self.quotas: QuotaGuard | None = None
        self.admissions: list[AdmissionController] = []
        self._runner: web.AppRunner | None = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.admin: AdminServer | None = None
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._started_at = self.clock.now()
        self._stopping = False
        self._background: set[asyncio.Task[None]] = set()
        self._ids = WorkerIds()
        self._pools: list[WorkerPool] = []  # every pool built, stopped in `stop`
        # By served model's index (config order): its autoscaler's actuator, if it has one.
        self._actuators: dict[int, Actuator] = {}
        self.scaler: Scaler | None = None
        self.scaler_metrics: ScalerMetrics | None = None
        self._scaler_task: asyncio.Task[None] | None = None
        self._electors: list[asyncio.Task[None]] = []
        self._leader_redis: Any = None  # the Redis client of the scaler's leases
        self.rollouts: RolloutController | None = None
        self._rollout_task: asyncio.Task[None] | None = None
        self._rollout_redis: Any = None  # the Redis client of the rollout store
        # Each autoscaled model's demand as the gateway sees it (homing.obs.demand).
        self.demand: dict[str, DemandMeter] = {}
        # The loop's busy share, sampled once a second: the gauge, and auto stream intervals.
        self.loop_busy = LoopBusySampler(self.clock, [self.gateway_metrics.loop_busy.set])
        registry = self.gateway_metrics.registry
        obs = config.obs
        # Every request's end: its log line, metrics, SLO verdict and worker records.
        self.recorder = RequestRecorder(
            now=self.clock.now,
            metrics=(
                RequestMetrics(registry, tenant_labels=obs.tenant_labels)
                if obs.request_metrics
                else None
            ),
            default_slo=slo_of(config.slo),
            registry=registry,
        )

    @property
    def model(self) -> ModelDispatch | None:
        """The first served model (None before start)."""
        if self.fleet is None or not self.fleet.models:
            return None
        return next(iter(self.fleet.models.values()))

    @property
    def pool(self) -> WorkerPool | None:
        """The first served model's pool."""
        return self.model.pool if self.model is not None else None

    @property
    def router(self) -> Router | None:
        """The first served model's router."""
        return self.model.router if self.model is not None else None

    @property
    def admission(self) -> AdmissionController | None:
        """The first served model's admission queue."""
        return self.admissions[0] if self.admissions else None

    @property
    def sims(self) -> SimLauncher | SglangLauncher | None:
        """The first model's launcher of homing's own workers (None with listed workers)."""
        return self.launchers[0] if self.launchers else None

    async def __aenter__(self) -> App:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Bring everything up; raises on a worker or listener that cannot start."""
        cfg = self.config
        gw = cfg.gateway
        listeners = [(gw.grpc_host, gw.grpc_port)]
        if "http" not in self.listen_sockets:
            listeners.insert(0, (gw.host, gw.port))
        for host, port in listeners:
            _ensure_bindable(host, port)  # fail fast, before any worker is started
        admin_socket = self._admin_settings().socket_path()
        if admin_socket is not None:
            prepare_socket(admin_socket)  # another live gateway on it: fail fast too
        if cfg.admin.enabled and cfg.admin.port is not None:
            _ensure_bindable(cfg.admin.host, cfg.admin.port)
        self._started_at = self.clock.now()
        self.loop_busy.start()
        try:
            specs = cfg.served_models()
            # Workers start in parallel; pools are built in config order (ids in that order).
            launched = await gather_or_cancel(*(self._launch(m, i) for i, m in enumerate(specs)))
            models = await gather_or_cancel(
                *(self._start_model(m, *w) for m, w in zip(specs, launched, strict=True))
            )
            self.fleet = Fleet(list(models), drain_timeout_s=gw.drain_timeout_s)
            await self._start_rollouts(self.fleet)
            await self._start_gateway(self.fleet)
            if cfg.admin.enabled:
                await self._start_admin(self.fleet)
            self._start_scaler(specs, list(models))
        except BaseException:
            await self.stop()
            raise
        log.info(
            "serving",
            models={m.model_id: [w.url for w in m.workers()] for m in self.fleet.models.values()},
            http=f"http://{self._http_host()}:{self.http_port}",
            grpc=f"{cfg.gateway.grpc_host}:{self.grpc_port}",
            policy=cfg.router.policy,
            auth="on" if cfg.tenants else "off",
            tenants=len(cfg.tenants),
            quota_backend=cfg.quotas.backend if cfg.tenants else None,
            tls=cfg.gateway.tls_cert_file is not None,
            admin=self.admin.addresses if self.admin is not None else None,
        )

    def _admin_settings(self) -> AdminSettings:
        """`config.admin`, with `state_dir` as its directory when it names none."""
        admin = self.config.admin
        if self.state_dir is None or admin.state_dir is not None:
            return admin
        return admin.model_copy(update={"state_dir": self.state_dir})

    def _http_host(self) -> str:
        """The HTTP listener's host: the handed-over socket's, else the configured one."""
        inherited = self.listen_sockets.get("http")
        if inherited is not None and inherited.family in (socket.AF_INET, socket.AF_INET6):
            return str(inherited.getsockname()[0])
        return self.config.gateway.host

    async def _launch(
        self, spec: ModelSettings, index: int
    ) -> tuple[list[str | WorkerSpec], float]:
        """The model's workers, started first when homing runs its own (embedded), and the
        health-probe timeout for them (seconds). With the model's autoscaler on, its
        actuator starts them (`min_replicas`, at least one: the pool learns its model from
        a worker) and is kept for the scaler (`_actuators[index]`)."""
        cfg = self.config
        workers: list[str | WorkerSpec] = [WorkerSpec(u, v) for u, v in spec.worker_specs()]
        health_timeout_s = cfg.engines.health_timeout_s
        scaler = cfg.scaler_of(spec)
        if scaler.enabled:
            if not workers and cfg.engines.launch == "sglang":
                health_timeout_s = cfg.sglang.health_timeout_s
            actuator = build_actuator(cfg, spec, scaler, clock=self.clock)
            self._actuators[index] = actuator
            count = 0 if workers else max(1, scaler.min_replicas)
            urls = await start_members(
                actuator, count, scaler.startup_timeout_s + 30.0, clock=self.clock
            )
            known = {w.url for w in workers if isinstance(w, WorkerSpec)}
            workers += [WorkerSpec(u, spec.version) for u in urls if u not in known]
            return workers, health_timeout_s
        if not workers and cfg.engines.launch == "sglang":
            # Real engines: HealthCheck is a generation inside the engine (SglangSettings).
            health_timeout_s = cfg.sglang.health_timeout_s
            launcher: SimLauncher | SglangLauncher = SglangLauncher(
                cfg.sglang, page_size=cfg.router.block_size
            )
            self.launchers.append(launcher)
            # In parallel; each child gives SGLang its own startup timeout after it has
            # checked its input (a second or two), hence the margin.
            urls = await launcher.start(timeout_s=cfg.sglang.startup_timeout_s + 30.0)
            workers = [WorkerSpec(u, spec.version) for u in urls]
        elif not workers:
            assert spec.sim is not None
            launcher = SimLauncher(spec.sim)
            self.launchers.append(launcher)
            urls = await launcher.start(timeout_s=cfg.engines.startup_timeout_s)
            workers = [WorkerSpec(u, spec.version) for u in urls]
        return workers, health_timeout_s

    def _start_model(
        self, spec: ModelSettings, workers: list[str | WorkerSpec], health_timeout_s: float
    ) -> Awaitable[ModelDispatch]:
        """Build the model's pool now (worker ids taken in call order); the awaitable
        starts it, its tokenizer, admission and metrics."""
        cfg = self.config
        router_settings = _model_router_settings(cfg.router, spec)
        router = router_from_settings(router_settings, clock=self.clock)
        holder: list[str] = []  # the model's name, once known, for the metrics

        def on_transition(w: WorkerState, before: Phase, action: Action) -> None:
            # The first join comes after discovery, so the pool knows its model by then.
            model = holder[0] if holder else _model_name(pool, spec)
            self.fleet_metrics.on_transition(model, action.value, before.value, w.phase.value)
            if w.phase is Phase.GONE:  # no labelled series outlives the worker
                self.recorder.forget_worker(model, w.worker_id)
            self._on_health_change(w)  # a cordon or drain may leave no worker to serve

        pool = WorkerPool(
            workers,
            router=router,
            model=spec.name,
            new_id=self._ids,
            on_health_change=self._on_health_change,
            on_transition=on_transition,
            clock=self.clock,
            config=PoolConfig(
                health_interval_s=cfg.engines.health_interval_s,
                health_timeout_s=health_timeout_s,
                unhealthy_threshold=cfg.engines.unhealthy_threshold,
                healthy_threshold=cfg.engines.healthy_threshold,
                progress_window_s=cfg.engines.progress_window_s,
                breaker=BreakerConfig(**cfg.engines.breaker.model_dump()),
            ),
        )
        self._pools.append(pool)
        return self._start_pool(spec, pool, router, router_settings, holder)

    async def _start_pool(
        self,
        spec: ModelSettings,
        pool: WorkerPool,
        router: Router,
        router_settings: RouterSettings,
        holder: list[str],
    ) -> ModelDispatch:
        """Start `pool` and build the model's dispatch (`stop` stops the pool on failure);
        with `engines.outliers.enabled` its outlier ejection runs beside the pool's tasks."""
        cfg = self.config
        await pool.start()
        await pool.wait_ready(cfg.engines.startup_timeout_s)
        if spec.tokenizer_path:
            tokenizer = TextTokenizer.from_dir(spec.tokenizer_path)
        else:
            tokenizer = TextTokenizer.from_bundle(await pool.tokenizer_bundle())
        model_id = pool.served_model_name
        holder.append(model_id)
        apply_model_settings(router, router_settings, model_id)
        intervals = StreamIntervalPolicy(
            spec.stream_interval, clock=self.clock, maximum=spec.max_stream_interval
        )
        if intervals.auto:
            self.loop_busy.add_sink(intervals.observe)
        self.gateway_metrics.stream_interval.labels(model_id).set_function(intervals.interval)
        dispatch = ModelDispatch(
            model_id=model_id,
            tokenizer=tokenizer,
            pool=pool,
            router=router,
            intervals=intervals,
            tool_call_parser=_parser_name(spec.tool_call_parser, detect_tool_parser, tokenizer),
            reasoning_parser=_parser_name(
                spec.reasoning_parser, detect_reasoning_parser, tokenizer
            ),
            system_fingerprint=served_fingerprint(spec, tokenizer),
            created=int(self.clock.wall()),
        )
        dispatch.admission = self._admission(dispatch, router_settings)
        if cfg.scaler_of(spec).enabled:
            meter = self.demand[model_id] = DemandMeter(now=self.clock.now)
            dispatch.demand = meter
            self.recorder.meter_demand(model_id, meter)
        self.router_metrics[model_id] = RouterMetrics(
            router,
            model=model_id,
            registry=self.gateway_metrics.registry,
            workers=lambda: [w.worker_id for w in pool.workers()],
            streams=lambda: {w.worker_id: w.kv_stream for w in pool.workers()},
        ).attach()
        self.fleet_metrics.watch(model_id, lambda: [w.phase.value for w in pool.workers()])
        if spec.slo is not None:
            self.recorder.set_slo(model_id, slo_of(spec.slo))
        self.recorder.watch(model_id, pool.workers)
        engine_metrics = EngineMetrics.on(self.gateway_metrics.registry)
        engine_metrics.watch(model_id, pool.workers)
        outliers = cfg.engines.outliers
        if outliers.enabled:
            ejector = OutlierEjector(
                pool,
                model=model_id,
                snapshots=lambda: [
                    self.recorder.replicas.snapshot(model_id, w, outliers.window_s)
                    for w in pool.workers()
                ],
                config=OutlierConfig(**outliers.model_dump(exclude={"enabled"})),
                clock=self.clock,
                metrics=engine_metrics,
            )
            pool.run_beside(ejector.run(), name=f"outliers-{model_id}")
        return dispatch

    def _admission(self, model: ModelDispatch, router: RouterSettings) -> AdmissionController:
        admission = AdmissionController(
            self.config.admission,
            model_id=model.model_id,
            # lazy: the fast path stops at the first replica that is not overloaded
            snapshots=model.snapshots,
            metrics=self.gateway_metrics,
            # The router's own overload thresholds: admission queues exactly when the router
            # would find no replica it is willing to load further.
            thresholds=policy_configs(router, model.model_id)[1].overload,
            clock=self.clock,
        )
        self.admissions.append(admission)
        return admission

    async def _start_gateway(self, fleet: Fleet) -> None:
        """Keys, quotas, the inference service and both listeners."""
        cfg = self.config
        gw = cfg.gateway
        metrics = self.gateway_metrics
        metrics.start_at_zero((t.name for t in cfg.tenants), get_args(QuotaKind))
        keyring = self.keyring = KeyRing(cfg.tenants, metrics)
        if cfg.tenants:
            # The in-process store keeps its windows on the App's clock; Redis on its own
            # server's TIME, shared by every gateway instance.
            store_clock = self.clock if cfg.quotas.backend == "memory" else None
            self.quotas = QuotaGuard(
                build_store(cfg.quotas, clock=store_clock),
                settings=cfg.quotas,
                metrics=metrics,
                clock=self.clock,
            )
            self.quotas.start()
            await self._check_quota_store()
        self.service = InferenceService(
            fleet,
            request_timeout_s=gw.request_timeout_s,
            max_messages=gw.max_messages,
            quotas=self.quotas,
            admissions=self.admissions,
            recorder=self.recorder,
            retry=RetryPolicy.from_router(cfg.router),
            migrate_streams=cfg.router.migrate_streams,
            metrics=metrics,
            clock=self.clock,
        )
        self.http = HttpApi(
            self.service,
            max_body_bytes=gw.max_body_bytes,
            keyring=keyring,
            max_header_bytes=gw.max_header_bytes,
            max_header_count=gw.max_header_count,
            header_timeout_s=gw.header_timeout_s,
            body_timeout_s=gw.body_timeout_s,
        )
        self.http.metrics_registry = metrics.registry
        ssl_context = None
        tls = None
        if gw.tls_cert_file is not None and gw.tls_key_file is not None:
            ssl_context = server_ssl_context(gw.tls_cert_file, gw.tls_key_file)
            tls = read_pem_pair(gw.tls_cert_file, gw.tls_key_file)
        # JSON errors and our limits on aiohttp's HTTP parser (homing.gateway.http_server).
        self._runner = GatewayRunner(
            self.http.app,
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=1.0,
            **self.http.runner_kwargs(),
        )
        await self._runner.setup()
        inherited = self.listen_sockets.get("http")
        site: web.BaseSite
        if inherited is not None:
            site = web.SockSite(self._runner, inherited, ssl_context=ssl_context)
        else:
            site = web.TCPSite(self._runner, gw.host, gw.port, ssl_context=ssl_context)
        await site.start()
        self.http_port = _bound_port(self._runner)
        self.grpc = GrpcApi(
            self.service,
            host=gw.grpc_host,
            port=gw.grpc_port,
            max_message_bytes=gw.max_body_bytes,
            keyring=keyring,
            max_metadata_bytes=gw.max_header_bytes,
            idle_timeout_s=gw.header_timeout_s,
            tls=tls,
        )
        self.grpc_port = self.grpc.port
        await self.grpc.start()

    async def _start_rollouts(self, fleet: Fleet) -> None:
        """Each model's version split and rollout, restored from the store (RuntimeError
        "rollouts: ..." when it cannot be read: a restart must not forget a rollback), and
        the task that takes their verdicts."""
        store, self._rollout_redis = build_rollout_store(
            self.config, state_dir=self._admin_settings().state_dir
        )
        controller = build_controller(
            self.config, fleet, self.recorder, self.gateway_metrics.registry, store, self.clock
        )
        try:
            await controller.restore()
        except RolloutStoreError as err:
            raise RuntimeError(f"rollouts: {err}") from None
        self.rollouts = controller
        self._rollout_task = asyncio.get_running_loop().create_task(
            controller.run(), name="rollouts"
        )

    def _start_scaler(self, specs: list[ModelSettings], models: list[ModelDispatch]) -> None:
        """The autoscaler of every model whose `scaler` is enabled, as one task."""
        assert self.fleet is not None
        cfg = self.config
        pools: list[PoolScaler] = []
        recorder = self.recorder
        for i, (spec, dispatch) in enumerate(zip(specs, models, strict=True)):
            actuator = self._actuators.get(i)
            if actuator is None:
                continue
            settings = cfg.scaler_of(spec)
            model_id = dispatch.model_id
            sim = cfg.launched_sim(spec)
            slo = self.recorder.slo(model_id)
            decode, prefill, source = seed_capacity(settings, sim, slo)
            gpus = gpus_per_replica(settings, sim)
            if self.scaler_metrics is None:
                self.scaler_metrics = ScalerMetrics(self.gateway_metrics.registry)
            pools.append(
                PoolScaler(
                    dispatch=dispatch,
                    fleet=self.fleet,
                    actuator=actuator,
                    config=scaler_config(settings, gpus=gpus),
                    estimator=CapacityEstimator(
                        tpot_slo_s=slo.rule_tpot_s,
                        seed_decode_streams=decode,
                        seed_prefill_tokens_per_s=prefill,
                    ),
                    demand=self.demand[model_id],
                    snapshot=lambda w, window, m=model_id: recorder.replicas.snapshot(m, w, window),
                    burn_rate=lambda m=model_id: recorder.tracker(m).burn_rate(
                        SCALER_BURN_WINDOW_S
                    ),
                    ttft_slo_s=slo.rule_ttft_s,
                    clock=self.clock,
                    advisory=settings.mode == "advisory",
                    drain_timeout_s=cfg.gateway.request_timeout_s + CUT_GRACE_S,
                    version=spec.version,
                    metrics=self.scaler_metrics,
                    elector=self._elector(settings, model_id),
                )
            )
            log.info(
                "scaler_on",
                model=model_id,
                mode=settings.mode,
                actuator=actuator.kind,
                replicas=[settings.min_replicas, settings.max_replicas],
                decode_streams_per_replica=round(decode, 2),
                prefill_tokens_per_s_per_replica=round(prefill, 1),
                capacity_source=source,
                gpus_per_replica=gpus,
            )
        if not pools:
            return
        scaler = self.scaler = Scaler(
            pools,
            clock=self.clock,
            tick_s=min(p.config.tick_s for p in pools),
            gpu_budget=cfg.scaler.gpu_budget,
        )
        for p in pools:
            if p.config.scale_to_zero and p.config.min_replicas == 0 and not p.advisory:
                self._hold_at_zero(p, scaler)
        scaler.start()
        for p in pools:
            if not isinstance(p.elector, SingleElector):
                elect = asyncio.get_running_loop().create_task(
                    p.elector.run(), name=f"scaler-leader-{p.model}"
                )
                self._electors.append(elect)
        task = asyncio.get_running_loop().create_task(scaler.run(), name="scaler")
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        self._scaler_task = task

    def _elector(self, settings: ScalerSettings, model_id: str) -> Elector:
        """Who actuates `model_id`'s pool among the gateway instances (`scaler.leader`)."""
        identity = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        if settings.leader == "redis":
            import redis.asyncio as aioredis

            url = settings.leader_redis_url or self.config.quotas.redis_url
            if self._leader_redis is None:
                self._leader_redis = aioredis.Redis.from_url(url)
            return RedisElector(
                self._leader_redis,
                name=model_id,
                identity=identity,
                clock=self.clock,
                lease_s=settings.leader_lease_s,
                key_prefix=self.config.quotas.key_prefix,
            )
        if settings.leader == "kubernetes":
            k = settings.kubernetes
            namespace = settings.leader_namespace or (k.namespace if k else "default")
            return KubernetesElector(
                namespace=namespace,
                name=lease_name(model_id),
                identity=identity,
                clock=self.clock,
                lease_s=settings.leader_lease_s,
                kubeconfig=k.kubeconfig if k else None,
            )
        return SingleElector()

    def _hold_at_zero(self, p: PoolScaler, scaler: Scaler) -> None:
        """Scale to zero: the model's requests wait at no replica, wake the scaler, and are
        refused past the queue timeout with the expected start as Retry-After."""
        admission = p.dispatch.admission
        if not isinstance(admission, AdmissionController) or not admission.settings.enabled:
            log.warning("scale_to_zero_without_admission", model=p.model)
            return
        admission.hold_when_empty = True
        admission.on_hold = scaler.wake
        actuator, default = p.actuator, p.config.default_cold_start_s

        def expected_start_s() -> float:
            measured = actuator.cold_start_s()
            return measured if measured is not None else default

        admission.expected_start_s = expected_start_s
        p.dispatch.scales_from_zero = True

    async def _start_admin(self, fleet: Fleet) -> None:
        """The admin API on its socket (and TCP port when configured)."""
        service = self.service
        self.admin = AdminServer(
            fleet,
            self._admin_settings(),
            tenants=self.config.tenants,
            quotas=self.quotas,
            in_flight=lambda: service.in_flight if service is not None else 0,
            started_at=self._started_at,
            clock=self.clock,
            scaler=lambda: self.scaler,  # it starts after the admin API
            rollouts=self.rollouts,
        )
        await self.admin.start()

    async def _check_quota_store(self) -> None:
        """Log whether the quota store answers; serving starts either way (requests get
        503 or pass uncounted, per `quotas.on_store_error`, until it does)."""
        assert self.quotas is not None
        q = self.config.quotas
        try:
            await self.quotas.store.ping()
        except QuotaStoreError as err:
            log.warning("quota_store_unavailable", operation="start", error=str(err))
        else:
            log.info("quota_store", backend=q.backend, on_store_error=q.on_store_error)

    def _on_health_change(self, state: WorkerState) -> None:
        """Keep the gRPC health service in step with the fleet (SERVING iff some model has a
        ready, healthy worker); called on health flips and lifecycle transitions."""
        if self.grpc is None or self.fleet is None or self._stopping:
            return
        serving = any(m.can_serve for m in self.fleet.models.values())
        task = asyncio.get_running_loop().create_task(self.grpc.set_serving(serving))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def stop(self) -> None:
        """Drain and stop; safe to call more than once and after a failed start."""
        self._stopping = True
        self.loop_busy.stop()
        if self._scaler_task is not None:  # no scaling decision races the shutdown
            self._scaler_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scaler_task
            self._scaler_task = None
        if self.scaler is not None:  # it no longer joins members nor stops them
            await self.scaler.close()
            self.scaler = None
        electors, self._electors = self._electors, []
        for task in electors:  # each releases its lease: another instance leads at once
            task.cancel()
        await asyncio.gather(*electors, return_exceptions=True)
        if self._leader_redis is not None:
            await self._leader_redis.aclose()
            self._leader_redis = None
        if self._rollout_task is not None:
            self._rollout_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rollout_task
            self._rollout_task = None
        if self._rollout_redis is not None:
            await self._rollout_redis.aclose()
            self._rollout_redis = None
        try:
            await self._stop_serving()
        finally:
            # The actuators stop what they started (local processes) once the pools are
            # down, or after whatever failed above.
            actuators, self._actuators = list(self._actuators.values()), {}
            await asyncio.gather(*(a.close() for a in actuators), return_exceptions=True)

    async def _stop_serving(self) -> None:
        """`stop` after the autoscaler: listeners, the drain, admission, quotas, pools."""
        drain = self.config.gateway.drain_timeout_s
        if self.admin is not None:
            await self.admin.stop()  # no worker operation may race the shutdown
            self.admin = None
        if self.service is not None:
            self.service.stop_accepting()  # keep-alive connections may still send requests
        # Stop accepting on both listeners at once; open HTTP streams and gRPC calls go on
        # until they finish or the drain timeout passes.
        grpc_stopped = None
        if self.grpc is not None:
            # gRPC's own grace outlasts ours, so cut calls end with our status, not its.
            grpc_stopped = asyncio.get_running_loop().create_task(
                self.grpc.stop(grace_s=drain + CUT_GRACE_S)
            )
        if self._runner is not None:
            for site in list(self._runner.sites):
                await site.stop()
        if self.service is not None and self.service.in_flight:
            log.info("draining", in_flight=self.service.in_flight, timeout_s=drain)
            if not await self.service.drained(drain):
                cut = self.service.interrupt_all(lambda: drained(drain), outcome="drained")
                log.warning("drain_timeout", cut=cut, timeout_s=drain)
                # The cut requests send their error (a stream as its last event) and end.
                if not await self.service.drained(CUT_GRACE_S):
                    log.warning("drain_cut_timeout", in_flight=self.service.in_flight)
        if grpc_stopped is not None:
            await grpc_stopped
            self.grpc = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        for admission in self.admissions:
            await admission.stop()
        self.admissions = []
        if self.quotas is not None:
            await self.quotas.stop()
            self.quotas = None
        if self.fleet is not None:
            await self.fleet.stop()
        pools, self._pools = self._pools, []
        await asyncio.gather(*(pool.stop() for pool in pools))
        launchers, self.launchers = self.launchers, []
        await asyncio.gather(*(launcher.stop() for launcher in launchers))

    # -- readiness and status --

    async def wait_min_ready(self, minimum: int, timeout_s: float) -> None:
        """Return once every model has at least `minimum` ready workers; TimeoutError naming
        the models short of it after `timeout_s` (on the app's clock). Woken by the pools'
        changes (`WorkerPool.subscribe`: health, phase, breaker, membership), not by
        polling."""
        assert self.fleet is not None
        models = list(self.fleet.models.values())
        changed = asyncio.Event()

        def short() -> dict[str, int]:
            counts = {m.model_id: m.ready_workers for m in models}
            return {k: v for k, v in counts.items() if v < minimum}

        unsubscribe = [m.pool.subscribe(changed.set) for m in models]
        try:
            async with self.clock.timeout(timeout_s):
                while short():
                    changed.clear()
                    await changed.wait()
        except TimeoutError:
            shown = ", ".join(f"{k} has {v}" for k, v in short().items())
            raise TimeoutError(
                f"fewer than {minimum} ready workers after {timeout_s:g} s ({shown})"
            ) from None
        finally:
            for stop in unsubscribe:
                stop()

    def status_line(self, requests_per_s: float | None = None) -> str:
        """One line for `systemctl status`: each model's ready / all workers, the request
        rate (when given) and the requests in flight."""
        if self.fleet is None:
            return "starting"
        models = ", ".join(
            f"{m.model_id} {m.ready_workers}/{len(m.workers())} ready"
            for m in self.fleet.models.values()
        )
        parts = [f"serving {models}"]
        if requests_per_s is not None:
            parts.append(f"{requests_per_s:.1f} req/s")
        parts.append(f"{self.service.in_flight if self.service else 0} in flight")
        return "; ".join(parts)

    # -- reload --

    async def reload(self, new: HomingConfig) -> ReloadPlan:
        """Serve `new` from now on without dropping a request (`homing.daemon.reload` says
        what may change). Requests already routed keep what they were admitted under;
        removed workers drain; a listed worker still draining from an earlier reload serves
        again. Everything that can be checked is checked before anything is applied:
        `ReloadRefused` (nothing applied) when `new` needs a restart or cannot be served
        as it is (a URL another model has, a model left with fewer ready workers than
        `daemon.min_ready_workers`). Returns the plan with what became of the added
        workers (`ReloadPlan.outcome`): one its pool refuses (another model or tokenizer)
        is dropped and named in `failed`, one not reachable yet stays joining and joins
        when it answers, as at startup."""
        if self.fleet is None or self.service is None:
            raise ReloadRefused("the gateway is not serving yet")
        plan = plan_reload(self.config, new)
        if not plan.applies:
            raise ReloadRefused(plan.refusal())
        if plan.empty:
            return plan
        steps = self._worker_steps(plan, new)  # ReloadRefused before anything is applied
        # Every in-place change first, with no await between: requests see old or new.
        if plan.tenants:
            self._reload_tenants(new.tenants)
        if plan.routing:
            self._reload_routing(new)
        if plan.slo:
            self._reload_slos(new)
        if plan.timeouts:
            self.service.request_timeout_s = new.gateway.request_timeout_s
            self.fleet.drain_timeout_s = new.gateway.drain_timeout_s
        if plan.retries:
            self.service.configure_retries(
                RetryPolicy.from_router(new.router), migrate_streams=new.router.migrate_streams
            )
        if self.admin is not None and (plan.admin_keys or plan.tenants):
            self.admin.update(tenants=new.tenants, keys=new.admin.keys, quotas=self.quotas)
        self.config = new
        return await self._reload_workers(plan, steps, new)

    def _reload_tenants(self, tenants: list[TenantSettings]) -> None:
        """New keys and quotas; the plan keeps authentication on (or off) as it was."""
        assert self.keyring is not None
        self.gateway_metrics.start_at_zero((t.name for t in tenants), get_args(QuotaKind))
        self.keyring.replace(tenants)

    def _reload_routing(self, new: HomingConfig) -> None:
        assert self.fleet is not None
        specs = zip(self.config.served_models(), new.served_models(), strict=True)
        for (was, spec), m in zip(specs, self.fleet.models.values(), strict=True):
            before = policy_configs(_model_router_settings(self.config.router, was), m.model_id)
            after = policy_configs(_model_router_settings(new.router, spec), m.model_id)
            policy, cache_aware, consistent_hash = after
            if after != before:  # a new policy starts with fresh state (its ring, counters)
                m.router.set_policy(
                    policy, cache_aware=cache_aware, consistent_hash=consistent_hash
                )
                log.info("router_policy_reloaded", model=m.model_id, policy=policy)
            admission = m.admission
            if isinstance(admission, AdmissionController):
                admission.thresholds = cache_aware.overload

    def _reload_slos(self, new: HomingConfig) -> None:
        assert self.fleet is not None
        self.recorder.default_slo = slo_of(new.slo)
        for spec, m in zip(new.served_models(), self.fleet.models.values(), strict=True):
            self.recorder.set_slo(m.model_id, slo_of(spec.slo or new.slo))

    def _worker_steps(self, plan: ReloadPlan, new: HomingConfig) -> list[_WorkerSteps]:
        """What the plan's worker changes do to the live pools; `ReloadRefused` naming every
        problem when an added URL belongs to another model or has another version, or a
        model would keep fewer ready workers than `daemon.min_ready_workers`."""
        assert self.fleet is not None
        models = list(self.fleet.models.values())
        owners = {w.url: (m, w) for m, w in self.fleet.workers()}
        minimum = new.daemon.min_ready_workers
        problems: list[str] = []
        out: list[_WorkerSteps] = []
        for change in plan.workers:
            m = models[change.model_index]
            steps = _WorkerSteps(m)
            removed = set(change.removed)
            leaving = [w for w in m.workers() if w.url in removed and not w.draining]
            steps.drains = [w.worker_id for w in leaving]
            back: list[WorkerState] = []
            for url, version in change.added:
                owner, w = owners.get(url, (None, None))
                if owner is None or w is None:
                    steps.adds.append((url, version))
                elif owner is not m:
                    problems.append(
                        f"worker {url} is worker {w.worker_id} of model {owner.model_id!r}; "
                        f"it can join model {m.model_id!r} once it has left that one"
                    )
                elif w.version != version:
                    problems.append(
                        f"worker {url} is already worker {w.worker_id} with version "
                        f"{w.version!r}, not {version!r}; remove it and list it again once "
                        "it has left"
                    )
                elif w.undrainable:
                    steps.rejoins.append(w.worker_id)
                    back.append(w)
                elif w.draining:
                    problems.append(
                        f"worker {url} is worker {w.worker_id}, draining since it was "
                        f"{w.drained_from.value if w.drained_from else 'joining'}; list it "
                        "again once it has left"
                    )
                # else: added through the admin API, listed from now on; it stays as it is
            lost = sum(1 for w in leaving if w.routable)
            left = m.ready_workers - lost + sum(1 for w in back if _ready_once_back(w))
            if lost and left < minimum:
                hint = (
                    "the workers it adds are not ready yet: add them in one reload and "
                    "remove the old ones in the next, once they serve"
                    if steps.adds
                    else "keep more of its workers listed"
                )
                problems.append(
                    f"model {m.model_id!r} would be left with {left} ready "
                    f"{'worker' if left == 1 else 'workers'}, fewer than "
                    f"daemon.min_ready_workers ({minimum}); {hint}"
                )
            out.append(steps)
        if problems:
            raise ReloadRefused(reload_refusal(rejected=tuple(problems)))
        return out

    async def _reload_workers(
        self, plan: ReloadPlan, steps: list[_WorkerSteps], new: HomingConfig
    ) -> ReloadPlan:
        """Serve the draining workers listed again, drain the removed ones (they finish
        every request: the drain may last as long as a request may) and add the new ones
        concurrently; the plan with what became of each."""
        assert self.fleet is not None
        rejoined: list[str] = []
        adds = []
        for s in steps:
            for worker_id in s.rejoins:
                state = self.fleet.undrain(worker_id)
                rejoined.append(state.url)
                log.info("worker_reload_undrain", model=s.model.model_id, worker=worker_id)
            for worker_id in s.drains:
                self.fleet.drain(worker_id, timeout_s=new.gateway.request_timeout_s)
                log.info("worker_reload_drain", model=s.model.model_id, worker=worker_id)
            adds += [self._reload_add(s.model.model_id, url, version) for url, version in s.adds]
        results = await asyncio.gather(*adds)
        failed = tuple((url, why) for url, why, _ in results if why is not None)
        joining = tuple(
            url for url, _, state in results if state is not None and state.phase is Phase.JOINING
        )
        return plan.with_results(failed=failed, joining=joining, rejoined=tuple(rejoined))

    async def _reload_add(
        self, model: str, url: str, version: str
    ) -> tuple[str, str | None, WorkerState | None]:
        """Add one listed worker: (url, why it did not join or None, its state or None)."""
        assert self.fleet is not None
        try:
            state = await self.fleet.add_worker(model, url, version)
        except FleetError as err:
            log.error("worker_reload_add_failed", model=model, url=url, error=str(err))
            return url, str(err), None
        log.info(
            "worker_reload_added",
            model=model,
            worker=state.worker_id,
            url=url,
            phase=state.phase.value,
        )
        return url, None, state


class _WorkerSteps:
    """One model's worker changes against its live pool: worker ids to `drains` and to
    serve again (`rejoins`), and (url, version) to `adds`."""

    def __init__(self, model: ModelDispatch) -> None:
        self.model = model
        self.drains: list[str] = []
        self.rejoins: list[str] = []
        self.adds: list[tuple[str, str]] = []


def _ready_once_back(w: WorkerState) -> bool:
    """Whether a draining worker would take requests as soon as it serves again."""
    return w.drained_from is Phase.READY and w.admits


class ReloadRefused(Exception):
    """A reload that was not applied; the message says why and what to do."""


def _model_router_settings(router: RouterSettings, spec: ModelSettings) -> RouterSettings:
    """`router` with `spec`'s own policy and weights as its per-model override."""
    if spec.name is None or (spec.policy is None and spec.weights is None):
        return router
    override = RouterModelSettings(policy=spec.policy, weights=spec.weights)
    return router.model_copy(update={"models": {**router.models, spec.name: override}})


def slo_of(settings: SloSettings) -> Slo:
    """The SLO a config section describes."""
    return Slo(
        ttft_p95_s=settings.ttft_p95_s,
        tpot_p95_s=settings.tpot_p95_s,
        ttft_s=settings.request_ttft_s,
        tpot_s=settings.request_tpot_s,
        objective=settings.objective,
    )


def _parser_name(
    configured: str | None,
    detect: Callable[[str | None], str | None],
    tokenizer: TextTokenizer,
) -> str | None:
    """The parser a model's config names ("none": None), else the one its template implies."""
    if configured is not None:
        return None if configured == "none" else configured
    return detect(tokenizer.chat_template)


_ANSWER_FIELDS: dict[str, Any] = {
    "name": True,
    "sim": {"model", "served_model_name", "extra_args"},
    "tokenizer_path": True,
    "version": True,
    "tool_call_parser": True,
    "reasoning_parser": True,
}
"""The fields of a model's config entry that shape its answers (`served_fingerprint`, as
pydantic's `include`); routing, workers (and their count, GPU or speed), SLO and scaling
do not."""


def served_fingerprint(spec: ModelSettings, tokenizer: TextTokenizer) -> str:
    """`system_fingerprint`: "fp_" and 12 hex digits of a hash of what shapes the model's
    answers (`_ANSWER_FIELDS` of its config entry, and its chat template), which changes
    when they do (as OpenAI's marks backend changes that affect determinism)."""
    served = spec.model_dump_json(include=_ANSWER_FIELDS)
    served += "\x00" + (tokenizer.chat_template or "")
    return "fp_" + hashlib.sha256(served.encode()).hexdigest()[:12]


def _model_name(pool: WorkerPool, spec: ModelSettings) -> str:
    """The pool's served model name, or the configured one before any worker answered."""
    try:
        return pool.served_model_name
    except RuntimeError:
        return spec.name or ""


def _ensure_bindable(host: str, port: int) -> None:
    """Raise OSError naming the address when `host:port` cannot be listened on."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise OSError(err.errno, f"cannot listen on {host}:{port}: {err.strerror}") from None


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    raise RuntimeError("HTTP listener has no bound address")
