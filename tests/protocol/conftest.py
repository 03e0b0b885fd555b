"""Fixtures of the protocol suite: each test module runs once per engine kind, over two workers
of that kind as real child processes (simulated, and real SGLang on the CPU), behind a whole
homing `App` in the module's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence

import pytest
import pytest_asyncio
from engine_fleet import ENGINES, SMALL_POOL_TOKENS, EngineWorker, Fleet
from helpers import own_app
from sglang_env import require_sglang

from homing.app import App
from homing.config import EngineSettings, GatewaySettings, HomingConfig, RouterSettings


def _fleet(engine: str) -> Iterator[Fleet]:
    fleet = Fleet(engine)
    try:
        fleet.start(2)
        yield fleet
    finally:
        fleet.close()


@pytest.fixture(scope="session")
def sim_fleet() -> Iterator[Fleet]:
    """Two simulated workers (`homing sim`, 10x speed) for the whole session."""
    yield from _fleet("sim")


@pytest.fixture(scope="session")
def sglang_fleet() -> Iterator[Fleet]:
    """Two real SGLang workers (`homing worker`, tiny model, CPU) for the whole session."""
    require_sglang()
    yield from _fleet("sglang")


@pytest.fixture(scope="module", params=ENGINES)
def fleet(request: pytest.FixtureRequest) -> Fleet:
    """The workers of one engine kind, all running; every test of the module runs once per
    kind."""
    fleet: Fleet = request.getfixturevalue(f"{request.param}_fleet")
    fleet.ensure_running()
    return fleet


def gateway_config(
    fleet: Fleet, policy: str = "cache_aware", workers: Sequence[str] | None = None
) -> HomingConfig:
    """homing over `fleet` (over `workers` instead, when given: URLs of workers of its kind).
    Real SGLang's HealthCheck is a one-token generation inside the engine, so its probe
    timeout is SGLang's own (SGLANG_HEALTH_CHECK_TIMEOUT, 20 s)."""
    real = fleet.engine == "sglang"
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=2.0),
        engines=EngineSettings(
            workers=list(fleet.urls if workers is None else workers),
            startup_timeout_s=120.0,
            health_interval_s=1.0,
            health_timeout_s=20.0 if real else 2.0,
        ),
        router=RouterSettings(policy=policy),  # type: ignore[arg-type]
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway(fleet: Fleet) -> AsyncIterator[App]:
    """A running `App` on free ports over `fleet` (cache-aware routing)."""
    async with own_app(gateway_config(fleet)) as app:
        yield app


@pytest.fixture
def small_pool_worker(fleet: Fleet) -> Iterator[EngineWorker]:
    """One more worker of the module's engine kind, with a KV pool of SMALL_POOL_TOKENS, for a
    test that needs the engine to evict (filling the fleet's 65,536-token pool would take
    minutes of CPU prefill on real SGLang); stopped after the test."""
    small = Fleet(fleet.engine, kv_tokens=SMALL_POOL_TOKENS)
    try:
        small.start(1)
        yield small.workers[0]
    finally:
        small.close()


@pytest_asyncio.fixture(loop_scope="module")
async def small_pool_gateway(fleet: Fleet, small_pool_worker: EngineWorker) -> AsyncIterator[App]:
    """A running `App` (cache-aware routing) over `small_pool_worker` and the fleet's first
    worker, for one test."""
    config = gateway_config(fleet, workers=[small_pool_worker.url, fleet.urls[0]])
    async with own_app(config) as app:
        yield app
