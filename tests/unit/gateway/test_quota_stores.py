"""The quota math on a ManualClock, run as one contract against both backends: the pure
in-process store and the Lua scripts on a real redis-server, which must decide identically."""

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
    RedisQuotaStore,
    ScopeLimits,
    SlidingWindow,
)

WINDOW_MS = 60_000
LEASE_MS = 30_000


class Harness:
    """A store and the ManualClock it reads."""

    def __init__(self, store: QuotaStore, clock: ManualClock) -> None:
        self.store = store
        self.clock = clock

    def advance_ms(self, ms: int) -> None:
        self.clock.advance(ms / 1000)


@pytest_asyncio.fixture(params=["memory", "redis"])
async def harness(
    request: pytest.FixtureRequest, redis_server: RedisServer
) -> AsyncIterator[Harness]:
    """The same scenario against the in-process store and the Redis store."""
    clock = ManualClock(start=1_000.0)
    store = quota_store(
        request.param, redis_server.url, clock, window_ms=WINDOW_MS, lease_ms=LEASE_MS
    )
    yield Harness(store, clock)
    await store.close()


def charge(*scopes: ScopeLimits, tokens: int = 1) -> Charge:
    return Charge(charge_id=uuid.uuid4().hex, tokens=tokens, scopes=scopes)


async def test_requests_limit_admits_exactly_the_limit_then_names_the_wait(
    harness: Harness,
) -> None:
    """With 3 requests per window, 3 pass and the 4th is told when the oldest expires."""
    tenant = ScopeLimits("t:a", requests=3)
    for _ in range(3):
        assert await harness.store.reserve(charge(tenant)) is None
        harness.advance_ms(1_000)
    denial = await harness.store.reserve(charge(tenant))
    assert denial == Denial("t:a", "requests", 3, 3, 1, WINDOW_MS - 3_000)


async def test_window_slides_instead_of_resetting_at_a_boundary(harness: Harness) -> None:
    """An entry frees exactly one window after it was admitted, not at a fixed boundary."""
    tenant = ScopeLimits("t:a", requests=2)
    assert await harness.store.reserve(charge(tenant)) is None  # t=0
    harness.advance_ms(30_000)
    assert await harness.store.reserve(charge(tenant)) is None  # t=30 s
    harness.advance_ms(29_999)
    assert (await harness.store.reserve(charge(tenant))) == Denial("t:a", "requests", 2, 2, 1, 1)
    harness.advance_ms(1)  # t=60 s: the first entry leaves the window
    assert await harness.store.reserve(charge(tenant)) is None
    denial = await harness.store.reserve(charge(tenant))
    assert denial is not None and denial.retry_after_ms == 30_000


async def test_tokens_wait_until_enough_oldest_entries_expire(harness: Harness) -> None:
    """A token request waits for the oldest entries whose costs cover the shortfall."""
    tenant = ScopeLimits("t:a", tokens=100)
    assert await harness.store.reserve(charge(tenant, tokens=30)) is None  # t=0
    harness.advance_ms(10_000)
    assert await harness.store.reserve(charge(tenant, tokens=30)) is None  # t=10 s
    harness.advance_ms(10_000)
    assert await harness.store.reserve(charge(tenant, tokens=30)) is None  # t=20 s
    # used 90; 50 more needs 40 freed: the first two entries (30 + 30), the second at 10 s.
    denial = await harness.store.reserve(charge(tenant, tokens=50))
    assert denial == Denial("t:a", "tokens", 100, 90, 50, 10_000 + WINDOW_MS - 20_000)


async def test_reconciliation_refunds_unused_tokens(harness: Harness) -> None:
    """Settling a 60-token reservation at 20 tokens makes room for 80 more."""
    tenant = ScopeLimits("t:a", tokens=100)
    first = charge(tenant, tokens=60)
    assert await harness.store.reserve(first) is None
    assert await harness.store.reserve(charge(tenant, tokens=60)) is not None
    await harness.store.settle(first, 20)
    assert await harness.store.reserve(charge(tenant, tokens=80)) is None
    denial = await harness.store.reserve(charge(tenant, tokens=1))
    assert denial is not None and denial.used == 100


