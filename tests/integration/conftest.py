"""Shared fixtures: a whole homing process (gateway + router + pool) in this test's event loop,
over two simulated SGLang workers running as real child processes on loopback; and the
Kubernetes API server fixtures of `k8s_api` (registered here, not in each test module, so
that the session starts one API server for all the modules that use it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio
from helpers import own_app
from k8s_api import api, kube_api

from homing.app import App
from homing.config import (
    BreakerSettings,
    EngineSettings,
    GatewaySettings,
    HomingConfig,
    OutlierSettings,
    RouterSettings,
    SimSettings,
)

__all__ = ["api", "kube_api"]  # the fixtures of `k8s_api`, for every integration module


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway() -> AsyncIterator[App]:
    """A running `App` on free ports (HTTP and gRPC) over 2 simulated workers at 10x speed."""
    config = HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=2.0),
        sim=SimSettings(workers=2, speedup=10.0),
    )
    async with own_app(config) as app:
        yield app


def _retry_config(router: RouterSettings) -> HomingConfig:
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        engines=EngineSettings(
            health_interval_s=0.2,
            unhealthy_threshold=10_000,
            breaker=BreakerSettings(enabled=False),
            outliers=OutlierSettings(enabled=False),
        ),
        router=router,
        sim=SimSettings(workers=2, speedup=10.0),
    )


@pytest.fixture(scope="session")
def retry_config() -> Callable[[RouterSettings], HomingConfig]:
    """Builds the config of the retry tests from their `RouterSettings`: 2 simulated workers
    at 10x speed, free ports, and no health flip, breaker or outlier ejection, so that
    request failures never take a refusing worker out of rotation (the tests are about what
    the gateway does with each failure)."""
    return _retry_config
