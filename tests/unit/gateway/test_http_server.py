"""The HTTP layer's decisions on aiohttp's real parsers: every malformed request maps to one
status and code, the same with llhttp (C) and the Python parser; the requests parsed before a
refusal are handed on first; bodies decode as their Content-Encoding or are refused; and the
private aiohttp names that `homing.gateway.http_server` relies on are still where it expects
them."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_parser import HttpRequestParserC, HttpRequestParserPy

from homing.gateway.errors import APIError, shutting_down
from homing.gateway.http_server import (
    CODES,
    GatewayProtocol,
    GatewayRunner,
    HttpLimits,
    ParserGuard,
    ParserRejection,
    body_error,
    decode_body,
    error_response,
    request_parser,
)

LIMITS = HttpLimits(max_body_bytes=65536, max_header_bytes=4096, max_header_count=20)
PARSERS = {"c": HttpRequestParserC, "python": HttpRequestParserPy}


def _head(*lines: str, start: str = "POST /v1/completions HTTP/1.1") -> bytes:
    return ("\r\n".join([start, *lines]) + "\r\n\r\n").encode("latin-1")


H = "Host: x"
CHUNKED = _head(H, "Transfer-Encoding: chunked")
BOTH = ("c", "python")
C_ONLY = ("c",)  # the Python parser lets these through
TRAILER_FLOOD = b"1\r\na\r\n0\r\n" + b"T: v\r\n" * 40 + b"\r\n"
LONG_TRAILER = b"0\r\nT: " + b"v" * 5000 + b"\r\n\r\n"

# name -> (reads, code, parsers that refuse it)
CASES: dict[str, tuple[list[bytes], str, tuple[str, ...]]] = {
    "long_url": ([_head(H, start=f"GET /{'a' * 5000} HTTP/1.1")], "uri_too_long", BOTH),
    "long_header_line": (
        [_head(H, "X-Pad: " + "a" * 5000)],
        "request_header_fields_too_large",
        BOTH,
    ),
    "long_header_name": ([_head(H, "X" * 5000 + ": a")], "request_header_fields_too_large", BOTH),
    "unfinished_head_over_the_limit": (
        [_head(H, *[f"X-{i}: {'v' * 500}" for i in range(9)])[:-2]],
        "request_header_fields_too_large",
        BOTH,
    ),
    "head_trickled_in_many_reads": (
        [b"GET / HTTP/1.1\r\n"] + [b"X-%d: %s\r\n" % (i, b"v" * 300) for i in range(14)],
        "request_header_fields_too_large",
        BOTH,
    ),
    "header_flood": ([_head(H, *[f"X-{i}: v" for i in range(40)])], "too_many_headers", BOTH),
    "duplicate_content_length": (
        [_head(H, "Content-Length: 1", "Content-Length: 2") + b"ab"],
        "invalid_content_length",
        BOTH,
    ),
    "non_numeric_content_length": (
        [_head(H, "Content-Length: abc")],
        "invalid_content_length",
        BOTH,
    ),
    "negative_content_length": ([_head(H, "Content-Length: -1")], "invalid_content_length", BOTH),
    "content_length_overflow": (
        [_head(H, "Content-Length: 99999999999999999999999")],
        "invalid_content_length",
        C_ONLY,
    ),
    "content_length_and_chunked": (
        [_head(H, "Content-Length: 5", "Transfer-Encoding: chunked") + b"0\r\n\r\n"],
        "ambiguous_body_length",
        BOTH,
    ),
    **{
        f"transfer_encoding_{name}": (
            [_head(H, f"Transfer-Encoding: {value}")],
            "invalid_transfer_encoding",
            BOTH,
        )
        for name, value in {
            "unknown": "gzip",
            "chunked_not_last": "chunked, gzip",
            "coding_before_chunked": "gzip, chunked",
            "identity_before_chunked": "identity, chunked",
            "chunked_twice_on_one_line": "chunked, chunked",
        }.items()
    },
    "empty_transfer_encoding": (
        [_head(H, "Transfer-Encoding: ", "Content-Length: 0")],
        "invalid_transfer_encoding",
        BOTH,
    ),
    "trailer_flood_with_the_head": (
        [CHUNKED + TRAILER_FLOOD],
        "too_many_headers",
        C_ONLY,  # the Python parser fails the body instead: see the body_error test
    ),
    "trailer_flood_later": ([CHUNKED, TRAILER_FLOOD], "too_many_headers", C_ONLY),
    "long_trailer_line_with_the_head": (
        [CHUNKED + LONG_TRAILER],
        "request_header_fields_too_large",
        C_ONLY,
    ),
    "long_trailer_line_later": ([CHUNKED, LONG_TRAILER], "request_header_fields_too_large", C_ONLY),
    "bad_chunk_size_with_head": ([CHUNKED + b"zz\r\n"], "invalid_chunked_body", BOTH),
    "bad_chunk_size_later": ([CHUNKED, b"5\r\nabcde\r\n", b"zz\r\n"], "invalid_chunked_body", BOTH),
    "chunk_without_crlf": ([CHUNKED, b"3\r\nabcX\r\n"], "invalid_chunked_body", BOTH),
    "chunk_size_overflow": ([CHUNKED, b"f" * 20 + b"\r\n"], "invalid_chunked_body", C_ONLY),
    "control_character_in_header": ([_head(H, "X-A: a\x01b")], "invalid_header", BOTH),
    "nul_in_header": ([_head(H, "X-A: a\x00b")], "invalid_header", BOTH),
    "delete_in_header": ([_head(H, "X-A: a\x7fb")], "invalid_header", BOTH),
    "space_in_header_name": ([_head(H, "X A: b")], "invalid_header", BOTH),
    "line_without_colon": ([_head(H, "nocolon")], "invalid_header", BOTH),
    "obsolete_line_folding": ([_head(H, "X-A: a", " b")], "invalid_header", BOTH),
    "bare_cr_in_header": ([_head(H, "X-A: a\rb")], "invalid_header", BOTH),
    "duplicate_host": ([_head(H, "Host: y")], "invalid_header", BOTH),
    "missing_host": ([_head("Content-Length: 0")], "missing_host", BOTH),
    "bad_method": ([_head(H, start="G(T / HTTP/1.1")], "invalid_request_line", BOTH),
    "no_http_version": ([_head(start="GET /health")], "invalid_request_line", BOTH),
    "no_http_version_with_headers": ([_head(H, start="GET /health")], "invalid_request_line", BOTH),
    "space_in_url": ([_head(H, start="GET /a b HTTP/1.1")], "invalid_request_line", BOTH),
    "control_character_in_url": (
        [_head(H, start="GET /a\x01 HTTP/1.1")],
        "invalid_request_line",
        BOTH,
    ),
    "unknown_http_version": ([_head(H, start="GET / HTTP/9.9")], "invalid_request_line", BOTH),
    "http_2_version": ([_head(H, start="GET / HTTP/2.0")], "invalid_request_line", BOTH),
    "tls_handshake": (
        [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"],
        "invalid_request_line",
        C_ONLY,
    ),
    "expect_other_than_continue": (
        [_head(H, "Expect: something", "Content-Length: 0")],
        "expectation_failed",
        BOTH,
    ),
    "expect_continue_then_another": (
        [_head(H, "Expect: 100-continue", "Expect: something", "Content-Length: 0")],
        "expectation_failed",
        BOTH,
    ),
    "expect_continue_in_a_list": (
        [_head(H, "Expect: 100-continue, something", "Content-Length: 0")],
        "expectation_failed",
        BOTH,
    ),
    "expect_continue_over_the_body_limit": (
        [_head(H, "Expect: 100-continue", "Content-Length: 65537")],
        "request_too_large",
        BOTH,
    ),
}


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop for the parsers' payload streams (nothing runs on it)."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _guard(kind: str, loop: asyncio.AbstractEventLoop) -> ParserGuard:
    """aiohttp's parser of `kind` guarded as `GatewayProtocol` builds it."""
    return request_parser(BaseProtocol(loop), loop, LIMITS, parser_class=PARSERS[kind])


