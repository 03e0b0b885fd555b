"""The admin API client (`homing.v1.Admin`) the `homing` admin verbs and the tests use.

Address: `--admin ADDR`, else `$HOMING_ADMIN`, else the default socket
`unix:<state dir>/admin.sock` (`homing.config.default_state_dir`: `$HOMING_STATE_DIR`, else
`$XDG_RUNTIME_DIR/homing`, else `/tmp/homing-<uid>`). An address is `unix:PATH` (a bare
absolute path is read as one) or `HOST:PORT`. Key: `key`, else `$HOMING_ADMIN_KEY`; sent as
`authorization: Bearer KEY`.

Every refusal raises `AdminError` with the server's status and message; a server that
cannot be reached (no socket file, nothing listening) is `AdminError` with UNAVAILABLE.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any

import grpc

from homing.config import default_state_dir
from homing.v1 import admin_pb2 as pb
from homing.v1 import admin_pb2_grpc as pb_grpc

#: Seconds an admin call may take by default (AddWorker waits for the worker's discovery,
#: `engines.discovery_timeout_s` = 10 s at most per call).
DEFAULT_TIMEOUT_S = 30.0

#: Seconds beyond a DrainWorker's own wait its call may take.
WAIT_MARGIN_S = 10.0

#: The deadline of a DrainWorker call that waits with no timeout (one day, in seconds).
UNBOUNDED_S = 86_400.0


class AdminError(Exception):
    """A refused or failed admin call: `code` (a `grpc.StatusCode`), `message`, and
    `answered`: the server itself refused it (its error JSON came with the status), so an
    UNAVAILABLE is a service of the gateway's, not the admin API, being down."""

    def __init__(self, code: grpc.StatusCode, message: str, answered: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.answered = answered

    @property
    def unreachable(self) -> bool:
        """The admin API could not be reached or did not answer in time."""
        late = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        return self.code in late and not self.answered


def default_address() -> str:
    """`unix:<state dir>/admin.sock`, the socket `homing serve` binds by default."""
    return "unix:" + os.path.join(default_state_dir(), "admin.sock")


def resolve_address(address: str | None = None) -> str:
    """`address`, else `$HOMING_ADMIN`, else `default_address()`, in the form grpc dials
    ("unix:PATH" or "HOST:PORT"). ValueError for an address of neither form."""
    chosen = address or os.environ.get("HOMING_ADMIN") or default_address()
    if chosen.startswith("/"):
        chosen = "unix:" + chosen
    if chosen.startswith("unix:"):
        if not chosen.removeprefix("unix:"):
            raise ValueError("the admin address unix: needs a path (unix:/run/homing/admin.sock)")
        return chosen
    host, _, port = chosen.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"admin address {chosen!r} must look like unix:PATH or HOST:PORT")
    return chosen


