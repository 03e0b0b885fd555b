"""The admin API server (`homing.v1.Admin`, proto/homing/v1/admin.proto) of a running gateway.

Listeners: a Unix socket at `AdminSettings.socket_path()` (default `<state dir>/admin.sock`)
and, when `admin.port` is set, plaintext TCP on `admin.host:admin.port` (keep that on
loopback or a private network: keys travel in clear). The socket file is created with mode
0600 and its directory, when homing creates it, with 0700: the socket is bound inside a
fresh 0700 directory, chmod-ed, then hard-linked into place (a link fails on an existing
name, so a server that starts meanwhile is never replaced). A socket file another live
server answers on is refused (`OSError` EADDRINUSE); a stale one is removed.

Auth: metadata `authorization: Bearer KEY`; the key's SHA-256 digest is compared with every
configured `admin.keys` digest in constant time (`hmac.compare_digest`). No or a wrong key
is UNAUTHENTICATED with `UNAUTHENTICATED_MESSAGE`. With no admin keys configured (the
default; TCP always needs keys) every call on the socket is allowed: its file mode, 0600 in
a directory of the serving user, is then the only guard.

Server reflection is on (for grpcurl); it needs no key, as it tells only the schema.

Errors: a `FleetError` ends the call with the gRPC status its `code` names and its message;
every refusal also carries `{"error": {"message", "status", "reason"}}` in the trailing
metadata key `x-error-json`, as the inference API does.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import hmac
import json
import math
import os
import socket
import stat
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import structlog
from grpc_reflection.v1alpha import reflection

from homing import __version__
from homing.admin.rollouts import status_message, weights_of
from homing.clock import Clock, SystemClock
from homing.config import AdminKeySettings, AdminSettings, QuotaLimits, TenantSettings
from homing.engines.pool import WorkerState
from homing.fleet import Fleet, FleetError, ModelDispatch
from homing.gateway.auth import Principal
from homing.gateway.quotas import QuotaGuard, QuotaStoreError, ScopeUsage, scopes_for
from homing.rollout.controller import RolloutController
from homing.v1 import admin_pb2 as pb
from homing.v1 import admin_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from homing.scaler.loop import PoolScaler, Scaler
    from homing.scaler.policy import Decision, PoolSignals

log = structlog.get_logger("homing.admin")

SERVICE_NAME = "homing.v1.Admin"

UNAUTHENTICATED_MESSAGE = "a valid admin key is required (--admin-key or HOMING_ADMIN_KEY)"

#: The longest Unix socket path Linux binds: `sun_path` is 108 bytes with its NUL.
MAX_SOCKET_PATH = 107

#: The staging path inside the socket's directory (`tempfile.mkdtemp` adds 8 characters).
_STAGED = "/.bXXXXXXXX/s"

#: Seconds running admin calls (a `DrainWorker` waiting) get when the server stops.
STOP_GRACE_S = 1.0


class NoRollouts(FleetError):
    """The gateway has no rollout controller (an admin server built without one)."""

    code = "UNAVAILABLE"


class SplitChangesRefused(FleetError):
    """This gateway does not change version splits (several processes would not follow)."""

    code = "FAILED_PRECONDITION"


class InvalidRequest(FleetError):
    """A request field out of range (a negative timeout, a missing model)."""

    code = "INVALID_ARGUMENT"


def prepare_socket(path: str) -> None:
    """Make `path` ready to bind: its directory exists (created 0700) and belongs to this
    user, nothing answers on `path`, and a stale socket there is removed.

    Raises OSError: EADDRINUSE when another live server answers on it, EEXIST when `path`
    is not a socket, ENAMETOOLONG past `MAX_SOCKET_PATH` bytes, EPERM when the directory
    belongs to another user.
    """
    directory = os.path.dirname(os.path.abspath(path))
    longest = max(len(os.fsencode(path)), len(os.fsencode(directory)) + len(_STAGED))
    if longest > MAX_SOCKET_PATH:
        raise OSError(
            errno.ENAMETOOLONG,
            f"the admin socket path {path} is too long for a Unix socket (binding it takes "
            f"{longest} bytes, at most {MAX_SOCKET_PATH}); set admin.socket or "
            "HOMING_STATE_DIR to a shorter one",
        )
    os.makedirs(directory, mode=0o700, exist_ok=True)
    owner = os.stat(directory).st_uid
    if owner != os.getuid():
        raise OSError(
            errno.EPERM,
            f"the admin socket directory {directory} belongs to uid {owner}, not to this user "
            f"(uid {os.getuid()}); set admin.state_dir or HOMING_STATE_DIR to a directory of "
            "your own",
        )
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket; remove it or move it")
    if _answers(path):
        raise OSError(
            errno.EADDRINUSE,
            f"another homing serve answers on the admin socket {path}; stop it, or give this "
            "one its own (admin.socket, admin.state_dir or HOMING_STATE_DIR)",
        )
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    log.info("admin_socket_stale_removed", path=path)


def _answers(path: str) -> bool:
    """Whether a server accepts connections on the Unix socket `path`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            return False
    return True


