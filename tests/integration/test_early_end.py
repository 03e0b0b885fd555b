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
from helpers import eventually, own_app, post_without_reading, stop_through_the_drain
from structlog.testing import capture_logs

from homing.app import App
from homing.clock import ManualClock
from homing.config import GatewaySettings, HomingConfig, SimSettings
from homing.gateway.errors import drained
from homing.v1 import inference_pb2 as pb
from homing.v1 import inference_pb2_grpc as pb_grpc

MODEL = "llama-3.1-8b"
DRAIN_S = 30.0  # virtual seconds: the gateway runs on a `ManualClock`
LONG = {"max_tokens": 100_000, "ignore_eos": True}  # far longer than any test runs


def _config(workers: int = 1) -> HomingConfig:
    return HomingConfig(
        gateway=GatewaySettings(port=0, grpc_port=0, drain_timeout_s=DRAIN_S),
        sim=SimSettings(workers=workers, speedup=1.0),
    )


@pytest_asyncio.fixture
async def app() -> AsyncIterator[App]:
    """A fresh gateway on a `ManualClock` over one simulated worker at real speed, drain
    timeout `DRAIN_S` of virtual time."""
    running = own_app(_config(), clock=ManualClock())
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


def _url(app: App, path: str) -> str:
    return f"http://127.0.0.1:{app.http_port}{path}"


def _long_grpc_stream(channel: grpc.aio.Channel, n: int = 1) -> Any:
    """A streamed gRPC completion of `n` choices far longer than any test runs."""
    return pb_grpc.InferenceStub(channel).Completion(
        pb.CompletionRequest(
            model=MODEL,
            text="go",
            stream=True,
            sampling=pb.SamplingOptions(max_tokens=100_000, ignore_eos=True, n=n),
        )
    )


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
            call = _long_grpc_stream(channel)
            await call.read()  # the first chunk: the call is under way
            assert await eventually(lambda: app.service.in_flight == 3, within_s=5.0)
            await stop_through_the_drain(app, DRAIN_S)
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
            call = _long_grpc_stream(channel)
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


async def test_request_sent_while_draining_gets_shutting_down(app: App) -> None:
    """During the drain a request on a connection that stayed open is refused with 503
    `shutting_down` and the connection is closed; the open stream still completes."""
    assert app.service is not None and app.http_port is not None
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s"
    )
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
    try:
        writer.write(request % (len(body), body))
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        length = int(next(v for k, v in _headers(head) if k == "content-length"))
        await reader.readexactly(length)  # the connection stays open (keep-alive)
        async with aiohttp.ClientSession() as http:
            long = {"model": MODEL, "prompt": "go", "max_tokens": 40, "stream": True}
            stream = await http.post(_url(app, "/v1/completions"), json=long)
            await stream.content.readline()
            stopping = asyncio.ensure_future(app.stop())
            assert await eventually(lambda: not app.service.accepting, within_s=5.0)
            writer.write(request % (len(body), body))
            answer = await asyncio.wait_for(reader.read(), 10)  # read() ends: closed
            text = (await stream.read()).decode()
            await stopping
    finally:
        writer.close()
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503")
    assert ("connection", "close") in [(k, v.lower()) for k, v in _headers(head)]
    assert json.loads(payload)["error"]["code"] == "shutting_down"
    assert _events(text)[-1] == "data: [DONE]" and '"error"' not in text


async def test_cut_stream_whose_client_stopped_reading_is_logged_drained(app: App) -> None:
    """A stream whose client stopped reading (its events pile up unsent) is still logged as
    `drained` when the drain timeout cuts it, not as closed by the client."""
    assert app.service is not None and app.http_port is not None
    body = json.dumps({"model": MODEL, "prompt": "go", "stream": True, "n": 16, **LONG}).encode()
    writer = await post_without_reading(app.http_port, "/v1/completions", body)
    try:

        def piling_up() -> bool:
            return any(len(g._events) > 50 for g in app.service._open)

        with capture_logs() as logs:
            assert await eventually(piling_up, within_s=30.0)
            await stop_through_the_drain(app, DRAIN_S)
    finally:
        writer.close()
    assert [e["outcome"] for e in _done_lines(logs)] == ["drained"]


async def test_worker_refusal_of_a_request_is_logged_as_its_status(app: App) -> None:
    """A request the worker refuses as invalid (400 to the client) is logged `error_400`,
    not as a worker failure."""
    # A string format xgrammar (and the simulated backend) does not implement.
    schema = {"type": "object", "properties": {"a": {"type": "string", "format": "ipv9"}}}
    body = {
        "model": MODEL,
        "prompt": "hi",
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }
    with capture_logs() as logs:
        async with aiohttp.ClientSession() as http:
            async with http.post(_url(app, "/v1/completions"), json=body) as resp:
                assert resp.status == 400
    assert [e["outcome"] for e in _done_lines(logs)] == ["error_400"]


def _headers(head: bytes) -> list[tuple[str, str]]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return [
        (k.strip().lower(), v.strip()) for k, v in (line.split(":", 1) for line in lines if line)
    ]


async def test_grpc_client_cancelling_a_stream_of_several_choices_is_client_closed(
    app: App,
) -> None:
    """A gRPC client that cancels its stream of 4 choices is logged once, `client_closed`."""
    assert app.service is not None
    with capture_logs() as logs:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            call = _long_grpc_stream(channel, n=4)
            for _ in range(10):
                await call.read()
            call.cancel()
        assert await eventually(lambda: app.service.in_flight == 0, within_s=5.0)
        assert await eventually(lambda: bool(_done_lines(logs)), within_s=5.0)
    assert [e["outcome"] for e in _done_lines(logs)] == ["client_closed"]


async def test_request_queued_for_admission_when_the_drain_begins_is_refused() -> None:
    """A request waiting in the admission queue when the drain begins gets 503
    `shutting_down` at once instead of starting engine work during the drain."""
    from homing.config import AdmissionSettings

    config = _config()
    config.admission = AdmissionSettings(max_in_flight_per_replica=1, queue_timeout_s=30.0)
    running = own_app(config)
    await running.start()
    try:
        assert running.admission is not None
        async with aiohttp.ClientSession() as http:
            body = {"model": MODEL, "prompt": "go", "stream": True, "max_tokens": 40}
            hog = await http.post(_url(running, "/v1/completions"), json=body)
            await hog.content.readline()
            queued = asyncio.ensure_future(
                http.post(_url(running, "/v1/completions"), json={**body, "stream": False})
            )
            assert await eventually(lambda: len(running.admission.queue) == 1, within_s=5.0)
            with capture_logs() as logs:
                stopping = asyncio.ensure_future(running.stop())
                answer = await queued
                status, refused = answer.status, await answer.json()
                text = (await hog.read()).decode()
                await stopping
    finally:
        await running.stop()
    assert (status, refused["error"]["code"]) == (503, "shutting_down")
    assert _events(text)[-1] == "data: [DONE]" and '"error"' not in text
    outcomes = sorted(e["outcome"] for e in _done_lines(logs))
    assert outcomes == ["error_503", "ok"]
