"""What an `App` holds: every component it builds and every handle it must close.

Rule of the file: state and plain accessors, and one callback, `_on_health_change`, which
starts a task that updates the gRPC health service. `AppParts` is the base of the jobs the
`App` is made of (`assembly`, `listeners`, `shutdown`, `reload`: one module each), so each
job reads and fills the same fields; `root.App` puts them together. Also here: the two
translations of config sections that building and reloading share (`slo_of`,
`model_router_settings`).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from homing.admin.server import AdminServer
from homing.app.processes import Leader
from homing.clock import Clock, SystemClock
from homing.config import (
    AdminSettings,
    HomingConfig,
    ModelSettings,
    RouterModelSettings,
    RouterSettings,
    SloSettings,
)
from homing.embedded import SglangLauncher, SimLauncher
from homing.engines.pool import WorkerPool, WorkerState
from homing.engines.pool.shared_in_flight import InFlightBoard
from homing.fleet import Fleet, ModelDispatch
from homing.fleet.fleet import WorkerIds
from homing.fleet.mirror import LeaderReader
from homing.gateway.admission import AdmissionController
from homing.gateway.auth import KeyRing
from homing.gateway.grpc_api import GrpcApi
from homing.gateway.http import HttpApi
from homing.gateway.metrics import GatewayMetrics
from homing.gateway.quotas import QuotaGuard
from homing.gateway.service import InferenceService
from homing.obs.demand import DemandMeter
from homing.obs.loop_busy import LoopBusySampler
from homing.obs.metrics import FleetMetrics, RouterMetrics
from homing.obs.process_metrics import ProcessMetrics
from homing.obs.requests import RequestMetrics, RequestRecorder
from homing.obs.slo import Slo
from homing.rollout.controller import RolloutController
from homing.router import Router
from homing.scaler.actuators.base import Actuator
from homing.scaler.loop import Scaler
from homing.scaler.metrics import ScalerMetrics


class AppParts:
    """The fields of an `App` (see `homing.app.App` for the arguments and what is public)."""

    def __init__(
        self,
        config: HomingConfig,
        *,
        listen_sockets: Mapping[str, socket.socket] | None = None,
        clock: Clock | None = None,
        state_dir: str | None = None,
        follow: Leader | None = None,
        shared_in_flight: tuple[InFlightBoard, int] | None = None,
    ) -> None:
        self.config = config
        self.state_dir = state_dir
        self.follow = follow
        self.shared_in_flight = shared_in_flight
        self.process_metrics: ProcessMetrics | None = None
        # Awaited before the workers homing started are stopped (the other gateway
        # processes may still stream on them: the leader's Daemon sets it).
        self.keep_workers: Callable[[], Awaitable[object]] | None = None
        self._mirror_task: asyncio.Task[None] | None = None
        self._mirror_reader: LeaderReader | None = None
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
        # Each served model's admission queue (its dispatch's `admission`), by model id.
        self.admissions: dict[str, AdmissionController] = {}
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
        return next(iter(self.admissions.values()), None)

    @property
    def sims(self) -> SimLauncher | SglangLauncher | None:
        """The first model's launcher of homing's own workers (None with listed workers)."""
        return self.launchers[0] if self.launchers else None

    @property
    def shares_listeners(self) -> bool:
        """Whether other gateway processes listen on the same ports (a follower, or the
        leader of several, which share an in-flight board): the gRPC port is bound with
        SO_REUSEPORT."""
        return self.follow is not None or self.shared_in_flight is not None

    def _admin_settings(self) -> AdminSettings:
        """`config.admin`, with `state_dir` as its directory when it names none."""
        admin = self.config.admin
        if self.state_dir is None or admin.state_dir is not None:
            return admin
        return admin.model_copy(update={"state_dir": self.state_dir})

    def _on_health_change(self, state: WorkerState) -> None:
        """Keep the gRPC health service in step with the fleet (SERVING iff some model has a
        ready, healthy worker); called on health flips and lifecycle transitions."""
        if self.grpc is None or self.fleet is None or self._stopping:
            return
        serving = any(m.can_serve for m in self.fleet.models.values())
        task = asyncio.get_running_loop().create_task(self.grpc.set_serving(serving))
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def model_router_settings(router: RouterSettings, spec: ModelSettings) -> RouterSettings:
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
