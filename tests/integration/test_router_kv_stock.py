"""KV usage is a stock, not a rate, through the whole gateway over real simulated workers
(child processes): workers that report a 0.99-full KV pool forever while running nothing
still get every request, none waits in the admission queue or gets a 503."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from helpers import eventually, own_app, post_fault

from homing.app import App
from homing.config import (
    AdmissionSettings,
    EngineSettings,
    GatewaySettings,
    HomingConfig,
    SimSettings,
)
from homing.router import snapshot_from_state

pytestmark = pytest.mark.asyncio(loop_scope="module")

FULL = 0.99


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app() -> AsyncIterator[App]:
    """Two simulated workers at 10x speed; a starved request would fail fast (1 s queue
    timeout) rather than hang."""
    config = HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        engines=EngineSettings(health_interval_s=0.1),
        sim=SimSettings(workers=2, speedup=10.0),
        admission=AdmissionSettings(queue_timeout_s=1.0),
    )
    async with own_app(config) as running:
        yield running


async def complete(session: aiohttp.ClientSession, app: App, i: int) -> tuple[int, str | None]:
    """One cold token-id completion (its own 256-token prompt): (status, serving worker)."""
    assert app.model is not None
    body = {
        "model": app.model.model_id,
        "prompt": list(range(30_000 + 256 * i, 30_256 + 256 * i)),
        "max_tokens": 4,
        "ignore_eos": True,
    }
    url = f"http://127.0.0.1:{app.http_port}/v1/completions"
    async with session.post(url, json=body) as resp:
        await resp.read()
        return resp.status, resp.headers.get("x-homing-worker")


async def test_workers_reporting_full_kv_with_nothing_running_still_get_requests(
    app: App,
) -> None:
    """Every worker's load records say KV 0.99 (sidecar fault `report_kv_usage`) with
    nothing running: sequential requests are all served without queueing, a concurrent
    burst is all served, both workers take requests, and the records still say 0.99."""
    pool, metrics = app.pool, app.gateway_metrics
    assert pool is not None and app.admission is not None
    for w in pool.workers():
        await post_fault(w.url, {"report_kv_usage": FULL})

    def all_full() -> bool:
        states = pool.workers()
        return all(w.load is not None and w.load.token_usage == FULL for w in states)

    assert await eventually(all_full, 5)
    assert all(w.load is not None and w.load.running == 0 for w in pool.workers())
    assert not app.admission.overloaded()
    served: set[str | None] = set()
    async with aiohttp.ClientSession() as session:
        for i in range(8):
            status, worker = await complete(session, app, i)
            assert status == 200
            served.add(worker)
        assert metrics.value("homing_admission_wait_seconds_count") == 0  # nobody queued
        burst = await asyncio.gather(*(complete(session, app, 100 + i) for i in range(16)))
    assert [status for status, _ in burst] == [200] * 16
    served |= {worker for _, worker in burst}
    assert served == {w.worker_id for w in pool.workers()}
    for reason in ("timeout", "queue_full", "tenant_full", "displaced"):
        assert metrics.value("homing_admission_rejected_total", reason=reason) == 0
    assert all_full()  # the fault held throughout: routing judged the queue, not the stock
    snapshots = [snapshot_from_state(w) for w in pool.workers()]
    assert all(s.token_usage == FULL for s in snapshots)
    router = app.router
    assert router is not None and router.decisions["overload"] == 0
