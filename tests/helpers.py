"""Helpers shared by the test suites (importable as `helpers`; tests/ is on pythonpath)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from homing.app import App
    from homing.clock import Clock, ManualClock
    from homing.config import HomingConfig


def own_app(config: HomingConfig, **kwargs: Any) -> App:
    """An `App` of `config` (with `kwargs`) whose admin socket and rollout store, when the
    config names no place for them, get a directory of their own below the test's
    `$HOMING_STATE_DIR`: several Apps may run in one test or module."""
    from homing.app import App

    own = tempfile.mkdtemp(prefix="app-", dir=os.environ.get("HOMING_STATE_DIR"))
    return App(config, state_dir=own, **kwargs)


def free_port() -> int:
    """A loopback TCP port free now (the OS's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str) -> tuple[int, bytes]:
    """GET `url` (2 s timeout): (status, body), or (0, b"") when it cannot be reached."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read()
    except OSError:
        return 0, b""


async def post_fault(worker_url: str, body: dict[str, object]) -> None:
    """POST a fault to a simulated worker's sidecar (its gRPC port + 1); asserts it took."""
    import aiohttp

    port = int(worker_url.rsplit(":", 1)[1]) + 1
    async with aiohttp.ClientSession() as http:
        async with http.post(f"http://127.0.0.1:{port}/fault", json=body) as resp:
            assert resp.status in (200, 202), await resp.text()


async def eventually(
    check: Callable[[], bool],
    within_s: float,
    *,
    clock: ManualClock | None = None,
    step_s: float = 0.1,
) -> bool:
    """Poll `check` every 10 ms until it holds or `within_s` of real time passes (a hang
    guard); its last value. With a `clock`, virtual time moves `step_s` a round, so the
    loops on it (health probes, backoffs) run meanwhile."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while loop.time() < deadline:
        if check():
            return True
        await asyncio.sleep(0.01)
        if clock is not None:
            clock.advance(step_s)
    return check()


async def stop_through_the_drain(app: App, drain_s: float) -> None:
    """Stop `app`, which runs on a `ManualClock` with requests in flight, moving virtual time
    through its drain: asserts the requests stay open while the clock is short of `drain_s`
    past the drain's start, then moves it there, where the drain cuts them, and on until
    the stop is done (hang guard: about 30 s of real time)."""
    from homing.clock import ManualClock

    clock, service = app.clock, app.service
    assert isinstance(clock, ManualClock) and service is not None and service.in_flight
    in_flight = service.in_flight
    stopping = asyncio.ensure_future(app.stop())
    cut_at = clock.now() + drain_s
    assert await eventually(lambda: cut_at in clock.deadlines(), within_s=10.0)
    clock.advance(drain_s * 0.999)
    await clock.settle()
    assert service.in_flight == in_flight and not stopping.done()  # still draining
    clock.advance(drain_s * 0.001)
    # The cut requests get the clock's cut grace to send their error and end; the clock
    # moves on 0.1 s a round until the stop is done.
    for _ in range(3000):
        if stopping.done():
            break
        await asyncio.sleep(0.01)
        clock.advance(0.1)
    await stopping


async def assert_ready_and_healthy(app: App) -> None:
    """`GET /ready` on a fresh connection is 200 with every worker counted healthy, and every
    worker of `app.pool` is healthy with no failure counted (a client's mistake must never
    count against a worker)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
    try:
        writer.write(b"GET /ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 5)  # until the server closes
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert app.pool is not None
    workers = app.pool.workers()
    assert app.model is not None
    assert json.loads(body) == {
        "ready": True,
        "healthy_workers": len(workers),
        "workers": len(workers),
        "models": {app.model.model_id: {"ready_workers": len(workers), "workers": len(workers)}},
    }
    assert [(w.healthy, w.consecutive_failures) for w in workers] == [(True, 0)] * len(workers)


async def post_without_reading(port: int, path: str, body: bytes) -> asyncio.StreamWriter:
    """Send `POST path` with a JSON `body` on a connection whose receive window is tiny and
    that never reads: a client that stopped reading. Close the returned writer when done."""
    import socket

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # the window fills at once
    sock.connect(("127.0.0.1", port))
    _, writer = await asyncio.open_connection(sock=sock)
    writer.write(
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body)
    )
    await writer.drain()
    return writer


async def send_raw(port: int, data: bytes, timeout_s: float = 5.0) -> bytes:
    """Send `data` on a fresh loopback connection and read until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout_s)
    finally:
        writer.close()


async def worker_of_session(app: App, model: str, session: str) -> str:
    """The id of the worker that serves `session`'s requests of `model` now, found with a
    one-token completion through `app`'s HTTP listener (asserts it is a 200)."""
    import aiohttp

    body = {"model": model, "prompt": "probe", "max_tokens": 1}
    url = f"http://127.0.0.1:{app.http_port}/v1/completions"
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=body, headers={"x-session-id": session}) as resp:
            assert resp.status == 200, await resp.text()
            return resp.headers["x-homing-worker"]


