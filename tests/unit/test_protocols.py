"""The declared interfaces that callers read directly (no `getattr` / `isinstance` probe) are
satisfied by every real implementation, member by member: each declared attribute or
property is there with a value of its declared type, each method with the declared
parameters (and async where declared async)."""

from __future__ import annotations

import collections.abc
import importlib
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any, Protocol, get_args, get_origin, get_type_hints

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from homing.clock import ManualClock
from homing.config import SimSettings
from homing.engines.lifecycle import Phase
from homing.engines.metrics import EngineMetrics, OutlierFamily, WorkerCounts
from homing.engines.pool import KvEventSink, WorkerState
from homing.obs.replica import ReplicaStats, WorkerView
from homing.obs.testing import FakeWorker
from homing.router import Router
from homing.scaler.actuators.base import Actuator, Member, MemberState
from homing.scaler.actuators.exec import ExecActuator
from homing.scaler.actuators.kubernetes import KubernetesActuator
from homing.scaler.actuators.local import LocalActuator
from homing.scaler.build import start_members
from homing.scaler.leader import Elector, RedisElector, SingleElector
from homing.scaler.leader_kubernetes import KubernetesElector
from homing.text.parsers import TOOL_PARSERS, ToolFormat, tool_structural_tag
from homing.text.tools.base import ToolSpec


def _is_protocol(hint: object) -> bool:
    return isinstance(hint, type) and Protocol in hint.__mro__


def _declared(proto: type) -> dict[str, Any]:
    """The protocol's members: name -> its property or function, or its annotated type."""
    members: dict[str, Any] = {}
    for klass in reversed(proto.__mro__[:-1]):  # object last: skipped
        if klass in (Protocol, typing.Generic):
            continue
        members.update((n, v) for n, v in vars(klass).items() if not n.startswith("_"))
    for name, hint in get_type_hints(proto).items():
        members.setdefault(name, hint)
    return members


def _check_type(value: object, hint: Any, where: str) -> None:
    """`value` is of `hint` (classes, unions, Literal, generic aliases, protocols)."""
    origin = get_origin(hint)
    if hint is Any or isinstance(hint, typing.TypeVar):
        return
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arm in get_args(hint):
            try:
                _check_type(value, arm, where)
                return
            except AssertionError as err:
                errors.append(str(err))
        raise AssertionError(f"{where}: {value!r} is none of {hint}: {errors}")
    if origin is typing.Literal:
        assert value in get_args(hint), f"{where}: {value!r} not in {hint}"
        return
    if hint is type(None):
        assert value is None, f"{where}: {value!r} is not None"
        return
    if _is_protocol(hint):
        assert_conforms(value, hint)
        return
    cls = origin if origin is not None else hint
    if cls is collections.abc.Callable:
        assert callable(value), f"{where}: {value!r} is not callable"
        return
    assert isinstance(value, cls), f"{where}: {value!r} is not a {hint}"