class AdminClient:
    """Async client of one admin server. Use `async with AdminClient(...) as admin:`.

    `address` and `key`: see the module docstring; `timeout_s`: per call (seconds).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.address = resolve_address(address)
        key = key if key is not None else os.environ.get("HOMING_ADMIN_KEY")
        self.metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {key}"),) if key else ()
        )
        self.timeout_s = timeout_s
        self._channel = grpc.aio.insecure_channel(self.address)
        self._stub = pb_grpc.AdminStub(self._channel)

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()

    def _check_socket(self) -> None:
        """AdminError UNAVAILABLE naming the path when the socket file does not exist (grpc
        would only say it failed to connect)."""
        if not self.address.startswith("unix:"):
            return
        path = self.address.removeprefix("unix:")
        if not os.path.exists(path):
            raise AdminError(
                grpc.StatusCode.UNAVAILABLE,
                f"no admin socket at {path}: is `homing serve` running? (pick another with "
                "--admin or HOMING_ADMIN)",
            )

    async def _call(self, method: Any, request: Any, timeout_s: float | None = None) -> Any:
        """Call `method`; `timeout_s` None: the client's `timeout_s`."""
        self._check_socket()
        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            return await method(request, timeout=timeout, metadata=self.metadata)
        except grpc.aio.AioRpcError as err:
            code, details = err.code(), err.details() or ""
            answered = any(k == "x-error-json" for k, _ in err.trailing_metadata() or ())
            if code is grpc.StatusCode.UNAVAILABLE and not answered:
                details = f"cannot reach the admin API at {self.address}: {details}"
            elif code is grpc.StatusCode.DEADLINE_EXCEEDED and not answered:
                details = f"the admin API at {self.address} did not answer in time"
            raise AdminError(code, details, answered) from None

    async def list_models(self) -> pb.AdminListModelsResponse:
        """Every served model with its pool."""
        return await self._call(self._stub.ListModels, pb.AdminListModelsRequest())

    async def list_workers(self, model: str = "") -> pb.ListWorkersResponse:
        """Every worker, or `model`'s."""
        return await self._call(self._stub.ListWorkers, pb.ListWorkersRequest(model=model))

    async def add_worker(self, model: str, url: str, version: str = "") -> pb.Worker:
        """Add `url` (grpc://host:port) to `model`'s pool."""
        request = pb.AddWorkerRequest(model=model, url=url, version=version)
        return await self._call(self._stub.AddWorker, request)

    async def drain_worker(
        self,
        worker_id: str,
        *,
        wait: bool = False,
        timeout_s: float | None = None,
        grace_s: float | None = None,
    ) -> pb.DrainWorkerResponse:
        """Drain `worker_id`; with `wait`, until it has left or `timeout_s` passed (None:
        until it leaves). `grace_s`: seconds before its open requests are cut (None: the
        gateway's drain timeout)."""
        request = pb.DrainWorkerRequest(worker_id=worker_id, wait=wait)
        if timeout_s is not None:
            request.timeout_s = timeout_s
        if grace_s is not None:
            request.grace_s = grace_s
        deadline = self.timeout_s
        if wait:
            # Without a timeout the wait ends when the worker leaves, at the latest when its
            # requests are cut (the drain timeout) and their grace has passed.
            deadline = UNBOUNDED_S if timeout_s is None else timeout_s + WAIT_MARGIN_S
        return await self._call(self._stub.DrainWorker, request, deadline)

    async def cordon_worker(self, worker_id: str) -> pb.Worker:
        """Stop new requests to `worker_id`; it stays."""
        request = pb.CordonWorkerRequest(worker_id=worker_id)
        return await self._call(self._stub.CordonWorker, request)

    async def uncordon_worker(self, worker_id: str) -> pb.Worker:
        """Let `worker_id` take new requests again."""
        request = pb.UncordonWorkerRequest(worker_id=worker_id)
        return await self._call(self._stub.UncordonWorker, request)

    async def remove_worker(self, worker_id: str, *, force: bool = False) -> pb.Worker:
        """Remove `worker_id` now (`force`: cut its requests in flight)."""
        request = pb.RemoveWorkerRequest(worker_id=worker_id, force=force)
        return await self._call(self._stub.RemoveWorker, request)

    async def list_tenants(self) -> pb.ListTenantsResponse:
        """The configured tenants with their limits and live quota use."""
        return await self._call(self._stub.ListTenants, pb.ListTenantsRequest())

    async def get_stats(self) -> pb.Stats:
        """Uptime, requests in flight, per-model worker counts."""
        return await self._call(self._stub.GetStats, pb.GetStatsRequest())

    async def get_scaler(self, model: str = "", *, advise: bool = False) -> pb.GetScalerResponse:
        """Every autoscaled model's scaler, or `model`'s; with `advise`, also what a tick
        would decide now (nothing is changed)."""
        request = pb.GetScalerRequest(model=model, advise=advise)
        return await self._call(self._stub.GetScaler, request)

    async def get_rollout(self, model: str) -> pb.RolloutStatus:
        """`model`'s version split and rollout now."""
        return await self._call(self._stub.GetRollout, pb.RolloutRequest(model=model))

    async def start_rollout(
        self, model: str, version: str, steps: list[float] | None, bake_s: float | None
    ) -> pb.RolloutStatus:
        """Roll `version` out on `model` (None: the gateway's default steps / bake)."""
        request = pb.StartRolloutRequest(model=model, version=version, steps=steps or [])
        if bake_s is not None:
            request.bake_s = bake_s
        return await self._call(self._stub.StartRollout, request)

    async def rollout_op(self, op: str, model: str) -> pb.RolloutStatus:
        """`op` ("pause", "resume", "promote", "rollback") on `model`'s rollout."""
        method = {
            "pause": self._stub.PauseRollout,
            "resume": self._stub.ResumeRollout,
            "promote": self._stub.PromoteRollout,
            "rollback": self._stub.RollbackRollout,
        }[op]
        return await self._call(method, pb.RolloutRequest(model=model))

    async def set_versions(
        self, model: str, weights: dict[str, float], *, reset: bool = False
    ) -> pb.RolloutStatus:
        """Set `model`'s split to `weights`, or `reset` it to the config's."""
        request = pb.SetVersionsRequest(
            model=model,
            weights=[pb.VersionWeight(version=v, weight=w) for v, w in weights.items()],
            reset=reset,
        )
        return await self._call(self._stub.SetVersions, request)
