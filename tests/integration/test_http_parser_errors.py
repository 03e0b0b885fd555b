"""Malformed HTTP over a real socket: whatever aiohttp's parser refuses (request line, header
and trailer floods, framing, control characters, Host, Expect), and what it would let through
(a Transfer-Encoding other than chunked, a second Expect), is answered with our JSON error body
and the right status, and the connection is closed; requests sent before such junk on the same
connection are answered first; a body over the limit is refused from its Content-Length before
it is read. None of it touches a worker's health (checked after every
test)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from helpers import assert_ready_and_healthy, own_app, send_raw

from homing.app import App
from homing.config import GatewaySettings, HomingConfig, SimSettings
from homing.gateway.http import LINGERING_S

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_HEADER_BYTES = 4096
MAX_HEADER_COUNT = 20
MAX_BODY_BYTES = 64 * 1024
BODY_TIMEOUT_S = 30.0  # long: a refusal that came from it would show in the timings


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app() -> AsyncIterator[App]:
    """A gateway over one simulated worker with 4 KiB of headers in at most 20 lines and a
    64 KiB body limit."""
    config = HomingConfig(
        gateway=GatewaySettings(
            port=0,
            grpc_port=0,
            drain_timeout_s=1.0,
            max_header_bytes=MAX_HEADER_BYTES,
            max_header_count=MAX_HEADER_COUNT,
            max_body_bytes=MAX_BODY_BYTES,
            header_timeout_s=5.0,
            body_timeout_s=BODY_TIMEOUT_S,
        ),
        sim=SimSettings(workers=1, speedup=10.0),
    )
    async with own_app(config) as running:
        yield running


@pytest_asyncio.fixture(autouse=True, loop_scope="module")
async def _stays_ready(app: App) -> AsyncIterator[None]:
    """After each test `/ready` is 200 and every worker is healthy with no failure counted."""
    yield
    await assert_ready_and_healthy(app)


@dataclass
class Reply:
    """One HTTP response read off a connection the server then closed."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _parse_all(raw: bytes) -> list[Reply]:
    """The responses in `raw`, one after the other (each with a Content-Length)."""
    replies = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
        length = int(headers["content-length"])
        assert len(rest) >= length, "a response was cut short"
        replies.append(Reply(int(lines[0].split()[1]), headers, rest[:length]))
        raw = rest[length:]
    return replies


def _parse(raw: bytes) -> Reply:
    (reply,) = _parse_all(raw)  # the server sent exactly one response
    return reply


