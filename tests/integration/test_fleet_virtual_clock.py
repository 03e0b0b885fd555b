"""The pool's and the fleet's waits run on the injected clock: over a real simulated
worker, a drain's timeout and a dead worker's probes fall due only as a virtual clock is
advanced."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest_asyncio
from helpers import eventually

from homing.clock import ManualClock
from homing.engines.lifecycle import Phase
from homing.engines.pool import PoolConfig, WorkerPool
from homing.fleet import Fleet, ModelDispatch
from homing.router import Router
from homing.sim.process import spawn_sim, terminate
from homing.text.tokenizer import TextTokenizer


@pytest_asyncio.fixture
async def sim() -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    args = ["--workers", "1", "--port", "0", "--speedup", "10", "--parent-pid", str(os.getpid())]
    process, ready = await spawn_sim(args)
    yield process, ready["workers"][0]["url"]
    await terminate([process], 2.0)


async def fleet_over(url: str, clock: ManualClock) -> tuple[Fleet, ModelDispatch]:
    router = Router(clock=clock)
    pool = WorkerPool([url], router=router, clock=clock, config=PoolConfig(unhealthy_threshold=3))
    await pool.start()
    tokenizer = TextTokenizer.from_bundle(await pool.tokenizer_bundle())
    model = ModelDispatch(pool.served_model_name, tokenizer, pool, router)
    return Fleet([model], drain_timeout_s=30.0), model


async def test_drain_timeout_cuts_leases_only_when_virtual_time_reaches_it(
    sim: tuple[asyncio.subprocess.Process, str],
) -> None:
    clock = ManualClock()
    fleet, model = await fleet_over(sim[1], clock)
    try:
        cuts: list[str] = []
        lease = model.lease([1, 2, 3, 4])
        lease.on_cut = cuts.append
        fleet.drain(lease.worker_id)
        await clock.settle()
        clock.advance(29.9)
        await clock.settle()
        assert cuts == [] and model.pool.state(lease.worker_id).phase is Phase.DRAINING
        clock.advance(0.1)
        await clock.settle()
        assert cuts == ["worker_drained"]
        lease.release()  # the cut request ends: the worker leaves
        assert await eventually(lambda: not model.pool.has(lease.worker_id), 5)
    finally:
        await fleet.stop()
        await model.pool.stop()


async def test_dead_workers_probes_wait_for_the_virtual_clock(
    sim: tuple[asyncio.subprocess.Process, str],
) -> None:
    clock = ManualClock()
    fleet, model = await fleet_over(sim[1], clock)
    try:
        [worker] = model.workers()
        assert worker.healthy
        sim[0].kill()
        # The KV stream's failure counts once at once (real I/O); the probes wait for time.
        assert await eventually(lambda: worker.consecutive_failures >= 1, 10)
        await asyncio.sleep(0.3)
        assert worker.healthy and worker.consecutive_failures < 3
        advances = 0
        while worker.healthy and advances < 10:
            clock.advance(1.0)  # one probe interval
            advances += 1
            await eventually(lambda: not worker.healthy, 0.5)
        assert not worker.healthy and advances >= 1
    finally:
        await fleet.stop()
        await model.pool.stop()