def _refusal(guard: ParserGuard, reads: list[bytes]) -> str | None:
    try:
        for data in reads:
            guard.feed_data(data)
        if guard.rejection_due:
            guard.feed_data(b"")
    except ParserRejection as rejection:
        return rejection.error.code
    return None


@pytest.mark.parametrize("kind", sorted(PARSERS))
@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_request_gets_its_code_on_both_parsers(
    name: str, kind: str, loop: asyncio.AbstractEventLoop
) -> None:
    """Each malformed request is refused with its code by the guarded parser (or, for the
    few the Python parser lets through, not refused there at all)."""
    reads, code, refusing = CASES[name]
    got = _refusal(_guard(kind, loop), reads)
    assert got == (code if kind in refusing else None)


@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_valid_pipelined_requests_pass_the_guard(
    kind: str, loop: asyncio.AbstractEventLoop
) -> None:
    """Well-formed requests, pipelined in one read and with heads near the limit, are parsed
    and none is refused; a body failing mid-way ends that body with the error."""
    guard = _guard(kind, loop)
    near = _head(H, "Content-Length: 2", "X-Pad: " + "p" * 3900) + b"{}"
    messages, _, _ = guard.feed_data(near + _head(H, "Content-Length: 0") * 3)
    assert [m.path for m, _ in messages] == ["/v1/completions"] * 4
    messages, _, _ = guard.feed_data(CHUNKED)
    (_, body), = messages  # fmt: skip
    with pytest.raises(ParserRejection):
        guard.feed_data(b"zz\r\n")
    assert body.is_eof()
    assert body.exception() is not None
    assert body.exception().code == "invalid_chunked_body"  # type: ignore[union-attr]