async def _send(app: App, data: bytes) -> Reply:
    """Send `data` on a fresh connection; the answer, read until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
    try:
        writer.write(data)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 5)  # returns at EOF: the server closed
    finally:
        writer.close()
    return _parse(raw)


def _head(*lines: str, start: str = "POST /v1/chat/completions HTTP/1.1") -> bytes:
    return ("\r\n".join([start, *lines]) + "\r\n\r\n").encode("latin-1")


def _chat(app: App) -> bytes:
    model = app.model.model_id  # type: ignore[union-attr]
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return json.dumps(body).encode()


def _error(message: str, code: str) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    }


H = "Host: 127.0.0.1"
JSON = "Content-Type: application/json"
TOO_LARGE_HEAD = _error(
    f"The request headers are too large (limit {MAX_HEADER_BYTES} bytes).",
    "request_header_fields_too_large",
)
REQUEST_LINE = _error(
    "The request line is not valid HTTP/1.1 (method, URL, version).", "invalid_request_line"
)
BAD_HEADER = _error(
    "A request header line is malformed or holds a control character.", "invalid_header"
)
BAD_LENGTH = _error("The Content-Length header is malformed or repeated.", "invalid_content_length")
BAD_CHUNKS = _error("The chunked request body is malformed.", "invalid_chunked_body")
BAD_TRANSFER_ENCODING = _error(
    "The Transfer-Encoding header is not supported or malformed.", "invalid_transfer_encoding"
)
TOO_MANY_LINES = _error(
    f"The request has more than {MAX_HEADER_COUNT} header lines.", "too_many_headers"
)
EXPECTATION_FAILED = _error("Only 'Expect: 100-continue' is supported.", "expectation_failed")
CHUNKED = _head(H, JSON, "Transfer-Encoding: chunked")
TRAILER_FLOOD = b"2\r\n{}\r\n0\r\n" + b"X-Trailer: v\r\n" * 200 + b"\r\n"

# name -> (request, status, body)
MALFORMED: dict[str, tuple[bytes, int, dict[str, Any]]] = {
    "url_too_long": (
        _head(H, start=f"GET /v1/models?{'q' * 5000} HTTP/1.1"),
        414,
        _error(f"The request line is too long (limit {MAX_HEADER_BYTES} bytes).", "uri_too_long"),
    ),
    "header_line_too_long": (_head(H, "X-Pad: " + "p" * 5000), 431, TOO_LARGE_HEAD),
    "unfinished_head_too_large": (
        _head(H, *[f"X-Pad-{i}: {'p' * 500}" for i in range(9)])[:-2],
        431,
        TOO_LARGE_HEAD,
    ),
    "header_flood": (_head(H, *[f"X-{i}: v" for i in range(200)]), 431, TOO_MANY_LINES),
    "one_header_line_too_many": (
        _head(H, *[f"X-{i}: v" for i in range(MAX_HEADER_COUNT)], start="GET /v1/models HTTP/1.1"),
        431,
        TOO_MANY_LINES,
    ),
    "trailer_flood": (CHUNKED + TRAILER_FLOOD, 431, TOO_MANY_LINES),
    "trailer_line_too_long": (
        CHUNKED + b"0\r\nX-Trailer: " + b"p" * 5000 + b"\r\n\r\n",
        431,
        TOO_LARGE_HEAD,
    ),
    "conflicting_content_lengths": (
        _head(H, JSON, "Content-Length: 2", "Content-Length: 3") + b"{}",
        400,
        BAD_LENGTH,
    ),
    "non_numeric_content_length": (_head(H, JSON, "Content-Length: 2x") + b"{}", 400, BAD_LENGTH),
    "content_length_and_chunked": (
        _head(H, JSON, "Content-Length: 5", "Transfer-Encoding: chunked") + b"0\r\n\r\n",
        400,
        _error(
            "The request has both Transfer-Encoding and Content-Length.", "ambiguous_body_length"
        ),
    ),
    "unknown_transfer_encoding": (
        _head(H, JSON, "Transfer-Encoding: compress"),
        400,
        BAD_TRANSFER_ENCODING,
    ),
    "coding_before_chunked": (
        _head(H, JSON, "Transfer-Encoding: gzip, chunked") + b"0\r\n\r\n",
        400,
        BAD_TRANSFER_ENCODING,
    ),
    "identity_before_chunked": (
        _head(H, JSON, "Transfer-Encoding: identity, chunked") + b"0\r\n\r\n",
        400,
        BAD_TRANSFER_ENCODING,
    ),
    "bad_chunk_size": (CHUNKED + b"zz\r\n{}\r\n0\r\n\r\n", 400, BAD_CHUNKS),
    "chunk_longer_than_its_size": (CHUNKED + b"2\r\n{}}\r\n0\r\n\r\n", 400, BAD_CHUNKS),
    "control_character_in_header": (_head(H, "X-Note: a\x01b"), 400, BAD_HEADER),
    "nul_in_header": (_head(H, "X-Note: a\x00b"), 400, BAD_HEADER),
    "bare_cr_in_header": (_head(H, "X-Note: a\rb"), 400, BAD_HEADER),
    "obsolete_line_folding": (_head(H, "X-Note: a", " b"), 400, BAD_HEADER),
    "space_in_header_name": (_head(H, "X Note: a"), 400, BAD_HEADER),
    "missing_host": (
        _head(JSON, "Content-Length: 2") + b"{}",
        400,
        _error("An HTTP/1.1 request must have a Host header.", "missing_host"),
    ),
    "bad_method": (_head(H, start="G{T /v1/models HTTP/1.1"), 400, REQUEST_LINE),
    "bad_http_version": (_head(H, start="GET /v1/models HTTP/7.0"), 400, REQUEST_LINE),
    "no_http_version": (b"GET /health\r\n\r\n", 400, REQUEST_LINE),  # HTTP/0.9's form
    "no_http_version_with_headers": (_head(H, start="GET /health"), 400, REQUEST_LINE),
    "tls_on_the_plain_port": (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400, REQUEST_LINE),
    "unsupported_expectation": (
        _head(H, JSON, "Expect: 200-ok", "Content-Length: 2") + b"{}",
        417,
        EXPECTATION_FAILED,
    ),
    "second_expectation_after_continue": (
        _head(H, JSON, "Expect: 100-continue", "Expect: foo", "Content-Length: 2") + b"{}",
        417,
        EXPECTATION_FAILED,
    ),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
async def test_malformed_request_gets_json_error_and_closed_connection(app: App, name: str) -> None:
    """Each malformed request gets its exact status and JSON body with `Connection: close`,
    and the server closes the connection after it."""
    request, status, body = MALFORMED[name]
    reply = await _send(app, request)
    assert (reply.status, reply.json()) == (status, body)
    assert reply.headers["content-type"] == "application/json; charset=utf-8"
    assert reply.headers["connection"] == "close"
    assert len(reply.headers["x-request-id"]) == 32


HEALTH = _head(H, start="GET /health HTTP/1.1")
# name -> (the valid requests, the junk sent after them in the same segment, junk's answer)
JUNK_AFTER_REQUESTS: dict[str, tuple[list[bytes], bytes, int, dict[str, Any]]] = {
    "garbage_line": ([HEALTH], b"GARBAGE\r\n\r\n", 400, REQUEST_LINE),
    "three_requests_then_garbage": ([HEALTH] * 3, b"GARBAGE\r\n\r\n", 400, REQUEST_LINE),
    "no_http_version": ([HEALTH, HEALTH], b"GET /health\r\n\r\n", 400, REQUEST_LINE),
    "unsupported_expectation": (
        [HEALTH],
        _head(H, JSON, "Expect: 200-ok", "Content-Length: 2") + b"{}",
        417,
        EXPECTATION_FAILED,
    ),
}


@pytest.mark.parametrize("name", sorted(JUNK_AFTER_REQUESTS))
async def test_requests_before_junk_in_one_segment_are_answered_first(app: App, name: str) -> None:
    """Valid requests followed by junk in one write each get their answer, kept alive; then
    the junk gets its JSON error with `Connection: close`, and the server closes."""
    requests, junk, status, body = JUNK_AFTER_REQUESTS[name]
    reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
    try:
        writer.write(b"".join(requests) + junk)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 5)  # returns at EOF: the server closed
    finally:
        writer.close()
    *answers, refusal = _parse_all(raw)
    assert [(a.status, a.json()) for a in answers] == [(200, {"status": "ok"})] * len(requests)
    assert all("connection" not in a.headers for a in answers)
    assert (refusal.status, refusal.json()) == (status, body)
    assert refusal.headers["connection"] == "close"


async def test_body_longer_than_its_content_length_answers_the_request_then_400(
    app: App,
) -> None:
    """A completion whose bytes run past its Content-Length is served; the bytes left over
    are taken as a next request and refused with 400 `invalid_request_line`."""
    body = _chat(app)
    request = _head(H, JSON, f"Content-Length: {len(body)}") + body + b"}\r\n\r\n"
    raw = await send_raw(app.http_port, request)
    served, refused = _parse_all(raw)
    assert served.status == 200
    assert served.json()["object"] == "chat.completion"
    assert (refused.status, refused.json()) == (400, REQUEST_LINE)
    assert refused.headers["connection"] == "close"


async def test_content_length_over_the_limit_is_413_before_the_body(app: App) -> None:
    """A Content-Length over the body limit is refused at once, with none of the body sent,
    and the connection is closed within the lingering time."""
    reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
    started = time.monotonic()
    try:
        writer.write(_head(H, JSON, f"Content-Length: {MAX_BODY_BYTES + 1}"))
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 5)
        closed = time.monotonic() - started
    finally:
        writer.close()
    reply = _parse(raw)
    assert closed < LINGERING_S + 1.0 < BODY_TIMEOUT_S
    assert (reply.status, reply.json()) == (
        413,
        _error(
            f"The request body is too large (limit {MAX_BODY_BYTES} bytes).", "request_too_large"
        ),
    )
    assert reply.headers["connection"] == "close"


async def test_expect_continue_over_the_limit_is_413_without_continue(app: App) -> None:
    """`Expect: 100-continue` with a Content-Length over the limit gets the 413 instead of
    `100 Continue`, so the client never sends the body."""
    head = _head(H, JSON, "Expect: 100-continue", f"Content-Length: {MAX_BODY_BYTES + 1}")
    reply = await _send(app, head)
    assert (reply.status, reply.json()["error"]["code"]) == (413, "request_too_large")
    assert reply.headers["connection"] == "close"


async def test_expect_continue_within_the_limit_is_served(app: App) -> None:
    """`Expect: 100-continue` within the limit gets `100 Continue`, then the completion."""
    body = _chat(app)
    head = _head(
        H, JSON, "Expect: 100-continue", f"Content-Length: {len(body)}", "Connection: close"
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
    try:
        writer.write(head)
        await writer.drain()
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.write(body)
        await writer.drain()
        reply = _parse(await asyncio.wait_for(reader.read(), 5))
    finally:
        writer.close()
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert reply.status == 200
    assert reply.json()["object"] == "chat.completion"


async def test_chunked_body_growing_past_the_limit_is_413(app: App) -> None:
    """A chunked body (no Content-Length) is cut off with 413 once it passes the limit."""
    chunk = b"%x\r\n%s\r\n" % (16 * 1024, b" " * 16 * 1024)
    reply = await _send(app, CHUNKED + chunk * 5 + b"0\r\n\r\n")
    assert (reply.status, reply.json()) == (
        413,
        _error(
            f"The request body is too large (limit {MAX_BODY_BYTES} bytes).", "request_too_large"
        ),
    )
    assert reply.headers["connection"] == "close"


@pytest.mark.parametrize(
    ("body", "status", "expected"),
    [(b"1\r\n{\r\nzz\r\n", 400, BAD_CHUNKS), (TRAILER_FLOOD, 431, TOO_MANY_LINES)],
    ids=["bad_chunk", "trailer_flood"],
)
async def test_bad_body_framing_while_the_body_is_read_is_answered_at_once(
    app: App, body: bytes, status: int, expected: dict[str, Any]
) -> None:
    """Bad chunk framing, or trailer lines past the header-line count, arriving while the
    handler reads the body answers that handler at once (not after the body timeout), with
    the code it gets in one read with the head."""
    reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
    started = time.monotonic()
    try:
        writer.write(_head(H, JSON, "Transfer-Encoding: chunked", "Expect: 100-continue"))
        await writer.drain()
        # `100 Continue` comes from the route, so the request is being handled from here on.
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == (
            b"HTTP/1.1 100 Continue\r\n\r\n"
        )
        writer.write(body)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    reply = _parse(raw)
    assert time.monotonic() - started < LINGERING_S + 1.0 < BODY_TIMEOUT_S
    assert (reply.status, reply.json()) == (status, expected)
    assert reply.headers["connection"] == "close"


async def test_a_few_trailers_are_served(app: App) -> None:
    """A chunked body with a few trailer lines (a count within the limit) is served."""
    body = _chat(app)
    trailers = b"".join(b"X-Trailer-%d: v\r\n" % i for i in range(3))
    request = _head(
        H, JSON, "Transfer-Encoding: chunked", "Connection: close"
    ) + b"%x\r\n%s\r\n0\r\n%s\r\n" % (len(body), body, trailers)
    reply = await _send(app, request)
    assert reply.status == 200
    assert reply.json()["object"] == "chat.completion"


async def test_a_well_formed_request_after_all_that_is_served(app: App) -> None:
    """The same gateway still serves a well-formed request whose head is just under both
    header limits."""
    body = _chat(app)
    pads = [f"X-Pad-{i}: {'p' * 150}" for i in range(MAX_HEADER_COUNT - 4)]
    request = _head(H, JSON, f"Content-Length: {len(body)}", "Connection: close", *pads) + body
    assert len(request) - len(body) < MAX_HEADER_BYTES
    reply = await _send(app, request)
    assert reply.status == 200
    assert reply.json()["choices"][0]["finish_reason"] == "length"
