"""Health judged by progress, over a simulated worker process: a busy worker whose probes
stall while its KV-event stream shows it working stays healthy; the same stalled probes
count once it idles; a worker whose engine stalls under load is marked unhealthy."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from engine_fleet import Fleet
from helpers import eventually, post_fault
from probe_relay import ProbeRelay

from homing.engines.client import EngineError, GenerateParams
from homing.engines.pool import PoolConfig, WorkerPool
from homing.router import Router

CONFIG = PoolConfig(
    health_interval_s=0.2,
    health_timeout_s=0.3,
    unhealthy_threshold=3,
    healthy_threshold=2,
    progress_window_s=2.0,
    kv_backoff_initial_s=0.05,
    kv_backoff_max_s=0.5,
)


@pytest.fixture
def sim() -> Iterator[Fleet]:
    """One simulated worker process at 10x speed."""
    fleet = Fleet("sim")
    fleet.start(1)
    try:
        yield fleet
    finally:
        fleet.close()


@pytest_asyncio.fixture
async def relay(sim: Fleet) -> AsyncIterator[ProbeRelay]:
    relay = ProbeRelay(sim.urls[0])
    await relay.start()
    try:
        yield relay
    finally:
        await relay.stop()


class Load:
    """`n` back-to-back generations of 400 tokens on the pool's w0, counted in flight."""

    def __init__(self, pool: WorkerPool, n: int = 4) -> None:
        self.pool = pool
        self.ids = itertools.count()
        self.tasks = [asyncio.create_task(self._loop()) for _ in range(n)]
        self.completed = 0

    async def _loop(self) -> None:
        while True:
            params = GenerateParams(
                f"load-{next(self.ids)}",
                list(range(2000, 2064)),
                max_new_tokens=400,
                temperature=0.0,
                ignore_eos=True,
            )
            try:
                with self.pool.track("w0"):
                    async for _ in self.pool.client("w0").generate(params, timeout_s=30):
                        pass
                self.completed += 1
            except EngineError:
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def test_stalled_probes_on_a_busy_progressing_worker_do_not_mark_it_unhealthy(
    relay: ProbeRelay,
) -> None:
    """Every HealthCheck is held past its timeout while 4 generations run: the worker stays
    healthy for 4 s (some 8 probes, each excused: more than the 3 failures that would mark
    it); idle, the same timeouts count."""
    pool = WorkerPool([relay.url], router=Router(), config=CONFIG)
    await pool.start()
    load = Load(pool)
    try:
        w0 = pool.state("w0")
        assert await eventually(lambda: load.completed >= 1 and w0.load is not None, 10.0)
        relay.hold()
        healthy_throughout = True
        for _ in range(40):
            await asyncio.sleep(0.1)
            healthy_throughout = healthy_throughout and w0.healthy
        assert healthy_throughout
        assert relay.held >= 6 and w0.probes_excused >= 6
        assert w0.consecutive_failures == 0
        await load.stop()
        assert await eventually(lambda: not w0.healthy, 5.0)  # idle: the timeouts count
        assert w0.last_error == "health check timed out"
        relay.release()
        assert await eventually(lambda: w0.healthy, 5.0)
    finally:
        await load.stop()
        await pool.stop()


async def test_a_worker_whose_engine_stalls_under_load_is_marked_unhealthy(sim: Fleet) -> None:
    """The engine runs no step for 8 s under 4 generations: its load records stop changing
    (only arrivals grow the queue), so the probe timeouts count once the progress window
    (2 s) has passed, and it turns unhealthy well before the stall ends."""
    pool = WorkerPool(sim.urls, router=Router(), config=CONFIG)
    await pool.start()
    load = Load(pool)
    try:
        w0 = pool.state("w0")
        assert await eventually(lambda: load.completed >= 1, 10.0)
        loop = asyncio.get_running_loop()
        stalled_at = loop.time()
        await post_fault(sim.urls[0], {"stall_s": 8})
        assert await eventually(lambda: not w0.healthy, 6.0)
        unhealthy_after = loop.time() - stalled_at
        assert unhealthy_after >= CONFIG.progress_window_s
        assert w0.last_error == "health check timed out"
        assert await eventually(lambda: w0.healthy, 10.0)  # the stall ends: it works again
    finally:
        await load.stop()
        await pool.stop()
