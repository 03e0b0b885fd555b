"""The worker pool against real simulated workers: discovery, health, live load, in-flight."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from helpers import eventually

from homing.engines.client import GenerateParams
from homing.engines.pool import PoolConfig, WorkerPool
from homing.router import Router
from homing.sim.config import SimConfig
from homing.sim.worker import SimWorker

FAST = PoolConfig(
    health_interval_s=0.05,
    health_timeout_s=0.5,
    unhealthy_threshold=3,
    healthy_threshold=2,
    kv_backoff_initial_s=0.05,
    kv_backoff_max_s=0.2,
)
CONFIG = SimConfig(speedup=10.0, heartbeat_idle_s=0.2, heartbeat_busy_s=0.05)


@pytest_asyncio.fixture
async def sims() -> AsyncIterator[list[SimWorker]]:
    """Two simulated workers on free loopback ports (the list may be edited by tests)."""
    workers = [SimWorker(CONFIG), SimWorker(CONFIG)]
    for w in workers:
        await w.start()
    try:
        yield workers
    finally:
        for w in workers:
            await w.stop(grace_s=0.1)


@pytest_asyncio.fixture
async def pool(sims: list[SimWorker]) -> AsyncIterator[WorkerPool]:
    """A started pool over `sims` with fast health probing."""
    p = WorkerPool([w.url for w in sims], router=Router(), config=FAST)
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


async def test_start_discovers_every_worker(pool: WorkerPool) -> None:
    """After start both workers are healthy and the model facts come from discovery."""
    await pool.wait_ready(5)
    assert [w.healthy for w in pool.workers()] == [True, True]
    assert pool.served_model_name == "llama-3.1-8b"
    assert pool.max_context_length > 0
    assert pool.eos_token_ids == ()  # SGLang's servicer reports none (stops use the tokenizer's)
    assert pool.page_size == 16
    assert await pool.tokenizer_bundle()


async def test_load_view_arrives_from_the_kv_stream(pool: WorkerPool) -> None:
    """Each worker's EngineLoad records fill its load view shortly after start."""
    assert await eventually(lambda: all(w.load is not None for w in pool.workers()), 3)
    load = pool.workers()[0].load
    assert load is not None and load.running == 0 and load.max_running_requests > 0


async def test_stopped_worker_turns_unhealthy_then_healthy_after_restart(
    sims: list[SimWorker], pool: WorkerPool
) -> None:
    """A stopped worker leaves rotation after 3 failed probes; restarted, it returns."""
    port = sims[1].port
    await sims[1].stop(grace_s=0.1)
    assert await eventually(lambda: not pool.state("w1").healthy, 3)
    assert pool.state("w1").consecutive_failures >= 3
    assert pool.state("w0").healthy
    restarted = SimWorker(CONFIG, port=port)
    await restarted.start()
    sims[1] = restarted
    assert await eventually(lambda: pool.state("w1").healthy, 5)


async def test_in_flight_returns_to_zero_after_consumer_close(
    sims: list[SimWorker], pool: WorkerPool
) -> None:
    """track() + generate: closing mid-stream leaves no in-flight count and no engine work."""
    params = GenerateParams(
        "pool-close", list(range(64)), max_new_tokens=20_000, temperature=0.0, ignore_eos=True
    )
    with pool.track("w0"):
        stream = pool.client("w0").generate(params, timeout_s=30)
        await anext(stream)
        assert pool.total_in_flight == 1
        await stream.aclose()
    assert pool.total_in_flight == 0
    assert await eventually(lambda: sims[0].num_running == 0, 1.0)


async def test_no_worker_at_start_then_ready_when_it_comes_up() -> None:
    """A pool whose only worker is down at start becomes ready once the worker serves."""
    probe = SimWorker(CONFIG)
    port = await probe.start()
    await probe.stop(grace_s=0.1)
    pool = WorkerPool([f"grpc://127.0.0.1:{port}"], router=Router(), config=FAST)
    await pool.start()
    late = SimWorker(CONFIG, port=port)
    try:
        assert not pool.healthy_workers()
        await late.start()
        await pool.wait_ready(5)
        assert pool.served_model_name == "llama-3.1-8b"
    finally:
        await pool.stop()
        await late.stop(grace_s=0.1)
