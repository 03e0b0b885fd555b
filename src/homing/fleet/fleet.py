"""The served models and the operations that change their pools while they serve.

Rule of the file: each operation checks its input, applies one lifecycle action through the
model's pool (`homing.engines.lifecycle`) and raises a `FleetError` subclass a person can act
on; the admin API maps those to status codes (`code`). Worker ids come from one `WorkerIds`
source, so they are unique across models and never reused.

Drain: the worker takes no new request from the moment `drain` returns; it leaves when its
last request ends. If requests are still open after the drain timeout, their leases are cut
(each holder ends its request with an explicit error) and the worker is removed once they
end, or `cut_grace_s` later.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import structlog

from homing.config.rules import MAX_VERSION_LABEL, is_version_label
from homing.engines.lifecycle import IllegalTransition, Phase
from homing.engines.pool import WorkerRefused, WorkerSpec, WorkerState, check_worker_url
from homing.fleet.dispatch import ModelDispatch

log = structlog.get_logger("homing.fleet")

#: Seconds cut requests get to send their error and end: after a drain timeout, before the
#: gateway stops or their worker is removed.
CUT_GRACE_S = 2.0


class FleetError(Exception):
    """An operation the fleet refuses; `code` names the kind (a gRPC status name)."""

    code = "FAILED_PRECONDITION"


class UnknownModel(FleetError):
    """No served model has that name."""

    code = "NOT_FOUND"


class UnknownWorker(FleetError):
    """No worker has that id."""

    code = "NOT_FOUND"


class InvalidWorker(FleetError):
    """A malformed worker URL or version."""

    code = "INVALID_ARGUMENT"


class DuplicateWorker(FleetError):
    """The URL is already one of the fleet's workers."""

    code = "ALREADY_EXISTS"


class WrongPhase(FleetError):
    """The worker's phase does not allow the operation (or the worker refused to join)."""

    code = "FAILED_PRECONDITION"


class WorkerIds:
    """Worker ids "w0", "w1", ... shared by every pool of a fleet; never reused."""

    def __init__(self) -> None:
        self._next = itertools.count()

    def __call__(self) -> str:
        return f"w{next(self._next)}"


