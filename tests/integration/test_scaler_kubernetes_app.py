"""The autoscaler inside `homing serve` driving a real kube-apiserver 1.20.2 + etcd on loopback:
the App's pool is the Deployment's Pods, its `kubernetes` actuator scales the Deployment and
its `kubernetes` elector holds the pool's Lease.

`k8s_api.FakeCluster` plays the ReplicaSet controller and the kubelet: for each Pod the
controller creates it starts a simulated worker (`homing sim`, the same speed-up as the
App's), and the kubelet marks the Pod Ready (podIP 127.0.0.1) through `pods/status`. The App
starts over a Deployment whose Pods are Ready already (with no worker listed and the scaler
on, its pool comes from the actuator), so no worker of its own is launched. Ticks are driven
by the test (`app.scaler.step()`, the background tick an hour away).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest_asyncio
from helpers import eventually, own_app, post_fault
from k8s_api import (
    NAME,
    SELECTOR,
    FakeCluster,
    KubeApiServer,
    deployment,
    pod_ready,
    replicas,
)
from kubernetes_asyncio import client as k8s
from stream_load import StreamLoad
from structlog.testing import capture_logs

from homing.app import App
from homing.config import (
    GatewaySettings,
    HomingConfig,
    KubernetesActuatorSettings,
    RouterSettings,
    ScalerSettings,
    SimSettings,
)
from homing.engines.lifecycle import Phase
from homing.scaler.actuators.base import MemberState
from homing.scaler.actuators.kubernetes import LOWEST_DELETION_COST
from homing.scaler.leader_kubernetes import KubernetesElector, lease_name

MODEL = "llama-3.1-8b"
HOUR = 3600.0
SPEEDUP = 10.0
SIM_ARGS = ["--speedup", str(SPEEDUP)]
LEASE_S = 10.0


def _config(kube_api: KubeApiServer, namespace: str, **scaler: Any) -> HomingConfig:
    settings = {
        "enabled": True,
        "actuator": "kubernetes",
        "kubernetes": KubernetesActuatorSettings(
            namespace=namespace,
            name=NAME,
            selector=SELECTOR,
            port_name="grpc",
            kubeconfig=kube_api.kubeconfig,
        ),
        "leader": "kubernetes",
        "leader_namespace": namespace,
        "leader_lease_s": LEASE_S,
        "tick_s": HOUR,  # the test steps the scaler itself
        "min_replicas": 1,
        "max_replicas": 3,
        "headroom": 0.0,
        "decode_streams_per_replica": 2.0,  # a few streams need more replicas
        "prefill_tokens_per_s_per_replica": 1e9,  # decode decides in these tests
        "warm_replicas": 0,
        "default_cold_start_s": 5.0,
        "scale_down_window_s": 0.5,
        "scale_down_cooldown_s": 0.0,
        "startup_timeout_s": 60.0,
        **scaler,
    }
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        router=RouterSettings(policy="round_robin"),
        sim=SimSettings(workers=1, speedup=SPEEDUP),
        scaler=ScalerSettings(**settings),
    )


@pytest_asyncio.fixture
async def cluster_app(
    kube_api: KubeApiServer, api: tuple[k8s.ApiClient, str]
) -> AsyncIterator[Any]:
    """`await cluster_app(pods, **scaler settings)`: a Deployment of `pods` Ready Pods (its
    `FakeCluster`), then a started App over it; the App is stopped, then the cluster."""
    made: list[tuple[FakeCluster, App | None]] = []

    async def make(pods: int, **scaler: Any) -> tuple[FakeCluster, App]:
        cluster = await deployment(api, pods, SIM_ARGS)
        made.append((cluster, None))
        app = own_app(_config(kube_api, api[1], **scaler))
        made[-1] = (cluster, app)
        await app.start()
        return cluster, app

    try:
        yield make
    finally:
        for cluster, app in made:
            try:
                if app is not None:
                    await app.stop()
            finally:
                await cluster.close()


def _ready(app: App) -> int:
    assert app.pool is not None
    return sum(1 for w in app.pool.workers() if w.phase is Phase.READY and w.healthy)


def _pool_scaler(app: App) -> Any:
    assert app.scaler is not None
    return app.scaler.pools[0]


async def _leader(app: App) -> KubernetesElector:
    """The App's elector, once it leads (10 s, else the test fails)."""
    elector = _pool_scaler(app).elector
    assert isinstance(elector, KubernetesElector)
    assert await eventually(lambda: elector.is_leader, 10.0), elector.holder
    return elector


