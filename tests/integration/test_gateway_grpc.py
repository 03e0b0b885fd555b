"""The gRPC client API (`homing.v1.Inference`): same text as HTTP, mapped errors, health and
reflection."""

from __future__ import annotations

import json

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from homing.app import App
from homing.v1 import inference_pb2 as pb
from homing.v1 import inference_pb2_grpc as pb_grpc

pytestmark = pytest.mark.asyncio(loop_scope="module")


def _channel(app: App) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")


async def test_grpc_chat_stream_matches_http_text(gateway: App) -> None:
    """A streamed gRPC chat gives the same text and usage as the HTTP API at temperature 0."""
    model = gateway.model.model_id
    messages = [{"role": "user", "content": "Say hello in Chinese"}]
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://127.0.0.1:{gateway.http_port}/v1/chat/completions",
            json={"model": model, "messages": messages, "temperature": 0, "max_tokens": 40},
        ) as resp:
            http_body = await resp.json()
    async with _channel(gateway) as channel:
        stub = pb_grpc.InferenceStub(channel)
        call = stub.ChatCompletion(
            pb.ChatCompletionRequest(
                model=model,
                messages=[pb.ChatMessage(role="user", content="Say hello in Chinese")],
                sampling=pb.SamplingOptions(temperature=0, max_tokens=40),
                stream=True,
            )
        )
        chunks = [c async for c in call]
        metadata = dict(await call.initial_metadata())
    text = "".join(ch.text for c in chunks for ch in c.choices)
    assert text == http_body["choices"][0]["message"]["content"]
    assert chunks[0].choices[0].role == "assistant"
    assert chunks[-1].usage.completion_tokens == http_body["usage"]["completion_tokens"]
    assert chunks[-1].usage.prompt_tokens == http_body["usage"]["prompt_tokens"]
    assert metadata["x-homing-worker"] == chunks[0].worker
    assert metadata["x-request-id"]


async def test_grpc_completion_non_streamed_returns_one_message(gateway: App) -> None:
    """stream=false answers one message holding the whole choice and usage."""
    async with _channel(gateway) as channel:
        stub = pb_grpc.InferenceStub(channel)
        chunks = [
            c
            async for c in stub.Completion(
                pb.CompletionRequest(
                    model=gateway.model.model_id,
                    token_ids=pb.TokenIds(ids=list(range(1000, 1040))),
                    sampling=pb.SamplingOptions(max_tokens=12, ignore_eos=True),
                )
            )
        ]
    assert len(chunks) == 1
    assert chunks[0].choices[0].finish_reason == "length"
    assert chunks[0].usage.completion_tokens == 12
    assert chunks[0].usage.prompt_tokens == 40


@pytest.mark.parametrize(
    ("request_", "code", "error_code"),
    [
        (
            pb.ChatCompletionRequest(
                model="gpt-9", messages=[pb.ChatMessage(role="user", content="x")]
            ),
            grpc.StatusCode.NOT_FOUND,
            "model_not_found",
        ),
        (
            pb.ChatCompletionRequest(model="MODEL", messages=[]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "invalid_value",
        ),
        (
            pb.ChatCompletionRequest(
                model="MODEL",
                messages=[pb.ChatMessage(role="user", content="x")],
                sampling=pb.SamplingOptions(temperature=5),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "invalid_value",
        ),
    ],
)
async def test_grpc_errors_map_http_status_and_carry_openai_body(
    gateway: App, request_: pb.ChatCompletionRequest, code: grpc.StatusCode, error_code: str
) -> None:
    """Client mistakes end the call with the mapped status and the OpenAI error JSON."""
    if request_.model == "MODEL":
        request_.model = gateway.model.model_id
    async with _channel(gateway) as channel:
        stub = pb_grpc.InferenceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.ChatCompletion(request_):
                pass
    assert info.value.code() == code
    trailing = dict(info.value.trailing_metadata() or ())
    body = json.loads(trailing["x-error-json"])
    assert body["error"]["code"] == error_code
    assert body["error"]["message"] == info.value.details()


async def test_grpc_health_and_reflection(gateway: App) -> None:
    """The health service says SERVING and reflection lists homing.v1.Inference."""
    async with _channel(gateway) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="homing.v1.Inference")
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = [
            r
            async for r in stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
        ]
    names = {s.name for s in responses[0].list_services_response.service}
    assert "homing.v1.Inference" in names
    assert "grpc.health.v1.Health" in names
