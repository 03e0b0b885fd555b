"""The HTTP layer's decisions on aiohttp's real parsers: every malformed request maps to one
status and code, the same with llhttp (C) and the Python parser, and the private aiohttp
names that `homing.gateway.http_server` relies on are still where it expects them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_parser import HttpRequestParserC, HttpRequestParserPy

from homing.gateway.http_server import (
    CODES,
    GatewayProtocol,
    GatewayRunner,
    HttpLimits,
    ParserGuard,
    ParserRejection,
)

LIMITS = HttpLimits(max_body_bytes=65536, max_header_bytes=4096, max_header_count=20)
PARSERS = {"c": HttpRequestParserC, "python": HttpRequestParserPy}


def _head(*lines: str, start: str = "POST /v1/completions HTTP/1.1") -> bytes:
    return ("\r\n".join([start, *lines]) + "\r\n\r\n").encode("latin-1")


H = "Host: x"
CHUNKED = _head(H, "Transfer-Encoding: chunked")
BOTH = ("c", "python")
C_ONLY = ("c",)  # the Python parser lets these through

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
    "unknown_transfer_encoding": (
        [_head(H, "Transfer-Encoding: gzip")],
        "invalid_transfer_encoding",
        BOTH,
    ),
    "chunked_not_last": (
        [_head(H, "Transfer-Encoding: chunked, gzip")],
        "invalid_transfer_encoding",
        BOTH,
    ),
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
    "space_in_url": ([_head(H, start="GET /a b HTTP/1.1")], "invalid_request_line", BOTH),
    "control_character_in_url": (
        [_head(H, start="GET /a\x01 HTTP/1.1")],
        "invalid_request_line",
        BOTH,
    ),
    "unknown_http_version": ([_head(H, start="GET / HTTP/9.9")], "invalid_request_line", C_ONLY),
    "tls_handshake": (
        [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"],
        "invalid_request_line",
        C_ONLY,
    ),
    "brotli_body": (
        [_head(H, "Content-Encoding: br", "Content-Length: 1") + b"a"],
        "unsupported_content_encoding",
        BOTH,
    ),
    "expect_other_than_continue": (
        [_head(H, "Expect: something", "Content-Length: 0")],
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
    parser = PARSERS[kind](BaseProtocol(loop), loop, 2**16, **LIMITS.parser_kwargs())
    return ParserGuard(parser, LIMITS)


def _refusal(guard: ParserGuard, reads: list[bytes]) -> str | None:
    try:
        for data in reads:
            guard.feed_data(data)
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


def test_request_line_and_header_line_limits_differ() -> None:
    """The parser's line limits are distinct for every header limit, so a `LineTooLong`
    tells a long URL (414) from a long header line (431)."""
    for max_header_bytes in (1024, 4096, 8189, 8190, 8191, 16384):
        limits = HttpLimits(max_body_bytes=1024, max_header_bytes=max_header_bytes)
        kwargs = limits.parser_kwargs()
        assert kwargs["max_line_size"] == min(8190, max_header_bytes)
        assert kwargs["max_field_size"] == max_header_bytes + 1


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