def _bind_socket(server: grpc.aio.Server, path: str) -> tuple[int, int]:
    """Bind `server` on `path` with mode 0600 from the first moment anyone can connect;
    the (st_dev, st_ino) of the socket file, to know it as ours at stop."""
    prepare_socket(path)
    directory = os.path.dirname(os.path.abspath(path))
    private = tempfile.mkdtemp(prefix=".b", dir=directory)  # mode 0700
    staged = os.path.join(private, "s")
    try:
        try:
            server.add_insecure_port(f"unix:{staged}")
        except RuntimeError as err:
            message = str(err).split(";")[0]  # grpc adds a hint about GRPC_VERBOSITY
            raise OSError(
                errno.EADDRNOTAVAIL, f"cannot bind the admin socket {path}: {message}"
            ) from None
        os.chmod(staged, 0o600)
        try:
            os.link(staged, path)
        except FileExistsError:
            raise OSError(
                errno.EADDRINUSE, f"the admin socket {path} appeared while this server started"
            ) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)
        os.rmdir(private)
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _digest_of(metadata: Sequence[tuple[str, Any]] | None) -> bytes | None:
    """SHA-256 of the `authorization: Bearer KEY` key (None when absent or malformed)."""
    value = dict(metadata or ()).get("authorization")
    if not isinstance(value, str) or value[:7].lower() != "bearer ":
        return None
    key = value[7:].strip()
    return hashlib.sha256(key.encode("utf-8")).digest() if key else None


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")
_Handler = Callable[[Any, _Req, grpc.aio.ServicerContext], Awaitable[_Resp]]


def _admin_call(method: _Handler[_Req, _Resp]) -> _Handler[_Req, _Resp]:
    """Authenticate the call, then run it; a `FleetError` ends it with its status."""

    @functools.wraps(method)
    async def handle(self: AdminServicer, request: _Req, context: grpc.aio.ServicerContext) -> Any:
        if not self.authorized(context.invocation_metadata()):
            await _abort(
                context, grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE, "Unauthenticated"
            )
        try:
            return await method(self, request, context)
        except FleetError as err:
            await _abort(context, grpc.StatusCode[err.code], str(err), type(err).__name__)

    return handle


async def _abort(
    context: grpc.aio.ServicerContext,
    code: grpc.StatusCode,
    message: str,
    reason: str,
) -> None:
    """End the call with `code` and `message`; `reason` names the refusal's kind."""
    body = {"error": {"message": message, "status": code.name, "reason": reason}}
    context.set_trailing_metadata((("x-error-json", json.dumps(body, ensure_ascii=True)),))
    await context.abort(code, message)


