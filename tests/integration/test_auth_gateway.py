"""Tenants and API keys on a running gateway: OpenAI's 401/403/404 on HTTP (official client)
and gRPC (mapped status + metadata), quotas as 429 with Retry-After on both, and tokens
reconciled with the engine's counts on every path."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import openai
import pytest
import pytest_asyncio
from helpers import eventually, own_app
from openai import AsyncOpenAI
from structlog.testing import capture_logs

from homing.app import App
from homing.clock import ManualClock
from homing.config import GatewaySettings, HomingConfig, SimSettings, TenantSettings
from homing.gateway.auth import hash_key
from homing.gateway.quotas import InProcessQuotaStore
from homing.v1 import inference_pb2 as pb
from homing.v1 import inference_pb2_grpc as pb_grpc

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODEL = "llama-3.1-8b"


def _tenant(name: str, *keys: tuple[str, str, dict[str, Any]], **fields: Any) -> TenantSettings:
    return TenantSettings.model_validate(
        {
            "name": name,
            "keys": [{"id": i, "sha256": hash_key(k), **extra} for i, k, extra in keys],
            **fields,
        }
    )


TENANTS = [
    _tenant(
        "acme",
        ("acme-prod", "sk-acme-prod", {}),
        ("acme-ci", "sk-acme-ci", {}),
        ("acme-old", "sk-acme-old", {"disabled": True}),
    ),
    _tenant("elsewhere", ("elsewhere-1", "sk-elsewhere", {}), models=["another-model"]),
    _tenant("narrow", ("narrow-1", "sk-narrow", {"models": ["another-model"]})),
    _tenant("rpm-http", ("rpm-http-1", "sk-rpm-http", {}), quota={"requests_per_minute": 2}),
    _tenant("rpm-grpc", ("rpm-grpc-1", "sk-rpm-grpc", {}), quota={"requests_per_minute": 1}),
    _tenant("metered", ("metered-1", "sk-metered", {}), quota={"tokens_per_minute": 1_000_000}),
    _tenant("low-tpm", ("low-tpm-1", "sk-low-tpm", {}), quota={"tokens_per_minute": 5_000}),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app() -> AsyncIterator[App]:
    """A gateway with tenants (in-process quota store) over one simulated worker."""
    config = HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=2.0),
        sim=SimSettings(workers=1, speedup=10.0),
        tenants=TENANTS,
    )
    async with own_app(config) as running:
        assert running.service is not None and running.model.model_id == MODEL
        yield running


def _client(app: App, key: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"http://127.0.0.1:{app.http_port}/v1", api_key=key, max_retries=0)


async def _post(app: App, body: dict[str, Any], **headers: str) -> tuple[int, Any, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://127.0.0.1:{app.http_port}/v1/chat/completions", json=body, headers=headers
        ) as resp:
            return resp.status, await resp.json(), resp.headers.copy()


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _error(message: str, code: str, type_: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


MISSING = (
    "You didn't provide an API key. You need to provide your API key in an Authorization "
    "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)


async def test_every_key_of_a_tenant_is_served_with_the_official_client(app: App) -> None:
    """Both live keys of one tenant get completions through the `openai` client."""
    for key in ("sk-acme-prod", "sk-acme-ci"):
        reply = await _client(app, key).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert reply.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, MISSING),
        ({"Authorization": "sk-acme-prod"}, MISSING),
        ({"Authorization": "Bearer sk-nobody"}, "Incorrect API key provided."),
        ({"Authorization": "Bearer sk-acme-old"}, "The API key provided has been disabled."),
    ],
)
async def test_missing_wrong_or_disabled_key_is_401(
    app: App, headers: dict[str, str], message: str
) -> None:
    """Each bad credential gets 401 `invalid_api_key` with OpenAI's body."""
    status, body, _ = await _post(app, CHAT, **headers)
    assert status == 401
    assert body == _error(message, "invalid_api_key", "invalid_request_error")


async def test_official_client_raises_authentication_error_for_a_wrong_key(app: App) -> None:
    """The `openai` client sees a wrong key as `AuthenticationError` (401)."""
    with pytest.raises(openai.AuthenticationError) as caught:
        await _client(app, "sk-nobody").models.list()
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"


async def test_model_the_tenant_may_not_use_is_404_and_hidden(app: App) -> None:
    """A tenant limited to other models gets 404 `model_not_found` and an empty model list."""
    status, body, _ = await _post(app, CHAT, Authorization="Bearer sk-elsewhere")
    assert status == 404
    assert body == _error(
        f"The model '{MODEL}' does not exist or you do not have access to it.",
        "model_not_found",
        "invalid_request_error",
        "model",
    )
    listed = await _client(app, "sk-elsewhere").models.list()
    assert listed.data == []
    listed = await _client(app, "sk-acme-prod").models.list()
    assert [m.id for m in listed.data] == [MODEL]


