"""Input limits over a real socket: message count, header size, and read timeouts, so a
slow client cannot hold a connection or a handler forever (slowloris)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio
from helpers import own_app, send_raw

from homing.app import App
from homing.config import GatewaySettings, HomingConfig, SimSettings
from homing.gateway.http import LINGERING_S
from homing.v1 import inference_pb2 as pb
from homing.v1 import inference_pb2_grpc as pb_grpc

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_HEADER_BYTES = 2048
TIMEOUT_S = 0.5


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app() -> AsyncIterator[App]:
    """A gateway with small limits: 2 KiB of headers, 3 messages, 0.5 s read timeouts."""
    config = HomingConfig(
        gateway=GatewaySettings(
            port=0,
            grpc_port=0,
            drain_timeout_s=1.0,
            max_header_bytes=MAX_HEADER_BYTES,
            max_messages=3,
            header_timeout_s=TIMEOUT_S,
            body_timeout_s=TIMEOUT_S,
        ),
        sim=SimSettings(workers=1, speedup=10.0),
    )
    async with own_app(config) as running:
        yield running


async def _raw(app: App, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `data` on a fresh connection; the status, headers and body of the answer."""
    raw = await send_raw(app.http_port, data)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def _request(body: bytes, *extra: str) -> bytes:
    lines = [
        "POST /v1/chat/completions HTTP/1.1",
        "Host: 127.0.0.1",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _chat(app: App, messages: int) -> bytes:
    return json.dumps(
        {
            "model": app.model.model_id,  # type: ignore[union-attr]
            "messages": [{"role": "user", "content": "hi"}] * messages,
            "max_tokens": 2,
        }
    ).encode()


def _error(message: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    }


async def test_more_messages_than_allowed_is_400(app: App) -> None:
    """Four messages against a limit of three get 400 naming `messages`; three are served."""
    status, _, body = await _raw(app, _request(_chat(app, 4)))
    assert status == 400
    assert json.loads(body) == _error(
        "Invalid value for 'messages': at most 3 messages are allowed, got 4.",
        "invalid_value",
        "messages",
    )
    status, _, _ = await _raw(app, _request(_chat(app, 3)))
    assert status == 200


async def test_headers_over_the_limit_are_431(app: App) -> None:
    """Request line plus header lines above 2 KiB get 431 (the same body as a head the parser
    refuses); a head within the limit is served."""
    body = _chat(app, 1)
    request = _request(body, "X-Pad: " + "a" * 2000)
    assert len(request.split(b"\r\n\r\n")[0]) + 2 > MAX_HEADER_BYTES  # lines with CRLFs
    status, headers, raw = await _raw(app, request)
    assert status == 431
    assert headers["content-type"].startswith("application/json")
    assert json.loads(raw) == _error(
        f"The request headers are too large (limit {MAX_HEADER_BYTES} bytes).",
        "request_header_fields_too_large",
    )
    status, _, _ = await _raw(app, _request(body, "X-Pad: " + "a" * 1500))
    assert status == 200


async def test_header_line_past_the_limit_is_refused_by_the_parser_with_431(app: App) -> None:
    """A single line past the header limit is refused by the HTTP parser before any handler
    runs, with our JSON 431 (homing.gateway.http_server) and the connection closed."""
    status, headers, raw = await _raw(app, _request(_chat(app, 1), "X-Pad: " + "a" * 9000))
    assert status == 431
    assert headers["content-type"].startswith("application/json")
    assert headers["connection"] == "close"
    assert json.loads(raw) == _error(
        f"The request headers are too large (limit {MAX_HEADER_BYTES} bytes).",
        "request_header_fields_too_large",
    )


async def test_slow_request_head_is_cut_off(app: App) -> None:
    """A client trickling its request head (one byte every 50 ms) is disconnected once the
    header timeout passes, although it never stops sending."""
    reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
    started = time.monotonic()
    closed_after: float | None = None
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        for _ in range(100):  # at most 5 s
            writer.write(b"X")
            try:
                await writer.drain()
            except ConnectionError:
                closed_after = time.monotonic() - started
                break
            try:
                data = await asyncio.wait_for(reader.read(1), 0.05)
            except TimeoutError:
                continue
            if data == b"":
                closed_after = time.monotonic() - started
                break
    finally:
        writer.close()
    assert closed_after is not None, "the slow client kept its connection"
    assert TIMEOUT_S <= closed_after < TIMEOUT_S + 1.0


async def test_idle_connection_is_closed(app: App) -> None:
    """A connection that sends nothing is closed after the header timeout."""
    reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
    started = time.monotonic()
    try:
        assert await asyncio.wait_for(reader.read(), 5) == b""
    finally:
        writer.close()
    assert TIMEOUT_S <= time.monotonic() - started < TIMEOUT_S + 1.0


async def test_slow_body_is_408(app: App) -> None:
    """A body that stops arriving gets 408 `request_timeout` after the body timeout, and
    the connection is closed after at most the short lingering period."""
    body = _chat(app, 1)
    reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
    started = time.monotonic()
    try:
        writer.write(_request(body)[: -len(body) + 10])  # the head and 10 body bytes
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        answered = time.monotonic() - started
        length = int(next(h for h in head.split(b"\r\n") if h.startswith(b"Content-Length:"))[15:])
        payload = await reader.readexactly(length)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        closed = time.monotonic() - started
    finally:
        writer.close()
    assert TIMEOUT_S <= answered < TIMEOUT_S + 1.0
    assert closed < TIMEOUT_S + LINGERING_S + 1.0
    assert head.startswith(b"HTTP/1.1 408 ")
    assert json.loads(payload) == _error(
        f"The request body was not received within {TIMEOUT_S:g} s.", "request_timeout"
    )


async def test_grpc_metadata_over_the_limit_is_refused(app: App) -> None:
    """gRPC metadata larger than the header limit is refused before the handler runs."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        stub = pb_grpc.InferenceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ListModels(pb.ListModelsRequest(), metadata=(("x-pad", "a" * 4000),))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        listed = await stub.ListModels(pb.ListModelsRequest(), metadata=(("x-pad", "a" * 500),))
        assert len(listed.models) == 1
