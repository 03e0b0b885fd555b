"""Assembly: the components one `homing serve` process is built from, made from its config.

Rule of the file: each step builds its components and starts them (workers, pools, quotas,
the rollout and scaler tasks, leader electors); which steps run, and in which order, is
`root.App.start`'s. Each served model gets its workers (homing's own, started here when it
runs them: simulated, real SGLang, or through the model's autoscaler actuator), its pool,
router, tokenizer, admission queue and metrics (`ModelDispatch`); then come the keys, quotas
and inference service the listeners serve, the rollout controller, and the autoscaler with
its leader election. Also here: what shapes a model's answers (`served_fingerprint`) and its
parsers.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from typing import Any, get_args

import structlog

from homing.app.parts import AppParts, model_router_settings, slo_of
from homing.config import ModelSettings, RouterSettings, ScalerSettings, gpus_per_replica
from homing.embedded import SglangLauncher, SimLauncher
from homing.engines.breaker import BreakerConfig
from homing.engines.ejector import OutlierEjector
from homing.engines.lifecycle import Action, Phase
from homing.engines.metrics import EngineMetrics
from homing.engines.outliers import OutlierConfig
from homing.engines.pool import PoolConfig, WorkerPool, WorkerSpec, WorkerState
from homing.engines.pool.shared_in_flight import SharedCount
from homing.fleet import Fleet, ModelDispatch
from homing.fleet.fleet import CUT_GRACE_S
from homing.fleet.stream_interval import StreamIntervalPolicy
from homing.gateway.admission import AdmissionController
from homing.gateway.auth import KeyRing
from homing.gateway.quotas import QuotaGuard, QuotaStore, QuotaStoreError, build_store
from homing.gateway.quotas.shared import RemoteQuotaStore
from homing.gateway.quotas.types import QuotaKind
from homing.gateway.retry_budget import RetryPolicy
from homing.gateway.service import InferenceService
from homing.obs.demand import DemandMeter
from homing.obs.metrics import RouterMetrics
from homing.rollout.build import build_controller
from homing.rollout.build import build_store as build_rollout_store
from homing.rollout.store import RolloutStoreError
from homing.router import Router
from homing.router.settings import apply_model_settings, policy_configs, router_from_settings
from homing.scaler.build import build_actuator, start_members
from homing.scaler.capacity import CapacityEstimator
from homing.scaler.leader import Elector, RedisElector, SingleElector
from homing.scaler.loop import PoolScaler, Scaler
from homing.scaler.metrics import ScalerMetrics
from homing.scaler.settings import scaler_config, seed_capacity
from homing.text.parsers import detect_reasoning_parser, detect_tool_parser
from homing.text.tokenizer import TextTokenizer, tokenizer_from_bundle

log = structlog.get_logger("homing.app")


#: The in-flight board's entry for the gateway processes' own requests (no worker URL).
REQUESTS_KEY = "homing:requests"

#: The SLO burn-rate window the autoscaler's fast path reads (seconds): the shortest of
#: `homing.obs.slo.BURN_WINDOWS`, the one a traffic step moves first.
SCALER_BURN_WINDOW_S = 300.0


class Assembly(AppParts):
    """The building steps of an `App`; each fills the fields of `AppParts` it makes."""

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
        if self.follow is not None:  # a follower launches nothing: it serves the leader's
            return workers, health_timeout_s
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
        router_settings = model_router_settings(cfg.router, spec)
        cap = cfg.admission.max_in_flight_per_replica
        router = router_from_settings(router_settings, clock=self.clock, max_in_flight=cap)
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
            shared=self.shared_in_flight,
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
            # Off the loop, though the parse holds the GIL for much of a first build.
            bundle = await pool.tokenizer_bundle()
            tokenizer = await asyncio.to_thread(tokenizer_from_bundle, bundle)
        model_id = pool.served_model_name
        holder.append(model_id)
        cap = self.config.admission.max_in_flight_per_replica
        apply_model_settings(router, router_settings, model_id, max_in_flight=cap)
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
            thresholds=policy_configs(
                router,
                model.model_id,
                max_in_flight=self.config.admission.max_in_flight_per_replica,
            )[1].overload,
            clock=self.clock,
        )
        self.admissions[model.model_id] = admission
        return admission

    async def _start_service(self, fleet: Fleet) -> None:
        """Keys, quotas and the inference service the listeners serve."""
        cfg = self.config
        gw = cfg.gateway
        metrics = self.gateway_metrics
        metrics.start_at_zero((t.name for t in cfg.tenants), get_args(QuotaKind))
        self.keyring = KeyRing(cfg.tenants, metrics)
        if cfg.tenants:
            # The in-process store keeps its windows on the App's clock; Redis on its own
            # server's TIME, shared by every gateway instance.
            store_clock = self.clock if cfg.quotas.backend == "memory" else None
            store: QuotaStore = build_store(cfg.quotas, clock=store_clock)
            if self.follow is not None and self.follow.quotas is not None:
                # A follower's memory backend is its leader's (one store for the box).
                store = RemoteQuotaStore(self.follow.quotas, timeout_s=cfg.quotas.store_timeout_s)
            self.quotas = QuotaGuard(
                store,
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
            admissions=list(self.admissions.values()),
            recorder=self.recorder,
            retry=RetryPolicy.from_router(cfg.router),
            migrate_streams=cfg.router.migrate_streams,
            metrics=metrics,
            clock=self.clock,
            shared=self._shared_requests(),
        )

    def _shared_requests(self) -> SharedCount | None:
        """Where this process publishes its requests in flight, with several processes."""
        if self.shared_in_flight is None:
            return None
        board, index = self.shared_in_flight
        slot = board.slot(REQUESTS_KEY)
        return SharedCount(board, index, slot) if slot is not None else None

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

    async def _start_rollouts(self, fleet: Fleet) -> None:
        """Each model's version split and rollout, restored from the store (RuntimeError
        "rollouts: ..." when it cannot be read: a restart must not forget a rollback), and
        the task that takes their verdicts and saves them (none in a follower: the store is
        its leader's, which alone writes it)."""
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
        if self.follow is not None:  # it routes by the leader's stored split, writes none
            return
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
            if p.elector.campaigns:
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
            from homing.scaler.leader_kubernetes import KubernetesElector, lease_name

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
        admission = self.admissions.get(p.dispatch.model_id)
        if admission is None or not admission.settings.enabled:
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