async def _lease(api: tuple[k8s.ApiClient, str]) -> Any:
    client, namespace = api
    return await k8s.CoordinationV1Api(client).read_namespaced_lease(lease_name(MODEL), namespace)


async def _long_stream(
    app: App, session: aiohttp.ClientSession, max_tokens: int, prompt: str
) -> tuple[str, str]:
    """One streamed completion through the App: (the worker that served it, its body)."""
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }
    url = f"http://127.0.0.1:{app.http_port}/v1/completions"
    async with session.post(url, json=body) as resp:
        assert resp.status == 200
        text = (await resp.read()).decode()
        return resp.headers["x-homing-worker"], text


async def test_the_app_starts_over_the_ready_pod_without_scaling_and_holds_the_lease(
    cluster_app: Any, api: tuple[k8s.ApiClient, str]
) -> None:
    """One Ready Pod and min_replicas 1: the App's pool is that Pod's worker, spec.replicas
    is never written (the Deployment's generation stays 1), an idle step keeps it at 1, and
    the elector holds the pool's Lease in the namespace (holderIdentity its own, the first
    transition); a stop hands the Lease back."""
    cluster, app = await cluster_app(1)
    assert app.pool is not None
    assert [w.url for w in app.pool.workers()] == [cluster.urls[f"{NAME}-1"]]
    assert _ready(app) == 1
    elector = await _leader(app)
    lease = await _lease(api)
    assert lease.spec.holder_identity == elector.identity
    assert lease.spec.lease_transitions == 1 and elector.token == 1
    assert lease.spec.lease_duration_seconds == math.ceil(LEASE_S)
    assert app.scaler is not None
    d = (await app.scaler.step())[MODEL]
    assert d.desired_ready == 1, d
    assert await replicas(api) == 1
    client, namespace = api
    workload = await k8s.AppsV1Api(client).read_namespaced_deployment(NAME, namespace)
    assert workload.metadata.generation == 1  # every write to its spec would bump it
    assert [r for r, _ in cluster.scales] == [1]
    assert await cluster.live() == {f"{NAME}-1"}
    members = _pool_scaler(app).actuator.members()
    assert [(m.member_id, m.state) for m in members] == [(f"{NAME}-1", MemberState.READY)]
    await app.stop()
    lease = await _lease(api)
    assert lease.spec.holder_identity is None and lease.spec.lease_transitions == 1


async def test_a_load_step_patches_replicas_up_and_the_new_pods_join_and_serve(
    cluster_app: Any, api: tuple[k8s.ApiClient, str]
) -> None:
    """Six streams at two per replica: one step patches spec.replicas 1 -> 3; the controller
    creates two Pods, the kubelet marks them Ready through pods/status, the actuator finds
    them, they join the pool ready, and the load reaches them."""
    cluster, app = await cluster_app(1)
    assert app.scaler is not None and app.pool is not None and app.model is not None
    elector = await _leader(app)
    async with StreamLoad(app.http_port, model=MODEL, concurrency=6, max_tokens=400) as load:
        assert await eventually(lambda: app.model.pool.total_in_flight >= 5, 10.0)
        d = (await app.scaler.step())[MODEL]
        assert (d.desired_ready, d.reason) == (3, "scale_up"), d
        assert await replicas(api) == 3  # the step returns once patched
        assert await eventually(lambda: len(cluster.ready) == 3, 60.0), cluster.ready
        pods = await cluster.pods()
        assert set(pods) == {f"{NAME}-1", f"{NAME}-2", f"{NAME}-3"}
        assert all(pod_ready(p) and p.status.pod_ip == "127.0.0.1" for p in pods.values())
        assert await eventually(lambda: _ready(app) == 3, 60.0)
        assert {w.url for w in app.pool.workers()} == set(cluster.urls.values())
        assert await eventually(lambda: len(load.by_worker) == 3, 30.0), load.by_worker
    assert load.failed == []
    started = {w.worker_id for w in app.pool.workers()} - {"w0"}
    assert len(started) == 2 and all(load.by_worker[w] > 0 for w in started)
    actuator = _pool_scaler(app).actuator
    assert [m.state for m in actuator.members()] == [MemberState.READY] * 3
    assert actuator.cold_start_s() is not None and actuator.cold_start_s() > 0
    assert [r for r, _ in cluster.scales] == [1, 3]
    assert await replicas(api) == 3
    assert elector.token == 1 and (await _lease(api)).spec.holder_identity == elector.identity


