"""Bytes that are not text, JSON that is not RFC 8259's, and bodies that do not match their
Content-Encoding, over a real socket: every string a request carries to the tokenizer, the
router's session hash, the log line or a gRPC trailer is valid Unicode, and every number is
finite, or the request is refused with a 4xx (never a 5xx); gzip and deflate bodies are served
only when whole, and bounded by the body limit after decoding. After every test the gateway is
ready and no worker is marked unhealthy."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import zlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio
from helpers import assert_ready_and_healthy, own_app

from homing.app import App
from homing.config import GatewaySettings, HomingConfig, SimSettings, TenantSettings
from homing.gateway.auth import hash_key
from homing.v1 import inference_pb2 as pb

pytestmark = pytest.mark.asyncio(loop_scope="module")

KEY = "sk-encoding"
MAX_BODY_BYTES = 64 * 1024


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app() -> AsyncIterator[App]:
    """A gateway with one API key over one simulated worker and a 64 KiB body limit."""
    tenant = TenantSettings.model_validate(
        {"name": "enc", "keys": [{"id": "enc-1", "sha256": hash_key(KEY)}]}
    )
    config = HomingConfig(
        gateway=GatewaySettings(
            port=0, grpc_port=0, drain_timeout_s=1.0, max_body_bytes=MAX_BODY_BYTES
        ),
        sim=SimSettings(workers=1, speedup=10.0),
        tenants=[tenant],
    )
    async with own_app(config) as running:
        yield running


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def _stays_ready(app: App) -> AsyncIterator[None]:
    """After each test `/ready` is 200 and every worker is healthy with no failure counted."""
    yield
    await assert_ready_and_healthy(app)


async def _send(
    app: App, body: bytes, *headers: bytes, path: bytes = b"/v1/chat/completions"
) -> tuple[int, dict[str, str], Any]:
    """POST `body` with raw header lines on a fresh connection; status, headers, JSON."""
    lines = [
        b"POST " + path + b" HTTP/1.1",
        b"Host: 127.0.0.1",
        b"Content-Type: application/json",
        b"Content-Length: %d" % len(body),
        b"Connection: close",
        *headers,
    ]
    if not any(h.lower().startswith(b"authorization:") for h in headers):
        lines.append(b"Authorization: Bearer " + KEY.encode())
    reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
    try:
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 5)  # until the server closes
    finally:
        writer.close()
    head, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    response_headers = {k.lower(): v for k, v in (h.split(": ", 1) for h in header_lines)}
    return int(status_line.split()[1]), response_headers, json.loads(rest)


def _chat(app: App, **fields: Any) -> dict[str, Any]:
    model = app.model.model_id  # type: ignore[union-attr]
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return {**body, **fields}


def _error(message: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    }


MARK = "QQQ"  # replaced by the bytes under test after encoding
FIELDS = {
    "content": {"messages": [{"role": "user", "content": MARK}]},
    "role": {"messages": [{"role": MARK, "content": "hi"}]},
    "stop": {"stop": [MARK]},
    "user": {"user": MARK},
    "model": {"model": MARK},
}
NOT_UTF8 = {
    "byte_ff": (b"\xff", "invalid start byte"),
    "encoded_lone_surrogate": (b"\xed\xa0\x80", "invalid continuation byte"),
    "overlong_slash": (b"\xc0\xaf", "invalid start byte"),
    "truncated_sequence": (b"\xe2\x82", "invalid continuation byte"),
}


@pytest.mark.parametrize("field", sorted(FIELDS))
@pytest.mark.parametrize("kind", sorted(NOT_UTF8))
async def test_body_bytes_that_are_not_utf8_are_400(app: App, field: str, kind: str) -> None:
    """Raw bytes that are not UTF-8 in any string field get 400 `invalid_json` naming the
    byte, before anything reads the field."""
    bad, reason = NOT_UTF8[kind]
    body = json.dumps(_chat(app, **FIELDS[field])).encode().replace(MARK.encode(), bad)
    status, _, reply = await _send(app, body)
    assert status == 400
    assert reply == _error(
        f"The request body is not valid UTF-8 (byte {body.index(bad)}: {reason}).", "invalid_json"
    )


@pytest.mark.parametrize("field", sorted(FIELDS))
async def test_escaped_lone_surrogate_in_any_field_is_400(app: App, field: str) -> None:
    """A JSON escape of a lone surrogate (`\\ud800`) in any string field gets 400."""
    body = json.dumps(_chat(app, **FIELDS[field])).encode().replace(MARK.encode(), b"\\ud800")
    status, _, reply = await _send(app, body)
    assert status == 400
    assert reply == _error(
        "The request body contains an unpaired UTF-16 surrogate escape.", "invalid_json"
    )


SCHEMA_WITH = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"maximum": MARK}}}
HUGE_NUMBER = "1" + "0" * 400 + ".5"


@pytest.mark.parametrize(
    ("fields", "text", "reason"),
    [
        ({"temperature": MARK}, "NaN", "NaN is not a JSON value"),
        ({"response_format": SCHEMA_WITH}, "NaN", "NaN is not a JSON value"),
        ({"response_format": SCHEMA_WITH}, "Infinity", "Infinity is not a JSON value"),
        ({"logit_bias": {"5": MARK}}, "-Infinity", "-Infinity is not a JSON value"),
        ({"response_format": SCHEMA_WITH}, "1e999", "the number 1e999 is out of range"),
        (
            {"response_format": SCHEMA_WITH},
            HUGE_NUMBER,
            f"the number {HUGE_NUMBER[:64]}... is out of range",
        ),
    ],
)
async def test_numbers_that_are_not_json_are_400(
    app: App, fields: dict[str, Any], text: str, reason: str
) -> None:
    """`NaN`, `Infinity`, `-Infinity` (which Python's json takes) and a number beyond a double
    (which it makes `inf`) get 400 `invalid_json`, in a schema that would reach the engine as
    text too."""
    body = json.dumps(_chat(app, **fields)).encode().replace(f'"{MARK}"'.encode(), text.encode())
    status, _, reply = await _send(app, body)
    assert status == 400
    assert reply == _error(f"The request body is not valid JSON: {reason}", "invalid_json")


async def test_prompt_bytes_that_are_not_utf8_are_400(app: App) -> None:
    """The completions prompt is checked the same way."""
    model = app.model.model_id  # type: ignore[union-attr]
    body = json.dumps({"model": model, "prompt": MARK, "max_tokens": 2}).encode()
    body = body.replace(MARK.encode(), b"\xed\xb0\x80")
    at = body.index(b"\xed")
    status, _, reply = await _send(app, body, path=b"/v1/completions")
    assert status == 400
    assert reply == _error(
        f"The request body is not valid UTF-8 (byte {at}: invalid continuation byte).",
        "invalid_json",
    )


async def test_valid_non_ascii_text_in_every_field_is_served(app: App) -> None:
    """UTF-8 text beyond ASCII, paired surrogate escapes and a UTF-8 session id are served."""
    text = f"héllo \u4e16\u754c \U0001f600 {MARK}"
    body = json.dumps(
        _chat(app, messages=[{"role": "user", "content": text}], stop=["\u00e9\u00e9"], user=text),
        ensure_ascii=False,
    ).encode()
    body = body.replace(MARK.encode(), b"\\ud83d\\ude00")  # a pair, as JSON escapes
    assert body.count(b"\\ud83d\\ude00") == 2
    status, headers, reply = await _send(app, body, "x-session-id: sess-é-1".encode())
    assert status == 200, reply
    assert reply["object"] == "chat.completion"
    assert headers["x-homing-worker"] == "w0"


async def test_session_id_that_is_not_utf8_is_400(app: App) -> None:
    """An `x-session-id` of raw bytes that are not UTF-8 gets 400 naming the header (it would
    reach the router's hash and the log line as undecodable text)."""
    body = json.dumps(_chat(app)).encode()
    for bad in (b"\xff\xfe", b"s-\xed\xa0\x80"):
        status, _, reply = await _send(app, body, b"x-session-id: " + bad)
        assert status == 400
        assert reply == _error(
            "The x-session-id header is not valid UTF-8.", "invalid_header_value", "x-session-id"
        )


async def test_request_id_that_is_not_utf8_is_replaced(app: App) -> None:
    """An `x-request-id` of bytes that are not UTF-8 is not echoed: the request is served
    under a new id."""
    body = json.dumps(_chat(app)).encode()
    status, headers, reply = await _send(app, body, b"x-request-id: r-\xff\xed\xa0\x80")
    assert status == 200
    assert len(headers["x-request-id"]) == 32
    assert reply["id"] == "chatcmpl-" + headers["x-request-id"]


async def test_api_key_that_is_not_utf8_is_401(app: App) -> None:
    """An Authorization header of bytes that are not UTF-8 is an incorrect key (401)."""
    body = json.dumps(_chat(app)).encode()
    status, _, reply = await _send(app, body, b"Authorization: Bearer sk-\xff\xed\xa0\x80")
    assert status == 401
    assert reply == _error("Incorrect API key provided.", "invalid_api_key")


@pytest.mark.parametrize("coding", ["gzip", "deflate", "GZIP"])
async def test_body_that_does_not_match_its_content_encoding_is_400(app: App, coding: str) -> None:
    """A plain body labelled gzip or deflate gets 400 `invalid_content_encoding`, and the
    connection is closed."""
    body = json.dumps(_chat(app)).encode()
    status, headers, reply = await _send(app, body, f"Content-Encoding: {coding}".encode())
    assert status == 400
    assert reply == _error(
        "The request body does not decode as its Content-Encoding.", "invalid_content_encoding"
    )
    assert headers["connection"] == "close"


@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "x-gzip", "gzip, gzip", "bogus"])
async def test_content_encoding_we_do_not_serve_is_415(app: App, coding: str) -> None:
    """A Content-Encoding other than gzip or deflate gets 415 with `Accept-Encoding` naming
    the ones served (RFC 9110 15.5.16), never a body read as if plain."""
    body = json.dumps(_chat(app)).encode()
    status, headers, reply = await _send(app, body, f"Content-Encoding: {coding}".encode())
    assert status == 415
    assert reply == _error(
        "The request's Content-Encoding is not supported; send the body as it is, or as gzip"
        " or deflate.",
        "unsupported_content_encoding",
    )
    assert headers["accept-encoding"] == "gzip, deflate"
    assert headers["connection"] == "close"