async def test_reconciliation_after_the_window_changes_nothing(harness: Harness) -> None:
    """An entry that already left the window is not charged again when it settles."""
    tenant = ScopeLimits("t:a", tokens=100)
    first = charge(tenant, tokens=100)
    assert await harness.store.reserve(first) is None
    harness.advance_ms(WINDOW_MS)
    await harness.store.settle(first, 100)
    assert await harness.store.reserve(charge(tenant, tokens=100)) is None


async def test_request_larger_than_the_token_limit_can_never_pass(harness: Harness) -> None:
    """A cost above the limit is refused with no retry time, even on an empty window."""
    denial = await harness.store.reserve(charge(ScopeLimits("t:a", tokens=100), tokens=101))
    assert denial == Denial("t:a", "tokens", 100, 0, 101, None)


async def test_refusal_by_one_scope_charges_no_scope(harness: Harness) -> None:
    """A key-scope refusal leaves the tenant's counters untouched (all or nothing)."""
    tenant = ScopeLimits("t:a", requests=2, tokens=1_000)
    key = ScopeLimits("k:a1", requests=1)
    assert await harness.store.reserve(charge(tenant, key, tokens=10)) is None
    denial = await harness.store.reserve(charge(tenant, key, tokens=10))
    assert denial is not None and denial.scope == "k:a1"
    other_key = ScopeLimits("k:a2", requests=5)
    assert await harness.store.reserve(charge(tenant, other_key, tokens=10)) is None
    denial = await harness.store.reserve(charge(tenant, other_key, tokens=10))
    assert denial == Denial("t:a", "requests", 2, 2, 1, WINDOW_MS)


async def test_longest_wait_is_reported_when_several_limits_are_hit(harness: Harness) -> None:
    """With both the request and the token limit hit, the binding one (longer wait) wins."""
    tenant = ScopeLimits("t:a", requests=2, tokens=100)
    assert await harness.store.reserve(charge(tenant, tokens=90)) is None  # t=0
    harness.advance_ms(5_000)
    assert await harness.store.reserve(charge(tenant, tokens=5)) is None  # t=5 s
    denial = await harness.store.reserve(charge(tenant, tokens=10))
    # requests wait for the entry at t=0 (55 s), tokens need 5 freed: also t=0 (55 s);
    # a tie keeps the first limit checked (requests).
    assert denial == Denial("t:a", "requests", 2, 2, 1, 55_000)
    harness.advance_ms(WINDOW_MS - 5_000)  # t=60 s: the first entry is gone
    assert await harness.store.reserve(charge(tenant, tokens=90)) is None
    denial = await harness.store.reserve(charge(tenant, tokens=10))
    assert denial is not None and denial.kind == "requests"


async def test_stream_slot_is_released_exactly_once(harness: Harness) -> None:
    """A settled request frees its slot; settling it again frees nothing more."""
    tenant = ScopeLimits("t:a", streams=1)
    first = charge(tenant)
    assert await harness.store.reserve(first) is None
    assert await harness.store.reserve(charge(tenant)) == Denial("t:a", "streams", 1, 1, 1, -1)
    assert await harness.store.settle(first, 0) == 1
    assert await harness.store.settle(first, 0) == 0
    second = charge(tenant)
    assert await harness.store.reserve(second) is None
    assert await harness.store.settle(first, 0) == 0  # a late repeat cannot free `second`
    assert await harness.store.reserve(charge(tenant)) is not None


async def test_unrenewed_slot_expires_with_its_lease(harness: Harness) -> None:
    """A slot whose holder died (no renewal, no release) frees itself after the lease."""
    tenant = ScopeLimits("t:a", streams=1)
    assert await harness.store.reserve(charge(tenant)) is None
    harness.advance_ms(LEASE_MS - 1)
    assert await harness.store.reserve(charge(tenant)) is not None
    harness.advance_ms(1)
    assert await harness.store.reserve(charge(tenant)) is None