async def test_scale_down_drains_the_victim_before_patching_replicas_and_deleting_its_pod(
    cluster_app: Any, api: tuple[k8s.ApiClient, str]
) -> None:
    """Three Ready Pods, one slow stream on each, then min_replicas lowered: a step drains
    one victim while spec.replicas stays 3 and its Pod stays; its stream completes, it
    leaves the pool, and only then is spec.replicas patched to 2 and that Pod deleted (with
    the lowest deletion cost); every stream ends with [DONE]."""
    cluster, app = await cluster_app(3, min_replicas=3)
    assert app.scaler is not None and app.pool is not None
    pool = app.pool
    assert await eventually(lambda: _ready(app) == 3, 30.0)
    await _leader(app)
    loop = asyncio.get_running_loop()
    for w in pool.workers():
        await post_fault(w.url, {"slowdown": 30})
    async with aiohttp.ClientSession() as session:
        streams = [
            asyncio.create_task(_long_stream(app, session, 300, f"story {i}")) for i in range(3)
        ]
        try:
            assert await eventually(
                lambda: sorted(w.in_flight for w in pool.workers()) == [1, 1, 1], 10.0
            )
            pool_scaler = _pool_scaler(app)
            pool_scaler.reconfigure(dataclasses.replace(pool_scaler.config, min_replicas=1))
            with capture_logs() as logs:
                for _ in range(50):  # polled: the stable window (0.5 s) passes between steps
                    d = (await app.scaler.step())[MODEL]
                    if d.desired_ready == 2:
                        break
                    await asyncio.sleep(0.05)
                assert d.desired_ready == 2, d
            draining = [w for w in pool.workers() if w.phase is Phase.DRAINING]
            assert len(draining) == 1 and draining[0].in_flight == 1, draining
            victim = draining[0]
            assert [e["worker"] for e in logs if e["event"] == "scaler_draining"] == [
                victim.worker_id
            ]
            pod = next(name for name, url in cluster.urls.items() if url == victim.url)
            patched: list[tuple[int, bool]] = []  # (replicas, victim still in the pool)
            cluster.on_scale.append(lambda n: patched.append((n, pool.has(victim.worker_id))))

            async def gone() -> None:
                assert await pool.wait_gone(victim.worker_id, 60.0)

            left = loop.create_task(gone())
            # While its stream runs the victim holds its replica and its Pod.
            assert await replicas(api) == 3
            assert pod in await cluster.live() and cluster.deleted == []
            for w in pool.workers():
                await post_fault(w.url, {"slowdown": 1})
            ended = await asyncio.gather(*streams)
        finally:
            for task in streams:
                task.cancel()
    for _, body in ended:
        assert body.rstrip().endswith("data: [DONE]") and '"error"' not in body
    on_victim = [body for worker, body in ended if worker == victim.worker_id]
    assert len(on_victim) == 1 and '"length"' in on_victim[0]  # all its 300 tokens
    await left  # it left the pool (drained: its stream had ended)
    assert await eventually(lambda: pod in cluster.deleted_versions, 30.0), cluster.deleted
    assert patched == [(2, False)]  # patched after the victim had left the pool
    scaled_down = dict(cluster.scales)[2]
    assert int(scaled_down) < int(cluster.deleted_versions[pod])  # patch, then the delete
    assert cluster.deleted == [(pod, LOWEST_DELETION_COST)]
    assert await replicas(api) == 2
    assert await cluster.live() == {f"{NAME}-1", f"{NAME}-2", f"{NAME}-3"} - {pod}
    actuator = _pool_scaler(app).actuator
    assert await eventually(lambda: len(actuator.members()) == 2, 30.0)
    assert pod not in {m.member_id for m in actuator.members()}
    assert victim.url not in {w.url for w in pool.workers()} and len(pool.workers()) == 2
