"""Outlier ejection's panic rule between intervals, over two simulated workers: an ejected
worker returns the moment the pool's last ready worker goes (it dies after the ejection),
not at the next interval."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from helpers import eventually
from structlog.testing import capture_logs

from homing.clock import SystemClock
from homing.engines.ejector import OutlierEjector
from homing.engines.lifecycle import Phase
from homing.engines.outliers import OutlierConfig
from homing.engines.pool import PoolConfig, WorkerPool, WorkerState
from homing.obs.replica import ReplicaSnapshot
from homing.obs.testing import replica_snapshot
from homing.router import Router
from homing.sim.config import SimConfig
from homing.sim.worker import SimWorker

FAST_PROBES = PoolConfig(
    health_interval_s=0.05,
    health_timeout_s=0.5,
    unhealthy_threshold=3,
    healthy_threshold=2,
    kv_backoff_initial_s=0.05,
    kv_backoff_max_s=0.2,
)
SIM = SimConfig(speedup=10.0, heartbeat_idle_s=0.2, heartbeat_busy_s=0.05)
#: TPOT (s) each worker's recent requests show: w0 is 10x slower than w1.
TPOT = {"w0": 0.1, "w1": 0.01}


@pytest_asyncio.fixture
async def sims() -> AsyncIterator[list[SimWorker]]:
    workers = [SimWorker(SIM), SimWorker(SIM)]
    for w in workers:
        await w.start()
    try:
        yield workers
    finally:
        for w in workers:
            await w.stop(grace_s=0.1)


def snapshot(w: WorkerState) -> ReplicaSnapshot:
    """`w` as the request recorder would show it, with 10 requests at its `TPOT`."""
    if w.routable:
        state = "ready"
    else:
        state = "unhealthy" if not w.healthy else w.phase.value
    return replica_snapshot(
        worker_id=w.worker_id,
        phase=w.phase.value,
        state=state,
        healthy=w.healthy,
        in_flight=w.in_flight,
        requests=10,
        tpot_s=TPOT[w.worker_id],
        error_ratio=0.0,
    )


async def test_an_ejected_worker_returns_at_once_when_the_last_ready_one_dies(
    sims: list[SimWorker],
) -> None:
    """w0 is ejected (10x w1's TPOT); w1 then dies: w0 is readmitted as soon as w1 turns
    unhealthy, with the interval (10 min) far from over."""
    pool = WorkerPool([w.url for w in sims], router=Router(), config=FAST_PROBES)
    await pool.start()
    try:
        await pool.wait_ready(5)
        assert await eventually(lambda: all(w.routable for w in pool.workers()), 5.0)
        config = OutlierConfig(interval_s=600.0, consecutive=1, window_s=600.0)
        ejector = OutlierEjector(
            pool,
            model="m",
            snapshots=lambda: [snapshot(w) for w in pool.workers()],
            config=config,
            clock=SystemClock(),
        )
        plan = await ejector.step()
        assert [e.worker_id for e in plan.ejections] == ["w0"]
        w0, w1 = pool.state("w0"), pool.state("w1")
        assert w0.phase is Phase.EJECTED
        pool.run_beside(ejector.run(), name="outliers-m")
        assert ejector.rescue() == []  # w1 is ready: nothing to do
        with capture_logs() as logs:
            await sims[1].stop(grace_s=0.1)
            assert await eventually(lambda: not w1.healthy, 3.0)
            assert await eventually(lambda: w0.phase is Phase.READY, 1.0)
        assert w0.routable
        returned = [e for e in logs if e["event"] == "outlier_returned"]
        assert [(e["worker"], e["reason"]) for e in returned] == [("w0", "no_ready_worker")]
        assert ejector.detector.ejected() == []
    finally:
        await pool.stop()
