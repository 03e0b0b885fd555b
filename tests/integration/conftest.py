"""Shared fixtures: a whole homing process (gateway + router + pool) in this test's event loop,
over two simulated SGLang workers running as real child processes on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from homing.app import App
from homing.config import GatewaySettings, HomingConfig, SimSettings


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateway() -> AsyncIterator[App]:
    """A running `App` on free ports (HTTP and gRPC) over 2 simulated workers at 10x speed."""
    config = HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=2.0),
        sim=SimSettings(workers=2, speedup=10.0),
    )
    async with App(config) as app:
        yield app
