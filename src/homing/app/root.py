"""The `App`: one `homing serve` process, put together from its jobs.

Rule of the file: the order of things. `App` is `AppParts` (what it holds) with the steps of
`assembly` (building), `listeners` (sockets), `shutdown` (drain and stop) and `reload`
(serving a new config in place); `start` runs the building and listening steps in order
(see the `homing.app` package docstring), and readiness and status are read here.
"""

from __future__ import annotations

import asyncio

import structlog

from homing.aio import gather_or_cancel
from homing.app.assembly import Assembly
from homing.app.listeners import Listeners
from homing.app.reload import Reloading
from homing.app.shutdown import Shutdown
from homing.fleet import Fleet
from homing.fleet.mirror import FleetMirror, leader_reader

log = structlog.get_logger("homing.app")


class App(Assembly, Listeners, Shutdown, Reloading):
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
    file store live when `admin` names neither (default `default_state_dir()`). `follow`:
    the leader of several gateway processes (`homing.app.processes`) whose workers this
    one, a follower, mirrors, and whose quota store it uses. `shared_in_flight`: (board,
    this process's row) where several gateway processes publish their requests in flight
    per worker (`homing.engines.pool.shared_in_flight`).
    """

    async def __aenter__(self) -> App:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Bring everything up; raises on a worker or listener that cannot start."""
        cfg = self.config
        gw = cfg.gateway
        self._check_addresses()
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
            await self._start_service(self.fleet)
            await self._start_listeners()
            if cfg.admin.enabled:
                await self._start_admin(self.fleet)
            self._start_scaler(specs, list(models))
            if self.follow is not None:
                reader = self._mirror_reader = leader_reader(self.follow.admin, key=self.follow.key)
                mirror = FleetMirror(self.fleet, reader, clock=self.clock)
                self._mirror_task = asyncio.get_running_loop().create_task(
                    mirror.run(), name="mirror"
                )
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
