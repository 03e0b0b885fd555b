"""The `kubernetes` actuator against a real kube-apiserver 1.20.2 + etcd on loopback.

Nothing runs Pods there (no controller-manager, no kubelet), so `k8s_api.FakeCluster` plays
both: its controller brings the Deployment's Pods to `spec.replicas` (a simulated worker
process each) while `controller_gate` is open, deleting the surplus in the ReplicaSet
controller's order; its kubelet marks a Pod Ready through `pods/status` once `ready_gate`
is open. The actuator runs on a `ManualClock`, so cold starts are exact.
"""

from __future__ import annotations

import asyncio

import pytest
from helpers import eventually
from k8s_api import (
    NAME,
    SELECTOR,
    KubeApiServer,
    deployment,
    pod_body,
    replicas,
    workload_body,
)
from kubernetes_asyncio import client as k8s
from structlog.testing import capture_logs

from homing.clock import ManualClock
from homing.engines.client import EngineClient
from homing.scaler.actuators.base import ActuatorError, MemberState
from homing.scaler.actuators.kubernetes import LOWEST_DELETION_COST, KubernetesActuator


def actuator(
    kube_api: KubeApiServer, namespace: str, clock: ManualClock, **kwargs: object
) -> KubernetesActuator:
    return KubernetesActuator(
        namespace=namespace,
        name=str(kwargs.pop("name", NAME)),
        selector=SELECTOR,
        clock=clock,
        kubeconfig=kube_api.kubeconfig,
        **kwargs,  # type: ignore[arg-type]
    )


def states(act: KubernetesActuator) -> dict[str, MemberState]:
    return {m.member_id: m.state for m in act.members()}


async def test_start_scales_up_and_new_pods_become_ready_members_with_cold_start(
    kube_api: KubeApiServer, api: tuple[k8s.ApiClient, str]
) -> None:
    cluster = await deployment(api, 1)
    clock = ManualClock(100.0)
    act = actuator(kube_api, api[1], clock)
    try:
        await act.open()
        assert states(act) == {f"{NAME}-1": MemberState.READY}
        assert act.cold_start_s() is None  # it was Ready before the actuator looked
        cluster.ready_gate.clear()
        await act.start(2)
        assert await replicas(api) == 3
        assert await eventually(lambda: len(act.members()) == 3, 60)
        new = [m for m in act.members() if m.member_id != f"{NAME}-1"]
        assert [m.state for m in new] == [MemberState.STARTING] * 2
        assert [m.asked_at for m in new] == [100.0, 100.0]
        clock.advance(7.0)
        cluster.ready_gate.set()
        assert await eventually(lambda: set(states(act).values()) == {MemberState.READY}, 30)
        new = [m for m in act.members() if m.member_id != f"{NAME}-1"]
        assert [m.ready_at for m in new] == [107.0, 107.0]
        assert act.cold_start_s() == 7.0
        for member in new:
            assert member.url is not None and member.url.startswith("grpc://127.0.0.1:")
            engine = EngineClient(member.url, worker_id=member.member_id)
            try:
                assert (await engine.model_info()).served_model_name
            finally:
                await engine.close()
    finally:
        await act.close()
        await cluster.close()


async def test_replicas_asked_for_are_starting_members_until_their_pods_replace_them(
    kube_api: KubeApiServer, api: tuple[k8s.ApiClient, str]
) -> None:
    cluster = await deployment(api, 0)
    clock = ManualClock(100.0)
    act = actuator(kube_api, api[1], clock)
    try:
        await act.open()
        assert act.members() == []
        cluster.controller_gate.clear()  # a slow controller (or a quota): no Pods yet
        cluster.ready_gate.clear()
        sizes: list[int] = []
        act.subscribe(lambda: sizes.append(len(act.members())))
        await act.start(2)
        assert await replicas(api) == 2
        assert [(m.member_id, m.url, m.state, m.asked_at) for m in act.members()] == [
            ("ask-1", None, MemberState.STARTING, 100.0),
            ("ask-2", None, MemberState.STARTING, 100.0),
        ]
        cluster.controller_gate.set()
        assert await eventually(lambda: set(states(act)) == {f"{NAME}-1", f"{NAME}-2"}, 60)
        assert [(m.state, m.asked_at) for m in act.members()] == [(MemberState.STARTING, 100.0)] * 2
        assert max(sizes) == 2  # each Pod took its placeholder's place, never beside it
        clock.advance(5.0)
        cluster.ready_gate.set()
        assert await eventually(lambda: set(states(act).values()) == {MemberState.READY}, 30)
        assert act.cold_start_s() == 5.0
        assert act.failed_starts == 0
    finally:
        await act.close()
        await cluster.close()