def _check_signature(impl: Any, declared: Any, where: str) -> None:
    """`impl` takes every parameter `declared` names (by name, optional where it is) and is
    async where it is; parameter kinds, positions and return types are not compared."""
    assert callable(impl), f"{where} is not callable"
    assert inspect.iscoroutinefunction(impl) == inspect.iscoroutinefunction(declared), (
        f"{where}: async in one of the protocol and the implementation only"
    )
    got = inspect.signature(impl).parameters
    for name, p in list(inspect.signature(declared).parameters.items())[1:]:  # less self
        assert name in got, f"{where} takes no {name!r}"
        if p.default is not inspect.Parameter.empty:
            assert got[name].default is not inspect.Parameter.empty, f"{where}: {name!r} required"
    extra = [
        n
        for n, p in got.items()
        if n not in inspect.signature(declared).parameters
        and p.default is inspect.Parameter.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    assert not extra, f"{where} requires {extra}, which the protocol does not pass"


def assert_conforms(obj: object, proto: type) -> None:
    """`obj` has every member `proto` declares, each of its declared type or signature."""
    hints = get_type_hints(proto)
    for name, decl in _declared(proto).items():
        where = f"{type(obj).__name__}.{name} ({proto.__name__})"
        assert hasattr(obj, name), f"{where} is missing"
        value = getattr(obj, name)
        if isinstance(decl, property):
            assert decl.fget is not None
            _check_type(value, get_type_hints(decl.fget)["return"], where)
        elif inspect.isfunction(decl):
            _check_signature(value, decl, where)
        else:
            _check_type(value, hints[name], where)


# ------------------------------------------------------------------ obs and engines


def _pool_worker(**fields: Any) -> WorkerState:
    return WorkerState(worker_id="w0", url="grpc://127.0.0.1:1", **fields)


@pytest.mark.parametrize(
    "worker",
    [
        _pool_worker(),
        _pool_worker(phase=Phase.READY, healthy=True, breaker="open"),
        FakeWorker(),
        FakeWorker(breaker="half_open"),
    ],
    ids=["pool", "pool-open", "fake", "fake-half-open"],
)
def test_every_worker_kind_read_by_obs_and_the_engine_metrics_is_typed(worker: object) -> None:
    """`ReplicaStats.snapshot` and the breaker series read `phase` and `breaker` directly:
    the pool's `WorkerState` and the test double `FakeWorker` both declare them as str."""
    assert_conforms(worker, WorkerView)
    if isinstance(worker, WorkerState):
        assert_conforms(worker, WorkerCounts)


def test_a_snapshot_takes_the_phase_and_breaker_of_a_pool_worker() -> None:
    stats = ReplicaStats(now=ManualClock().now)
    ready = stats.snapshot("m", _pool_worker(phase=Phase.READY, healthy=True))
    assert (ready.phase, type(ready.phase), ready.state) == ("ready", str, "ready")
    tripped = stats.snapshot("m", _pool_worker(phase=Phase.READY, healthy=True, breaker="open"))
    assert (tripped.state, tripped.reason) == ("breaker_open", "circuit breaker open")
    ejected = stats.snapshot("m", _pool_worker(phase=Phase.EJECTED, healthy=True))
    assert (ejected.phase, ejected.state, ejected.reason) == ("ejected", "ejected", "phase ejected")


def test_a_snapshot_of_a_fake_worker_with_its_breaker_open() -> None:
    s = ReplicaStats(now=ManualClock().now).snapshot("m", FakeWorker(breaker="open"))
    assert (s.state, s.reason) == ("breaker_open", "circuit breaker open")


def test_the_engine_metrics_count_ejected_pool_workers_by_their_phase() -> None:
    registry = CollectorRegistry()
    metrics = EngineMetrics.on(registry)
    workers = [_pool_worker(phase=Phase.EJECTED), _pool_worker(phase=Phase.READY)]
    metrics.watch("m", lambda: workers)
    assert registry.get_sample_value("homing_outlier_ejected_workers", {"model": "m"}) == 1


def test_every_outlier_family_the_ejector_names_is_a_counter_of_the_metrics() -> None:
    metrics = EngineMetrics.on(CollectorRegistry())
    assert set(metrics.outliers) == set(get_args(OutlierFamily))
    assert metrics.outliers["ejections"] is metrics.ejections
    assert metrics.outliers["returns"] is metrics.returns
    assert metrics.outliers["skipped"] is metrics.skipped
    assert metrics.outliers["probes"] is metrics.probes


def test_the_router_is_the_pools_kv_event_sink() -> None:
    """The pool reads `block_size` (the page size a joining worker must have) of its
    router directly."""
    router = Router(block_size=32)
    assert_conforms(router, KvEventSink)
    assert router.block_size == 32


# ------------------------------------------------------------------ scaler


def test_every_actuator_is_an_actuator() -> None:
    """`start_members` opens every actuator and the scaler loop reads `failed_starts`
    directly: each kind declares both."""
    clock = ManualClock()
    actuators = [
        LocalActuator.for_sim(SimSettings(), clock=clock),
        ExecActuator(["/bin/true"], clock=clock),
        KubernetesActuator(namespace="default", name="llama", selector="app=llama", clock=clock),
    ]
    for actuator in actuators:
        assert_conforms(actuator, Actuator)
        assert actuator.failed_starts == 0


class _ListedActuator:
    """An actuator that lists its members only once opened (as the Kubernetes one)."""

    kind = "listed"

    def __init__(self, urls: list[str]) -> None:
        self.failed_starts = 0
        self.calls: list[str] = []
        self._urls = urls
        self._opened = False

    async def open(self) -> None:
        self.calls.append("open")
        self._opened = True

    def members(self) -> list[Member]:
        self.calls.append("members")
        if not self._opened:
            return []
        return [Member(f"m{i}", u, MemberState.READY, 0.0, 0.0) for i, u in enumerate(self._urls)]

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        return lambda: None

    async def start(self, count: int) -> None:
        self.calls.append(f"start {count}")

    async def stop(self, member_id: str) -> None:
        pass

    def cold_start_s(self) -> float | None:
        return None

    async def close(self) -> None:
        pass


async def test_start_members_opens_the_actuator_before_it_counts_its_members() -> None:
    actuator = _ListedActuator(["grpc://127.0.0.1:1", "grpc://127.0.0.1:2"])
    assert_conforms(actuator, Actuator)
    urls = await start_members(actuator, 2, 1.0, clock=ManualClock())
    assert urls == ["grpc://127.0.0.1:1", "grpc://127.0.0.1:2"]
    assert actuator.calls[0] == "open" and "start 2" not in actuator.calls  # both listed


def test_every_elector_is_an_elector_and_says_whether_it_campaigns() -> None:
    """The app starts `run` only for an elector that campaigns."""
    clock = ManualClock()
    redis = RedisElector(aioredis.Redis(), name="m", identity="a", clock=clock)
    kube = KubernetesElector(namespace="default", name="m", identity="a", clock=clock)
    single = SingleElector()
    for elector in (redis, kube, single):
        assert_conforms(elector, Elector)
    assert (redis.campaigns, kube.campaigns, single.campaigns) == (True, True, False)


# ------------------------------------------------------------------ text


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_every_tool_parser_module_offers_a_structural_tag(name: str) -> None:
    """The gateway asks each family for its `structural_tag` without probing the module."""
    assert_conforms(importlib.import_module(TOOL_PARSERS[name][0]), ToolFormat)
    assert tool_structural_tag(name, ()) is None  # no tools: no constraint
    tools = (ToolSpec("get_weather", {"type": "object"}),)
    tag = tool_structural_tag(name, tools)
    assert tag is None or tag["type"] == "structural_tag"


def test_the_families_that_cannot_be_constrained() -> None:
    tools = (ToolSpec("get_weather", {"type": "object"}),)
    none = sorted(name for name in TOOL_PARSERS if tool_structural_tag(name, tools) is None)
    assert none == ["gpt_oss", "pythonic", "qwen3_coder"]


# ------------------------------------------------------------------ the check itself


class _Sink:
    """A `KvEventSink` but for the cases below."""

    block_size = 16

    def decode_kv_batch(self, data: bytes) -> object:
        return data

    def apply_kv_decoded(self, worker_id: str, batch: object, lag_s: float | None = None) -> None:
        pass

    def flush_worker(self, worker_id: str, reason: str = "flush") -> None:
        pass

    def remove_worker(self, worker_id: str) -> None:
        pass

    def set_stream(self, worker_id: str, state: str) -> None:
        pass


class _NoBlockSize(_Sink):
    block_size = None  # type: ignore[assignment]


class _RequiredReason(_Sink):
    def flush_worker(self, worker_id: str, reason: str) -> None:  # type: ignore[override]
        pass


class _AsyncRemove(_Sink):
    async def remove_worker(self, worker_id: str) -> None:  # type: ignore[override]
        pass


def test_the_check_refuses_a_wrong_type_a_required_parameter_and_async() -> None:
    assert_conforms(_Sink(), KvEventSink)
    for wrong in (_NoBlockSize(), _RequiredReason(), _AsyncRemove()):
        with pytest.raises(AssertionError):
            assert_conforms(wrong, KvEventSink)
    with pytest.raises(AssertionError, match="breaker"):
        assert_conforms(FakeWorker(breaker=1), WorkerView)  # type: ignore[arg-type]