async def test_model_the_key_may_not_use_is_403(app: App) -> None:
    """A key narrowed to other models gets 403 `model_not_allowed`."""
    status, body, _ = await _post(app, CHAT, Authorization="Bearer sk-narrow")
    assert status == 403
    assert body == _error(
        f"This API key is not allowed to use the model '{MODEL}'.",
        "model_not_allowed",
        "permission_error",
        "model",
    )


async def test_health_and_readiness_need_no_key(app: App) -> None:
    """Probes stay open with auth on."""
    async with aiohttp.ClientSession() as session:
        for path in ("/health", "/ready"):
            async with session.get(f"http://127.0.0.1:{app.http_port}{path}") as resp:
                assert resp.status == 200


async def test_a_refused_tenant_is_served_again_once_its_window_passes_on_the_apps_clock() -> None:
    """On a `ManualClock`, with 1 request/min: the second request is refused with
    Retry-After 60, still refused 59 virtual seconds later with Retry-After 1, and served
    once the first request's minute has passed; no real time is waited."""
    clock = ManualClock()
    config = HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=2.0),
        sim=SimSettings(workers=1, speedup=10.0),
        tenants=[
            _tenant("window", ("window-1", "sk-window", {}), quota={"requests_per_minute": 1})
        ],
    )
    key = {"Authorization": "Bearer sk-window"}
    async with own_app(config, clock=clock) as windowed:
        assert (await _post(windowed, CHAT, **key))[0] == 200
        status, _, headers = await _post(windowed, CHAT, **key)
        assert (status, headers["Retry-After"]) == (429, "60")
        clock.advance(59.0)
        status, _, headers = await _post(windowed, CHAT, **key)
        assert (status, headers["Retry-After"]) == (429, "1")
        clock.advance(1.0)
        assert (await _post(windowed, CHAT, **key))[0] == 200