def _seconds(value: float, name: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise InvalidRequest(f"{name} must be a finite number of seconds >= 0, not {value}")
    return value


def worker_message(model: ModelDispatch, w: WorkerState) -> pb.Worker:
    """The `Worker` message of `w`, a worker of `model`."""
    message = pb.Worker(
        id=w.worker_id,
        model=model.model_id,
        url=w.url,
        version=w.version,
        phase=w.phase.value,
        healthy=w.healthy,
        in_flight=w.in_flight_all,
        cached_blocks=model.router.index.worker_blocks(w.worker_id),
        kv_stream=w.kv_stream,
        last_error=w.last_error or "",
        kv_epoch=w.kv_epoch,
        breaker=w.breaker,
    )
    if w.load is not None:
        message.running = w.load.running
        message.waiting = w.load.waiting
        message.token_usage = w.load.token_usage
    return message


def _limits(limits: QuotaLimits | None) -> pb.QuotaLimits:
    message = pb.QuotaLimits()
    if limits is not None:
        if limits.requests_per_minute is not None:
            message.requests_per_minute = limits.requests_per_minute
        if limits.tokens_per_minute is not None:
            message.tokens_per_minute = limits.tokens_per_minute
        if limits.concurrent_streams is not None:
            message.concurrent_streams = limits.concurrent_streams
    return message


def _use(limits: QuotaLimits | None, usage: ScopeUsage | None) -> pb.QuotaUse:
    """The use of the kinds `limits` sets (the stores count only those)."""
    message = pb.QuotaUse()
    if limits is None or usage is None:
        return message
    if limits.requests_per_minute is not None:
        message.requests = usage.requests
    if limits.tokens_per_minute is not None:
        message.tokens = usage.tokens
    if limits.concurrent_streams is not None:
        message.streams = usage.streams
    return message


def signals_message(s: PoolSignals) -> pb.ScalerSignals:
    """The `ScalerSignals` of one tick's `s` (`last_arrival_age_s`: seconds from its newest
    arrival to `s.now`, both on the scaler's clock)."""
    message = pb.ScalerSignals(
        ready=s.ready,
        warm=s.warm,
        starting=s.starting,
        draining=s.draining,
        in_flight=s.in_flight,
        queued=s.queued,
        prefill_tokens_per_s=s.prefill_tokens_per_s,
        arrivals_per_s=s.arrivals_per_s,
        workers_waiting=s.workers_waiting,
        decode_streams_per_replica=s.decode_streams_per_replica,
        prefill_tokens_per_s_per_replica=s.prefill_tokens_per_s_per_replica,
    )
    if s.last_arrival_at is not None:
        message.last_arrival_age_s = max(0.0, s.now - s.last_arrival_at)
    for name in ("ttft_p95_s", "ttft_slo_s", "burn_rate", "cold_start_s"):
        value = getattr(s, name)
        if value is not None:
            setattr(message, name, value)
    return message


def decision_message(d: Decision, s: PoolSignals | None) -> pb.ScalerDecision:
    """The `ScalerDecision` of `d`, decided from `s` (None: signals not kept); its chain in
    the order the policy computed it."""
    message = pb.ScalerDecision(
        desired_ready=d.desired_ready,
        desired_warm=d.desired_warm,
        reason=d.reason,
        fast=d.fast,
        chain=[pb.ScalerChainStep(name=k, value=v) for k, v in d.chain.steps()],
    )
    if d.held_by is not None:
        message.held_by = d.held_by
    if s is not None:
        message.signals.CopyFrom(signals_message(s))
    return message


def scaler_pool_message(p: PoolScaler, *, advise: bool = False) -> pb.ScalerPool:
    """The `ScalerPool` of `p` now; with `advise`, also `p.advise()` (which acts on
    nothing)."""
    counts = p.counts()
    message = pb.ScalerPool(
        model=p.model,
        mode=p.mode,
        actuator=p.actuator.kind,
        ready=counts.ready,
        warm=counts.warm,
        starting=counts.starting,
        draining=counts.draining,
        ejected=counts.ejected,
        min_replicas=p.config.min_replicas,
        max_replicas=p.config.max_replicas,
        default_cold_start_s=p.config.default_cold_start_s,
        decode_streams_per_replica=p.estimator.decode_streams,
        prefill_tokens_per_s_per_replica=p.estimator.prefill_tokens_per_s,
    )
    cold = p.actuator.cold_start_s()
    if cold is not None:
        message.cold_start_s = cold
    if p.last is not None:
        message.last.CopyFrom(decision_message(p.last, p.last_signals))
    if advise:
        signals, decision = p.advise()
        message.advice.CopyFrom(decision_message(decision, signals))
    return message


class AdminServicer(pb_grpc.AdminServicer):
    """The `homing.v1.Admin` calls over a `Fleet`, the tenants' config, their quotas and
    the autoscaler (`scaler()`: the running one, None when none is enabled)."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        keys: Sequence[bytes],
        tenants: Sequence[TenantSettings],
        quotas: QuotaGuard | None,
        in_flight: Callable[[], int],
        clock: Clock,
        started_at: float,
        scaler: Callable[[], Scaler | None] = lambda: None,
        rollouts: RolloutController | None = None,
        split_changes_refused: str | None = None,
    ) -> None:
        self.fleet = fleet
        self.clock = clock
        self.rollouts = rollouts
        self.split_changes_refused = split_changes_refused
        self.keys = list(keys)
        self.tenants = list(tenants)
        self.quotas = quotas
        self.in_flight = in_flight
        self.started_at = started_at
        self.scaler = scaler

    def authorized(self, metadata: Sequence[tuple[str, Any]] | None) -> bool:
        """Whether the call's metadata carries a configured admin key (always, with none
        configured). Compares against every key, each in constant time."""
        if not self.keys:
            return True
        digest = _digest_of(metadata)
        if digest is None:
            return False
        found = False
        for key in self.keys:
            found |= hmac.compare_digest(digest, key)
        return found

    @_admin_call
    async def ListModels(
        self, request: pb.AdminListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.AdminListModelsResponse:
        return pb.AdminListModelsResponse(
            models=[
                pb.ModelPool(
                    name=m.model_id,
                    policy=m.router.policy_name,
                    ready_workers=m.ready_workers,
                    workers=len(m.workers()),
                    max_context_length=m.max_context_length,
                )
                for m in self.fleet.models.values()
            ]
        )

    @_admin_call
    async def ListWorkers(
        self, request: pb.ListWorkersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListWorkersResponse:
        if request.model:
            models = [self.fleet.model(request.model)]
        else:
            models = list(self.fleet.models.values())
        return pb.ListWorkersResponse(
            workers=[worker_message(m, w) for m in models for w in m.workers()]
        )

    @_admin_call
    async def AddWorker(
        self, request: pb.AddWorkerRequest, context: grpc.aio.ServicerContext
    ) -> pb.Worker:
        if not request.model:
            served = ", ".join(sorted(self.fleet.models)) or "none"
            raise InvalidRequest(f"a model is required (served: {served})")
        state = await self.fleet.add_worker(request.model, request.url, request.version)
        log.info("admin_worker_added", worker=state.worker_id, model=request.model, url=request.url)
        return worker_message(self.fleet.model(request.model), state)

    @_admin_call
    async def DrainWorker(
        self, request: pb.DrainWorkerRequest, context: grpc.aio.ServicerContext
    ) -> pb.DrainWorkerResponse:
        timeout = (
            _seconds(request.timeout_s, "timeout_s") if request.HasField("timeout_s") else None
        )
        grace = _seconds(request.grace_s, "grace_s") if request.HasField("grace_s") else None
        model, _ = self.fleet.find(request.worker_id)
        state = self.fleet.drain(request.worker_id, grace)
        log.info("admin_worker_drain", worker=request.worker_id, grace_s=grace, wait=request.wait)
        left = False
        if request.wait:
            left = await self.fleet.wait_gone(request.worker_id, timeout)
        return pb.DrainWorkerResponse(worker=worker_message(model, state), left=left)

    @_admin_call
    async def CordonWorker(
        self, request: pb.CordonWorkerRequest, context: grpc.aio.ServicerContext
    ) -> pb.Worker:
        model, _ = self.fleet.find(request.worker_id)
        state = self.fleet.cordon(request.worker_id)
        log.info("admin_worker_cordoned", worker=request.worker_id)
        return worker_message(model, state)

    @_admin_call
    async def UncordonWorker(
        self, request: pb.UncordonWorkerRequest, context: grpc.aio.ServicerContext
    ) -> pb.Worker:
        model, _ = self.fleet.find(request.worker_id)
        state = self.fleet.uncordon(request.worker_id)
        log.info("admin_worker_uncordoned", worker=request.worker_id)
        return worker_message(model, state)

    @_admin_call
    async def RemoveWorker(
        self, request: pb.RemoveWorkerRequest, context: grpc.aio.ServicerContext
    ) -> pb.Worker:
        model, _ = self.fleet.find(request.worker_id)
        state = await self.fleet.remove(request.worker_id, force=request.force)
        log.info("admin_worker_removed", worker=request.worker_id, force=request.force)
        return worker_message(model, state)

    @_admin_call
    async def ListTenants(
        self, request: pb.ListTenantsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTenantsResponse:
        response = pb.ListTenantsResponse()
        if self.quotas is not None:
            response.window_s = self.quotas.settings.window_s
            response.backend = self.quotas.settings.backend
        for tenant in self.tenants:
            message = pb.Tenant(
                name=tenant.name,
                priority=tenant.priority,
                models=tenant.models or [],
                any_model=tenant.models is None,
                limits=_limits(tenant.quota),
            )
            usage = await self._usage(tenant, None, response)
            message.use.CopyFrom(_use(tenant.quota, usage))
            for key in tenant.keys:
                key_usage = await self._usage(tenant, key.quota, response, key.id)
                message.keys.append(
                    pb.TenantKey(
                        id=key.id,
                        disabled=key.disabled,
                        models=key.models or [],
                        narrowed=key.models is not None,
                        limits=_limits(key.quota),
                        use=_use(key.quota, key_usage),
                    )
                )
            response.tenants.append(message)
        return response

    async def _usage(
        self,
        tenant: TenantSettings,
        key_quota: QuotaLimits | None,
        response: pb.ListTenantsResponse,
        key_id: str = "",
    ) -> ScopeUsage | None:
        """The live use of the tenant's scope (`key_id` ""), or of the key's own scope;
        None when it is not limited or the store did not answer (`use_error` says why)."""
        principal = Principal(
            tenant=tenant.name,
            key_id=key_id,
            priority=tenant.priority,
            tenant_models=None,
            key_models=None,
            tenant_quota=QuotaLimits() if key_id else tenant.quota,
            key_quota=key_quota,
        )
        scopes = scopes_for(principal)  # the scope names the gateway charges under
        if self.quotas is None or not scopes or response.use_error:
            return None
        try:
            return await self.quotas.store.usage(scopes[0].scope)
        except QuotaStoreError as err:
            response.use_error = f"the quota store did not answer: {err}"
            return None

    @_admin_call
    async def GetStats(
        self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.Stats:
        return pb.Stats(
            uptime_s=self.clock.now() - self.started_at,
            in_flight=self.in_flight(),
            version=__version__,
            models=[
                pb.ModelStats(
                    name=m.model_id,
                    ready_workers=m.ready_workers,
                    workers=len(m.workers()),
                    in_flight=m.pool.total_in_flight,
                )
                for m in self.fleet.models.values()
            ],
        )

    @_admin_call
    async def GetScaler(
        self, request: pb.GetScalerRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetScalerResponse:
        if request.model:
            self.fleet.model(request.model)  # UnknownModel (NOT_FOUND) for one not served
        scaler = self.scaler()
        pools = [] if scaler is None else list(scaler.pools)
        if request.model:
            pools = [p for p in pools if p.model == request.model]
        return pb.GetScalerResponse(
            pools=[scaler_pool_message(p, advise=request.advise) for p in pools]
        )

    # -- rollouts --

    def _controller(self) -> RolloutController:
        if self.rollouts is None:
            raise NoRollouts("this gateway runs no rollout controller")
        return self.rollouts

    def _changing_split(self) -> RolloutController:
        """The controller, for a call that changes a version split (`SplitChangesRefused`,
        with the reason, where such changes are refused)."""
        if self.split_changes_refused is not None:
            raise SplitChangesRefused(self.split_changes_refused)
        return self._controller()

    def _status(self, model_id: str) -> pb.RolloutStatus:
        controller = self._controller()
        return status_message(controller.status(model_id), self.fleet.model(model_id))

    @_admin_call
    async def GetRollout(
        self, request: pb.RolloutRequest, context: grpc.aio.ServicerContext
    ) -> pb.RolloutStatus:
        return self._status(request.model)

    @_admin_call
    async def StartRollout(
        self, request: pb.StartRolloutRequest, context: grpc.aio.ServicerContext
    ) -> pb.RolloutStatus:
        bake_s = request.bake_s if request.HasField("bake_s") else None
        await self._changing_split().start(
            request.model, request.version, list(request.steps) or None, bake_s
        )
        return self._status(request.model)

    @_admin_call
    async def PauseRollout(
        self, request: pb.RolloutRequest, context: grpc.aio.ServicerContext
    ) -> pb.RolloutStatus:
        await self._changing_split().pause(request.model)
        return self._status(request.model)

    @_admin_call
    async def ResumeRollout(
        self, request: pb.RolloutRequest, context: grpc.aio.ServicerContext
    ) -> pb.RolloutStatus:
        await self._changing_split().resume(request.model)
        return self._status(request.model)

    @_admin_call
    async def PromoteRollout(
        self, request: pb.RolloutRequest, context: grpc.aio.ServicerContext
    ) -> pb.RolloutStatus:
        await self._changing_split().promote(request.model)
        return self._status(request.model)

    @_admin_call
    async def RollbackRollout(
        self, request: pb.RolloutRequest, context: grpc.aio.ServicerContext
    ) -> pb.RolloutStatus:
        await self._changing_split().rollback(request.model)
        return self._status(request.model)

    @_admin_call
    async def SetVersions(
        self, request: pb.SetVersionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.RolloutStatus:
        controller = self._changing_split()
        weights = weights_of(request)
        if request.reset:
            await controller.reset_split(request.model)
        else:
            await controller.set_split(request.model, weights)
        return self._status(request.model)


class AdminServer:
    """The admin API of one gateway process (see the module docstring).

    `tenants`: the configured tenants (`HomingConfig.tenants`); `quotas`: their quota guard
    (None without tenants); `in_flight`: the gateway's requests in flight now;
    `clock`: what uptime is measured on (default `SystemClock`); `started_at`: its time
    when the process started serving (default: now);
    `scaler`: the running autoscaler, asked at each `GetScaler` (None: none enabled).
    `rollouts`: the version splits and rollouts (None: the rollout calls are UNAVAILABLE).
    `split_changes_refused`: why a call that changes a version split (a rollout's start,
    pause, resume, promotion or rollback, or a split set) is refused (FAILED_PRECONDITION
    with it; None: allowed).
    After `start`: `socket_path` (None without a socket), `tcp_port` (None without TCP)
    and `addresses` (as `--admin` takes them: "unix:PATH", "HOST:PORT").
    """

    def __init__(
        self,
        fleet: Fleet,
        settings: AdminSettings,
        *,
        tenants: Sequence[TenantSettings] = (),
        quotas: QuotaGuard | None = None,
        in_flight: Callable[[], int] = lambda: 0,
        clock: Clock | None = None,
        started_at: float | None = None,
        scaler: Callable[[], Scaler | None] = lambda: None,
        rollouts: RolloutController | None = None,
        split_changes_refused: str | None = None,
    ) -> None:
        self.settings = settings
        clock = clock if clock is not None else SystemClock()
        self.servicer = AdminServicer(
            fleet,
            keys=[bytes.fromhex(k.sha256) for k in settings.keys],
            tenants=tenants,
            quotas=quotas,
            in_flight=in_flight,
            clock=clock,
            started_at=clock.now() if started_at is None else started_at,
            scaler=scaler,
            rollouts=rollouts,
            split_changes_refused=split_changes_refused,
        )
        self.server: grpc.aio.Server | None = None
        self.socket_path: str | None = None
        self.tcp_port: int | None = None
        self.addresses: list[str] = []
        self._socket_id: tuple[int, int] | None = None

    def update(
        self,
        *,
        tenants: Sequence[TenantSettings],
        keys: Sequence[AdminKeySettings],
        quotas: QuotaGuard | None,
    ) -> None:
        """Serve a reloaded configuration's tenants, quotas and admin keys from the next
        call on."""
        self.settings = self.settings.model_copy(update={"keys": list(keys)})
        self.servicer.keys = [bytes.fromhex(k.sha256) for k in keys]
        self.servicer.tenants = list(tenants)
        self.servicer.quotas = quotas

    async def start(self) -> None:
        """Bind the listeners and serve. Raises OSError for a socket or port that cannot
        be used (see `prepare_socket`)."""
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        pb_grpc.add_AdminServicer_to_server(self.servicer, server)
        reflection.enable_server_reflection((SERVICE_NAME, reflection.SERVICE_NAME), server)
        path = self.settings.socket_path()
        try:
            if path is not None:
                self._socket_id = _bind_socket(server, path)
                self.socket_path = path
                self.addresses.append(f"unix:{path}")
            if self.settings.port is not None:
                host, port = self.settings.host, self.settings.port
                try:
                    bound = server.add_insecure_port(f"{host}:{port}")
                except RuntimeError:
                    bound = 0
                if bound == 0:
                    raise OSError(errno.EADDRINUSE, f"cannot listen on {host}:{port} (admin API)")
                self.tcp_port = bound
                self.addresses.append(f"{host}:{bound}")
            await server.start()
        except BaseException:
            self._unlink_socket()
            raise
        self.server = server
        log.info("admin_serving", addresses=self.addresses, auth=bool(self.settings.keys))

    async def stop(self) -> None:
        """Stop serving (running calls get `STOP_GRACE_S`) and remove the socket file if it
        is still ours; safe to call more than once."""
        server, self.server = self.server, None
        if server is not None:
            await server.stop(STOP_GRACE_S)
        self._unlink_socket()

    def _unlink_socket(self) -> None:
        path, ours = self.socket_path, self._socket_id
        self._socket_id = None
        if path is None or ours is None:
            return
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(path)
            if (st.st_dev, st.st_ino) == ours:
                os.unlink(path)
