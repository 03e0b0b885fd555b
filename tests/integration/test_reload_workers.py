"""`App.reload` and the listed workers of a running gateway, over real simulated workers:
everything that can be checked is checked before anything is applied (a URL another model
has, a version that differs, a model left short of `daemon.min_ready_workers`, auth switched
on or off: refused, nothing applied); a worker its pool refuses is named in the outcome; one
not reachable yet joins later, as at startup; a URL listed again while it drains serves again
as the same worker. `wait_min_ready` wakes on the pools' changes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import pytest
import pytest_asyncio
from helpers import eventually, free_port, own_app
from structlog.testing import capture_logs

from homing.app import App, ReloadRefused
from homing.config import (
    AdminSettings,
    DaemonSettings,
    EngineSettings,
    GatewaySettings,
    HomingConfig,
    ModelSettings,
    RouterSettings,
    TenantSettings,
    WorkerEntry,
)
from homing.daemon.runner import Daemon
from homing.engines.lifecycle import Phase
from homing.fleet import Fleet
from homing.ports import free_port_pair
from homing.sim.process import spawn_sim, terminate

SMALL = "llama-3.1-8b"
LARGE = "llama-3.1-70b"
KEY = "sk-acme-0123456789"

pytestmark = pytest.mark.asyncio(loop_scope="module")


@dataclass
class Sim:
    """A simulated worker process and its URL."""

    process: asyncio.subprocess.Process
    url: str


async def _start_sim(model: str = SMALL, port: int = 0) -> Sim:
    args = ["--workers", "1", "--port", str(port), "--model", model, "--speedup", "10"]
    process, ready = await spawn_sim([*args, "--parent-pid", str(os.getpid())])
    return Sim(process, ready["workers"][0]["url"])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sims() -> AsyncIterator[dict[str, Sim]]:
    """Three workers of the small model (a, b, c) and one of the large model (large)."""
    started = await asyncio.gather(_start_sim(), _start_sim(), _start_sim(), _start_sim(LARGE))
    yield dict(zip(("a", "b", "c", "large"), started, strict=True))
    await terminate((s.process for s in started), 2.0)


def _dead_url() -> str:
    """A loopback URL nothing listens on (yet)."""
    return f"grpc://127.0.0.1:{free_port()}"


def _config(
    *workers: str | WorkerEntry,
    min_ready: int = 1,
    policy: str = "round_robin",
    tenants: list[TenantSettings] | None = None,
    large: list[str] | None = None,
) -> HomingConfig:
    models = [ModelSettings(name=SMALL, workers=list(workers))]
    if large is not None:
        models.append(ModelSettings(name=LARGE, workers=list(large)))
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=2.0),
        engines=EngineSettings(health_interval_s=0.1, unhealthy_threshold=2),
        router=RouterSettings(policy=policy),  # type: ignore[arg-type]
        models=models,
        admin=AdminSettings(enabled=False),
        daemon=DaemonSettings(min_ready_workers=min_ready),
        tenants=tenants or [],
    )


def _fleet(app: App) -> Fleet:
    assert app.fleet is not None
    return app.fleet


def _by_url(app: App) -> dict[str, tuple[str, Phase]]:
    """url -> (worker id, phase) of every worker of every model."""
    return {w.url: (w.worker_id, w.phase) for _, w in _fleet(app).workers()}


async def test_a_worker_its_pool_refuses_is_named_and_an_unreachable_one_joins_later(
    sims: dict[str, Sim],
) -> None:
    """A SIGHUP reload (`Daemon.reload`) applies; its log line and STATUS text name the
    worker of another model that did not join (dropped, as at startup) and the one not
    reachable yet (kept `joining`, as at startup), which joins once a worker answers on its
    URL."""
    a, large = sims["a"].url, sims["large"].url
    async with own_app(_config(a)) as app:
        port = free_port_pair("127.0.0.1")  # a simulated worker starts on it later
        dead = f"grpc://127.0.0.1:{port}"
        daemon = Daemon(_config(a), load=lambda: _config(a, large, dead), environ={})
        with capture_logs() as logs:
            assert await daemon.reload(app)
        refused = f"refused: worker {large} serves model '{LARGE}', the pool serves '{SMALL}'"
        outcome = (
            f"reloaded: models[0].workers; 1 worker did not join: {large} ({refused}); "
            f"not reachable yet (joining): {dead}"
        )
        assert daemon.last_reload == outcome
        assert daemon.status(app).endswith(f"; {outcome}")
        (line,) = [e for e in logs if e["event"] == "reload_applied"]
        assert line["log_level"] == "warning"
        assert line["workers_failed"] == [f"{large} ({refused})"]
        assert line["workers_joining"] == [dead]
        workers = _by_url(app)
        assert set(workers) == {a, dead} and workers[dead][1] is Phase.JOINING
        late = await _start_sim(port=port)
        try:
            assert await eventually(lambda: _by_url(app)[dead][1] is Phase.READY, 30)
            assert app.model is not None and app.model.ready_workers == 2
        finally:
            await terminate([late.process], 2.0)


async def _open_stream(http: aiohttp.ClientSession, app: App) -> tuple[aiohttp.ClientResponse, str]:
    """A long stream opened and its first chunk read: (the open response, its worker id)."""
    body = {
        "model": SMALL,
        "prompt": "a long story " * 8,
        "max_tokens": 3000,
        "ignore_eos": True,
        "stream": True,
    }
    resp = await http.post(f"http://127.0.0.1:{app.http_port}/v1/completions", json=body)
    assert resp.status == 200, await resp.text()
    async for raw in resp.content:
        if raw.startswith(b"data: {"):
            break
    return resp, resp.headers["x-homing-worker"]


async def test_a_url_listed_again_while_it_drains_serves_again_as_the_same_worker(
    sims: dict[str, Sim],
) -> None:
    """Removed with a stream open, the worker drains; listed again, its drain is called off:
    same id, `ready`, it stays when the stream ends and takes new requests."""
    a, b = sims["a"].url, sims["b"].url
    async with own_app(_config(a, b)) as app, aiohttp.ClientSession() as http:
        resp, worker = await _open_stream(http, app)
        url = next(u for u, (i, _) in _by_url(app).items() if i == worker)
        other = a if url == b else b
        removed = await app.reload(_config(other))
        assert removed.outcome() == "reloaded: models[0].workers"
        assert _by_url(app)[url] == (worker, Phase.DRAINING)

        back = await app.reload(_config(a, b))
        assert back.rejoined == (url,) and back.failed == () and back.joining == ()
        assert back.outcome() == (f"reloaded: models[0].workers; draining, serving again: {url}")
        assert _by_url(app)[url] == (worker, Phase.READY)

        resp.close()  # the stream that kept it draining ends
        pool = _fleet(app).model(SMALL).pool
        assert await eventually(lambda: pool.state(worker).in_flight == 0, 10)
        # a retirement, were one still due, runs at once once its last request ended
        assert not await pool.wait_gone(worker, timeout_s=0.2)
        assert _by_url(app)[url] == (worker, Phase.READY)
        served = set()
        for _ in range(4):  # round robin over both
            small = {"model": SMALL, "prompt": "hi", "max_tokens": 2}
            async with http.post(
                f"http://127.0.0.1:{app.http_port}/v1/completions", json=small
            ) as done:
                assert done.status == 200, await done.text()
                served.add(done.headers["x-homing-worker"])
        assert worker in served


async def test_a_relisted_draining_worker_keeps_a_cordon_and_an_ejected_one_is_refused(
    sims: dict[str, Sim],
) -> None:
    """A cordoned worker removed (with a stream open) and listed again comes back cordoned,
    not `ready`: the operator's cordon holds. One drained while outlier detection held it
    out is refused (it returns only through a readmission probe), nothing applied."""
    a, b = sims["a"].url, sims["b"].url
    async with own_app(_config(a, b)) as app, aiohttp.ClientSession() as http:
        resp, worker = await _open_stream(http, app)
        url = next(u for u, (i, _) in _by_url(app).items() if i == worker)
        other = a if url == b else b
        pool = _fleet(app).model(SMALL).pool
        pool.cordon(worker)
        await app.reload(_config(other))
        back = await app.reload(_config(a, b))
        assert back.rejoined == (url,)
        assert _by_url(app)[url] == (worker, Phase.CORDONED)

        pool.uncordon(worker)
        pool.eject(worker)
        await app.reload(_config(other))
        with pytest.raises(ReloadRefused) as refused:
            await app.reload(_config(a, b))
        assert f"worker {url} is worker {worker}, draining since it was ejected" in str(
            refused.value
        )
        assert _by_url(app)[url] == (worker, Phase.DRAINING)
        assert app.config.models[0].workers == _config(other).models[0].workers
        resp.close()


async def test_a_reload_leaving_a_model_short_of_min_ready_workers_is_refused_whole(
    sims: dict[str, Sim],
) -> None:
    """Two ready workers and one not reachable, two needed ready: removing a ready one (with
    or without adding a new one, which is not ready yet) is refused naming the model, and
    nothing of the reload is applied (the policy change neither)."""
    a, b, c = sims["a"].url, sims["b"].url, sims["c"].url
    dead = _dead_url()
    old = _config(a, b, dead, min_ready=2)
    async with own_app(old) as app:
        before = _by_url(app)
        with pytest.raises(ReloadRefused) as refused:
            await app.reload(_config(a, dead, min_ready=2, policy="least_load"))
        assert str(refused.value) == (
            f"model '{SMALL}' would be left with 1 ready worker, fewer than "
            "daemon.min_ready_workers (2); keep more of its workers listed; nothing was applied"
        )
        with pytest.raises(ReloadRefused) as replaced:
            await app.reload(_config(a, dead, c, min_ready=2))
        assert str(replaced.value) == (
            f"model '{SMALL}' would be left with 1 ready worker, fewer than "
            "daemon.min_ready_workers (2); the workers it adds are not ready yet: add them "
            "in one reload and remove the old ones in the next, once they serve; nothing "
            "was applied"
        )
        assert app.config is old and _by_url(app) == before
        # The same change in two reloads goes through.
        added = await app.reload(_config(a, b, dead, c, min_ready=2))
        assert added.failed == () and _by_url(app)[c][1] is Phase.READY
        assert (await app.reload(_config(a, dead, c, min_ready=2))).applies
        assert b not in _by_url(app) or _by_url(app)[b][1] is Phase.DRAINING


async def test_a_url_of_another_model_or_version_is_refused_and_one_added_by_hand_is_kept(
    sims: dict[str, Sim],
) -> None:
    """A URL added through the admin path to the large model cannot be listed under the small
    one; one added by hand to the small model with another version cannot be listed with
    this one; listed with its own version, it is kept as it is (no second worker)."""
    a, large = sims["a"].url, sims["large"].url
    theirs, mine = _dead_url(), sims["b"].url
    async with own_app(_config(a, large=[large])) as app:
        fleet = _fleet(app)
        other = await fleet.add_worker(LARGE, theirs)
        by_hand = await fleet.add_worker(SMALL, mine, "v1")
        with pytest.raises(ReloadRefused) as refused:
            await app.reload(_config(a, theirs, WorkerEntry(url=mine), large=[large]))
        assert str(refused.value) == (
            f"worker {theirs} is worker {other.worker_id} of model '{LARGE}'; it can join "
            f"model '{SMALL}' once it has left that one; worker {mine} is already worker "
            f"{by_hand.worker_id} with version 'v1', not ''; remove it and list it again "
            "once it has left; nothing was applied"
        )
        before = _by_url(app)
        plan = await app.reload(_config(a, WorkerEntry(url=mine, version="v1"), large=[large]))
        assert plan.outcome() == "reloaded: models[0].workers"
        assert _by_url(app) == before
        assert fleet.model(SMALL).pool.state(by_hand.worker_id).version == "v1"


async def test_authentication_stays_as_it_started_across_reloads(sims: dict[str, Sim]) -> None:
    """Dropping every tenant is refused and keys are still asked for."""
    sha = hashlib.sha256(KEY.encode()).hexdigest()
    tenants = [
        TenantSettings.model_validate({"name": "acme", "keys": [{"id": "k", "sha256": sha}]})
    ]
    async with own_app(_config(sims["a"].url, tenants=tenants)) as app:
        with pytest.raises(ReloadRefused) as refused:
            await app.reload(_config(sims["a"].url))
        assert str(refused.value) == (
            "the new config has no tenants, which would turn authentication off; that needs "
            "a restart (systemctl restart homing); nothing was applied"
        )
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{app.http_port}/v1/models") as resp:
                assert resp.status == 401
                assert json.loads(await resp.text())["error"]["code"] == "invalid_api_key"


async def test_wait_min_ready_wakes_when_a_worker_joins_and_names_the_short_model() -> None:
    """With one of two workers stopped, waiting for two times out naming the model; a wait
    under way returns once the worker is back on its port and joins."""
    first, second = await asyncio.gather(_start_sim(), _start_sim())
    port = int(second.url.rsplit(":", 1)[1])
    restarted: list[Sim] = []
    try:
        async with own_app(_config(first.url, second.url)) as app:
            await app.wait_min_ready(2, 30)
            await terminate([second.process], 2.0)
            assert app.model is not None
            model = app.model
            assert await eventually(lambda: model.ready_workers == 1, 30)
            with pytest.raises(TimeoutError) as short:
                await app.wait_min_ready(2, 0.3)
            assert str(short.value) == (f"fewer than 2 ready workers after 0.3 s ({SMALL} has 1)")
            waiting = asyncio.create_task(app.wait_min_ready(2, 60))
            for _ in range(20):  # the port may linger a moment after the stop
                try:
                    restarted.append(await _start_sim(port=port))
                    break
                except RuntimeError:
                    await asyncio.sleep(0.5)
            await waiting
            assert model.ready_workers == 2
    finally:
        await terminate([first.process, *(s.process for s in restarted)], 2.0)
