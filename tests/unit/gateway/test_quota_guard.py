"""The quota shell: 429 bodies in OpenAI's words with an integer Retry-After, 503 when the
store is down (fail closed) or admission uncounted (fail open), and settle exactly once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis_server import RedisServer, free_port

from homing.clock import ManualClock
from homing.config import QuotaLimits, QuotaSettings
from homing.gateway.auth import Principal
from homing.gateway.errors import APIError
from homing.gateway.metrics import GatewayMetrics
from homing.gateway.quotas import Denial, InProcessQuotaStore, QuotaGuard, build_store
from homing.gateway.quotas.guard import rate_limit_error
from homing.gateway.quotas.types import QuotaStoreError


def principal(quota: QuotaLimits, key_quota: QuotaLimits | None = None) -> Principal:
    return Principal(
        tenant="acme",
        key_id="acme-prod",
        priority=0,
        tenant_models=None,
        key_models=None,
        tenant_quota=quota,
        key_quota=key_quota,
    )


def _429(message: str, type_: str) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": type_,
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }


def test_requests_429_names_the_quota_and_rounds_the_wait_up() -> None:
    """41.2 s until the oldest request leaves the window is `Retry-After: 42`."""
    err = rate_limit_error(
        Denial("t:acme", "requests", 10, 10, 1, 41_200),
        principal(QuotaLimits()),
        window_s=60,
        streams_retry_after_s=1,
    )
    assert (err.status, err.retry_after_s) == (429, 42)
    assert err.body() == _429(
        "Rate limit reached for requests per min (RPM) on tenant acme: Limit 10, Used 10, "
        "Requested 1. Please try again in 42s.",
        "requests",
    )


def test_tokens_429_on_a_key_scope_names_the_key() -> None:
    """A key's own token limit is reported against the key id, with at least 1 s to wait."""
    err = rate_limit_error(
        Denial("k:acme-prod", "tokens", 500, 480, 50, 3),
        principal(QuotaLimits()),
        window_s=60,
        streams_retry_after_s=1,
    )
    assert err.retry_after_s == 1
    assert err.body() == _429(
        "Rate limit reached for tokens per min (TPM) on API key acme-prod: Limit 500, Used 480, "
        "Requested 50. Please try again in 1s.",
        "tokens",
    )


def test_streams_429_uses_the_configured_hint() -> None:
    """When only the stream limit is hit the wait is unknown: `streams_retry_after_s`."""
    err = rate_limit_error(
        Denial("t:acme", "streams", 2, 2, 1, -1),
        principal(QuotaLimits()),
        window_s=60,
        streams_retry_after_s=3,
    )
    assert err.retry_after_s == 3
    assert err.body()["error"]["message"] == (
        "Rate limit reached for concurrent streams on tenant acme: Limit 2, Used 2, "
        "Requested 1. Please try again in 3s."
    )


def test_request_larger_than_the_limit_has_no_retry_after() -> None:
    """Waiting cannot help a request above the token limit: 429 without Retry-After."""
    err = rate_limit_error(
        Denial("t:acme", "tokens", 100, 0, 150, None),
        principal(QuotaLimits()),
        window_s=60,
        streams_retry_after_s=1,
    )
    assert err.retry_after_s is None
    assert err.body() == _429(
        "Request too large for tokens per min (TPM) on tenant acme: Limit 100, Requested 150. "
        "The input or output tokens must be reduced in order to run successfully.",
        "tokens",
    )


def test_short_test_windows_say_their_length() -> None:
    """A window other than 60 s is named in seconds rather than mislabelled 'min'."""
    err = rate_limit_error(
        Denial("t:acme", "requests", 1, 1, 1, 500),
        principal(QuotaLimits()),
        window_s=2,
        streams_retry_after_s=1,
    )
    assert err.body()["error"]["message"].startswith("Rate limit reached for requests per 2 s ")


def _guard(settings: QuotaSettings, clock: ManualClock | None = None) -> QuotaGuard:
    return QuotaGuard(build_store(settings, clock), settings=settings, metrics=GatewayMetrics())


async def test_store_down_fails_closed_with_503_and_counts_it() -> None:
    """Redis not listening: 503 `quota_store_unavailable` with Retry-After 1, and a metric."""
    settings = QuotaSettings(
        backend="redis", redis_url=f"redis://127.0.0.1:{free_port()}/0", store_timeout_s=0.5
    )
    guard = _guard(settings)
    try:
        with pytest.raises(APIError) as caught:
            await guard.reserve(
                principal(QuotaLimits(requests_per_minute=5)), tokens=10, request_id="r1"
            )
        assert caught.value.status == 503
        assert caught.value.retry_after_s == 1
        assert caught.value.body() == {
            "error": {
                "message": "The quota store is unavailable, so the request cannot be admitted; "
                "retry shortly.",
                "type": "service_unavailable_error",
                "param": None,
                "code": "quota_store_unavailable",
            }
        }
        assert (
            guard.metrics.value(
                "homing_quota_store_errors_total", operation="reserve", action="fail_closed"
            )
            == 1
        )
    finally:
        await guard.stop()