GET = _head(H, start="GET /health HTTP/1.1")
# name -> (one read: valid requests then junk, the requests handed on, the refusal's code)
JUNK_AFTER_REQUESTS: dict[str, tuple[bytes, int, str]] = {
    "garbage_line": (GET + b"GARBAGE\r\n\r\n", 1, "invalid_request_line"),
    "three_requests_then_garbage": (GET * 3 + b"GARBAGE\r\n\r\n", 3, "invalid_request_line"),
    "body_longer_than_content_length": (
        _head(H, "Content-Length: 2") + b"{}}\r\n\r\n",
        1,
        "invalid_request_line",
    ),
    "no_http_version": (GET + _head(start="GET /health"), 1, "invalid_request_line"),
    "head_error": (GET + _head(H, "Expect: foo", "Content-Length: 0"), 1, "expectation_failed"),
    "bad_chunk": (GET + CHUNKED + b"zz\r\n", 1, "invalid_chunked_body"),
    "header_flood": (GET + _head(H, *[f"X-{i}: v" for i in range(40)]), 1, "too_many_headers"),
}


@pytest.mark.parametrize("kind", sorted(PARSERS))
@pytest.mark.parametrize("name", sorted(JUNK_AFTER_REQUESTS))
def test_requests_before_a_refusal_in_one_read_are_handed_on_first(
    name: str, kind: str, loop: asyncio.AbstractEventLoop
) -> None:
    """Valid requests followed by junk in one read are all returned, with the refusal due;
    the next call raises it, and the calls after that parse nothing."""
    data, count, code = JUNK_AFTER_REQUESTS[name]
    guard = _guard(kind, loop)
    messages, _, _ = guard.feed_data(data)
    assert len(messages) == count
    assert all(body.is_eof() for _, body in messages)
    assert guard.rejection_due
    with pytest.raises(ParserRejection) as caught:
        guard.feed_data(b"")
    assert caught.value.error.code == code
    assert not guard.rejection_due
    assert guard.feed_data(GET)[0] == ()


@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_guard_hands_on_at_most_aiohttps_queue_of_requests(
    kind: str, loop: asyncio.AbstractEventLoop
) -> None:
    """Of 40 requests in one read, 32 (aiohttp's queue bound) are handed on; the rest come
    once the connection has consumed some and feeds no data, as aiohttp does."""
    guard = _guard(kind, loop)
    assert len(guard.feed_data(GET * 40)[0]) == 32
    assert len(guard.feed_data(b"")[0]) == 0
    for _ in range(16):
        guard.message_consumed()
    assert len(guard.feed_data(b"")[0]) == 8


def test_request_line_and_header_line_limits_differ() -> None:
    """The parser's line limits are distinct for every header limit, so a `LineTooLong`
    tells a long URL (414) from a long header line (431)."""
    for max_header_bytes in (1024, 4096, 8189, 8190, 8191, 16384):
        limits = HttpLimits(
            max_body_bytes=1024, max_header_bytes=max_header_bytes, max_header_count=100
        )
        kwargs = limits.parser_kwargs()
        assert kwargs["max_line_size"] == min(8190, max_header_bytes)
        assert kwargs["max_field_size"] == max_header_bytes + 1


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (TRAILER_FLOOD, "too_many_headers"),
        (LONG_TRAILER, "request_header_fields_too_large"),
        (b"1" + b";e" * 3000 + b"\r\na\r\n0\r\n\r\n", "invalid_chunked_body"),  # size line
    ],
)
def test_python_parser_body_failures_get_the_c_parsers_codes(
    body: bytes, code: str, loop: asyncio.AbstractEventLoop
) -> None:
    """The Python parser fails a chunked body's trailer section on the body, not the parser;
    the handler's read then answers the code llhttp's refusal gets."""
    guard = _guard("python", loop)
    (_, payload), = guard.feed_data(CHUNKED)[0]  # fmt: skip
    guard.feed_data(body)
    failure = payload.exception()
    assert isinstance(failure, web.RequestPayloadError)
    assert body_error(failure, LIMITS).code == code


