"""A follower's fleet follows a leader's over the leader's admin socket
(`homing.fleet.mirror`), against a real simulated worker in this process: the leader's
worker is added to a follower that had none, and drained there when the leader drains it."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
import pytest_asyncio
from helpers import eventually

from homing.admin.server import AdminServer
from homing.clock import ManualClock
from homing.config import AdminSettings
from homing.config.admin import AdminKeySettings
from homing.engines.lifecycle import Phase
from homing.engines.pool import PoolConfig, WorkerPool
from homing.fleet import Fleet, ModelDispatch
from homing.fleet.mirror import FleetMirror, LeaderWorker, MirrorAction, leader_reader
from homing.router import Router
from homing.sim.config import SimConfig
from homing.sim.worker import SimWorker
from homing.text.served import served_tokenizer_zip
from homing.text.tokenizer import TextTokenizer

MODEL = "llama-3.1-8b"  # the simulated worker's served name
FAST = PoolConfig(health_interval_s=0.05, health_timeout_s=0.5, kv_backoff_initial_s=0.05)
KEY = "leader-secret"


@dataclass
class Side:
    """One process's fleet with its one model."""

    fleet: Fleet
    model: ModelDispatch


async def side_over(urls: list[str]) -> Side:
    """A started fleet serving MODEL over `urls` (none: a follower before its first round)."""
    router = Router()
    pool = WorkerPool(urls, router=router, model=MODEL, config=FAST)
    await pool.start()
    tokenizer = TextTokenizer.from_bundle(served_tokenizer_zip())
    model = ModelDispatch(MODEL, tokenizer, pool, router)
    return Side(Fleet([model]), model)


async def stop(side: Side) -> None:
    await side.fleet.stop()
    await side.model.pool.stop()


@pytest_asyncio.fixture
async def sim() -> AsyncIterator[SimWorker]:
    worker = SimWorker(SimConfig(speedup=10.0))
    await worker.start()
    yield worker
    await worker.stop(grace_s=0.1)


@pytest_asyncio.fixture
async def leader(sim: SimWorker) -> AsyncIterator[tuple[Side, str]]:
    """The leader's fleet over `sim` and the address of its admin socket (key: KEY)."""
    side = await side_over([sim.url])
    path = os.path.join(tempfile.mkdtemp(dir=os.environ.get("HOMING_STATE_DIR")), "admin.sock")
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    settings = AdminSettings(socket=path, keys=[AdminKeySettings(id="test", sha256=digest)])
    server = AdminServer(side.fleet, settings)
    await server.start()
    try:
        yield side, "unix:" + path
    finally:
        await server.stop()
        await stop(side)


@pytest_asyncio.fixture
async def follower() -> AsyncIterator[Side]:
    side = await side_over([])
    yield side
    await stop(side)


async def test_follower_adds_the_leaders_worker_then_drains_it_when_the_leader_does(
    sim: SimWorker, leader: tuple[Side, str], follower: Side
) -> None:
    lead, address = leader
    mirror = FleetMirror(follower.fleet, leader_reader(address, key=KEY), clock=ManualClock())

    assert await mirror.sync_once() == [MirrorAction("add", MODEL, sim.url)]
    [(_, added)] = follower.fleet.workers()
    assert added.url == sim.url and added.phase is Phase.READY
    assert await mirror.sync_once() == []  # in step

    # Open requests on both sides keep the worker draining rather than gone at once.
    lead_lease = lead.model.lease([1, 2, 3])
    own_lease = follower.model.lease([1, 2, 3])
    lead.fleet.drain(lead_lease.worker_id)

    assert await mirror.sync_once() == [
        MirrorAction("drain", MODEL, sim.url, worker_id=added.worker_id)
    ]
    assert added.phase is Phase.DRAINING
    assert await mirror.sync_once() == []  # not drained twice, not added again
    own_lease.release()  # its last request ends: the worker leaves the follower
    assert await eventually(lambda: follower.fleet.workers() == [], 5)
    lead_lease.release()
    assert await eventually(lambda: lead.fleet.workers() == [], 5)
    assert await mirror.sync_once() == []


async def test_the_reader_sends_the_admin_key(leader: tuple[Side, str], sim: SimWorker) -> None:
    """With the key: the leader's list; without: UNAUTHENTICATED (a failed read)."""
    _, address = leader
    assert await leader_reader(address, key=KEY)() == [
        LeaderWorker(MODEL, sim.url, "", Phase.READY)
    ]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await leader_reader(address)()
    assert err.value.code() is grpc.StatusCode.UNAUTHENTICATED