async def test_store_down_fails_open_when_configured_and_counts_it() -> None:
    """`on_store_error = "fail_open"` admits uncounted (no ticket) and still counts it."""
    settings = QuotaSettings(
        backend="redis",
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
        on_store_error="fail_open",
        store_timeout_s=0.5,
    )
    guard = _guard(settings)
    try:
        ticket = await guard.reserve(
            principal(QuotaLimits(requests_per_minute=5)), tokens=10, request_id="r1"
        )
        assert ticket is None
        assert (
            guard.metrics.value(
                "homing_quota_store_errors_total", operation="reserve", action="fail_open"
            )
            == 1
        )
    finally:
        await guard.stop()


async def test_unlimited_or_anonymous_callers_never_touch_the_store() -> None:
    """No principal (auth off) or no limits: no ticket, even with the store unreachable."""
    settings = QuotaSettings(backend="redis", redis_url=f"redis://127.0.0.1:{free_port()}/0")
    guard = _guard(settings)
    try:
        assert await guard.reserve(None, tokens=10, request_id="r") is None
        assert await guard.reserve(principal(QuotaLimits()), tokens=10, request_id="r") is None
    finally:
        await guard.stop()


async def test_settle_is_exactly_once_even_when_the_caller_is_cancelled(
    redis_server: RedisServer,
) -> None:
    """A settle whose caller is cancelled still releases the slot, and a repeat is a no-op."""
    settings = QuotaSettings(backend="redis", redis_url=redis_server.url, key_prefix="guard-once")
    guard = _guard(settings)
    who = principal(QuotaLimits(concurrent_streams=1))
    try:
        ticket = await guard.reserve(who, tokens=1, request_id="a")
        assert ticket is not None and guard.live == 1
        settling = asyncio.get_running_loop().create_task(guard.settle(ticket, 1))
        await asyncio.sleep(0)
        settling.cancel()
        with pytest.raises(asyncio.CancelledError):
            await settling
        assert guard.live == 0
        await guard.stop()  # waits for the shielded settle to finish
        guard = _guard(settings)
        second = await guard.reserve(who, tokens=1, request_id="b")
        assert second is not None
        await guard.settle(ticket, 1)  # the first ticket again: nothing happens
        with pytest.raises(APIError) as caught:
            await guard.reserve(who, tokens=1, request_id="c")
        assert caught.value.status == 429
        await guard.settle(second, 1)
    finally:
        await guard.stop()


async def test_reserve_charges_prompt_plus_max_tokens_and_settle_reconciles() -> None:
    """The window holds the reservation until settle replaces it with the engine's count."""
    clock = ManualClock()
    settings = QuotaSettings()
    guard = _guard(settings, clock)
    store = guard.store
    assert isinstance(store, InProcessQuotaStore)
    ticket = await guard.reserve(
        principal(QuotaLimits(tokens_per_minute=1_000)), tokens=420, request_id="r"
    )
    assert store._tokens["t:acme"].used == 420
    await guard.settle(ticket, 137)
    assert store._tokens["t:acme"].used == 137
    await guard.stop()


class _LostReplyStore:
    """A real store whose reserve runs and then fails (`raise_error`) or hangs, as when a
    slow Redis ran the script but the reply never arrived."""

    def __init__(self, inner: Any, *, raise_error: bool) -> None:
        self.inner = inner
        self.raise_error = raise_error
        self.ran = asyncio.Event()

    async def reserve(self, charge: Any) -> Any:
        assert await self.inner.reserve(charge) is None
        self.ran.set()
        if self.raise_error:
            raise QuotaStoreError("TimeoutError: Timeout reading from socket")
        await asyncio.Event().wait()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.parametrize("failure", ["store_error", "cancelled"])
async def test_failed_or_cancelled_reserve_leaves_no_slot_or_tokens(
    redis_server: RedisServer, failure: str
) -> None:
    """A reserve that charged in Redis but failed or was cancelled before its reply is
    refunded in the background: the tenant's request, tokens and slot are all free again."""
    settings = QuotaSettings(
        backend="redis", redis_url=redis_server.url, key_prefix=f"guard-lost-{failure}"
    )
    inner = build_store(settings)
    lossy = _LostReplyStore(inner, raise_error=failure == "store_error")
    guard = QuotaGuard(lossy, settings=settings, metrics=GatewayMetrics())  # type: ignore[arg-type]
    who = principal(QuotaLimits(requests_per_minute=1, tokens_per_minute=100, concurrent_streams=1))
    if failure == "store_error":
        with pytest.raises(APIError) as caught:
            await guard.reserve(who, tokens=100, request_id="lost")
        assert caught.value.status == 503
    else:
        task = asyncio.get_running_loop().create_task(
            guard.reserve(who, tokens=100, request_id="lost")
        )
        await lossy.ran.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await asyncio.wait(list(guard._pending), timeout=5)
    lossy.raise_error = False
    plain = QuotaGuard(inner, settings=settings, metrics=GatewayMetrics())
    ticket = await plain.reserve(who, tokens=100, request_id="next")
    assert ticket is not None
    await plain.settle(ticket, 1)
    await plain.stop()
