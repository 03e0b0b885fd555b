"""Two gateway instances with the same config share one real redis-server in front of the
same simulated workers: a tenant's limits hold across both (not N-fold), a killed client's
stream slot comes back at once, and Redis going away fails closed, then recovers."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio
from helpers import own_app
from openai import AsyncOpenAI
from redis_server import RedisServer

from homing.app import App
from homing.config import (
    EngineSettings,
    GatewaySettings,
    HomingConfig,
    QuotaSettings,
    SimSettings,
    TenantSettings,
)
from homing.embedded import SimLauncher
from homing.gateway.auth import hash_key

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "llama-3.1-8b"
PROMPT = list(range(100, 120))  # 20 prompt tokens, exactly
MAX_TOKENS = 30  # with ignore_eos every request uses exactly 20 + 30 = 50 tokens


def _tenant(name: str, **quota: int) -> TenantSettings:
    return TenantSettings.model_validate(
        {"name": name, "keys": [{"id": name, "sha256": hash_key(f"sk-{name}")}], "quota": quota}
    )


TENANTS = [
    _tenant("rpm10", requests_per_minute=10),
    _tenant("tpm500", tokens_per_minute=500),
    _tenant("one-stream", concurrent_streams=1),
    _tenant("outage", requests_per_minute=1000),
    _tenant("serial", concurrent_streams=1),
]


def _config(workers: list[str], redis_url: str, prefix: str, **quotas: Any) -> HomingConfig:
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=1.0),
        engines=EngineSettings(workers=workers),
        tenants=TENANTS,
        quotas=QuotaSettings(
            backend="redis", redis_url=redis_url, key_prefix=prefix, store_timeout_s=0.5, **quotas
        ),
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def workers() -> AsyncIterator[list[str]]:
    """Two simulated SGLang workers (10x speed) that both instances serve."""
    sims = SimLauncher(SimSettings(workers=2, speedup=10.0))
    urls = await sims.start(timeout_s=60)
    yield urls
    await sims.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pair(workers: list[str], redis_server: RedisServer) -> AsyncIterator[tuple[App, App]]:
    """Two instances with one config (same key prefix) over the session's redis-server."""
    config = _config(workers, redis_server.url, f"pair-{uuid.uuid4().hex}")
    async with own_app(config) as first, own_app(config.model_copy(deep=True)) as second:
        yield first, second


def _client(app: App, tenant: str) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=f"http://127.0.0.1:{app.http_port}/v1", api_key=f"sk-{tenant}", max_retries=0
    )


async def test_each_instance_subscribes_to_every_workers_events(
    pair: tuple[App, App], workers: list[str]
) -> None:
    """Both instances run their own pool over the same two workers, each healthy."""
    for app in pair:
        assert app.pool is not None
        assert sorted(w.url for w in app.pool.healthy_workers()) == sorted(workers)


async def test_ten_requests_per_minute_hold_across_two_instances(pair: tuple[App, App]) -> None:
    """40 requests sent alternately to two instances within a minute: exactly 10 succeed and
    30 get 429 with an integer Retry-After."""
    ok = 0
    retry_afters: list[int] = []
    for i in range(40):
        client = _client(pair[i % 2], "rpm10")
        try:
            await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
            ok += 1
        except openai.RateLimitError as err:
            retry_afters.append(int(err.response.headers["retry-after"]))
            assert err.code == "rate_limit_exceeded"
            assert err.type == "requests"
    assert ok == 10
    assert len(retry_afters) == 30
    assert all(1 <= r <= 60 for r in retry_afters)


async def test_tokens_per_minute_hold_across_two_instances_for_streams(
    pair: tuple[App, App],
) -> None:
    """500 tokens/min at 50 tokens per streamed request, 40 sent alternately to both
    instances: exactly 10 streams complete, 30 get 429 naming the token quota."""
    ok = 0
    refused = 0
    for i in range(40):
        client = _client(pair[i % 2], "tpm500")
        try:
            stream = await client.completions.create(
                model=MODEL,
                prompt=PROMPT,
                max_tokens=MAX_TOKENS,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True},
            )
            usage = [c.usage async for c in stream if c.usage is not None]
            assert usage[0].total_tokens == len(PROMPT) + MAX_TOKENS
            ok += 1
        except openai.RateLimitError as err:
            refused += 1
            assert 1 <= int(err.response.headers["retry-after"]) <= 60
            assert err.type == "tokens"
            assert err.body["message"].startswith(
                "Rate limit reached for tokens per min (TPM) on tenant tpm500: Limit 500, "
                "Used 500, Requested 50."
            )
    assert (ok, refused) == (10, 30)


