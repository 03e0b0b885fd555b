"""One simulated SGLang worker: a grpc.aio server on a loopback port around an `EngineLoop`,
with its HTTP sidecar (metrics, faults) on the next port.

Rule of this file: composition and lifecycle only. It resolves the preset (timing model and
limits), wires tokenizer -> planner, scheduler -> engine loop -> KV-event hub, registers
`SglangScheduler` and `grpc.health.v1` (SERVING) and nothing else, and owns start, stop and
the fault actions:
- ports: the gRPC server on `port` and the sidecar on `port + 1`; with port 0 a free pair
  (P, P + 1) is chosen;
- restart: the gRPC server and engine go away at once (open streams are cut, as when a process
  dies) and come back on the same port with an empty cache, a new KV-event sequence (starting
  at 1 again) and no faults; the sidecar stays up;
- crash: gRPC server, engine and sidecar stop at once, without ending any stream cleanly; then
  `on_crash` is called (the `homing sim` process exits when all its workers crashed).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from homing.ports import free_port_pair
from homing.sim.config import SimConfig
from homing.sim.engine_loop import EngineLoop, LoopStats
from homing.sim.faults import Fault, FaultState
from homing.sim.generation import OutputPlanner
from homing.sim.kv_events import EngineMemoryInfo, KvEventHub
from homing.sim.metrics import WorkerSnapshot, worker_registry
from homing.sim.scheduler import Scheduler, SchedulerConfig, StepTimer
from homing.sim.servicer import ServedModel, SimSchedulerServicer
from homing.sim.sidecar import Sidecar
from homing.sim.timing import (
    EngineLimits,
    InstantTimer,
    JitteredTimer,
    TimingModel,
    resolve_limits,
)

SERVICE_NAME = "sglang.grpc.scheduler.SglangScheduler"
"""Full name of the served service (grpc.health.v1 reports it SERVING)."""

GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
]


def resolve_worker(config: SimConfig) -> tuple[TimingModel, EngineLimits]:
    """The timing model and limits `config` implies; raises ValueError for an unknown preset
    or a model that does not fit."""
    timing = TimingModel.from_names(config.model, config.gpu, config.tp)
    limits = resolve_limits(
        timing,
        page_size=config.page_size,
        kv_capacity_tokens=config.kv_capacity_tokens,
        max_running_requests=config.max_running_requests,
        max_context_length=config.max_context_length,
        mem_fraction_static=config.mem_fraction_static,
    )
    return timing, limits


class _Engine:
    """One incarnation of the worker's engine (a restart builds a new one)."""

    def __init__(
        self,
        engine: EngineLoop,
        hub: KvEventHub,
        server: grpc.aio.Server,
        health_servicer: health.aio.HealthServicer,
    ) -> None:
        self.engine = engine
        self.hub = hub
        self.server = server
        self.health = health_servicer

    async def stop(self, grace_s: float | None) -> None:
        """Stop this incarnation; `grace_s` None cuts every open RPC at once."""
        if grace_s is not None:
            await self.health.enter_graceful_shutdown()
            await self.engine.stop()
            self.hub.close()
            await self.server.stop(grace_s)
        else:
            await self.server.stop(None)
            await self.engine.stop()
            self.hub.close()