def _raw_deflate(data: bytes) -> bytes:
    return zlib.compress(data, wbits=-zlib.MAX_WBITS)


@pytest.mark.parametrize(
    ("coding", "compress"),
    [("gzip", gzip.compress), ("deflate", zlib.compress), ("deflate", _raw_deflate)],
    ids=["gzip", "deflate", "raw_deflate"],
)
async def test_compressed_body_is_served(app: App, coding: str, compress: Any) -> None:
    """A gzip or deflate body (zlib's format, or raw as some clients send it) is decoded and
    served."""
    body = compress(json.dumps(_chat(app)).encode())
    status, _, reply = await _send(app, body, f"Content-Encoding: {coding}".encode())
    assert status == 200
    assert reply["object"] == "chat.completion"


GZIPPED = gzip.compress(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
DEFLATED = zlib.compress(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
CUT: dict[str, tuple[str, bytes]] = {
    "gzip_without_its_trailer": ("gzip", GZIPPED[:-8]),
    "gzip_one_byte_short": ("gzip", GZIPPED[:-1]),
    "gzip_cut_mid_stream": ("gzip", GZIPPED[: len(GZIPPED) // 2]),
    "gzip_header_only": ("gzip", GZIPPED[:10]),
    "gzip_then_garbage": ("gzip", GZIPPED + b"trailing"),
    "gzip_second_member": ("gzip", GZIPPED + GZIPPED),
    "deflate_without_its_checksum": ("deflate", DEFLATED[:-4]),
    "deflate_cut_mid_stream": ("deflate", DEFLATED[: len(DEFLATED) // 2]),
    "empty_gzip_body": ("gzip", b""),
}


@pytest.mark.parametrize("name", sorted(CUT))
async def test_compressed_body_cut_short_or_with_bytes_after_it_is_400(app: App, name: str) -> None:
    """A gzip or deflate stream that is cut short (no trailer, mid-stream), empty, or followed
    by more bytes gets 400 `invalid_content_encoding` and the connection is closed, never a
    body read as whatever part decoded."""
    coding, body = CUT[name]
    status, headers, reply = await _send(app, body, f"Content-Encoding: {coding}".encode())
    assert status == 400
    assert reply == _error(
        "The request body does not decode as its Content-Encoding.", "invalid_content_encoding"
    )
    assert headers["connection"] == "close"


async def test_decompression_bomb_is_413_on_the_decoded_size(app: App) -> None:
    """16 MiB of zeros gzipped to a few KiB is refused with 413 once the decoded body passes
    the limit, quickly and without decoding the rest."""
    bomb = gzip.compress(b" " * (16 * 1024 * 1024), compresslevel=9)
    assert len(bomb) < MAX_BODY_BYTES
    started = time.monotonic()
    status, headers, reply = await _send(app, bomb, b"Content-Encoding: gzip")
    assert time.monotonic() - started < 2.0
    assert status == 413
    assert reply == _error(
        f"The request body is too large (limit {MAX_BODY_BYTES} bytes).", "request_too_large"
    )
    assert headers["connection"] == "close"


# -- gRPC: a string field that is not UTF-8 fails protobuf parsing --

UNDECODABLE = (
    "The request message could not be decoded: it is not valid protobuf for this method,"
    " or a string field in it is not valid UTF-8."
)


def _grpc_chat(app: App, **fields: Any) -> pb.ChatCompletionRequest:
    model = app.model.model_id  # type: ignore[union-attr]
    request = pb.ChatCompletionRequest(
        model=model,
        messages=[pb.ChatMessage(role="user", content="hi")],
        sampling=pb.SamplingOptions(max_tokens=2),
    )
    for name, value in fields.items():
        if name == "stop":
            request.sampling.stop.append(value)
        elif name == "content":
            request.messages[0].content = value
        elif name == "role":
            request.messages[0].role = value
        else:
            setattr(request, name, value)
    return request


async def _grpc_call(app: App, method: str, payload: bytes) -> grpc.aio.AioRpcError | list[Any]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        call = channel.unary_stream(
            f"/homing.v1.Inference/{method}",
            request_serializer=lambda raw: raw,
            response_deserializer=pb.CompletionChunk.FromString,
        )
        try:
            return [
                chunk
                async for chunk in call(payload, metadata=(("authorization", f"Bearer {KEY}"),))
            ]
        except grpc.aio.AioRpcError as err:
            return err


def _assert_undecodable(outcome: grpc.aio.AioRpcError | list[Any]) -> None:
    assert isinstance(outcome, grpc.aio.AioRpcError)
    assert outcome.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert outcome.details() == UNDECODABLE
    trailing = dict(outcome.trailing_metadata() or ())
    assert json.loads(trailing["x-error-json"]) == _error(UNDECODABLE, "invalid_message")
    assert len(trailing["x-request-id"]) == 32


@pytest.mark.parametrize("field", ["content", "role", "stop", "user", "model"])
@pytest.mark.parametrize("bad", [b"\xff\xfe\xfd", b"\xed\xa0\x80"], ids=["byte_ff", "cesu"])
async def test_grpc_string_field_that_is_not_utf8_is_invalid_argument(
    app: App, field: str, bad: bytes
) -> None:
    """Bytes that are not UTF-8 in any string field of a ChatCompletion get INVALID_ARGUMENT
    with the error JSON trailer (grpc answered UNKNOWN with protobuf's exception text)."""
    payload = _grpc_chat(app, **{field: MARK}).SerializeToString().replace(MARK.encode(), bad)
    _assert_undecodable(await _grpc_call(app, "ChatCompletion", payload))


async def test_grpc_completion_text_and_garbage_are_invalid_argument(app: App) -> None:
    """A Completion whose prompt text is not UTF-8, and a message that is not protobuf at all,
    get INVALID_ARGUMENT; a well-formed call on the same server is then served."""
    model = app.model.model_id  # type: ignore[union-attr]
    request = pb.CompletionRequest(
        model=model, text=MARK, sampling=pb.SamplingOptions(max_tokens=2)
    )
    payload = request.SerializeToString().replace(MARK.encode(), b"\xc0\xaf\xff")
    _assert_undecodable(await _grpc_call(app, "Completion", payload))
    _assert_undecodable(await _grpc_call(app, "ChatCompletion", b"\xff\xff\xff\xff"))
    served = await _grpc_call(app, "ChatCompletion", _grpc_chat(app).SerializeToString())
    assert isinstance(served, list) and served[-1].usage.completion_tokens == 2


async def test_grpc_list_models_garbage_is_invalid_argument(app: App) -> None:
    """ListModels with a message that does not parse gets INVALID_ARGUMENT too."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        call = channel.unary_unary(
            "/homing.v1.Inference/ListModels",
            request_serializer=lambda raw: raw,
            response_deserializer=pb.ListModelsResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(b"\x0a\xff\xff\xff\xff\x0f", metadata=(("authorization", f"Bearer {KEY}"),))
    _assert_undecodable(caught.value)


# -- gRPC: a message over the body limit gets our error, as on HTTP --

TOO_LARGE_MESSAGE = f"The request message is too large (limit {MAX_BODY_BYTES} bytes)."


def _padded(message: bytes, size: int) -> bytes:
    """`message` with an unknown length-delimited field (number 1000) appended so that the
    whole is `size` bytes; protobuf keeps unknown fields, so it parses as `message`."""
    tag = b"\xd2\x3e"  # varint of (1000 << 3) | 2
    for length_bytes in range(1, 6):
        pad = size - len(message) - len(tag) - length_bytes
        length, varint = pad, b""
        while True:
            varint += bytes([(length & 0x7F) | (0x80 if length > 0x7F else 0)])
            length >>= 7
            if not length:
                break
        if len(varint) == length_bytes:
            padded = message + tag + varint + b"p" * pad
            assert len(padded) == size
            return padded
    raise ValueError(size)


async def _list_models(
    app: App, payload: bytes, compression: grpc.Compression | None = None
) -> pb.ListModelsResponse | grpc.aio.AioRpcError:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        call = channel.unary_unary(
            "/homing.v1.Inference/ListModels",
            request_serializer=lambda raw: raw,
            response_deserializer=pb.ListModelsResponse.FromString,
        )
        try:
            return await call(
                payload, metadata=(("authorization", f"Bearer {KEY}"),), compression=compression
            )
        except grpc.aio.AioRpcError as err:
            return err


def _assert_too_large(outcome: Any) -> None:
    assert isinstance(outcome, grpc.aio.AioRpcError)
    assert outcome.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert outcome.details() == TOO_LARGE_MESSAGE
    trailing = dict(outcome.trailing_metadata() or ())
    assert json.loads(trailing["x-error-json"]) == _error(TOO_LARGE_MESSAGE, "request_too_large")
    assert len(trailing["x-request-id"]) == 32


async def test_grpc_message_over_the_body_limit_is_invalid_argument_with_error_json(
    app: App,
) -> None:
    """A ChatCompletion or ListModels message one byte over `max_body_bytes` (gzipped too:
    the size is the decompressed one) gets INVALID_ARGUMENT with `request_too_large` in
    `x-error-json` (gRPC core answered RESOURCE_EXHAUSTED with its own text); one of exactly
    the limit is served."""
    chat = _grpc_chat(app).SerializeToString()
    _assert_too_large(await _grpc_call(app, "ChatCompletion", _padded(chat, MAX_BODY_BYTES + 1)))
    _assert_too_large(await _list_models(app, _padded(b"", MAX_BODY_BYTES + 1)))
    gzipped = await _list_models(app, _padded(b"", MAX_BODY_BYTES + 1), grpc.Compression.Gzip)
    _assert_too_large(gzipped)
    served = await _grpc_call(app, "ChatCompletion", _padded(chat, MAX_BODY_BYTES))
    assert isinstance(served, list) and served[-1].usage.completion_tokens == 2
    listed = await _list_models(app, _padded(b"", MAX_BODY_BYTES))
    assert isinstance(listed, pb.ListModelsResponse) and len(listed.models) == 1


async def test_grpc_message_over_twice_the_body_limit_is_refused_by_grpc_core(app: App) -> None:
    """A message over twice `max_body_bytes` is refused by gRPC core, unread, with
    RESOURCE_EXHAUSTED and no `x-error-json` (as the README's limits table says)."""
    outcome = await _list_models(app, _padded(b"", 2 * MAX_BODY_BYTES + 1))
    assert isinstance(outcome, grpc.aio.AioRpcError)
    assert outcome.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "x-error-json" not in dict(outcome.trailing_metadata() or ())
