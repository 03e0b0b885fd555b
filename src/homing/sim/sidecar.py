"""HTTP sidecar of one simulated worker (aiohttp, on the worker's port + 1): metrics and faults.

Rule of this file: the HTTP edge only. It decodes and validates requests and hands every
action to the worker behind the `FaultTarget` protocol.

- `GET /metrics`: the worker's Prometheus metrics (`homing.sim.metrics`), text format 0.0.4.
- `GET /fault`: the faults in force, as JSON.
- `POST /fault`: a fault body (see `homing.sim.faults`). Answers 200 with the faults in force
  (or, for `restart`, once the worker serves again; for `clear`, once the cache is flushed),
  202 for `crash` (sent before the worker dies, sidecar included), 409 when `clear` found the
  engine busy for longer than `clear_timeout_s`, and 400 with `{"error": message}` for a body
  that is not JSON or not a valid fault.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from homing.sim.faults import Fault, FaultError, parse_fault


class FaultTarget(Protocol):
    """What the sidecar needs from a worker (`homing.sim.worker.SimWorker`)."""

    def fault_state(self) -> dict[str, object]: ...

    async def apply_fault(self, fault: Fault) -> None: ...

    async def restart(self) -> None: ...

    async def crash(self) -> None: ...

    async def clear_cache(self, timeout_s: float) -> tuple[bool, str]: ...


class Sidecar:
    """The sidecar server of one worker (see the module docstring)."""

    def __init__(
        self, target: FaultTarget, registry: CollectorRegistry, *, clear_timeout_s: float = 10.0
    ) -> None:
        self._target = target
        self._registry = registry
        self._clear_timeout_s = clear_timeout_s
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    def app(self) -> web.Application:
        """The aiohttp application (routes above)."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/fault", self._get_fault)
        app.router.add_post("/fault", self._post_fault)
        return app

    async def start(self, host: str, port: int) -> int:
        """Serve on host:port (port > 0); returns it. Raises OSError when it cannot bind."""
        runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = port
        return port

    async def stop(self) -> None:
        """Stop serving (idempotent)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self._registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def _get_fault(self, request: web.Request) -> web.Response:
        return web.json_response(self._target.fault_state())

    async def _post_fault(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body: Any = json.loads(raw) if raw.strip() else None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(f"the fault body is not valid JSON: {exc}")
        if body is None:
            return _error('the fault body is empty; send a JSON object such as {"slowdown": 2}')
        try:
            fault = parse_fault(body)
        except FaultError as exc:
            return _error(str(exc))
        if fault.crash:
            response = web.json_response({"crashing": True}, status=202)
            await response.prepare(request)
            await response.write_eof()
            task = asyncio.get_running_loop().create_task(self._target.crash())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return response
        if fault.restart:
            await self._target.restart()
            return web.json_response({"restarted": True, "faults": self._target.fault_state()})
        if fault.clear:
            ok, message = await self._target.clear_cache(self._clear_timeout_s)
            return web.json_response({"cleared": ok, "message": message}, status=200 if ok else 409)
        await self._target.apply_fault(fault)
        return web.json_response({"faults": self._target.fault_state()})


def _error(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)
