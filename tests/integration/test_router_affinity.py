"""The router against real simulated workers (child processes) through the whole gateway:
restarts and kills never leave stale affinity, a shared system prompt spreads within the
bounded-load capacity, cancelled streams leave no in-flight count, and /metrics shows it."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
import pytest_asyncio
from helpers import eventually, own_app

from homing.app import App
from homing.config import EngineSettings, GatewaySettings, HomingConfig, SimSettings
from homing.engines.pool import WorkerPool
from homing.router import (
    CacheAwareConfig,
    RouteDecision,
    Router,
    RouteRequest,
    load_bound,
    snapshot_from_state,
)
from homing.router.testing import RecordingObserver

SYSTEM = list(range(20_000, 22_000))  # a 2,000-token system prompt


def config(workers: int) -> HomingConfig:
    """Embedded sims at 10x speed with fast health probes."""
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=2.0),
        engines=EngineSettings(health_interval_s=0.1, unhealthy_threshold=2),
        sim=SimSettings(workers=workers, speedup=10.0),
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app4() -> AsyncIterator[App]:
    """One App over four simulated workers shared by this module's tests (each uses its own
    prompts; a restarted worker comes back; the kill test runs last). One App per module
    also keeps process forks away from a live App's gRPC threads, which can abort a child
    sim at fork (see the report of issue 4)."""
    async with own_app(config(4)) as app:
        yield app


def parts(app: App) -> tuple[WorkerPool, Router, str]:
    """The app's pool, router and base URL."""
    assert app.pool is not None and app.router is not None
    return app.pool, app.router, f"http://127.0.0.1:{app.http_port}"