async def test_an_ask_no_pod_came_for_is_given_back_at_the_startup_timeout_or_on_stop(
    kube_api: KubeApiServer, api: tuple[k8s.ApiClient, str]
) -> None:
    cluster = await deployment(api, 0)
    clock = ManualClock()
    act = actuator(kube_api, api[1], clock, startup_timeout_s=60.0)
    try:
        await act.open()
        cluster.controller_gate.clear()  # no Pod ever comes
        await act.start(2)
        assert set(states(act)) == {"ask-1", "ask-2"}
        await act.stop("ask-2")
        assert await replicas(api) == 1
        assert set(states(act)) == {"ask-1"}
        clock.advance(59.0)
        assert set(states(act)) == {"ask-1"}
        with capture_logs() as logs:
            clock.advance(1.0)
            assert act.members() == []
            assert await eventually(lambda: cluster.desired == 0, 10)
        assert act.failed_starts == 1
        failed = [entry for entry in logs if entry["event"] == "scaler_start_failed"]
        assert [entry["member"] for entry in failed] == ["ask-1"]
        assert "60 s" in failed[0]["reason"]
        assert await replicas(api) == 0
    finally:
        await act.close()
        await cluster.close()


async def test_stop_annotates_the_pod_scales_down_deletes_it_and_returns_once_it_is_gone(
    kube_api: KubeApiServer, api: tuple[k8s.ApiClient, str]
) -> None:
    cluster = await deployment(api, 2)
    act = actuator(kube_api, api[1], ManualClock())
    try:
        await act.open()
        assert await eventually(lambda: len(act.members()) == 2, 10)
        seen: list[dict[str, MemberState]] = []
        act.subscribe(lambda: seen.append(states(act)))
        # The oldest Pod: without the annotation the controller would delete the newest.
        await act.stop(f"{NAME}-1")
        assert await eventually(lambda: len(cluster.deleted) == 1, 10)
        assert cluster.deleted == [(f"{NAME}-1", LOWEST_DELETION_COST)]
        assert await replicas(api) == 1
        assert await cluster.live() == {f"{NAME}-2"}
        assert states(act) == {f"{NAME}-2": MemberState.READY}
        assert {f"{NAME}-1": MemberState.STOPPING, f"{NAME}-2": MemberState.READY} in seen
    finally:
        await act.close()
        await cluster.close()


async def test_stop_removes_a_ready_victim_not_the_pod_still_starting(
    kube_api: KubeApiServer, api: tuple[k8s.ApiClient, str]
) -> None:
    cluster = await deployment(api, 1)
    act = actuator(kube_api, api[1], ManualClock())
    stopping: asyncio.Task[None] | None = None
    try:
        await act.open()
        cluster.ready_gate.clear()
        await act.start(1)
        assert await eventually(lambda: f"{NAME}-2" in states(act), 60)
        assert states(act) == {f"{NAME}-1": MemberState.READY, f"{NAME}-2": MemberState.STARTING}
        # The ReplicaSet controller acts two hops after the scale (Deployment controller, then
        # ReplicaSet): the gate holds it until the actuator is done.
        cluster.controller_gate.clear()
        stopping = asyncio.get_running_loop().create_task(act.stop(f"{NAME}-1"))
        stopped = await eventually(stopping.done, 10)
        assert await eventually(lambda: cluster.desired == 1, 10)
        before = cluster.reconciles
        cluster.controller_gate.set()
        assert await eventually(lambda: cluster.reconciles > before, 30)
        # Ranking not Ready first, the controller would have taken the starting Pod.
        assert cluster.controller_deleted == []
        assert stopped
        assert await cluster.live() == {f"{NAME}-2"}
        assert await replicas(api) == 1
        assert states(act) == {f"{NAME}-2": MemberState.STARTING}
        assert await eventually(lambda: len(cluster.deleted) == 1, 10)
        assert cluster.deleted == [(f"{NAME}-1", LOWEST_DELETION_COST)]
    finally:
        if stopping is not None and not stopping.done():
            stopping.cancel()
        await act.close()
        await cluster.close()


