"""Leader election for the autoscaler against a real kube-apiserver 1.20.2 + etcd on loopback
(`KubernetesElector`), and the single-instance elector. The Kubernetes electors run on a
`ManualClock` throughout (their expiry is judged on their own clock); the Redis electors
are in test_scaler_leader_redis.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from electors import Running
from helpers import eventually
from k8s_api import KubeApiServer
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio import config as k8s_config
from structlog.testing import capture_logs

from homing.clock import ManualClock
from homing.scaler.leader import SingleElector
from homing.scaler.leader_kubernetes import KubernetesElector


@pytest_asyncio.fixture
async def running() -> AsyncIterator[Running]:
    electors = Running()
    yield electors
    await electors.close()


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
