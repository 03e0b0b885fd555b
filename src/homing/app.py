"""Composition root: builds the subsystems from the config, runs them, and stops them in order.

Start order: simulated workers (embedded default only) -> worker pool (discovery, health,
KV-event subscriptions feeding the router) -> tokenizer (local directory or the worker's
GetTokenizer bundle) -> inference service -> HTTP and gRPC listeners.
Stop order (SIGINT/SIGTERM): stop accepting (listeners closed, health NOT_SERVING), let
in-flight requests finish up to `gateway.drain_timeout_s`, then stop the pool and the
simulated workers.
"""

from __future__ import annotations

import asyncio
import signal
import socket

import structlog
from aiohttp import web

from homing.config import HomingConfig
from homing.embedded import SimLauncher
from homing.engines.pool import PoolConfig, WorkerPool, WorkerState
from homing.gateway.grpc_api import GrpcApi
from homing.gateway.http import HttpApi
from homing.gateway.service import InferenceService, ModelEntry
from homing.router import Router
from homing.text.tokenizer import TextTokenizer

log = structlog.get_logger("homing.app")


class App:
    """One `homing serve` process. Use `async with App(config) as app:` or start()/stop()."""

    def __init__(self, config: HomingConfig) -> None:
        self.config = config
        self.sims: SimLauncher | None = None
        self.pool: WorkerPool | None = None
        self.router: Router | None = None
        self.service: InferenceService | None = None
        self.http: HttpApi | None = None
        self.grpc: GrpcApi | None = None
        self._runner: web.AppRunner | None = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self._stopping = False
        self._background: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> App:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Bring everything up; raises on a worker or listener that cannot start."""
        cfg = self.config
        gw = cfg.gateway
        for host, port in ((gw.host, gw.port), (gw.grpc_host, gw.grpc_port)):
            _ensure_bindable(host, port)  # fail fast, before any worker is started
        try:
            urls = list(cfg.engines.workers)
            if cfg.embedded:
                self.sims = SimLauncher(cfg.sim)
                urls = await self.sims.start(timeout_s=cfg.engines.startup_timeout_s)
            self.router = Router(cfg.router.policy, block_size=cfg.router.block_size)
            self.pool = WorkerPool(
                urls,
                router=self.router,
                on_health_change=self._on_health_change,
                config=PoolConfig(
                    health_interval_s=cfg.engines.health_interval_s,
                    health_timeout_s=cfg.engines.health_timeout_s,
                    unhealthy_threshold=cfg.engines.unhealthy_threshold,
                    healthy_threshold=cfg.engines.healthy_threshold,
                ),
            )
            await self.pool.start()
            await self.pool.wait_ready(cfg.engines.startup_timeout_s)
            if cfg.engines.tokenizer_path:
                tokenizer = TextTokenizer.from_dir(cfg.engines.tokenizer_path)
            else:
                tokenizer = TextTokenizer.from_bundle(await self.pool.tokenizer_bundle())
            model = ModelEntry(
                model_id=self.pool.served_model_name,
                tokenizer=tokenizer,
                max_context_length=self.pool.max_context_length,
                pool=self.pool,
                router=self.router,
            )
            self.service = InferenceService(model, request_timeout_s=cfg.gateway.request_timeout_s)
            self.http = HttpApi(self.service, max_body_bytes=cfg.gateway.max_body_bytes)
            self._runner = web.AppRunner(
                self.http.app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0
            )
            await self._runner.setup()
            site = web.TCPSite(self._runner, cfg.gateway.host, cfg.gateway.port)
            await site.start()
            self.http_port = _bound_port(self._runner)
            self.grpc = GrpcApi(
                self.service,
                host=cfg.gateway.grpc_host,
                port=cfg.gateway.grpc_port,
                max_message_bytes=cfg.gateway.max_body_bytes,
            )
            self.grpc_port = self.grpc.port
            await self.grpc.start()
        except BaseException:
            await self.stop()
            raise
        log.info(
            "serving",
            model=model.model_id,
            http=f"http://{cfg.gateway.host}:{self.http_port}",
            grpc=f"{cfg.gateway.grpc_host}:{self.grpc_port}",
            workers=urls,
            policy=cfg.router.policy,
        )

    def _on_health_change(self, state: WorkerState) -> None:
        """Keep the gRPC health service in step with the pool (SERVING iff a worker is)."""
        if self.grpc is None or self.pool is None or self._stopping:
            return
        serving = bool(self.pool.healthy_workers())
        task = asyncio.get_running_loop().create_task(self.grpc.set_serving(serving))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def stop(self) -> None:
        """Drain and stop; safe to call more than once and after a failed start."""
        self._stopping = True
        drain = self.config.gateway.drain_timeout_s
        # Stop accepting on both listeners at once; open HTTP streams and gRPC calls go on
        # until they finish or the drain timeout passes.
        grpc_stopped = None
        if self.grpc is not None:
            grpc_stopped = asyncio.get_running_loop().create_task(self.grpc.stop(grace_s=drain))
        if self._runner is not None:
            for site in list(self._runner.sites):
                await site.stop()
        if self.service is not None and self.service.in_flight:
            log.info("draining", in_flight=self.service.in_flight, timeout_s=drain)
            if not await self.service.drained(drain):
                log.warning("drain_timeout", in_flight=self.service.in_flight)
        if grpc_stopped is not None:
            await grpc_stopped
            self.grpc = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.pool is not None:
            await self.pool.stop()
            self.pool = None
        if self.sims is not None:
            await self.sims.stop()
            self.sims = None

    async def run_until_signal(self) -> None:
        """Serve until SIGINT or SIGTERM, then stop gracefully."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
            log.info("shutdown_requested")
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            await self.stop()


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
