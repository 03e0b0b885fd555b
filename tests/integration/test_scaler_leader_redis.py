"""Leader election for the autoscaler against a real redis-server on loopback (`RedisElector`).

Redis's PX expiry is real time, so these electors run on the system clock with a 1 s lease
(3 s where a renew interval must be told apart from a lease), and each step waits for the
event (a subscribe callback, a completed round) with a deadline: claims about real time, so
the module runs in `make test`'s serial phase. The outage test runs on a `ManualClock`,
since there only the elector's own reckoning counts.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from electors import Running
from helpers import eventually
from redis_server import RedisServer
from structlog.testing import capture_logs

from homing.clock import ManualClock, SystemClock
from homing.scaler.leader import RedisElector


@pytest_asyncio.fixture
async def running() -> AsyncIterator[Running]:
    electors = Running()
    yield electors
    await electors.close()


@pytest_asyncio.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    redis = aioredis.Redis.from_url(redis_server.url, socket_timeout=1.0)
    yield redis
    await redis.aclose()


def redis_elector(
    client: aioredis.Redis, pool: str, who: str, lease_s: float = 1.0, **kwargs: Any
) -> RedisElector:
    return RedisElector(
        client,
        name=pool,
        identity=f"{who}:{uuid.uuid4().hex[:6]}",
        clock=kwargs.pop("clock", SystemClock()),
        lease_s=lease_s,
        key_prefix="leader-test",
        **kwargs,
    )


def pool_name() -> str:
    return f"pool-{uuid.uuid4().hex[:8]}"


async def test_redis_exactly_one_of_two_leads_and_keeps_leading_across_leases(
    client: aioredis.Redis, running: Running
) -> None:
    pool = pool_name()
    a = running.start(redis_elector(client, pool, "a"))
    b = running.start(redis_elector(client, pool, "b"))
    assert await eventually(lambda: a.rounds >= 1 and b.rounds >= 1, 10)
    leader, follower = (a, b) if a.is_leader else (b, a)
    assert leader.is_leader and not follower.is_leader
    assert leader.token is not None and leader.token >= 1 and follower.token is None
    assert follower.holder == leader.identity
    assert await leader.still_leader(leader.token)
    assert not await follower.still_leader(leader.token)
    # Three leases of renewals later, nothing has changed hands.
    assert await eventually(lambda: leader.rounds >= 10, 10)
    assert running.of(leader) == [True] and running.of(follower) == []
    assert await client.get(leader.key) == f"{leader.identity} {leader.token}".encode()


async def test_redis_a_clean_stop_hands_over_within_one_renew_interval(
    client: aioredis.Redis, running: Running
) -> None:
    pool = pool_name()
    a = running.start(redis_elector(client, pool, "a", lease_s=3.0))  # renew every 1 s
    assert await eventually(lambda: a.is_leader, 10)
    b = running.start(redis_elector(client, pool, "b", lease_s=3.0))
    assert await eventually(lambda: b.rounds >= 1, 10)
    old = a.token
    assert old is not None and not b.is_leader
    await running.stop(a)
    stopped = time.monotonic()
    assert not a.is_leader and running.of(a) == [True, False]
    assert await client.get(a.key) is None  # released, not left to expire
    assert await eventually(lambda: b.is_leader, 3.0)
    assert time.monotonic() - stopped < b.renew_s + 0.3  # well under the 3 s lease
    assert b.token is not None and b.token > old


async def test_redis_a_dead_leader_is_replaced_within_one_lease_and_is_fenced(
    client: aioredis.Redis, running: Running
) -> None:
    pool = pool_name()
    a = running.start(redis_elector(client, pool, "a"))
    assert await eventually(lambda: a.is_leader, 10)
    b = running.start(redis_elector(client, pool, "b"))
    assert await eventually(lambda: b.rounds >= 1, 10)
    old = a.token
    assert old is not None
    a.abandon()
    await running.stop(a)  # dies: no release
    died = time.monotonic()
    assert await client.get(a.key) == f"{a.identity} {old}".encode()
    assert await eventually(lambda: b.is_leader, a.lease_s + 1.0)
    took = time.monotonic() - died
    # It waited for the lease to run out (at most one lease after the last renew), and
    # took over at its end, not a lease later: the upper bound leaves a loaded runner's
    # lateness room (a serial CI run read 1.32 s against a 1 s lease) ...
    assert a.lease_s - a.renew_s - 0.1 < took < 2 * a.lease_s
    assert b.token is not None and b.token > old
    # ... and the old leader's token is now refused by the store.
    assert not await a.still_leader(old)
    assert await b.still_leader(b.token)


async def test_redis_separate_pools_have_separate_leaders(
    client: aioredis.Redis, running: Running
) -> None:
    first, second = pool_name(), pool_name()
    a = running.start(redis_elector(client, first, "a"))
    b = running.start(redis_elector(client, second, "b"))
    assert await eventually(lambda: a.is_leader and b.is_leader, 10)
    assert a.key != b.key
    c = running.start(redis_elector(client, first, "c"))
    assert await eventually(lambda: c.rounds >= 1, 10)
    assert not c.is_leader and c.holder == a.identity


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test's own (it is stopped and started again)."""
    server = RedisServer()
    server.start()
    yield server
    server.stop()


async def test_redis_outage_steps_the_leader_down_at_its_lease_then_it_returns_with_a_higher_token(
    own_redis: RedisServer, running: Running
) -> None:
    clock = ManualClock()
    redis = aioredis.Redis.from_url(own_redis.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    try:
        a = redis_elector(redis, pool_name(), "a", lease_s=1.2, renew_s=0.4, clock=clock)
        running.start(a)
        assert await eventually(lambda: a.is_leader and a.rounds == 1, 10)
        old = a.token
        assert old is not None
        own_redis.stop()
        with capture_logs() as logs:
            clock.advance(0.4)  # t = 0.4: the renew fails
            assert await eventually(lambda: a.rounds == 2, 10)
            clock.advance(0.4)  # t = 0.8: and again
            assert await eventually(lambda: a.rounds == 3, 10)
            assert a.is_leader
            clock.advance(0.3)  # t = 1.1: the lease (sent at 0, 1.2 s) still holds
            await asyncio.sleep(0.05)
            assert a.is_leader and a.rounds == 3
            clock.advance(0.15)  # t = 1.25: it has run out
            assert await eventually(lambda: not a.is_leader, 10)
        assert running.of(a) == [True, False]
        events = [entry["event"] for entry in logs]
        # Two failed renews, then the step-down (and a failed campaign in that round).
        assert events[:3] == ["scaler_leader_store_failed"] * 2 + ["scaler_leader_lost"]
        assert not running.tasks[id(a)].done()  # nothing escaped run()
        # Redis comes back empty (no persistence): the token counter is gone, yet the new
        # token is above the old one.
        own_redis.start()
        before = a.rounds
        clock.advance(a.renew_s)
        assert await eventually(lambda: a.rounds > before, 10)
        assert a.is_leader and a.token is not None and a.token > old
        assert await a.still_leader(a.token)
    finally:
        await redis.aclose()
