"""The router's index mirrors real workers' KV events through the pool's subscription."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from helpers import eventually

from homing.engines.client import GenerateDone, GenerateParams
from homing.engines.pool import PoolConfig, WorkerPool
from homing.router import Router, RouteRequest, snapshot_from_state
from homing.sim.config import SimConfig
from homing.sim.worker import SimWorker

FAST = PoolConfig(
    health_interval_s=0.05, health_timeout_s=0.5, kv_backoff_initial_s=0.05, kv_backoff_max_s=0.2
)
CONFIG = SimConfig(speedup=10.0, heartbeat_idle_s=0.2, heartbeat_busy_s=0.05)
PROMPT = list(range(5000, 5200))  # 200 tokens: 12 full blocks of 16


@pytest_asyncio.fixture
async def setup() -> AsyncIterator[tuple[list[SimWorker], WorkerPool, Router]]:
    """Two workers, a cache_aware router and a started pool feeding it."""
    sims = [SimWorker(CONFIG), SimWorker(CONFIG)]
    for s in sims:
        await s.start()
    router = Router("cache_aware")
    pool = WorkerPool([s.url for s in sims], router=router, config=FAST)
    await pool.start()
    await pool.wait_ready(5)
    # the subscription is open once the first load record has arrived
    assert await eventually(lambda: all(w.load is not None for w in pool.workers()), 3)
    try:
        yield sims, pool, router
    finally:
        await pool.stop()
        for s in sims:
            await s.stop(grace_s=0.1)


async def run_to_completion(pool: WorkerPool, worker_id: str, request_id: str) -> GenerateDone:
    """Send PROMPT to `worker_id` and return its done message."""
    params = GenerateParams(request_id, PROMPT, max_new_tokens=8, temperature=0.0)
    done = None
    async for item in pool.client(worker_id).generate(params, timeout_s=30):
        if isinstance(item, GenerateDone):
            done = item
    assert done is not None
    return done


async def test_repeated_prompt_routes_to_the_worker_that_cached_it(
    setup: tuple[list[SimWorker], WorkerPool, Router],
) -> None:
    """After w1 served a prompt, its stored events make cache_aware pick w1 for it again."""
    _, pool, router = setup
    await run_to_completion(pool, "w1", "warm")
    full = len(PROMPT) // 16 * 16
    assert await eventually(lambda: router.index.match(PROMPT).get("w1", 0) >= full, 3)
    assert "w0" not in router.index.match(PROMPT)
    snapshots = [snapshot_from_state(w) for w in pool.healthy_workers()]
    decision = router.select(RouteRequest(PROMPT), snapshots)
    assert (decision.worker_id, decision.branch) == ("w1", "exact_hit")
    assert decision.matched_tokens >= full
    again = await run_to_completion(pool, "w1", "hit")
    assert again.cached_tokens >= full


async def test_flush_cache_clears_the_workers_index_entries(
    setup: tuple[list[SimWorker], WorkerPool, Router],
) -> None:
    """FlushCache on the worker emits cleared; the router stops crediting it."""
    _, pool, router = setup
    await run_to_completion(pool, "w0", "warm-0")
    assert await eventually(lambda: router.index.worker_blocks("w0") > 0, 3)
    assert await pool.client("w0").flush_cache()
    assert await eventually(lambda: router.index.worker_blocks("w0") == 0, 3)


async def test_stopped_worker_is_flushed_from_the_index(
    setup: tuple[list[SimWorker], WorkerPool, Router],
) -> None:
    """When a worker's stream breaks (worker stopped), its entries are flushed."""
    sims, pool, router = setup
    await run_to_completion(pool, "w1", "warm-1")
    assert await eventually(lambda: router.index.worker_blocks("w1") > 0, 3)
    await sims[1].stop(grace_s=0.1)
    assert await eventually(lambda: router.index.worker_blocks("w1") == 0, 3)
    assert router.index.match(PROMPT).get("w1") is None


async def test_removed_worker_is_flushed_and_leaves_rotation(
    setup: tuple[list[SimWorker], WorkerPool, Router],
) -> None:
    """pool.remove() stops the worker's tasks and the router forgets its prefixes."""
    _, pool, router = setup
    await run_to_completion(pool, "w1", "warm-rm")
    assert await eventually(lambda: router.index.worker_blocks("w1") > 0, 3)
    await pool.remove("w1")
    assert router.index.match(PROMPT).get("w1") is None
    assert [w.worker_id for w in pool.healthy_workers()] == ["w0"]
    assert router.worker_mode("w1") == "approximate"


async def test_pool_reports_epochs_and_stream_state(
    setup: tuple[list[SimWorker], WorkerPool, Router],
) -> None:
    """Each subscription is a new epoch; an open stream is reported per worker."""
    sims, pool, _ = setup
    assert all(w.kv_stream == "open" and w.kv_epoch >= 1 for w in pool.workers())
    epoch = pool.state("w0").kv_epoch
    await sims[0].restart()
    assert await eventually(lambda: pool.state("w0").kv_epoch > epoch, 5)
    assert await eventually(lambda: pool.state("w0").kv_stream == "open", 5)
