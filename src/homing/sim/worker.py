"""One simulated SGLang worker: a grpc.aio server on a loopback port around an `EngineLoop`.

Rule of this file: composition only. It resolves the preset (timing model and limits), wires
tokenizer -> planner, scheduler -> engine loop -> KV-event hub, registers
`SglangScheduler` and `grpc.health.v1` (SERVING) and nothing else, and owns start/stop.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc

from homing.sim.config import SimConfig
from homing.sim.engine_loop import EngineLoop
from homing.sim.generation import OutputPlanner
from homing.sim.kv_events import EngineMemoryInfo, KvEventHub
from homing.sim.scheduler import Scheduler, SchedulerConfig
from homing.sim.servicer import ServedModel, SimSchedulerServicer
from homing.sim.timing import EngineLimits, TimingModel, resolve_limits

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


class SimWorker:
    """A simulated worker serving on `host:port` (port 0 = a free port).

    Raises ValueError at construction for an unknown preset or a model that does not fit.
    """

    def __init__(self, config: SimConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config
        self.host = host
        self._requested_port = port
        self.port = 0
        self.timing, self.limits = resolve_worker(config)
        self._server: grpc.aio.Server | None = None
        self._engine: EngineLoop | None = None
        self._hub: KvEventHub | None = None
        self._health: health.aio.HealthServicer | None = None

    @property
    def url(self) -> str:
        """`grpc://host:port` once started."""
        return f"grpc://{self.host}:{self.port}"

    @property
    def engine(self) -> EngineLoop:
        """The engine loop (after `start`)."""
        if self._engine is None:
            raise RuntimeError("the worker is not started")
        return self._engine

    @property
    def num_running(self) -> int:
        """Requests the scheduler is running now (0 before start)."""
        return self._engine.scheduler.num_running if self._engine else 0

    @property
    def num_waiting(self) -> int:
        """Requests queued in the scheduler now (0 before start)."""
        return self._engine.scheduler.num_waiting if self._engine else 0

    async def start(self) -> int:
        """Build the engine, bind the port and serve; returns the bound port.
        Raises RuntimeError when the port cannot be bound."""
        from homing.text.served import load_served_tokenizer, served_tokenizer_zip

        tokenizer = await asyncio.to_thread(load_served_tokenizer)
        tokenizer_zip = await asyncio.to_thread(served_tokenizer_zip)
        cfg, timing, limits = self.config, self.timing, self.limits
        scheduler = Scheduler(
            SchedulerConfig(
                kv_capacity_tokens=limits.kv_capacity_tokens,
                max_running_requests=limits.max_running_requests,
                page_size=cfg.page_size,
                chunked_prefill_size=cfg.chunked_prefill_size,
                eos_token_ids=frozenset(tokenizer.eos_token_ids),
            ),
            timing,
        )
        engine = EngineLoop(scheduler, speedup=cfg.speedup)
        hub = KvEventHub(
            engine.load,
            EngineMemoryInfo(
                weight_gb=timing.model.weight_bytes / cfg.tp / 1e9,
                kv_cache_gb=limits.kv_capacity_tokens * timing.kv_bytes_per_token / cfg.tp / 1e9,
                token_capacity=limits.kv_capacity_tokens,
            ),
            heartbeat_busy_s=cfg.heartbeat_busy_s,
            heartbeat_idle_s=cfg.heartbeat_idle_s,
        )
        engine_callbacks(engine, hub)
        served = ServedModel(
            vocab_size=tokenizer.vocab_size,
            eos_token_ids=tokenizer.eos_token_ids,
            bos_token_id=tokenizer.bos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            tokenizer_zip=tokenizer_zip,
        )
        planner = OutputPlanner(tokenizer, worker_seed=cfg.seed)
        servicer = SimSchedulerServicer(
            cfg,
            engine=engine,
            hub=hub,
            planner=planner,
            served=served,
            timing=timing,
            limits=limits,
        )
        server = grpc.aio.server(options=GRPC_OPTIONS)
        pb_grpc.add_SglangSchedulerServicer_to_server(servicer, server)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        try:
            port = server.add_insecure_port(f"{self.host}:{self._requested_port}")
        except RuntimeError as exc:
            raise RuntimeError(f"cannot bind {self.host}:{self._requested_port}: {exc}") from exc
        if port == 0:
            raise RuntimeError(f"cannot bind {self.host}:{self._requested_port}")
        self.port = servicer.port = port
        engine.start()
        await server.start()
        serving = health_pb2.HealthCheckResponse.SERVING
        await health_servicer.set("", serving)
        await health_servicer.set(SERVICE_NAME, serving)
        self._server, self._engine, self._hub, self._health = server, engine, hub, health_servicer
        return port

    async def __aenter__(self) -> SimWorker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(grace_s=0.1)

    async def stop(self, grace_s: float = 0.5) -> None:
        """Stop serving: health NOT_SERVING, open streams end ("abort"), event streams close,
        then the server stops after `grace_s` seconds at most. Idempotent."""
        if self._server is None:
            return
        server, self._server = self._server, None
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._engine is not None:
            await self._engine.stop()
        if self._hub is not None:
            self._hub.close()
        await server.stop(grace_s)


def engine_callbacks(engine: EngineLoop, hub: KvEventHub) -> None:
    """Route the engine's KV events and load changes to the hub."""
    engine.set_listeners(on_kv_events=hub.publish, on_load_changed=hub.load_changed)
