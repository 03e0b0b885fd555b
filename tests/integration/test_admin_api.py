"""The admin API (`homing.v1.Admin`) of a running App over simulated workers (child
processes), called through `AdminClient` on its Unix socket and its TCP port: every call,
and every refusal with its exact status code and message."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import stat
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
import pytest
import pytest_asyncio
from helpers import eventually, own_app

from homing.admin.client import AdminClient, AdminError
from homing.admin.server import UNAUTHENTICATED_MESSAGE, AdminServer
from homing.app import App
from homing.config import (
    AdminKeySettings,
    AdminSettings,
    ApiKeySettings,
    EngineSettings,
    GatewaySettings,
    HomingConfig,
    QuotaLimits,
    SimSettings,
    TenantSettings,
)
from homing.sim.process import spawn_sim, terminate
from homing.v1 import admin_pb2 as pb
from homing.v1 import admin_pb2_grpc as pb_grpc

pytestmark = pytest.mark.asyncio(loop_scope="module")

ADMIN_KEY = "adm-7f3c-secret"
TENANT_KEY = "sk-acme-1"
OTHER_KEY = "sk-free-1"

Code = grpc.StatusCode


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(scope="module")
def state_dir() -> Iterator[str]:
    """A short state directory of the module's own (Unix socket paths are short)."""
    with tempfile.TemporaryDirectory(prefix="adm-") as path:
        yield path


def config(state_dir: str) -> HomingConfig:
    """Two simulated workers at 10x speed, two tenants, admin keys, socket and TCP."""
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=2.0),
        engines=EngineSettings(health_interval_s=0.1, unhealthy_threshold=2),
        sim=SimSettings(workers=2, speedup=10.0),
        tenants=[
            TenantSettings(
                name="acme",
                priority=5,
                keys=[
                    ApiKeySettings(
                        id="acme-1", sha256=sha(TENANT_KEY), quota=QuotaLimits(concurrent_streams=4)
                    )
                ],
                quota=QuotaLimits(
                    requests_per_minute=1000, tokens_per_minute=1_000_000, concurrent_streams=8
                ),
            ),
            TenantSettings(
                name="free",
                keys=[ApiKeySettings(id="free-1", sha256=sha(OTHER_KEY), models=[])],
                models=["llama-3.1-8b"],
            ),
        ],
        admin=AdminSettings(
            state_dir=os.path.join(state_dir, "run"),
            port=0,
            keys=[AdminKeySettings(id="ops", sha256=sha(ADMIN_KEY))],
        ),
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(state_dir: str) -> AsyncIterator[App]:
    async with own_app(config(state_dir)) as running:
        yield running


@pytest.fixture(autouse=True)
def _no_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOMING_ADMIN_KEY", raising=False)
    monkeypatch.delenv("HOMING_ADMIN", raising=False)


def socket_of(app: App) -> str:
    assert app.admin is not None and app.admin.socket_path is not None
    return app.admin.socket_path


@pytest_asyncio.fixture(loop_scope="module")
async def admin(app: App) -> AsyncIterator[AdminClient]:
    async with AdminClient(f"unix:{socket_of(app)}", key=ADMIN_KEY) as client:
        yield client


@dataclass
class Spares:
    """Simulated workers started outside the App (`await spares.start()`), to be added."""

    processes: list[asyncio.subprocess.Process] = field(default_factory=list)

    async def start(self) -> str:
        """Start one; its grpc:// URL."""
        args = ["--workers", "1", "--port", "0", "--speedup", "10"]
        process, ready = await spawn_sim([*args, "--parent-pid", str(os.getpid())])
        self.processes.append(process)
        return str(ready["workers"][0]["url"])


@pytest_asyncio.fixture(loop_scope="module")
async def spare() -> AsyncIterator[Spares]:
    """Spare workers for one test, all stopped after it."""
    spares = Spares()
    yield spares
    await terminate(spares.processes, 2.0)


def exists(path: str) -> bool:
    return os.path.lexists(path)


async def refused(call: object) -> AdminError:
    """The `AdminError` the awaited `call` raises."""
    with pytest.raises(AdminError) as caught:
        await call  # type: ignore[misc]
    return caught.value


def model_of(app: App) -> str:
    assert app.model is not None
    return app.model.model_id