async def test_requests_quota_is_429_with_retry_after_over_http(app: App) -> None:
    """With 2 requests/min the third is refused: 429, integer Retry-After, the quota named."""
    client = _client(app, "sk-rpm-http")
    for _ in range(2):
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    with capture_logs() as logs, pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    done = [entry for entry in logs if entry["event"] == "request_done"]
    assert [entry["outcome"] for entry in done] == ["error_429"]  # one line per request
    retry_after = int(caught.value.response.headers["retry-after"])
    assert 55 <= retry_after <= 60
    assert caught.value.body == {
        "message": "Rate limit reached for requests per min (RPM) on tenant rpm-http: Limit 2, "
        f"Used 2, Requested 1. Please try again in {retry_after}s.",
        "type": "requests",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    assert (
        app.gateway_metrics.value("homing_rate_limited_total", quota="requests", tenant="rpm-http")
        == 1
    )


def _channel(app: App) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")


def _grpc_chat(model: str = MODEL) -> pb.ChatCompletionRequest:
    return pb.ChatCompletionRequest(
        model=model,
        messages=[pb.ChatMessage(role="user", content="hi")],
        sampling=pb.SamplingOptions(max_tokens=2),
    )


async def _grpc_call(
    app: App, key: str | None, request: pb.ChatCompletionRequest
) -> list[pb.CompletionChunk]:
    metadata = (("authorization", f"Bearer {key}"),) if key is not None else ()
    async with _channel(app) as channel:
        stub = pb_grpc.InferenceStub(channel)
        return [c async for c in stub.ChatCompletion(request, metadata=metadata)]


@pytest.mark.parametrize(
    ("key", "code", "error"),
    [
        (
            None,
            grpc.StatusCode.UNAUTHENTICATED,
            _error(MISSING, "invalid_api_key", "invalid_request_error"),
        ),
        (
            "sk-nobody",
            grpc.StatusCode.UNAUTHENTICATED,
            _error("Incorrect API key provided.", "invalid_api_key", "invalid_request_error"),
        ),
        (
            "sk-elsewhere",
            grpc.StatusCode.NOT_FOUND,
            _error(
                f"The model '{MODEL}' does not exist or you do not have access to it.",
                "model_not_found",
                "invalid_request_error",
                "model",
            ),
        ),
        (
            "sk-narrow",
            grpc.StatusCode.PERMISSION_DENIED,
            _error(
                f"This API key is not allowed to use the model '{MODEL}'.",
                "model_not_allowed",
                "permission_error",
                "model",
            ),
        ),
    ],
)
async def test_grpc_bad_key_and_wrong_model_map_to_grpc_status(
    app: App, key: str | None, code: grpc.StatusCode, error: dict[str, Any]
) -> None:
    """gRPC answers UNAUTHENTICATED / NOT_FOUND / PERMISSION_DENIED with the OpenAI body."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _grpc_call(app, key, _grpc_chat())
    assert caught.value.code() == code
    assert caught.value.details() == error["error"]["message"]
    assert json.loads(dict(caught.value.trailing_metadata())["x-error-json"]) == error


async def test_grpc_key_in_metadata_is_served_and_lists_models(app: App) -> None:
    """A good key in `authorization` metadata gets a completion and the model list."""
    chunks = await _grpc_call(app, "sk-acme-prod", _grpc_chat())
    assert chunks[-1].usage.completion_tokens > 0
    async with _channel(app) as channel:
        stub = pb_grpc.InferenceStub(channel)
        listed = await stub.ListModels(
            pb.ListModelsRequest(), metadata=(("authorization", "Bearer sk-acme-prod"),)
        )
        assert [m.id for m in listed.models] == [MODEL]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ListModels(pb.ListModelsRequest())
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_grpc_quota_is_resource_exhausted_with_retry_delay_in_metadata(app: App) -> None:
    """Past 1 request/min gRPC answers RESOURCE_EXHAUSTED with retry-after (s) and
    grpc-retry-pushback-ms in the trailing metadata."""
    await _grpc_call(app, "sk-rpm-grpc", _grpc_chat())
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _grpc_call(app, "sk-rpm-grpc", _grpc_chat())
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailing = dict(caught.value.trailing_metadata())
    retry_after = int(trailing["retry-after"])
    assert 55 <= retry_after <= 60
    assert trailing["grpc-retry-pushback-ms"] == str(retry_after * 1000)
    body = json.loads(trailing["x-error-json"])
    assert body["error"]["code"] == "rate_limit_exceeded"
    assert body["error"]["type"] == "requests"


def _metered_used(app: App) -> int:
    assert app.quotas is not None
    store = app.quotas.store
    assert isinstance(store, InProcessQuotaStore)
    window = store._tokens.get("t:metered")
    return 0 if window is None else window.used


async def test_tokens_are_reconciled_to_the_engines_usage(app: App) -> None:
    """After a non-streamed and a streamed request the tenant is charged exactly the
    reported prompt + completion tokens, not the prompt + max_tokens reservation."""
    client = _client(app, "sk-metered")
    before = _metered_used(app)
    reply = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello"}], max_tokens=500
    )
    assert reply.usage is not None
    assert _metered_used(app) - before == reply.usage.total_tokens
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hello again"}],
        max_tokens=500,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [chunk.usage async for chunk in stream if chunk.usage is not None]
    expected = reply.usage.total_tokens + usage[0].total_tokens
    # The stream's last bytes reach the client just before the gateway settles it.
    assert await eventually(lambda: _metered_used(app) - before == expected, 2)


async def test_aborted_stream_is_charged_what_the_engine_did(app: App) -> None:
    """A client that disconnects mid-stream is charged prompt + tokens produced so far,
    well under its reservation, and its concurrency ticket is settled."""
    before = _metered_used(app)
    body = {
        "model": MODEL,
        "prompt": [1, 2, 3, 4, 5, 6, 7, 8],
        "max_tokens": 5000,
        "stream": True,
        "ignore_eos": True,
    }
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://127.0.0.1:{app.http_port}/v1/completions",
            json=body,
            headers={"Authorization": "Bearer sk-metered"},
        ) as resp:
            assert resp.status == 200
            received = 0
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    received += 1
                if received >= 5:
                    break
    assert app.service is not None
    for _ in range(200):
        if app.service.in_flight == 0:
            break
        await asyncio.sleep(0.01)
    charged = _metered_used(app) - before
    assert 8 + 5 <= charged < 8 + 5000


async def test_keys_never_reach_the_logs(app: App) -> None:
    """Request log lines name the tenant and key id, never the key, good or wrong."""
    with capture_logs() as logs:
        await _post(app, CHAT, Authorization="Bearer sk-acme-prod")
        await _post(app, CHAT, Authorization="Bearer sk-acme-prod-typo")
    done = [entry for entry in logs if entry["event"] == "request_done"]
    assert any(e.get("tenant") == "acme" and e.get("api_key") == "acme-prod" for e in done)
    assert any(e.get("error_code") == "invalid_api_key" for e in done)
    assert "sk-acme-prod" not in repr(logs)


async def test_request_without_max_tokens_reserves_a_bounded_completion(app: App) -> None:
    """A chat without max_tokens reserves prompt + 1,024 tokens, not the whole context, so a
    tenant with 5,000 tokens/minute is served rather than refused as too large."""
    reply = await _client(app, "sk-low-tpm").chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].finish_reason in {"stop", "length"}
    assert reply.usage is not None and reply.usage.completion_tokens > 0
