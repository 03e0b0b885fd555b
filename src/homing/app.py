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
import contextlib
import signal

import structlog
from aiohttp import web

from homing.config import HomingConfig
from homing.embedded import SimLauncher
from homing.engines.pool import PoolConfig, WorkerPool
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

    async def __aenter__(self) -> App:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Bring everything up; raises on a worker or listener that cannot start."""
        cfg = self.config
        try:
            urls = list(cfg.engines.workers)
            if cfg.embedded:
                self.sims = SimLauncher(cfg.sim)
                urls = await self.sims.start(timeout_s=cfg.engines.startup_timeout_s)
            self.router = Router(cfg.router.policy, block_size=cfg.router.block_size)
            self.pool = WorkerPool(
                urls,
                router=self.router,
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
                self.service, host=cfg.gateway.grpc_host, port=cfg.gateway.grpc_port
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

    async def stop(self) -> None:
        """Drain and stop; safe to call more than once and after a failed start."""
        drain = self.config.gateway.drain_timeout_s
        if self._runner is not None:
            # Stop accepting connections first; open streams keep running.
            for site in list(self._runner.sites):
                await site.stop()
        if self.grpc is not None:
            with contextlib.suppress(Exception):
                await self.grpc.set_serving(False)
        if self.service is not None and self.service.in_flight:
            log.info("draining", in_flight=self.service.in_flight, timeout_s=drain)
            if not await self.service.drained(drain):
                log.warning("drain_timeout", in_flight=self.service.in_flight)
        if self.grpc is not None:
            await self.grpc.stop(grace_s=1.0)
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


def _bound_port(runner: web.AppRunner) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    raise RuntimeError("HTTP listener has no bound address")
