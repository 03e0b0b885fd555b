"""`QuotaStore.usage`, the admin API's read of live quota use, as one contract against both
backends (the in-process store and the Lua script on a real redis-server): it counts what
the window and the leases hold now, and reading it changes no decision."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from quota_backends import quota_store
from redis_server import RedisServer

from homing.clock import ManualClock
from homing.gateway.quotas import (
    Charge,
    Denial,
    QuotaStore,
    ScopeLimits,
    ScopeUsage,
)

WINDOW_MS = 60_000
LEASE_MS = 30_000


@pytest_asyncio.fixture(params=["memory", "redis"])
async def store_and_clock(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> AsyncIterator[tuple[QuotaStore, ManualClock]]:
    """The in-process store and the Redis store, each on its own ManualClock."""
    clock = ManualClock(start=1_000.0)
    store = quota_store(
        request.param, redis_server.url, clock, window_ms=WINDOW_MS, lease_ms=LEASE_MS
    )
    yield store, clock
    await store.close()


def charge(*scopes: ScopeLimits, tokens: int = 1) -> Charge:
    return Charge(charge_id=uuid.uuid4().hex, tokens=tokens, scopes=scopes)


async def test_usage_of_an_unknown_scope_is_zero(
    store_and_clock: tuple[QuotaStore, ManualClock],
) -> None:
    """A scope nothing was charged under holds nothing."""
    store, _ = store_and_clock
    assert await store.usage("t:nobody") == ScopeUsage(0, 0, 0)


async def test_usage_counts_requests_tokens_and_streams_in_the_window(
    store_and_clock: tuple[QuotaStore, ManualClock],
) -> None:
    """Two admitted requests of 30 and 50 tokens hold 2 requests, 80 tokens, 2 slots; a
    settle reconciles the tokens and frees its slot; the window's end frees the rest."""
    store, clock = store_and_clock
    tenant = ScopeLimits("t:a", requests=10, tokens=1_000, streams=5)
    first, second = charge(tenant, tokens=30), charge(tenant, tokens=50)
    assert await store.reserve(first) is None
    clock.advance(10.0)
    assert await store.reserve(second) is None
    assert await store.usage("t:a") == ScopeUsage(requests=2, tokens=80, streams=2)
    await store.settle(first, 12)
    assert await store.usage("t:a") == ScopeUsage(requests=2, tokens=62, streams=1)
    clock.advance(50.0)  # t = 60 s: the first entry has left the window; the slot expired too
    assert await store.usage("t:a") == ScopeUsage(requests=1, tokens=50, streams=0)
    clock.advance(10.0)
    assert await store.usage("t:a") == ScopeUsage(0, 0, 0)


async def test_usage_counts_only_the_kinds_a_scope_limits(
    store_and_clock: tuple[QuotaStore, ManualClock],
) -> None:
    """A scope with only a token limit counts tokens, not requests or streams."""
    store, _ = store_and_clock
    assert await store.reserve(charge(ScopeLimits("t:a", tokens=100), tokens=40)) is None
    assert await store.usage("t:a") == ScopeUsage(requests=0, tokens=40, streams=0)


async def test_reading_usage_changes_no_decision(
    store_and_clock: tuple[QuotaStore, ManualClock],
) -> None:
    """Usage read between charges leaves the next refusal exactly as it would be."""
    store, clock = store_and_clock
    tenant = ScopeLimits("t:a", requests=2)
    assert await store.reserve(charge(tenant)) is None
    clock.advance(1.0)
    assert await store.reserve(charge(tenant)) is None
    for _ in range(3):
        assert await store.usage("t:a") == ScopeUsage(requests=2)
    denial = await store.reserve(charge(tenant))
    assert denial == Denial("t:a", "requests", 2, 2, 1, WINDOW_MS - 1_000)