class SimWorker:
    """A simulated worker serving gRPC on `host:port` and its sidecar on port + 1 (port 0 = a
    free pair); see the module docstring.

    Raises ValueError at construction for an unknown preset or a model that does not fit.
    """

    def __init__(
        self,
        config: SimConfig,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        sidecar: bool = True,
        on_crash: Callable[[SimWorker], object] | None = None,
    ) -> None:
        self.config = config
        self.host = host
        self._requested_port = port
        self.port = 0
        self.metrics_port: int | None = None
        self.timing, self.limits = resolve_worker(config)
        self.faults = FaultState()
        self.restarts = 0
        self.crashed = False
        self._with_sidecar = sidecar
        self._on_crash = on_crash
        self._current: _Engine | None = None
        self._sidecar: Sidecar | None = None
        self._served: ServedModel | None = None
        self._planner: OutputPlanner | None = None
        self._eos: frozenset[int] = frozenset()
        self._last_stats = LoopStats()
        self._rng = random.Random(config.seed)

    @property
    def url(self) -> str:
        """`grpc://host:port` once started."""
        return f"grpc://{self.host}:{self.port}"

    @property
    def engine(self) -> EngineLoop:
        """The engine loop (after `start`)."""
        if self._current is None:
            raise RuntimeError("the worker is not started")
        return self._current.engine

    @property
    def hub(self) -> KvEventHub:
        """The KV-event hub (after `start`)."""
        if self._current is None:
            raise RuntimeError("the worker is not started")
        return self._current.hub

    @property
    def num_running(self) -> int:
        """Requests the scheduler is running now (0 when not serving)."""
        return self._current.engine.scheduler.num_running if self._current else 0

    @property
    def num_waiting(self) -> int:
        """Requests queued in the scheduler now (0 when not serving)."""
        return self._current.engine.scheduler.num_waiting if self._current else 0

    # ---- lifecycle ----

    async def start(self) -> int:
        """Build the engine, bind the ports and serve; returns the gRPC port.
        Raises RuntimeError when a port cannot be bound."""
        from homing.text.served import load_served_tokenizer

        tokenizer = await asyncio.to_thread(load_served_tokenizer)
        self._served = ServedModel(
            vocab_size=tokenizer.vocab_size,
            eos_token_ids=tokenizer.eos_token_ids,
            bos_token_id=tokenizer.bos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            tokenizer_revision=self.config.tokenizer_revision,
        )
        self._planner = OutputPlanner(
            tokenizer,
            worker_seed=self.config.seed,
            tool_call_share=self.config.tool_call_share,
        )
        self._eos = frozenset(tokenizer.eos_token_ids)
        # With port 0 another process may take the pair between the check and the binds:
        # try a few fresh pairs before giving up.
        attempts = 5 if self._requested_port == 0 else 1
        for attempt in range(attempts):
            port = self._requested_port
            if port == 0 and self._with_sidecar:
                port = free_port_pair(self.host)
            try:
                await self._bind_and_serve(port)
                return self.port
            except RuntimeError:
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    async def _bind_and_serve(self, port: int) -> None:
        """Serve gRPC on `port` and the sidecar on the next port; RuntimeError when either
        cannot be bound (nothing is left running then)."""
        self._current = await self._build(port)
        self.port = self._current_port
        if not self._with_sidecar:
            return
        sidecar = Sidecar(self, worker_registry(self.snapshot))
        try:
            self.metrics_port = await sidecar.start(self.host, self.port + 1)
        except OSError as exc:
            await self._current.stop(None)
            self._current = None
            raise RuntimeError(
                f"cannot bind the sidecar on {self.host}:{self.port + 1}: {exc}"
            ) from exc
        self._sidecar = sidecar

    async def _build(self, port: int) -> _Engine:
        assert self._served is not None and self._planner is not None
        cfg, timing, limits = self.config, self.timing, self.limits
        timer: StepTimer = (
            InstantTimer()
            if cfg.instant
            else JitteredTimer(timing, cfg.jitter, self._rng)
            if cfg.jitter > 0
            else timing
        )
        scheduler = Scheduler(
            SchedulerConfig(
                kv_capacity_tokens=limits.kv_capacity_tokens,
                max_running_requests=limits.max_running_requests,
                page_size=cfg.page_size,
                chunked_prefill_size=cfg.chunked_prefill_size,
                eos_token_ids=self._eos,
                schedule_policy=cfg.schedule_policy,
                max_queued_requests=cfg.max_queued_requests,
                stream_interval=cfg.stream_interval,
            ),
            timer,
        )
        engine = EngineLoop(scheduler, speedup=cfg.speedup, faults=self.faults, instant=cfg.instant)
        hub = KvEventHub(
            engine.load,
            EngineMemoryInfo(
                weight_gb=timing.model.weight_bytes / cfg.tp / 1e9,
                kv_cache_gb=limits.kv_capacity_tokens * timing.kv_bytes_per_token / cfg.tp / 1e9,
                token_capacity=limits.kv_capacity_tokens,
            ),
            heartbeat_busy_s=cfg.heartbeat_busy_s,
            heartbeat_idle_s=cfg.heartbeat_idle_s,
            core_source=scheduler.core_load,
            faults=self.faults,
        )
        engine_callbacks(engine, hub)
        servicer = SimSchedulerServicer(
            cfg,
            engine=engine,
            hub=hub,
            planner=self._planner,
            served=self._served,
            timing=timing,
            limits=limits,
        )
        server = grpc.aio.server(options=GRPC_OPTIONS)
        pb_grpc.add_SglangSchedulerServicer_to_server(servicer, server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        try:
            bound = server.add_insecure_port(f"{self.host}:{port}")
        except RuntimeError as exc:
            raise RuntimeError(f"cannot bind {self.host}:{port}: {exc}") from exc
        if bound == 0:
            raise RuntimeError(f"cannot bind {self.host}:{port}")
        self._current_port = servicer.port = bound
        engine.start()
        await server.start()
        status = health_pb2.HealthCheckResponse.SERVING
        await health_servicer.set("", status)
        await health_servicer.set(SERVICE_NAME, status)
        return _Engine(engine, hub, server, health_servicer)

    async def __aenter__(self) -> SimWorker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(grace_s=0.1)

    async def stop(self, grace_s: float = 0.5) -> None:
        """Stop serving: health NOT_SERVING, open streams end ("abort"), event streams close,
        then the server stops after `grace_s` seconds at most; the sidecar stops. Idempotent."""
        current, self._current = self._current, None
        if current is not None:
            self._last_stats = current.engine.stats
            await current.stop(grace_s)
        sidecar, self._sidecar = self._sidecar, None
        if sidecar is not None:
            await sidecar.stop()

    # ---- faults ----

    def snapshot(self) -> WorkerSnapshot:
        """The figures /metrics reports now."""
        current = self._current
        return WorkerSnapshot(
            model_name=self.config.model_name,
            load=current.engine.load() if current is not None else None,
            loop=current.engine.stats if current is not None else self._last_stats,
            speedup=self.config.speedup,
            faults=self.faults,
            restarts=self.restarts,
        )

    def fault_state(self) -> dict[str, object]:
        """The faults in force (for the sidecar)."""
        now = self._current.engine.wall_now() if self._current else 0.0
        return self.faults.as_dict(now)

    async def apply_fault(self, fault: Fault) -> None:
        """Put a state fault (slowdown, stall, health, reject, report_kv_usage, or `{}`
        reset) in force."""
        current = self._current
        if current is None:
            return
        self.faults.apply(fault, current.engine.wall_now())
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.faults.healthy
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        current.engine.fault_changed()
        if fault.report_kv_usage is not None or fault.clear_report_kv_usage or fault.reset:
            current.hub.resend_load()
        await current.health.set("", status)
        await current.health.set(SERVICE_NAME, status)

    async def restart(self) -> None:
        """Come back on the same port with an empty cache, a new event sequence and no faults.
        Raises RuntimeError when the port cannot be bound again within ~5 s."""
        current, self._current = self._current, None
        if current is not None:
            await current.stop(None)
        self.faults.reset()
        self.restarts += 1
        for attempt in range(50):
            try:
                self._current = await self._build(self.port)
                return
            except RuntimeError:
                if attempt == 49:
                    raise
                await asyncio.sleep(0.1)

    async def crash(self) -> None:
        """Die at once: gRPC server, engine and sidecar stop without a goodbye."""
        self.crashed = True
        current, self._current = self._current, None
        if current is not None:
            self._last_stats = current.engine.stats
            await current.stop(None)
        sidecar, self._sidecar = self._sidecar, None
        if sidecar is not None:
            with contextlib.suppress(Exception):
                await sidecar.stop()
        if self._on_crash is not None:
            self._on_crash(self)

    async def clear_cache(self, timeout_s: float) -> tuple[bool, str]:
        """Flush the prefix cache once the engine is idle (up to `timeout_s` wall seconds)."""
        if self._current is None:
            return False, "the worker is not serving"
        return await self._current.engine.flush_cache(timeout_s)


def engine_callbacks(engine: EngineLoop, hub: KvEventHub) -> None:
    """Route the engine's KV events and load changes to the hub."""
    engine.set_listeners(on_kv_events=hub.publish, on_load_changed=hub.load_changed)
