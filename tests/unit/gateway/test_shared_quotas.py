"""One process's in-process quota store served to the box's other gateway processes: a real
`QuotaServer` on a Unix socket in tmp_path, called by a real `RemoteQuotaStore`, answers
exactly as the store it serves."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from homing.clock import ManualClock, SystemClock
from homing.gateway.quotas import (
    Charge,
    Denial,
    InProcessQuotaStore,
    QuotaStoreError,
    ScopeLimits,
    ScopeUsage,
)
from homing.gateway.quotas.shared import QuotaServer, RemoteQuotaStore

WINDOW_MS = 60_000
LEASE_MS = 30_000


@dataclass
class Shared:
    """The served store, its clock, the server and a client of it, and a twin store on
    the same clock given the same calls directly (what the store itself answers)."""

    store: InProcessQuotaStore
    twin: InProcessQuotaStore
    clock: ManualClock
    server: QuotaServer
    remote: RemoteQuotaStore


@pytest_asyncio.fixture
async def shared(tmp_path: Path) -> AsyncIterator[Shared]:
    clock = ManualClock(start=1_000.0)
    store = InProcessQuotaStore(clock=clock, window_ms=WINDOW_MS, lease_ms=LEASE_MS)
    twin = InProcessQuotaStore(clock=clock, window_ms=WINDOW_MS, lease_ms=LEASE_MS)
    server = QuotaServer(store, str(tmp_path / "quotas.sock"))
    await server.start()
    remote = RemoteQuotaStore(server.path, timeout_s=5.0)
    yield Shared(store, twin, clock, server, remote)
    await remote.close()
    await server.stop()


def charge(charge_id: str, *scopes: ScopeLimits, tokens: int = 1) -> Charge:
    return Charge(charge_id=charge_id, tokens=tokens, scopes=scopes)


async def test_reserve_admits_up_to_the_limit_then_gives_the_stores_denial(
    shared: Shared,
) -> None:
    tenant = ScopeLimits("t:a", requests=2)
    for i in range(2):
        c = charge(f"c{i}", tenant)
        assert await shared.remote.reserve(c) is None
        assert await shared.twin.reserve(c) is None
    shared.clock.advance(10.0)
    third = charge("c2", tenant)
    denial = await shared.remote.reserve(third)
    assert denial == Denial("t:a", "requests", 2, 2, 1, 50_000)
    assert denial == await shared.twin.reserve(third)


async def test_a_denial_that_waiting_cannot_help_crosses_with_no_retry_time(
    shared: Shared,
) -> None:
    too_big = charge("big", ScopeLimits("t:a", tokens=100), tokens=101)
    denial = await shared.remote.reserve(too_big)
    assert denial == Denial("t:a", "tokens", 100, 0, 101, None)
    assert denial == await shared.twin.reserve(too_big)


async def test_a_repeated_reserve_of_one_charge_is_admitted_once(shared: Shared) -> None:
    tenant = ScopeLimits("t:a", requests=1)
    c = charge("c0", tenant)
    assert await shared.remote.reserve(c) is None
    assert await shared.remote.reserve(c) is None  # a retried call: not charged twice
    assert await shared.store.usage("t:a") == ScopeUsage(requests=1)


async def test_settle_releases_the_stream_slot_and_says_how_many(shared: Shared) -> None:
    tenant = ScopeLimits("t:a", streams=1)
    first, second = charge("c0", tenant), charge("c1", tenant)
    assert await shared.remote.reserve(first) is None
    assert await shared.remote.reserve(second) == Denial("t:a", "streams", 1, 1, 1, -1)
    assert await shared.remote.settle(first, 7) == 1
    assert await shared.remote.settle(first, 7) == 0  # already released
    assert await shared.remote.reserve(second) is None


async def test_settle_replaces_the_reserved_tokens_by_the_engines_count(shared: Shared) -> None:
    tenant = ScopeLimits("t:a", requests=5, tokens=1000)
    c = charge("c0", tenant, tokens=500)
    assert await shared.remote.reserve(c) is None
    assert await shared.remote.settle(c, 120) == 0
    assert await shared.remote.usage("t:a") == ScopeUsage(requests=1, tokens=120)


async def test_a_refund_takes_the_request_out_as_if_never_admitted(shared: Shared) -> None:
    tenant = ScopeLimits("t:a", requests=5, tokens=1000, streams=2)
    c = charge("c0", tenant, tokens=500)
    assert await shared.remote.reserve(c) is None
    assert await shared.remote.settle(c, 0, refund=True) == 1
    assert await shared.remote.usage("t:a") == ScopeUsage(requests=0, tokens=0, streams=0)


async def test_renew_keeps_a_stream_slot_past_its_first_lease(shared: Shared) -> None:
    tenant = ScopeLimits("t:a", streams=5)
    kept, dropped = charge("kept", tenant), charge("dropped", tenant)
    assert await shared.remote.reserve(kept) is None
    assert await shared.remote.reserve(dropped) is None
    shared.clock.advance(20.0)
    await shared.remote.renew([kept])
    shared.clock.advance(20.0)  # 40 s after the take, 20 s after the renewal
    assert await shared.remote.usage("t:a") == ScopeUsage(streams=1)
    assert await shared.remote.settle(kept, 1) == 1
    assert await shared.remote.settle(dropped, 1) == 0


async def test_usage_is_the_served_stores(shared: Shared) -> None:
    tenant = ScopeLimits("t:a", requests=10, tokens=1000, streams=3)
    key = ScopeLimits("k:a-prod", requests=4)
    for i, tokens in enumerate((100, 250)):
        assert await shared.remote.reserve(charge(f"c{i}", tenant, key, tokens=tokens)) is None
    for scope in ("t:a", "k:a-prod", "t:nobody"):
        assert await shared.remote.usage(scope) == await shared.store.usage(scope)
    assert await shared.remote.usage("t:a") == ScopeUsage(requests=2, tokens=350, streams=2)
    assert await shared.remote.usage("k:a-prod") == ScopeUsage(requests=2)
    assert await shared.remote.usage("t:nobody") == ScopeUsage()


async def test_ping_answers(shared: Shared) -> None:
    assert await shared.remote.ping() is None


async def test_the_socket_is_for_its_owner_only(shared: Shared) -> None:
    assert stat.S_ISSOCK(os.stat(shared.server.path).st_mode)
    assert stat.S_IMODE(os.stat(shared.server.path).st_mode) == 0o600


async def test_the_umask_is_restored_after_the_socket_is_made(tmp_path: Path) -> None:
    before = os.umask(0o022)
    os.umask(before)
    server = QuotaServer(
        InProcessQuotaStore(clock=ManualClock(), window_ms=WINDOW_MS, lease_ms=LEASE_MS),
        str(tmp_path / "q.sock"),
    )
    await server.start()
    try:
        now = os.umask(before)
        assert now == before
    finally:
        await server.stop()


async def test_a_stale_socket_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "quotas.sock"
    path.write_text("left by an earlier run")
    store = InProcessQuotaStore(clock=SystemClock(), window_ms=WINDOW_MS, lease_ms=LEASE_MS)
    server = QuotaServer(store, str(path))
    await server.start()
    remote = RemoteQuotaStore(str(path), timeout_s=5.0)
    try:
        assert stat.S_ISSOCK(path.stat().st_mode)
        assert await remote.reserve(charge("c0", ScopeLimits("t:a", requests=1))) is None
        assert await remote.usage("t:a") == ScopeUsage(requests=1)
    finally:
        await remote.close()
        await server.stop()


async def test_stopping_removes_the_socket_file(tmp_path: Path) -> None:
    path = tmp_path / "quotas.sock"
    store = InProcessQuotaStore(clock=SystemClock(), window_ms=WINDOW_MS, lease_ms=LEASE_MS)
    server = QuotaServer(store, str(path))
    await server.start()
    assert path.exists()
    await server.stop()
    assert not path.exists()


# -- malformed calls --


async def post(path: str, name: str, data: bytes) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path)) as session,
        session.post(
            f"http://quotas/{name}", data=data, headers={"Content-Type": "application/json"}
        ) as resp,
    ):
        return resp.status, await resp.json()


@pytest.mark.parametrize(
    ("name", "data", "error"),
    [
        ("reserve", b"garbage", "not JSON: Expecting value: line 1 column 1 (char 0)"),
        ("ping", b"", "not JSON: Expecting value: line 1 column 1 (char 0)"),
        ("reserve", b'{"charge": {"charge_id": "c"}}', "malformed call: KeyError('scopes')"),
        ("usage", b"{}", "malformed call: KeyError('scope')"),
        (
            "reserve",
            b"[]",
            "malformed call: TypeError('list indices must be integers or slices, not str')",
        ),
        (
            "settle",
            b'{"charge": {"charge_id": "c", "tokens": 1, "scopes": []}, "tokens": "many"}',
            "malformed call: ValueError(\"invalid literal for int() with base 10: 'many'\")",
        ),
        (
            "renew",
            b'{"charges": [{"charge_id": "c", "tokens": 1, "scopes": [{"scope": "t", "x": 1}]}]}',
            'malformed call: TypeError("ScopeLimits.__init__() got an unexpected keyword '
            "argument 'x'\")",
        ),
    ],
)
async def test_a_malformed_call_is_400_with_an_error(
    shared: Shared, name: str, data: bytes, error: str
) -> None:
    assert await post(shared.server.path, name, data) == (400, {"error": error})


async def test_a_malformed_call_charges_nothing(shared: Shared) -> None:
    body = b'{"charge": {"charge_id": "c", "tokens": "x", "scopes": [{"scope": "t:a"}]}}'
    status, _ = await post(shared.server.path, "reserve", body)
    assert status == 400
    assert await shared.store.usage("t:a") == ScopeUsage()


async def test_a_400_reaches_the_caller_as_a_store_error_with_the_servers_reason(
    shared: Shared,
) -> None:
    bad = Charge(charge_id="c", tokens="x", scopes=())  # type: ignore[arg-type]
    with pytest.raises(QuotaStoreError) as err:
        await shared.remote.reserve(bad)
    reason = "malformed call: " + repr(ValueError("invalid literal for int() with base 10: 'x'"))
    assert str(err.value) == f"quota server: 400 { ({'error': reason}) }"


# -- an unreachable server --


CALLS: dict[str, Callable[[RemoteQuotaStore], Awaitable[object]]] = {
    "reserve": lambda r: r.reserve(charge("c", ScopeLimits("t:a", requests=1))),
    "settle": lambda r: r.settle(charge("c", ScopeLimits("t:a", streams=1)), 1),
    "renew": lambda r: r.renew([charge("c", ScopeLimits("t:a", streams=1))]),
    "usage": lambda r: r.usage("t:a"),
    "ping": lambda r: r.ping(),
}


@pytest.mark.parametrize("method", list(CALLS))
async def test_every_call_to_a_socket_nobody_serves_is_a_store_error(
    tmp_path: Path, method: str
) -> None:
    path = str(tmp_path / "nobody.sock")
    remote = RemoteQuotaStore(path, timeout_s=2.0)
    try:
        with pytest.raises(QuotaStoreError) as err:
            await CALLS[method](remote)
    finally:
        await remote.close()
    message = str(err.value)
    assert message.startswith(f"quota server at {path}: UnixClientConnectorError("), message
    assert message.endswith("FileNotFoundError(2, 'No such file or directory'))"), message


@pytest.mark.parametrize("method", list(CALLS))
async def test_every_call_to_a_server_that_never_answers_is_a_store_error_after_the_timeout(
    tmp_path: Path, method: str
) -> None:
    """The kernel accepts the connection (its backlog) but nobody reads or answers."""
    path = str(tmp_path / "mute.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mute:
        mute.bind(path)
        mute.listen()
        remote = RemoteQuotaStore(path, timeout_s=0.1)
        try:
            with pytest.raises(QuotaStoreError) as err:
                await CALLS[method](remote)
        finally:
            await remote.close()
    assert str(err.value) == f"quota server at {path}: TimeoutError()"


async def test_closing_a_client_twice_or_unused_is_harmless(tmp_path: Path) -> None:
    remote = RemoteQuotaStore(str(tmp_path / "nobody.sock"), timeout_s=1.0)
    await remote.close()
    await remote.close()