# -- listeners and auth --


async def test_socket_file_is_mode_0600_in_a_0700_directory(app: App) -> None:
    """The socket homing created is a socket of mode 0600, in a directory it made 0700."""
    path = socket_of(app)
    mode = os.stat(path).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert app.admin is not None
    assert app.admin.addresses == [f"unix:{path}", f"127.0.0.1:{app.admin.tcp_port}"]


@pytest.mark.parametrize("key", [None, "wrong-key", ""])
async def test_missing_or_wrong_key_is_unauthenticated(app: App, key: str | None) -> None:
    """No key, a wrong key or an empty one: UNAUTHENTICATED with the message naming how to
    pass one, on the socket and on TCP alike."""
    assert app.admin is not None
    for address in (f"unix:{socket_of(app)}", f"127.0.0.1:{app.admin.tcp_port}"):
        async with AdminClient(address, key=key) as client:
            err = await refused(client.list_workers())
        assert (err.code, err.message) == (Code.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
        assert UNAUTHENTICATED_MESSAGE == (
            "a valid admin key is required (--admin-key or HOMING_ADMIN_KEY)"
        )


async def test_key_from_the_environment_and_over_tcp_is_accepted(
    app: App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`HOMING_ADMIN_KEY` is the key when none is given; TCP serves the same API."""
    assert app.admin is not None
    monkeypatch.setenv("HOMING_ADMIN_KEY", ADMIN_KEY)
    async with AdminClient(f"127.0.0.1:{app.admin.tcp_port}") as client:
        models = await client.list_models()
    assert [m.name for m in models.models] == [model_of(app)]


async def test_refusal_carries_x_error_json(app: App) -> None:
    """A refusal's trailing metadata holds the JSON error with its status and reason."""
    async with grpc.aio.insecure_channel(f"unix:{socket_of(app)}") as channel:
        stub = pb_grpc.AdminStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CordonWorker(
                pb.CordonWorkerRequest(worker_id="w99"),
                metadata=(("authorization", f"Bearer {ADMIN_KEY}"),),
            )
    trailing = dict(caught.value.trailing_metadata() or ())
    assert json.loads(trailing["x-error-json"]) == {
        "error": {
            "message": "no worker 'w99' (list them with `homing workers ls`)",
            "status": "NOT_FOUND",
            "reason": "UnknownWorker",
        }
    }


async def test_second_server_on_a_live_socket_is_refused(app: App) -> None:
    """Another AdminServer, or a whole App, on the socket a live server answers on fails
    with EADDRINUSE before starting anything; the live one keeps serving."""
    assert app.fleet is not None
    path = socket_of(app)
    second = AdminServer(app.fleet, AdminSettings(socket=path))
    with pytest.raises(OSError) as caught:
        await second.start()
    message = (
        f"another homing serve answers on the admin socket {path}; stop it, or give this one "
        "its own (admin.socket, admin.state_dir or HOMING_STATE_DIR)"
    )
    assert caught.value.strerror == message
    other = own_app(
        HomingConfig(gateway=GatewaySettings(port=0, grpc_port=0), admin=AdminSettings(socket=path))
    )
    with pytest.raises(OSError, match="another homing serve answers"):
        await other.start()
    assert other.fleet is None and other.launchers == []  # no worker was started
    async with AdminClient(f"unix:{path}", key=ADMIN_KEY) as client:
        assert len((await client.list_workers()).workers) >= 2


async def test_stale_socket_is_replaced_and_removed_at_stop(
    app: App, state_dir: str, tmp_path: Path
) -> None:
    """A socket file nobody answers on is replaced; a new directory is made 0700; the file
    goes when the server stops. A file that is not a socket is refused."""
    assert app.fleet is not None
    directory = os.path.join(state_dir, "stale")
    stale = os.path.join(directory, "new", "a.sock")
    os.makedirs(os.path.dirname(stale))
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(stale)  # bound, never listening, closed: a stale file
    server = AdminServer(app.fleet, AdminSettings(socket=stale))
    await server.start()
    try:
        assert stat.S_IMODE(os.stat(stale).st_mode) == 0o600
        async with AdminClient(f"unix:{stale}") as client:  # no keys: the file mode guards
            assert len((await client.get_stats()).models) == 1
    finally:
        await server.stop()
    assert not exists(stale)

    fresh = os.path.join(directory, "made", "admin.sock")
    made = AdminServer(app.fleet, AdminSettings(state_dir=os.path.dirname(fresh)))
    await made.start()
    await made.stop()
    assert made.socket_path == fresh
    assert stat.S_IMODE(os.stat(os.path.dirname(fresh)).st_mode) == 0o700

    plain = tmp_path / "plain"
    plain.write_text("not a socket")
    with pytest.raises(OSError) as caught:
        await AdminServer(app.fleet, AdminSettings(socket=str(plain))).start()
    assert caught.value.strerror == f"{plain} exists and is not a socket; remove it or move it"


async def test_unreachable_socket_is_unavailable_naming_the_path(tmp_path: Path) -> None:
    """No socket file: UNAVAILABLE naming the path, before any connection attempt."""
    path = tmp_path / "none.sock"
    async with AdminClient(f"unix:{path}") as client:
        err = await refused(client.get_stats())
    assert err.code is Code.UNAVAILABLE
    assert err.message == (
        f"no admin socket at {path}: is `homing serve` running? (pick another with --admin "
        "or HOMING_ADMIN)"
    )


# -- reads --


async def test_list_models_and_stats(app: App, admin: AdminClient) -> None:
    """ListModels gives the pool with its policy, counts and context; GetStats the uptime,
    the version and per-model counts."""
    assert app.model is not None
    models = await admin.list_models()
    assert [
        (m.name, m.policy, m.ready_workers, m.workers, m.max_context_length) for m in models.models
    ] == [(model_of(app), "cache_aware", 2, 2, app.model.max_context_length)]
    stats = await admin.get_stats()
    assert stats.uptime_s > 0 and stats.version == "0.1.0" and stats.in_flight == 0
    assert [(m.name, m.ready_workers, m.workers, m.in_flight) for m in stats.models] == [
        (model_of(app), 2, 2, 0)
    ]


async def test_list_workers_reports_live_state(app: App, admin: AdminClient) -> None:
    """ListWorkers gives every worker with its phase, health, load and cache credit; the
    model filter gives the same; an unknown model is NOT_FOUND."""
    assert app.pool is not None and app.router is not None
    served = await complete(app)
    router = app.router
    assert await eventually(lambda: router.index.worker_blocks(served) > 0, 5)
    listed = (await admin.list_workers()).workers
    assert [(w.id, w.model, w.phase, w.healthy) for w in listed] == [
        (w.worker_id, model_of(app), "ready", True) for w in app.pool.workers()
    ]
    one = next(w for w in listed if w.id == served)
    assert one.url == app.pool.state(served).url and one.kv_stream == "open"
    assert one.cached_blocks == router.index.worker_blocks(served) > 0
    assert one.HasField("running") and one.HasField("token_usage") and one.last_error == ""
    assert list((await admin.list_workers(model_of(app))).workers) == list(listed)
    err = await refused(admin.list_workers("nope"))
    assert (err.code, err.message) == (
        Code.NOT_FOUND,
        f"no model 'nope' is served (served: {model_of(app)})",
    )


async def test_list_tenants_gives_limits_and_live_use(app: App, admin: AdminClient) -> None:
    """ListTenants gives each tenant's priority, models, limits and what its scope holds;
    a key with a limit of its own has its own use; unlimited kinds have no use."""
    await complete(app)
    tenants = await admin.list_tenants()
    assert (tenants.window_s, tenants.backend, tenants.use_error) == (60.0, "memory", "")
    acme, free = tenants.tenants
    assert (acme.name, acme.priority, acme.any_model) == ("acme", 5, True)
    assert (acme.limits.requests_per_minute, acme.limits.concurrent_streams) == (1000, 8)
    assert acme.use.requests >= 1 and acme.use.tokens > 0 and acme.use.streams == 0
    (key,) = acme.keys
    assert (key.id, key.disabled, key.narrowed, key.limits.concurrent_streams) == (
        "acme-1",
        False,
        False,
        4,
    )
    assert key.use.streams == 0 and not key.use.HasField("requests")
    assert (free.name, free.any_model, list(free.models)) == ("free", False, ["llama-3.1-8b"])
    assert not free.use.HasField("requests") and not free.limits.HasField("requests_per_minute")
    assert free.keys[0].narrowed and list(free.keys[0].models) == []


# -- worker operations --


async def test_add_worker_and_its_refusals(app: App, admin: AdminClient, spare: Spares) -> None:
    """AddWorker joins a fresh worker `ready` with its version; a duplicate URL is
    ALREADY_EXISTS, a bad URL or version INVALID_ARGUMENT, an unknown model NOT_FOUND."""
    model = model_of(app)
    url = await spare.start()
    added = await admin.add_worker(model, url, "v2")
    assert (added.model, added.url, added.version, added.phase, added.healthy) == (
        model,
        url,
        "v2",
        "ready",
        True,
    )
    cases = [
        (
            admin.add_worker(model, url),
            Code.ALREADY_EXISTS,
            f"{url} is already worker {added.id} of model '{model}'",
        ),
        (
            admin.add_worker(model, "http://127.0.0.1:1"),
            Code.INVALID_ARGUMENT,
            "worker URL 'http://127.0.0.1:1' must look like grpc://host:port",
        ),
        (
            admin.add_worker(model, "grpc://127.0.0.1:70000"),
            Code.INVALID_ARGUMENT,
            "worker URL 'grpc://127.0.0.1:70000' needs a port in 1-65535",
        ),
        (
            admin.add_worker(model, "grpc://127.0.0.1:1", "x" * 129),
            Code.INVALID_ARGUMENT,
            "version must be at most 128 printable ASCII characters",
        ),
        (
            admin.add_worker("", "grpc://127.0.0.1:1"),
            Code.INVALID_ARGUMENT,
            f"a model is required (served: {model})",
        ),
        (
            admin.add_worker("nope", "grpc://127.0.0.1:1"),
            Code.NOT_FOUND,
            f"no model 'nope' is served (served: {model})",
        ),
    ]
    for call, code, message in cases:
        err = await refused(call)
        assert (err.code, err.message) == (code, message)
    removed = await admin.remove_worker(added.id)
    assert (removed.id, removed.phase) == (added.id, "gone")


async def test_cordon_uncordon_and_wrong_phases(app: App, admin: AdminClient) -> None:
    """Cordon takes a ready worker out of rotation and uncordon brings it back; both are
    idempotent (as kubectl's), and uncordoning a joining worker is FAILED_PRECONDITION."""
    target = (await admin.list_workers()).workers[0].id
    cordoned = await admin.cordon_worker(target)
    assert cordoned.phase == "cordoned"
    assert (await admin.list_models()).models[0].ready_workers == 1
    assert (await admin.cordon_worker(target)).phase == "cordoned"
    assert (await admin.uncordon_worker(target)).phase == "ready"
    assert (await admin.uncordon_worker(target)).phase == "ready"
    assert (await admin.list_models()).models[0].ready_workers == 2


@pytest.mark.parametrize("verb", ["cordon", "uncordon", "drain", "rm"])
async def test_unknown_worker_is_not_found(admin: AdminClient, verb: str) -> None:
    """Every worker operation on an id no worker has is NOT_FOUND with how to list them."""
    calls = {
        "cordon": lambda: admin.cordon_worker("w99"),
        "uncordon": lambda: admin.uncordon_worker("w99"),
        "drain": lambda: admin.drain_worker("w99", wait=True),
        "rm": lambda: admin.remove_worker("w99", force=True),
    }
    err = await refused(calls[verb]())
    assert (err.code, err.message) == (
        Code.NOT_FOUND,
        "no worker 'w99' (list them with `homing workers ls`)",
    )


async def test_drain_wait_returns_once_an_idle_worker_has_left(
    app: App, admin: AdminClient, spare: Spares
) -> None:
    """An idle worker drained with wait has left when the call returns (phase gone);
    a negative timeout is INVALID_ARGUMENT."""
    added = await admin.add_worker(model_of(app), await spare.start())
    err = await refused(admin.drain_worker(added.id, wait=True, timeout_s=-1))
    assert (err.code, err.message) == (
        Code.INVALID_ARGUMENT,
        "timeout_s must be a finite number of seconds >= 0, not -1.0",
    )
    drained = await admin.drain_worker(added.id, wait=True, timeout_s=10)
    assert drained.left and drained.worker.phase == "gone"
    assert added.id not in [w.id for w in (await admin.list_workers()).workers]


async def test_busy_worker_drain_timeout_phases_and_forced_remove(
    app: App, admin: AdminClient, spare: Spares
) -> None:
    """With a request held open on a worker: stats and tenants count it; drain with wait
    gives up at its timeout (left false, still draining); cordoning or draining it again is
    FAILED_PRECONDITION; removing it is refused without force and, forced, cuts the stream
    with `worker_removed`."""
    model = model_of(app)
    url = await spare.start()
    busy = await admin.add_worker(model, url)
    others = [w.id for w in (await admin.list_workers()).workers if w.id != busy.id]
    for other in others:
        await admin.cordon_worker(other)  # the next request goes to `busy`
    sidecar = f"http://127.0.0.1:{int(url.rsplit(':', 1)[1]) + 1}/fault"
    async with aiohttp.ClientSession() as http:
        async with http.post(sidecar, json={"slowdown": 10_000}) as resp:
            assert resp.status in (200, 202), await resp.text()
        stream = asyncio.ensure_future(_stream(http, app))
        try:
            assert await eventually(lambda: _in_flight(app, busy.id) == 1, 10)
            for other in others:
                await admin.uncordon_worker(other)
            stats = await admin.get_stats()
            assert stats.in_flight == 1 and stats.models[0].in_flight == 1
            acme = (await admin.list_tenants()).tenants[0]
            assert (acme.use.streams, acme.keys[0].use.streams) == (1, 1)

            waited = await admin.drain_worker(busy.id, wait=True, timeout_s=0.3, grace_s=60)
            assert not waited.left
            assert (waited.worker.phase, waited.worker.in_flight) == ("draining", 1)
            for call, verb in (
                (admin.cordon_worker(busy.id), "cordon"),
                (admin.uncordon_worker(busy.id), "uncordon"),
            ):
                err = await refused(call)
                assert (err.code, err.message) == (
                    Code.FAILED_PRECONDITION,
                    f"worker {busy.id}: cannot {verb} a worker that is draining",
                )
            # Draining again keeps the first drain, so an operator can wait for it again.
            again = await admin.drain_worker(busy.id, wait=True, timeout_s=0.3)
            assert (again.left, again.worker.phase) == (False, "draining")
            err = await refused(admin.remove_worker(busy.id))
            assert (err.code, err.message) == (
                Code.FAILED_PRECONDITION,
                f"worker {busy.id} has 1 request(s) in flight; drain it first (homing workers "
                f"drain {busy.id} --wait) or remove it with --force",
            )
            removed = await admin.remove_worker(busy.id, force=True)
            assert removed.phase == "gone"
            assert await asyncio.wait_for(stream, 10) == "worker_removed"
        finally:
            stream.cancel()
    assert busy.id not in [w.id for w in (await admin.list_workers()).workers]


async def complete(app: App) -> str:
    """One small completion of the tenant; the worker that served it."""
    body = {"model": model_of(app), "prompt": list(range(100, 164)), "max_tokens": 4}
    headers = {"authorization": f"Bearer {TENANT_KEY}"}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"http://127.0.0.1:{app.http_port}/v1/completions", json=body, headers=headers
        ) as resp:
            assert resp.status == 200, await resp.text()
            return resp.headers["x-homing-worker"]


def _in_flight(app: App, worker_id: str) -> int:
    assert app.pool is not None
    return app.pool.state(worker_id).in_flight if app.pool.has(worker_id) else -1


async def _stream(http: aiohttp.ClientSession, app: App) -> str | None:
    """A streamed completion of the tenant, read to its end; the error code it ended with
    (from the error body when it ended before its first chunk, else its error event)."""
    body = {
        "model": model_of(app),
        "prompt": list(range(300, 364)),
        "max_tokens": 500,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"authorization": f"Bearer {TENANT_KEY}"}
    code = None
    async with http.post(
        f"http://127.0.0.1:{app.http_port}/v1/completions", json=body, headers=headers
    ) as resp:
        if resp.status != 200:
            return str((await resp.json())["error"]["code"])
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                event = json.loads(line.removeprefix("data: "))
                if "error" in event:
                    code = event["error"]["code"]
    return code
