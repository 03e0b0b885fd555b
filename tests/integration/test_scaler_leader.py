"""Leader election for the autoscaler against a real redis-server and a real kube-apiserver
1.20.2 + etcd on loopback.

Redis's PX expiry is real time, so the Redis electors run on the system clock with a 1 s
lease (3 s where a renew interval must be told apart from a lease), and each step waits for
the event (a subscribe callback, a completed round) with a deadline; the outage test runs on
a `ManualClock`, since there only the elector's own reckoning counts. The Kubernetes
electors run on a `ManualClock` throughout (their expiry is judged on their own clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from helpers import eventually
from k8s_api import KubeApiServer
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from redis_server import RedisServer
from structlog.testing import capture_logs

from homing.clock import ManualClock, SystemClock
from homing.scaler.leader import RedisElector, SingleElector
from homing.scaler.leader_kubernetes import KubernetesElector


class Running:
    """Electors run as tasks, with every `is_leader` change each one reported."""

    def __init__(self) -> None:
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.changes: dict[int, list[bool]] = {}

    def start(self, elector: Any) -> Any:
        self.changes[id(elector)] = changes = []
        elector.subscribe(changes.append)
        self.tasks[id(elector)] = asyncio.get_running_loop().create_task(elector.run())
        return elector

    def of(self, elector: Any) -> list[bool]:
        return self.changes[id(elector)]

    async def stop(self, elector: Any) -> None:
        """Cancel its run(); fails the test if run() raised anything but the cancel."""
        task = self.tasks.pop(id(elector))
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        for task in self.tasks.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task


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
    # It waited for the lease to run out (at most one lease after the last renew) ...
    assert a.lease_s - a.renew_s - 0.1 < took < a.lease_s + 0.3
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


async def test_single_elector_leads_at_once_with_token_one() -> None:
    single = SingleElector()
    assert single.kind == "single"
    assert single.is_leader and single.token == 1
    assert await single.still_leader(1) and not await single.still_leader(2)
    task = asyncio.get_running_loop().create_task(single.run())
    await asyncio.sleep(0)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# -- Kubernetes --------------------------------------------------------------------------------


@pytest_asyncio.fixture
async def lease_api(kube_api: KubeApiServer) -> AsyncIterator[tuple[k8s.CoordinationV1Api, str]]:
    """The Lease API (admin) and a fresh namespace of this test's own."""
    configuration = k8s.Configuration()
    await k8s_config.load_kube_config(
        config_file=kube_api.kubeconfig, client_configuration=configuration
    )
    async with k8s.ApiClient(configuration=configuration) as api:
        namespace = f"t-{uuid.uuid4().hex[:10]}"
        await k8s.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
        yield k8s.CoordinationV1Api(api), namespace
        await k8s.CoreV1Api(api).delete_namespace(namespace)


class GatedElector(KubernetesElector):
    """Holds its next read's answer until `gate` opens (armed by `hold`): so a write of
    another instance lands between its read and its write."""

    def hold(self) -> None:
        self.opened = asyncio.Event()
        self.gate: asyncio.Event | None = self.opened
        self.holding = asyncio.Event()

    async def _read(self) -> Any:
        lease = await super()._read()
        gate = getattr(self, "gate", None)
        if gate is not None:
            self.gate = None
            self.holding.set()
            await gate.wait()
        return lease


def kube_elector(
    kube_api: KubeApiServer,
    namespace: str,
    who: str,
    clock: ManualClock,
    cls: type = KubernetesElector,
) -> Any:
    return cls(
        namespace=namespace,
        name="llama",
        identity=f"{who}:{uuid.uuid4().hex[:6]}",
        clock=clock,
        lease_s=2.0,
        kubeconfig=kube_api.kubeconfig,
    )