async def test_stream_slot_is_free_when_the_client_sees_the_end(pair: tuple[App, App]) -> None:
    """With 1 concurrent stream, streamed requests sent back to back (alternating instances)
    all succeed: the slot is released before `data: [DONE]` reaches the client."""
    for i in range(6):
        stream = await _client(pair[i % 2], "serial").completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=3, stream=True
        )
        assert [c async for c in stream]


STREAMING_CLIENT = """
import sys, urllib.request, json
req = urllib.request.Request(sys.argv[1], data=json.dumps({
    "model": sys.argv[2], "prompt": [1, 2, 3, 4], "max_tokens": 20000, "stream": True,
    "ignore_eos": True}).encode(),
    headers={"content-type": "application/json", "authorization": "Bearer " + sys.argv[3]})
with urllib.request.urlopen(req) as resp:
    for line in resp:
        if line.startswith(b"data: {"):
            print("streaming", flush=True)
"""


async def test_killed_client_frees_its_stream_slot_within_a_second(
    pair: tuple[App, App],
) -> None:
    """With 1 concurrent stream, a second stream is refused while a client process streams;
    after that process is SIGKILLed mid-stream the next request succeeds within 1 s."""
    first, second = pair
    client = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        STREAMING_CLIENT,
        f"http://127.0.0.1:{first.http_port}/v1/completions",
        MODEL,
        "sk-one-stream",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert client.stdout is not None
        line = await asyncio.wait_for(client.stdout.readline(), 10)
        assert line == b"streaming\n"
        with pytest.raises(openai.RateLimitError) as caught:
            await _client(second, "one-stream").completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=2
            )
        assert caught.value.type == "streams"
        assert caught.value.response.headers["retry-after"] == "1"
    finally:
        client.kill()
        await client.wait()
    killed_at = time.monotonic()
    while True:
        try:
            await _client(second, "one-stream").completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=2
            )
            break
        except openai.RateLimitError:
            assert time.monotonic() - killed_at < 1.0, "the killed client's slot was not freed"
            await asyncio.sleep(0.02)
    assert time.monotonic() - killed_at < 1.0


async def _status(app: App, tenant: str) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://127.0.0.1:{app.http_port}/v1/completions",
            json={"model": MODEL, "prompt": PROMPT, "max_tokens": 2},
            headers={"Authorization": f"Bearer sk-{tenant}"},
        ) as resp:
            return resp.status, json.loads(await resp.read()), resp.headers.copy()


async def test_redis_down_fails_closed_then_recovers(workers: list[str]) -> None:
    """Redis stopped: 503 `quota_store_unavailable` with Retry-After and a metric; Redis
    back on the same port: requests succeed again without restarting the gateway."""
    redis = RedisServer()
    redis.start()
    try:
        async with own_app(_config(workers, redis.url, f"outage-{uuid.uuid4().hex}")) as app:
            assert (await _status(app, "outage"))[0] == 200
            redis.stop()
            status, body, headers = await _status(app, "outage")
            assert status == 503
            assert headers["Retry-After"] == "1"
            assert body == {
                "error": {
                    "message": "The quota store is unavailable, so the request cannot be "
                    "admitted; retry shortly.",
                    "type": "service_unavailable_error",
                    "param": None,
                    "code": "quota_store_unavailable",
                }
            }
            assert (
                app.gateway_metrics.value(
                    "homing_quota_store_errors_total", operation="reserve", action="fail_closed"
                )
                >= 1
            )
            redis.start()
            deadline = time.monotonic() + 5
            status = 0
            while time.monotonic() < deadline:
                status = (await _status(app, "outage"))[0]
                if status == 200:
                    break
                await asyncio.sleep(0.05)
            assert status == 200
    finally:
        redis.stop()


async def test_redis_down_fails_open_when_configured(workers: list[str]) -> None:
    """With `on_store_error = "fail_open"` and no Redis, requests are served and counted
    in the error metric with action fail_open, as `GET /metrics` shows."""
    redis = RedisServer()  # never started: nothing listens on its port
    config = _config(workers, redis.url, "open", on_store_error="fail_open")
    async with own_app(config) as app:
        for _ in range(3):
            assert (await _status(app, "rpm10"))[0] == 200
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{app.http_port}/metrics") as resp:
                exposition = await resp.text()
        assert (
            'homing_quota_store_errors_total{action="fail_open",operation="reserve"} 3.0'
            in exposition
        )