JSON = b'{"model": "m", "prompt": "' + b"x" * 1000 + b'"}'
GZIP = gzip.compress(JSON, mtime=0)  # no timestamp: every collection the same
ZLIB = zlib.compress(JSON)
RAW_DEFLATE = zlib.compress(JSON, wbits=-zlib.MAX_WBITS)


@pytest.mark.parametrize(
    ("raw", "coding", "decoded"),
    [
        (JSON, None, JSON),
        (GZIP, "gzip", JSON),
        (ZLIB, "deflate", JSON),
        (RAW_DEFLATE, "deflate", JSON),
    ],
)
def test_decode_body_decodes_whole_streams(raw: bytes, coding: str | None, decoded: bytes) -> None:
    """A whole gzip or deflate stream (zlib's format or raw) decodes to the body."""
    assert decode_body(raw, coding, LIMITS) == decoded


@pytest.mark.parametrize(
    ("raw", "coding"),
    [
        (GZIP[:-8], "gzip"),  # no trailer (CRC-32, size)
        (GZIP[:-1], "gzip"),
        (GZIP[: len(GZIP) // 2], "gzip"),
        (GZIP[:10], "gzip"),  # the header alone
        (b"", "gzip"),
        (GZIP + b"garbage", "gzip"),
        (GZIP + GZIP, "gzip"),  # a second member
        (JSON, "gzip"),
        (ZLIB[:-4], "deflate"),  # no Adler-32
        (RAW_DEFLATE[:-3], "deflate"),
        (ZLIB + b"x", "deflate"),
        (b"", "deflate"),
    ],
)
def test_decode_body_refuses_streams_cut_short_or_followed_by_bytes(
    raw: bytes, coding: str
) -> None:
    """A stream that is cut short, is not of its coding, or has bytes after its end (a
    second gzip member too) is 400 `invalid_content_encoding`."""
    with pytest.raises(APIError) as caught:
        decode_body(raw, coding, LIMITS)
    assert (caught.value.status, caught.value.code) == (400, "invalid_content_encoding")


@pytest.mark.parametrize(
    ("coding", "compress"),
    [("gzip", lambda data: gzip.compress(data, mtime=0)), ("deflate", zlib.compress)],
)
def test_decode_body_stops_at_the_limit(coding: str, compress: Any) -> None:
    """A body that decodes to exactly `max_body_bytes` is served; one byte more is 413."""
    exact = b" " * LIMITS.max_body_bytes
    assert decode_body(compress(exact), coding, LIMITS) == exact
    with pytest.raises(APIError) as caught:
        decode_body(compress(exact + b" "), coding, LIMITS)
    assert (caught.value.status, caught.value.code) == (413, "request_too_large")


def test_shutting_down_closes_the_connection() -> None:
    """A 503 `shutting_down` closes the connection, as the HTTP layer's own errors do, so the
    client's retry opens a new one (to another instance)."""
    response = error_response(shutting_down(), "r1")
    assert response.status == 503
    assert response.headers["Connection"] == "close"
    assert response.headers["Retry-After"] == "1"
    assert response.keep_alive is False


def test_every_code_is_a_client_error_with_a_message() -> None:
    """All codes of the HTTP layer are 4xx with a filled-in message."""
    for code, (status, _) in CODES.items():
        err = LIMITS.error(code)
        assert 400 <= status < 500
        assert err.status == status
        assert "{" not in err.message
        assert err.body()["error"]["type"] == "invalid_request_error"


async def test_runner_builds_guarded_protocols_with_aiohttps_settings() -> None:
    """`GatewayRunner` serves with `GatewayProtocol` and `ParserGuard` and hands aiohttp's
    other settings through: this fails if the private aiohttp names it uses move."""
    runner = GatewayRunner(web.Application(), limits=LIMITS, keepalive_timeout=7.5)
    await runner.setup()
    try:
        server = runner.server
        assert server is not None
        protocol: Any = server()
        assert isinstance(protocol, GatewayProtocol)
        assert isinstance(protocol._parser, ParserGuard)
        assert isinstance(protocol._parser._parser, HttpRequestParserC | HttpRequestParserPy)
        assert protocol.keepalive_timeout == 7.5
        assert (protocol.max_line_size, protocol.max_field_size, protocol.max_headers) == (
            4096,
            4097,
            22,
        )
    finally:
        await runner.cleanup()