async def advance(clock: ManualClock, seconds: float, *electors: KubernetesElector) -> None:
    """Move the clock, then wait until each of `electors` has finished a round."""
    before = [e.rounds for e in electors]
    clock.advance(seconds)
    assert await eventually(
        lambda: all(e.rounds > b for e, b in zip(electors, before, strict=True)), 20
    )


async def test_kubernetes_one_leads_renews_and_on_release_the_other_takes_over_with_token_plus_one(
    kube_api: KubeApiServer,
    lease_api: tuple[k8s.CoordinationV1Api, str],
    running: Running,
) -> None:
    api, namespace = lease_api
    clock = ManualClock()
    a = running.start(kube_elector(kube_api, namespace, "a", clock))
    b = running.start(kube_elector(kube_api, namespace, "b", clock))
    assert await eventually(lambda: a.rounds >= 1 and b.rounds >= 1, 20)
    leader, follower = (a, b) if a.is_leader else (b, a)
    assert leader.is_leader and not follower.is_leader
    assert leader.token == 1 and follower.token is None
    assert follower.holder == leader.identity
    lease = await api.read_namespaced_lease("llama", namespace)
    assert lease.spec.holder_identity == leader.identity
    assert lease.spec.lease_transitions == 1 and lease.spec.lease_duration_seconds == 2
    # Five renew intervals (over the 2 s lease): the leader renews, the follower waits.
    for _ in range(5):
        await advance(clock, leader.renew_s, leader, follower)
    assert running.of(leader) == [True] and running.of(follower) == []
    renewed = await api.read_namespaced_lease("llama", namespace)
    assert renewed.metadata.resource_version != lease.metadata.resource_version
    assert await leader.still_leader(1)
    await running.stop(leader)  # releases: holderIdentity cleared
    released = await api.read_namespaced_lease("llama", namespace)
    assert released.spec.holder_identity is None and released.spec.lease_transitions == 1
    await advance(clock, follower.renew_s, follower)
    assert follower.is_leader and follower.token == 2
    taken = await api.read_namespaced_lease("llama", namespace)
    assert taken.spec.holder_identity == follower.identity and taken.spec.lease_transitions == 2
    assert not await leader.still_leader(1)


async def test_kubernetes_a_stale_version_takeover_gets_409_and_leaves_one_leader(
    kube_api: KubeApiServer,
    lease_api: tuple[k8s.CoordinationV1Api, str],
    running: Running,
) -> None:
    api, namespace = lease_api
    clock = ManualClock()
    a = running.start(kube_elector(kube_api, namespace, "a", clock))
    assert await eventually(lambda: a.is_leader, 20)
    b = running.start(kube_elector(kube_api, namespace, "b", clock, GatedElector))
    c = running.start(kube_elector(kube_api, namespace, "c", clock))
    assert await eventually(lambda: b.rounds >= 1 and c.rounds >= 1, 20)
    assert not b.is_leader and not c.is_leader
    a.abandon()
    await running.stop(a)  # dies holding the Lease
    stale = await api.read_namespaced_lease("llama", namespace)
    assert stale.spec.holder_identity == a.identity
    b.hold()
    with capture_logs() as logs:
        # Past the 2 s lease by the followers' clock: both go for it; b holds its read.
        clock.advance(2.1)
        assert await eventually(lambda: b.holding.is_set() and c.is_leader, 20)
        assert c.token == 2
        rounds = b.rounds
        b.opened.set()  # b now replaces from the version it read before c's takeover
        assert await eventually(lambda: b.rounds > rounds, 20)
    assert "scaler_leader_conflict" in [entry["event"] for entry in logs]
    assert not b.is_leader and running.of(b) == []
    await advance(clock, b.renew_s, b, c)
    assert c.is_leader and not b.is_leader and b.holder == c.identity
    lease = await api.read_namespaced_lease("llama", namespace)
    assert lease.spec.holder_identity == c.identity and lease.spec.lease_transitions == 2
    assert not await a.still_leader(1) and await c.still_leader(2)