async def complete(
    session: aiohttp.ClientSession, url: str, prompt: list[int], max_tokens: int = 4
) -> tuple[int, str | None, int]:
    """POST a token-id completion; (status, serving worker, cached prompt tokens)."""
    body = {"model": "llama-3.1-8b", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        doc = await resp.json()
        cached = 0
        if resp.status == 200:
            details = doc["usage"].get("prompt_tokens_details") or {}
            cached = details.get("cached_tokens", 0)
        return resp.status, resp.headers.get("x-homing-worker"), cached


async def warm(app: App, session: aiohttp.ClientSession, prompt: list[int]) -> str:
    """Serve `prompt` once and wait until the index credits its worker with it."""
    _, router, url = parts(app)
    status, worker, _ = await complete(session, url, prompt)
    assert status == 200 and worker is not None
    full = len(prompt) // 16 * 16
    assert await eventually(lambda: router.index.match(prompt).get(worker, 0) >= full, 5)
    return worker


@pytest.mark.asyncio(loop_scope="module")
async def test_restarted_worker_is_not_credited_with_its_old_prefixes(app4: App) -> None:
    """A worker restarted at the same address (sidecar fault) loses its credit at once and
    only regains it for what it stores in its new life."""
    pool, router, url = parts(app4)
    prompt = [*range(40_000, 40_512), *range(50_000, 50_100)]
    async with aiohttp.ClientSession() as session:
        victim = await warm(app4, session, prompt)
        epoch = pool.state(victim).kv_epoch
        port = int(pool.state(victim).url.rsplit(":", 1)[1])
        async with session.post(
            f"http://127.0.0.1:{port + 1}/fault", json={"restart": True}
        ) as resp:
            assert resp.status == 200
        assert await eventually(lambda: pool.state(victim).kv_epoch > epoch, 5)
        assert victim not in router.index.match(prompt)
        snapshots = [snapshot_from_state(w) for w in pool.healthy_workers()]
        decision = router.select(RouteRequest(prompt), snapshots)
        assert decision.worker_id != victim or decision.branch not in ("exact_hit", "approx_hit")
        # The restarted worker really is cold: it reports no cached tokens for the prompt.
        status, worker, cached = await complete(session, url, prompt)
        assert status == 200
        if worker == victim:
            assert cached == 0
        async with session.get(f"{url}/metrics") as resp:
            text = await resp.text()
        resync = f'reason="stream_error",worker="{victim}"'
        assert any(
            line.startswith("homing_router_kv_resyncs_total{") and resync in line
            for line in text.splitlines()
        )
        exact = [
            line
            for line in text.splitlines()
            if line.startswith("homing_router_worker_mode{") and 'mode="exact"' in line
        ]
        assert exact and any(line.endswith(" 1.0") for line in exact)
        assert "homing_router_decisions_total{" in text


def load_and_bound(pool: WorkerPool) -> Callable[[RouteDecision], tuple[int, int]]:
    """A `RecordingObserver` hook: per decision, the chosen worker's load and the capacity
    that applied, computed from the pool at that moment with the router's own load measure
    (`WorkerSnapshot.load`: the larger of the gateway's in-flight count and the worker's last
    reported running + waiting): the ring's c (floor) for placements by hashing, the
    affinity c_hit (floor) for prefix hits, both the policy's defaults (`CacheAwareConfig`)."""
    config = CacheAwareConfig()

    def measure(decision: RouteDecision) -> tuple[int, int]:
        loads = {w.worker_id: snapshot_from_state(w).load for w in pool.healthy_workers()}
        total, n = sum(loads.values()), len(loads)
        if decision.branch in ("ring", "overflow"):
            bound = load_bound(total, n, config.load_factor, config.min_bound)
        else:
            bound = load_bound(total, n, config.hit_load_factor, config.hit_min_bound)
        return loads[decision.worker_id], bound

    return measure


@pytest.mark.asyncio(loop_scope="module")
async def test_shared_system_prompt_spreads_within_the_bound(app4: App) -> None:
    """200 concurrent requests sharing a 2,000-token system prompt: each lands on a worker
    under its bound (c = 1.25 x mean in-flight when placed by the ring, 1.5 x for a prefix
    hit), the prompt collects on few workers first and then spreads; all succeed."""
    pool, router, url = parts(app4)
    recorder = RecordingObserver(load_and_bound(pool))
    metrics_observer, router.observer = router.observer, recorder
    connector = aiohttp.TCPConnector(limit=200)
    async with aiohttp.ClientSession(connector=connector) as session:
        results = await asyncio.gather(
            *(
                complete(session, url, [*SYSTEM, *range(80_000 + 50 * i, 80_040 + 50 * i)], 8)
                for i in range(200)
            )
        )
    router.observer = metrics_observer
    assert all(status == 200 for status, _, _ in results)
    assert len(recorder.decisions) == 200
    for decision, (load, bound) in recorder.decisions_with_extras():
        assert decision.branch != "overload"
        assert load < bound, (decision, load, bound)
    per_worker = Counter(worker for _, worker, _ in results)
    assert len(per_worker) >= 2
    branches = Counter(decision.branch for decision in recorder.decisions)
    assert branches["ring"] + branches["overflow"] > 0
    assert sum(cached for _, _, cached in results) > 0


@pytest.mark.asyncio(loop_scope="module")
async def test_in_flight_returns_to_zero_after_500_cancelled_streams(app4: App) -> None:
    """500 streams closed by the client after their first chunk leave no request counted
    in flight, in the gateway or on any worker."""
    pool, router, url = parts(app4)
    before = sum(router.decisions.values())
    body = {"model": "llama-3.1-8b", "max_tokens": 300, "ignore_eos": True, "stream": True}

    async def cancel_after_first_chunk(session: aiohttp.ClientSession, i: int) -> bool:
        payload = {**body, "prompt": [*SYSTEM[:256], *range(90_000 + 7 * i, 90_007 + 7 * i)]}
        async with session.post(f"{url}/v1/completions", json=payload) as resp:
            if resp.status != 200:
                return False
            line = await resp.content.readline()
            return line.startswith(b"data: ")
        # leaving the block closes the connection mid-stream

    connector = aiohttp.TCPConnector(limit=50, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        sem = asyncio.Semaphore(50)

        async def one(i: int) -> bool:
            async with sem:
                return await cancel_after_first_chunk(session, i)

        ok = await asyncio.gather(*(one(i) for i in range(500)))
    assert all(ok)
    assert await eventually(lambda: pool.total_in_flight == 0, 10)
    assert app4.service is not None
    assert await eventually(lambda: app4.service.in_flight == 0, 10)
    assert await eventually(
        lambda: all(w.load is not None and w.load.running == 0 for w in pool.workers()), 10
    )
    assert sum(router.decisions.values()) - before == 500


@pytest.mark.asyncio(loop_scope="module")
async def test_dead_worker_is_never_chosen_for_affinity(app4: App) -> None:
    """kill -9 of the prefix holder: once its KV-event stream is seen to drop and its
    index entries are flushed (at once: the socket closes), 20 requests with its prefix all
    succeed elsewhere and no decision credits the dead worker. (A request routed in the
    instant before is retried elsewhere; see test_retry_worker_restart.) (Destructive: last
    in this module.)"""
    pool, router, url = parts(app4)
    assert app4.sims is not None
    prompt = [*SYSTEM[:1024], *range(60_000, 60_064)]
    async with aiohttp.ClientSession() as session:
        victim = await warm(app4, session, prompt)
        child = next(c for c in app4.sims.children if c.url == pool.state(victim).url)
        before = Counter(router.chosen)
        epoch = pool.state(victim).kv_epoch
        child.process.kill()
        await child.process.wait()
        # the stream drop flushes its part of the index
        assert await eventually(lambda: pool.state(victim).kv_epoch > epoch, 5)
        results = [
            await complete(session, url, [*prompt, *range(70_000 + 10 * i, 70_005 + 10 * i)])
            for i in range(20)
        ]
    assert all(status == 200 for status, _, _ in results)
    assert all(worker != victim for _, worker, _ in results)
    affinity = {
        branch: router.chosen[(victim, branch)] - before[(victim, branch)]
        for branch in ("exact_hit", "approx_hit")
    }
    assert affinity == {"exact_hit": 0, "approx_hit": 0}
    assert victim not in router.index.match(prompt)