async def test_a_watch_from_a_compacted_version_gets_410_and_is_relisted(
    kube_api: KubeApiServer, api: tuple[k8s.ApiClient, str]
) -> None:
    cluster = await deployment(api, 1)
    act = actuator(kube_api, api[1], ManualClock(), watch_timeout_s=1)
    try:
        await act.open()
        assert act.relists == 1
        # Writes elsewhere move etcd's revision past the actuator's; compacting there makes
        # the watch it resumes (each second) too old.
        other = f"{api[1]}-other"
        await k8s.CoreV1Api(api[0]).create_namespace({"metadata": {"name": other}})
        # Two writes: a watch from revision R starts at R + 1, which must be compacted too.
        await k8s.CoreV1Api(api[0]).create_namespaced_config_map(
            other, {"metadata": {"name": "bump"}}
        )
        with capture_logs() as logs:
            kube_api.compact()
            assert await eventually(lambda: act.relists >= 2, 10)
        # 410 re-lists at once (any other failure would wait for the frozen clock's backoff).
        assert "kubernetes_watch_gone" in [entry["event"] for entry in logs]
        # And it watches again: a scale-up's Pod shows up.
        await act.start(1)
        assert await eventually(lambda: len(act.members()) == 2, 60)
        assert await eventually(lambda: set(states(act).values()) == {MemberState.READY}, 30)
        await k8s.CoreV1Api(api[0]).delete_namespace(other)
    finally:
        await act.close()
        await cluster.close()


async def test_a_missing_deployment_is_an_actuator_error_saying_not_found(
    kube_api: KubeApiServer, api: tuple[k8s.ApiClient, str]
) -> None:
    act = actuator(kube_api, api[1], ManualClock(), name="absent")
    try:
        with pytest.raises(ActuatorError, match="NOT FOUND") as error:
            await act.start(1)
        assert "absent" in str(error.value)
    finally:
        await act.close()


async def test_a_statefulset_refuses_to_stop_any_but_its_highest_ordinal(
    kube_api: KubeApiServer, api: tuple[k8s.ApiClient, str]
) -> None:
    client, namespace = api
    await k8s.AppsV1Api(client).create_namespaced_stateful_set(
        namespace, workload_body("StatefulSet", 2)
    )
    for ordinal in (0, 1):
        await k8s.CoreV1Api(client).create_namespaced_pod(
            namespace, pod_body(f"{NAME}-{ordinal}", {"app": NAME}, 50051)
        )
    act = actuator(kube_api, namespace, ManualClock(), kind="StatefulSet")
    try:
        await act.open()
        assert set(states(act)) == {f"{NAME}-0", f"{NAME}-1"}
        with pytest.raises(ActuatorError, match=f"only {NAME}-1 can be stopped"):
            await act.stop(f"{NAME}-0")
        scale = await k8s.AppsV1Api(client).read_namespaced_stateful_set_scale(NAME, namespace)
        assert scale.spec.replicas == 2
    finally:
        await act.close()


async def test_a_failed_pod_leaves_as_a_failed_start(
    kube_api: KubeApiServer, api: tuple[k8s.ApiClient, str]
) -> None:
    client, namespace = api
    await k8s.CoreV1Api(client).create_namespaced_pod(
        namespace, pod_body(f"{NAME}-x", {"app": NAME}, 50051)
    )
    await k8s.AppsV1Api(client).create_namespaced_deployment(
        namespace, workload_body("Deployment", 1)
    )
    act = actuator(kube_api, namespace, ManualClock())
    try:
        await act.open()
        assert states(act) == {f"{NAME}-x": MemberState.STARTING}
        await k8s.CoreV1Api(client).patch_namespaced_pod_status(
            f"{NAME}-x", namespace, {"status": {"phase": "Failed", "reason": "Evicted"}}
        )
        assert await eventually(lambda: act.members() == [], 10)
        assert act.failed_starts == 1
    finally:
        await act.close()