async def test_full_streams_name_the_wait_only_for_a_slot_nobody_renews(
    harness: Harness,
) -> None:
    """With every slot taken, the wait is unknown (-1) while the soonest lease is renewed on
    time, and is the ms until it runs out once it has gone unrenewed past half a lease."""
    tenant = ScopeLimits("t:a", streams=2)
    held = [charge(tenant), charge(tenant)]
    for slot in held:
        assert await harness.store.reserve(slot) is None
    harness.advance_ms(LEASE_MS // 3)
    assert await harness.store.reserve(charge(tenant)) == Denial("t:a", "streams", 2, 2, 1, -1)
    await harness.store.renew(held[1:])  # held[0]'s instance crashed: no more renewals
    harness.advance_ms(LEASE_MS // 3)
    left = LEASE_MS - 2 * (LEASE_MS // 3)
    assert await harness.store.reserve(charge(tenant)) == Denial("t:a", "streams", 2, 2, 1, left)
    harness.advance_ms(left)
    assert await harness.store.reserve(charge(tenant)) is None


async def test_renewed_slot_outlives_its_first_lease(harness: Harness) -> None:
    """Renewing a running request's slot keeps it taken past the original lease."""
    tenant = ScopeLimits("t:a", streams=1)
    running = charge(tenant)
    assert await harness.store.reserve(running) is None
    harness.advance_ms(LEASE_MS - 1_000)
    await harness.store.renew([running])
    harness.advance_ms(LEASE_MS - 1_000)
    assert await harness.store.reserve(charge(tenant)) is not None
    assert await harness.store.settle(running, 0) == 1
    assert await harness.store.reserve(charge(tenant)) is None


async def test_scopes_are_independent(harness: Harness) -> None:
    """One tenant's exhausted limit does not touch another tenant's."""
    assert await harness.store.reserve(charge(ScopeLimits("t:a", requests=1))) is None
    assert await harness.store.reserve(charge(ScopeLimits("t:a", requests=1))) is not None
    assert await harness.store.reserve(charge(ScopeLimits("t:b", requests=1))) is None


def test_sliding_window_used_is_the_sum_of_live_costs() -> None:
    """`used` drops by an entry's (reconciled) cost exactly when that entry expires."""
    window = SlidingWindow(window_ms=100)
    window.add("a", 10, now_ms=0)
    window.add("b", 5, now_ms=50)
    window.adjust("a", 4)
    assert window.used == 9
    window.expire(99)
    assert window.used == 9
    window.expire(100)
    assert window.used == 5
    window.adjust("a", 50)  # expired: no effect
    assert window.used == 5


async def test_redis_keys_expire_with_the_window(redis_server: RedisServer) -> None:
    """Every key a reservation writes carries a TTL, so idle tenants leave nothing behind."""
    prefix = f"test-{uuid.uuid4().hex}"
    store = RedisQuotaStore(
        redis_server.url, key_prefix=prefix, window_ms=WINDOW_MS, lease_ms=LEASE_MS, timeout_s=2
    )
    try:
        scope = ScopeLimits("t:a", requests=5, tokens=100, streams=2)
        assert await store.reserve(charge(scope, tokens=10)) is None
        keys = sorted(await store.redis.keys(f"{prefix}:*"))
        assert keys == sorted(store.key("t:a", p) for p in "rtcs")
        for key in keys:
            ttl = await store.redis.pttl(key)
            assert 0 < ttl <= WINDOW_MS
    finally:
        await store.redis.delete(*await store.redis.keys(f"{prefix}:*"))
        await store.close()


async def test_replayed_reserve_charges_once(harness: Harness) -> None:
    """A reserve replayed with the same charge id (a client retry after a lost reply) is
    admitted without a second request, token or stream charge."""
    tenant = ScopeLimits("t:a", requests=2, tokens=100, streams=2)
    first = charge(tenant, tokens=60)
    assert await harness.store.reserve(first) is None
    assert await harness.store.reserve(first) is None  # the replay
    # Charged once: 60 tokens, 1 request, 1 slot; 40 more tokens and a second stream fit.
    assert await harness.store.reserve(charge(tenant, tokens=40)) is None
    denial = await harness.store.reserve(charge(tenant, tokens=1))
    assert denial is not None and (denial.kind, denial.used) == ("requests", 2)
    assert await harness.store.settle(first, 0) == 1
    assert await harness.store.settle(first, 0) == 0


async def test_refund_takes_the_request_tokens_and_slot_back(harness: Harness) -> None:
    """A refunded charge leaves no request entry, no tokens and no stream slot behind."""
    tenant = ScopeLimits("t:a", requests=1, tokens=100, streams=1)
    refunded = charge(tenant, tokens=100)
    assert await harness.store.reserve(refunded) is None
    assert await harness.store.settle(refunded, 0, refund=True) == 1
    assert await harness.store.reserve(charge(tenant, tokens=100)) is None
    assert await harness.store.settle(refunded, 0, refund=True) == 0  # a repeat does nothing
    assert await harness.store.reserve(charge(tenant, tokens=1)) is not None