class NotifyListener:
    """A datagram socket at `path` standing in for systemd's notification socket; each
    message read is kept in `messages` as (monotonic time, fields)."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.path = path
        self.messages: list[tuple[float, dict[str, str]]] = []

    def until(self, key: str, timeout_s: float, value: str | None = None) -> dict[str, str]:
        """Read messages until one with `key` (equal to `value` when given); returns it
        (fails the test after `timeout_s`)."""
        import pytest

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                break
            fields = dict(line.split("=", 1) for line in data.decode().split("\n"))
            self.messages.append((time.monotonic(), fields))
            if key in fields and (value is None or fields[key] == value):
                return fields
        pytest.fail(f"no {key}={value or '*'} within {timeout_s} s; got {self.messages}")

    def sequence(self) -> list[str]:
        """The state messages in order (watchdog pings and status-only lines left out)."""
        out = []
        for _, fields in self.messages:
            states = [k for k in fields if k not in ("WATCHDOG", "STATUS", "MONOTONIC_USEC")]
            out += [f"{k}={fields[k]}" for k in states]
        return out

    def states(self) -> list[str]:
        """READY, RELOADING and STOPPING messages in order."""
        keys = ("READY", "RELOADING", "STOPPING")
        return [f"{k}={f[k]}" for _, f in self.messages for k in keys if k in f]


async def greedy_ids(app: App, worker_id: str, input_ids: Sequence[int], tokens: int) -> list[int]:
    """Worker `worker_id`'s own greedy output ids for `input_ids` (`tokens` of them, EOS
    ignored), asked of it directly, as one non-streamed answer."""
    from homing.engines.client import GenerateDone, GenerateParams, TokenChunk

    assert app.pool is not None
    params = GenerateParams(
        request_id=f"truth-{len(input_ids)}",
        input_ids=list(input_ids),
        max_new_tokens=tokens,
        temperature=0.0,
        ignore_eos=True,
        stream=False,
    )
    items = [item async for item in app.pool.client(worker_id).generate(params)]
    done = items[-1]
    assert isinstance(done, GenerateDone) and not any(isinstance(i, TokenChunk) for i in items)
    assert len(done.token_ids) == tokens
    return list(done.token_ids)


@contextlib.asynccontextmanager
async def app_factory(
    config: Callable[..., HomingConfig], *, clock: Callable[[], Clock] | None = None
) -> AsyncIterator[Callable[..., Awaitable[App]]]:
    """`async with app_factory(config) as make:` then `await make(*args, **kwargs)`: a
    started `App` of `config(*args, **kwargs)`, on a clock of its own from `clock()` (None:
    the system's); every one made is stopped on the way out."""

    started: list[App] = []

    async def make(*args: object, **kwargs: object) -> App:
        app = own_app(config(*args, **kwargs), clock=clock() if clock is not None else None)
        await app.start()
        started.append(app)
        return app

    try:
        yield make
    finally:
        for app in started:
            await app.stop()