class Fleet:
    """The served models by name (`models`, in config order) and their worker operations.

    `drain_timeout_s`: the default time a draining worker's requests get before they are
    cut.
    """

    def __init__(self, models: list[ModelDispatch], *, drain_timeout_s: float = 30.0) -> None:
        self.models: dict[str, ModelDispatch] = {m.model_id: m for m in models}
        if len(self.models) != len(models):
            raise ValueError("two models have the same name")
        self.drain_timeout_s = drain_timeout_s
        self._drains: dict[str, asyncio.Task[None]] = {}

    # -- lookups --

    def model(self, name: str) -> ModelDispatch:
        """The model served as `name`; `UnknownModel` otherwise."""
        try:
            return self.models[name]
        except KeyError:
            served = ", ".join(sorted(self.models)) or "none"
            raise UnknownModel(f"no model {_shown(name)} is served (served: {served})") from None

    def find(self, worker_id: str) -> tuple[ModelDispatch, WorkerState]:
        """The model and live state of `worker_id`; `UnknownWorker` otherwise."""
        for m in self.models.values():
            if m.pool.has(worker_id):
                return m, m.pool.state(worker_id)
        raise UnknownWorker(f"no worker {_shown(worker_id)} (list them with `homing workers ls`)")

    def workers(self) -> list[tuple[ModelDispatch, WorkerState]]:
        """Every worker of every model, models in order."""
        return [(m, w) for m in self.models.values() for w in m.workers()]

    # -- operations --

    async def add_worker(self, model: str, url: str, version: str = "") -> WorkerState:
        """Add `url` to `model`'s pool; returns its state once discovery answered (`ready`,
        or `joining` while it cannot be reached). `UnknownModel`, `InvalidWorker`,
        `DuplicateWorker`, `WrongPhase` (refused: another model or tokenizer)."""
        dispatch = self.model(model)
        try:
            url = check_worker_url(url)  # canonical: one engine has one URL
        except ValueError as err:
            raise InvalidWorker(str(err)) from None
        if not is_version_label(version):
            raise InvalidWorker(
                f"version must be at most {MAX_VERSION_LABEL} printable ASCII characters"
            )
        for m, w in self.workers():
            if w.url == url:
                raise DuplicateWorker(
                    f"{url} is already worker {w.worker_id} of model {m.model_id!r}"
                )
        try:
            return await dispatch.pool.add(WorkerSpec(url, version))
        except WorkerRefused as err:
            raise WrongPhase(f"refused: {err}") from None

    def cordon(self, worker_id: str) -> WorkerState:
        """`worker_id` takes no new requests and stays (a cordoned one stays as it is).
        `UnknownWorker`, `WrongPhase` (joining, draining or ejected)."""
        m, state = self.find(worker_id)
        if state.phase is Phase.CORDONED:
            return state
        return self._act(worker_id, lambda: m.pool.cordon(worker_id))

    def uncordon(self, worker_id: str) -> WorkerState:
        """`worker_id` takes new requests again (a ready one stays as it is).
        `UnknownWorker`, `WrongPhase`."""
        m, state = self.find(worker_id)
        if state.phase is Phase.READY:
            return state
        return self._act(worker_id, lambda: m.pool.uncordon(worker_id))

    def drain(self, worker_id: str, timeout_s: float | None = None) -> WorkerState:
        """Start draining `worker_id` (see the module docstring); `timeout_s` None takes
        `drain_timeout_s`. A worker already draining keeps its first drain's timeout.
        `UnknownWorker`, `WrongPhase`."""
        m, current = self.find(worker_id)
        if current.phase is Phase.DRAINING:
            return current
        state = self._act(worker_id, lambda: m.pool.drain(worker_id))
        limit = self.drain_timeout_s if timeout_s is None else timeout_s
        task = asyncio.get_running_loop().create_task(self._drain(m, worker_id, limit))
        self._drains[worker_id] = task
        task.add_done_callback(lambda t: self._forget_drain(worker_id, t))
        return state

    def undrain(self, worker_id: str) -> WorkerState:
        """A draining `worker_id` takes new requests again and stays; its drain's timeout
        no longer applies. One not draining stays as it is. `UnknownWorker`, `WrongPhase`."""
        m, current = self.find(worker_id)
        if current.phase is not Phase.DRAINING:
            return current
        state = self._act(worker_id, lambda: m.pool.undrain(worker_id))
        task = self._drains.pop(worker_id, None)
        if task is not None:
            task.cancel()
        return state

    def _forget_drain(self, worker_id: str, task: asyncio.Task[None]) -> None:
        if self._drains.get(worker_id) is task:
            del self._drains[worker_id]

    async def wait_gone(self, worker_id: str, timeout_s: float | None) -> bool:
        """Wait until `worker_id` has left, at most `timeout_s`; True when it has."""
        for m in self.models.values():
            try:
                return await m.pool.wait_gone(worker_id, timeout_s)
            except KeyError:
                continue
        raise UnknownWorker(f"no worker {_shown(worker_id)}")

    async def remove(self, worker_id: str, *, force: bool = False) -> WorkerState:
        """Remove `worker_id` now. With requests in flight it is `WrongPhase` unless
        `force`, which cuts them first. `UnknownWorker`."""
        m, state = self.find(worker_id)
        open_ = m.open_leases(worker_id)
        if open_ and not force:
            raise WrongPhase(
                f"worker {worker_id} has {open_} request(s) in flight; drain it first "
                f"(homing workers drain {worker_id} --wait) or remove it with --force"
            )
        if open_:
            m.cut(worker_id, "worker_removed")
        await m.pool.remove(worker_id)
        return state

    async def stop(self) -> None:
        """Cancel the drains under way (their workers stay in their pools)."""
        tasks = list(self._drains.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- internals --

    def _act(self, worker_id: str, action: Callable[[], WorkerState]) -> WorkerState:
        try:
            return action()
        except IllegalTransition as err:
            raise WrongPhase(f"worker {worker_id}: {err}") from None

    async def _drain(self, m: ModelDispatch, worker_id: str, timeout_s: float) -> None:
        if await m.pool.wait_gone(worker_id, timeout_s):
            return
        if not m.pool.has(worker_id) or m.pool.state(worker_id).phase is not Phase.DRAINING:
            return
        cut = m.cut(worker_id, "worker_drained")
        log.warning("worker_drain_timeout", worker=worker_id, cut=cut, timeout_s=timeout_s)
        if not await m.pool.wait_gone(worker_id, CUT_GRACE_S):
            await m.pool.remove(worker_id)


def _shown(text: str) -> str:
    """`text` quoted for a message, cut to 64 characters (client input is echoed bounded)."""
    return repr(text if len(text) <= 64 else text[:64] + "...")
