"""A request that ends early says so: cut at the drain timeout or by a failing worker, a
stream ends with an OpenAI error event and `[DONE]` (gRPC: the mapped status and
`x-error-json`), it is logged with its own outcome, and every request, cancelled ones
included, writes exactly one `request_done` line."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest
import pytest_asyncio
from helpers import eventually
from structlog.testing import capture_logs

from homing.app import App
from homing.config import GatewaySettings, HomingConfig, SimSettings
from homing.gateway.errors import drained
from homing.v1 import inference_pb2 as pb
from homing.v1 import inference_pb2_grpc as pb_grpc

MODEL = "llama-3.1-8b"
DRAIN_S = 0.5
LONG = {"max_tokens": 100_000, "ignore_eos": True}  # far longer than any test runs


def _config(workers: int = 1) -> HomingConfig:
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=DRAIN_S),
        sim=SimSettings(workers=workers, speedup=1.0),
    )


@pytest_asyncio.fixture
async def app() -> AsyncIterator[App]:
    """A fresh gateway over one simulated worker at real speed, drain timeout 0.5 s."""
    running = App(_config())
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


def _url(app: App, path: str) -> str:
    return f"http://127.0.0.1:{app.http_port}{path}"


def _events(text: str) -> list[str]:
    return [e for e in text.split("\n\n") if e]


def _done_lines(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "request_done"]


async def test_drain_timeout_ends_open_requests_with_a_drained_error(app: App) -> None:
    """At the drain timeout an HTTP stream gets the `drained` error event then `[DONE]`, a
    non-streamed request the 503 `drained` body, a gRPC stream UNAVAILABLE with the same
    JSON in `x-error-json`; each is logged once with outcome `drained`."""
    assert app.service is not None
    expected = drained(DRAIN_S).body()
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], **LONG}
    with capture_logs() as logs:
        async with (
            aiohttp.ClientSession() as http,
            grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel,
        ):
            stream = await http.post(
                _url(app, "/v1/chat/completions"), json={**chat, "stream": True}
            )
            await stream.content.readline()  # the role chunk: the stream is under way
            plain = asyncio.ensure_future(http.post(_url(app, "/v1/chat/completions"), json=chat))
            call = pb_grpc.InferenceStub(channel).Completion(
                pb.CompletionRequest(
                    model=MODEL,
                    text="go",
                    stream=True,
                    sampling=pb.SamplingOptions(max_tokens=100_000, ignore_eos=True),
                )
            )
            await call.read()  # the first chunk: the call is under way
            assert await eventually(lambda: app.service.in_flight == 3, within_s=5.0)
            await app.stop()
            text = (await stream.read()).decode()
            answer = await plain
            status, body = answer.status, await answer.json()
            with pytest.raises(grpc.aio.AioRpcError) as cut:
                while await call.read() is not grpc.aio.EOF:
                    pass
    events = _events(text)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: ")) == expected
    assert (status, body, answer.headers["Retry-After"]) == (503, expected, "1")
    assert cut.value.code() == grpc.StatusCode.UNAVAILABLE
    trailers = dict(cut.value.trailing_metadata() or ())
    assert json.loads(trailers["x-error-json"]) == expected
    assert sorted(e["outcome"] for e in _done_lines(logs)) == ["drained"] * 3


async def test_grpc_stream_cut_by_a_dying_worker_gets_its_status_and_error_json(
    app: App,
) -> None:
    """A worker killed mid-stream ends a gRPC stream with UNAVAILABLE and the error JSON,
    logged once as `engine_error`."""
    assert app.sims is not None
    with capture_logs() as logs:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            call = pb_grpc.InferenceStub(channel).Completion(
                pb.CompletionRequest(
                    model=MODEL,
                    text="go",
                    stream=True,
                    sampling=pb.SamplingOptions(max_tokens=100_000, ignore_eos=True),
                )
            )
            await call.read()
            app.sims.children[0].process.kill()
            with pytest.raises(grpc.aio.AioRpcError) as cut:
                while await call.read() is not grpc.aio.EOF:
                    pass
    assert cut.value.code() == grpc.StatusCode.UNAVAILABLE
    error = json.loads(dict(cut.value.trailing_metadata() or ())["x-error-json"])
    assert error["error"]["code"] == "no_capacity"
    assert error["error"]["message"].startswith("The worker failed: ")
    assert [e["outcome"] for e in _done_lines(logs)] == ["engine_error"]


async def test_client_gone_while_sending_its_body_writes_one_request_done(app: App) -> None:
    """A client that sends half a body and hangs up is logged once, as `client_closed`."""
    assert app.service is not None and app.http_port is not None
    with capture_logs() as logs:
        _reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"model":'
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        assert await eventually(lambda: bool(_done_lines(logs)), within_s=5.0)
    lines = _done_lines(logs)
    assert [(e["outcome"], e["path"]) for e in lines] == [("client_closed", "/v1/chat/completions")]


async def test_client_gone_mid_answer_writes_one_request_done(app: App) -> None:
    """A client that hangs up while its non-streamed answer is generated is logged once."""
    assert app.service is not None
    body = {"model": MODEL, "prompt": "go", **LONG}
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as http:
            call = asyncio.ensure_future(http.post(_url(app, "/v1/completions"), json=body))
            assert await eventually(lambda: app.service.in_flight == 1, within_s=5.0)
            call.cancel()
        assert await eventually(lambda: app.service.in_flight == 0, within_s=5.0)
    assert [e["outcome"] for e in _done_lines(logs)] == ["client_closed"]
