"""A client that stops reading its stream costs the gateway bounded memory: past a fixed
number of unsent events the request stops reading its engine streams (backpressure)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from helpers import eventually, own_app, post_without_reading

from homing.app import App
from homing.config import GatewaySettings, HomingConfig, SimSettings
from homing.gateway.generation import MAX_PENDING_EVENTS

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app() -> AsyncIterator[App]:
    """A gateway over one simulated worker at 10x speed."""
    config = HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        sim=SimSettings(workers=1, speedup=10.0),
    )
    async with own_app(config) as running:
        yield running


async def test_events_of_a_client_that_stops_reading_stay_bounded(app: App) -> None:
    """With 16 choices streaming to a client that reads nothing, the request's unsent events
    reach the bound and stay there while its engine streams go on being produced."""
    assert app.service is not None and app.http_port is not None
    body = json.dumps(
        {"model": "llama-3.1-8b", "prompt": "go", "stream": True, "n": 16,
         "max_tokens": 100_000, "ignore_eos": True}
    ).encode()  # fmt: skip
    writer = await post_without_reading(app.http_port, "/v1/completions", body)
    try:

        def pending() -> int:
            return max((len(g._events) for g in app.service._open), default=0)

        assert await eventually(lambda: pending() >= MAX_PENDING_EVENTS, within_s=30.0)
        highest = 0
        for _ in range(100):  # one second of engine time at the bound
            highest = max(highest, pending())
            await asyncio.sleep(0.01)
        # after its check each choice adds one engine message's events (text, tail, finish)
        assert highest <= MAX_PENDING_EVENTS + 3 * 16
    finally:
        writer.close()
    assert await eventually(lambda: app.service.in_flight == 0, within_s=5.0)
