"""The per-worker circuit breaker over simulated worker processes: a half-open worker takes
exactly one lease at a time (virtual clock); a worker that refuses connections opens its
breaker and a half-open trial closes it once the worker is back; a worker that passes its
probes but refuses every Generate stays out, re-opening with a doubled interval."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
import pytest_asyncio
from engine_fleet import Fleet as ProcessFleet
from helpers import eventually, post_fault
from stream_load import StreamLoad
from structlog.testing import capture_logs

from homing.app import App
from homing.clock import ManualClock
from homing.config import (
    BreakerSettings,
    EngineSettings,
    GatewaySettings,
    HomingConfig,
    SimSettings,
)
from homing.engines.client import EngineError
from homing.engines.pool import PoolConfig, WorkerPool
from homing.fleet import ModelDispatch
from homing.fleet.dispatch import NoReplica
from homing.router import Router
from homing.sim.process import spawn_sim, terminate
from homing.text.tokenizer import TextTokenizer

MODEL = "llama-3.1-8b"
REFUSED = EngineError(grpc.StatusCode.UNAVAILABLE, "connection refused")


@pytest_asyncio.fixture
async def sim_url() -> AsyncIterator[str]:
    args = ["--workers", "1", "--port", "0", "--speedup", "10", "--parent-pid", str(os.getpid())]
    process, ready = await spawn_sim(args)
    yield ready["workers"][0]["url"]
    await terminate([process], 2.0)


async def test_a_half_open_worker_takes_exactly_one_lease_at_a_time(sim_url: str) -> None:
    """Open: no lease. Past 1 s of virtual time: one lease (the trial); a second is
    refused while it is out; the trial ends well: closed, leases flow again."""
    clock = ManualClock()
    router = Router(clock=clock)
    # Health tolerates the failures here, so only the breaker keeps the worker out.
    config = PoolConfig(unhealthy_threshold=10)
    pool = WorkerPool([sim_url], router=router, clock=clock, config=config)
    await pool.start()
    try:
        tokenizer = TextTokenizer.from_bundle(await pool.tokenizer_bundle())
        model = ModelDispatch(pool.served_model_name, tokenizer, pool, router)
        for _ in range(5):
            model.report_failure("w0", REFUSED)
        w0 = pool.state("w0")
        assert w0.breaker == "open"
        with pytest.raises(NoReplica):
            model.lease([1, 2, 3])
        clock.advance(1.0)
        assert w0.breaker == "half_open"
        trial = model.lease([1, 2, 3])
        with pytest.raises(NoReplica):
            model.lease([4, 5, 6])  # the trial slot is taken
        trial.release()
        assert w0.breaker == "closed"
        with model.lease([1, 2, 3]), model.lease([4, 5, 6]):
            pass
    finally:
        await pool.stop()


@pytest.fixture
def workers() -> Iterator[ProcessFleet]:
    """Two simulated worker processes at 10x speed."""
    fleet = ProcessFleet("sim")
    fleet.start(2)
    try:
        yield fleet
    finally:
        fleet.close()


def served(workers: list[str]) -> HomingConfig:
    """The listed workers; breakers open at 3 failures (health's own threshold, which takes
    a dead worker out after as many, so the requests in flight on it are all it fails)."""
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        engines=EngineSettings(
            workers=workers, health_interval_s=0.2, breaker=BreakerSettings(consecutive=3)
        ),
    )


async def test_the_breaker_opens_on_a_worker_that_refuses_connections_and_closes_after_restart(
    workers: ProcessFleet,
) -> None:
    """Killed with 4 streams in flight on it, w1's requests fail at once: its breaker opens.
    Restarted on its port, w1 is probed healthy, its half-open trial succeeds, and the
    breaker closes; w1 serves again."""
    async with App(served(workers.urls)) as app:
        assert app.pool is not None
        w0, w1 = app.pool.workers()
        with capture_logs() as logs:
            async with StreamLoad(app.http_port or 0, model=MODEL, concurrency=8) as load:
                assert await eventually(lambda: load.by_worker[w1.worker_id] >= 4, 10.0)
                assert await eventually(lambda: w1.in_flight >= 4, 5.0)
                workers.kill(1)
                assert await eventually(lambda: w1.breaker == "open", 5.0)
                assert not w1.routable
                killed_for = time.monotonic()
                await asyncio.to_thread(workers.restart, 1)
                restarted_at = time.monotonic()
                assert await eventually(lambda: w1.breaker == "closed" and w1.routable, 15.0)
                closed_s = time.monotonic() - restarted_at
                before = load.by_worker[w1.worker_id]
                assert await eventually(lambda: load.by_worker[w1.worker_id] > before, 10.0)
        print(f"down {restarted_at - killed_for:.1f} s; closed {closed_s:.1f} s after restart")
        changes = [(e["before"], e["state"]) for e in logs if e["event"] == "worker_breaker"]
        assert changes[0] == ("closed", "open")
        assert changes[-1] == ("half_open", "closed")
        assert w1.breaker_opens >= 1
        assert w0.breaker == "closed" and w0.breaker_opens == 0
        registry = app.gateway_metrics.registry
        labels = {"model": MODEL, "worker": w1.worker_id}
        assert (registry.get_sample_value("homing_worker_breaker_opens_total", labels) or 0) >= 1
        state = registry.get_sample_value(
            "homing_worker_breaker_state", {**labels, "state": "closed"}
        )
        assert state == 1.0


async def test_a_worker_refusing_every_generate_but_passing_probes_stays_out() -> None:
    """`reject: UNAVAILABLE` while HealthCheck passes: health alone would bring w0 back
    after two probes, the breaker keeps it out, one trial per open interval (1 s, 2 s,
    4 s); once it serves again, the next trial closes the breaker."""
    config = HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        engines=EngineSettings(health_interval_s=0.2, breaker=BreakerSettings(consecutive=3)),
        sim=SimSettings(workers=2, speedup=10.0),
    )
    async with App(config) as app:
        assert app.pool is not None
        w0, w1 = app.pool.workers()
        async with StreamLoad(app.http_port or 0, model=MODEL, concurrency=4) as load:
            assert await eventually(lambda: load.by_worker[w0.worker_id] >= 3, 10.0)
            await post_fault(w0.url, {"reject": "UNAVAILABLE"})
            assert await eventually(lambda: w0.breaker_opens >= 3, 15.0)
            assert w0.healthy or await eventually(lambda: w0.healthy, 2.0)  # probes pass
            served_before = load.ok
            await asyncio.sleep(1.0)
            assert load.ok > served_before  # w1 serves
            await post_fault(w0.url, {"reject": None})
            assert await eventually(lambda: w0.breaker == "closed" and w0.routable, 15.0)
            before = load.by_worker[w0.worker_id]
            assert await eventually(lambda: load.by_worker[w0.worker_id] > before, 10.0)
        assert w1.breaker_opens == 0
