"""A 429 for concurrent streams says when a slot will free: the time left on a stream lease
that a crashed instance left behind, and the configured guess while the holder is alive."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from helpers import own_app
from redis.asyncio import Redis
from redis_server import RedisServer

from homing.app import App
from homing.clock import ManualClock
from homing.config import GatewaySettings, HomingConfig, QuotaSettings, SimSettings, TenantSettings
from homing.gateway.auth import hash_key
from homing.gateway.quotas import Charge, RedisQuotaStore, ScopeLimits

pytestmark = pytest.mark.asyncio(loop_scope="module")

LEASE_S = 30.0
KEY = "sk-one-stream"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(redis_server: RedisServer) -> AsyncIterator[App]:
    """A gateway whose tenant `one` may hold one stream, quotas in the real redis-server."""
    tenant = TenantSettings.model_validate(
        {
            "name": "one",
            "keys": [{"id": "one-key", "sha256": hash_key(KEY)}],
            "quota": {"concurrent_streams": 1},
        }
    )
    config = HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        sim=SimSettings(workers=1, speedup=10.0),
        tenants=[tenant],
        quotas=QuotaSettings(
            backend="redis",
            redis_url=redis_server.url,
            key_prefix=f"leases-{uuid.uuid4().hex}",
            stream_lease_s=LEASE_S,
        ),
    )
    async with own_app(config, clock=ManualClock()) as running:
        yield running


async def _plant_lease(app: App, url: str, taken_s_ago: float) -> Charge:
    """Take the tenant's stream slot as another instance did `taken_s_ago` seconds ago and
    never renewed (it crashed), on the Redis server's own clock."""
    async with Redis.from_url(url) as redis:
        seconds, micros = await redis.time()
    clock = ManualClock(start=seconds + micros / 1e6 - taken_s_ago)
    store = RedisQuotaStore(
        url,
        key_prefix=app.config.quotas.key_prefix,
        window_ms=int(app.config.quotas.window_s * 1000),
        lease_ms=int(LEASE_S * 1000),
        timeout_s=2.0,
        clock=clock,
    )
    held = Charge(uuid.uuid4().hex, tokens=0, scopes=(ScopeLimits("t:one", streams=1),))
    try:
        assert await store.reserve(held) is None
    finally:
        await store.close()
    return held


async def _post(app: App) -> tuple[int, Any, str | None]:
    body = {"model": "llama-3.1-8b", "prompt": "hi", "max_tokens": 4}
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://127.0.0.1:{app.http_port}/v1/completions",
            json=body,
            headers={"Authorization": f"Bearer {KEY}"},
        ) as resp:
            return resp.status, await resp.json(), resp.headers.get("Retry-After")


async def _release(url: str, app: App, held: Charge) -> None:
    async with Redis.from_url(url) as redis:
        await redis.zrem(f"{app.config.quotas.key_prefix}:{{t:one}}:s", held.charge_id)


def _streams_429(retry_s: int) -> dict[str, Any]:
    return {
        "error": {
            "message": "Rate limit reached for concurrent streams on tenant one: Limit 1, "
            f"Used 1, Requested 1. Please try again in {retry_s}s.",
            "type": "streams",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }


async def test_slot_of_a_crashed_instance_gives_the_time_left_on_its_lease(
    app: App, redis_server: RedisServer
) -> None:
    """A slot unrenewed for 20 s of a 30 s lease: Retry-After is the 10 s it has left."""
    held = await _plant_lease(app, redis_server.url, taken_s_ago=20.0)
    try:
        status, body, retry_after = await _post(app)
    finally:
        await _release(redis_server.url, app, held)
    assert (status, body, retry_after) == (429, _streams_429(10), "10")


async def test_slot_of_a_live_instance_gives_the_configured_retry_after(
    app: App, redis_server: RedisServer
) -> None:
    """A slot renewed on time (a stream still running somewhere) frees when that stream
    ends, which nobody knows: Retry-After is `quotas.streams_retry_after_s`."""
    held = await _plant_lease(app, redis_server.url, taken_s_ago=1.0)
    try:
        status, body, retry_after = await _post(app)
    finally:
        await _release(redis_server.url, app, held)
    assert (status, body, retry_after) == (429, _streams_429(1), "1")
    status, _, _ = await _post(app)
    assert status == 200
    assert app.pool is not None and len(app.pool.healthy_workers()) == 1
