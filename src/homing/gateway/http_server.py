"""The HTTP/1.1 server layer under the OpenAI API: input limits and aiohttp's parser errors.

Rule of this file: whatever a client sends, it gets the OpenAI error body (never aiohttp's plain
text) with the 4xx status of its mistake; after a mistake in the HTTP framing itself (every code
in `CODES`) the connection is closed, since the bytes that follow cannot be trusted.

`HttpLimits` holds the limits; `GatewayRunner` is the `web.AppRunner` that serves an application
with them. aiohttp's own parser (llhttp in C, or the Python one with `AIOHTTP_NO_EXTENSIONS`)
refuses malformed requests before any application code runs and answers them itself in plain
text; `GatewayProtocol` renders those refusals through `error_response` instead, with the
status and code that `parser_error` chooses (see `CODES`). It also guards the parser
(`ParserGuard`) so that a request head arriving in many small reads is cut off once it passes
`max_header_bytes` (aiohttp itself bounds only each line and the number of lines), and so
that `Expect` values other than `100-continue` (417) and an `Expect: 100-continue` request
whose `Content-Length` is over the body limit (413) are refused before `100 Continue` is sent.

aiohttp offers no public hook for either: the protocol class a `web.Server` builds and the
parser a `RequestHandler` holds are fixed. So this module, and only it, uses three private
names of aiohttp 3.14: `AppRunner._make_server` (overridden to build our `web.Server`
subclass), `web.Server._kwargs` (the handler settings aiohttp collected) and
`RequestHandler._parser` (wrapped). `tests/unit/gateway/test_http_server.py` fails if they move.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web
from aiohttp.http_exceptions import (
    BadHttpMessage,
    BadStatusLine,
    ContentEncodingError,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    TransferEncodingError,
)
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from homing.gateway.errors import APIError, internal_error
from homing.gateway.generation import log_rejection, new_request_id

log = structlog.get_logger("homing.http")

# The request line's limit in bytes (at most `max_header_bytes`): Apache's LimitRequestLine
# default, also aiohttp's default `max_line_size`.
REQUEST_LINE_BYTES = 8190
# Header lines per request: Envoy's default `max_headers_count` (HttpProtocolOptions).
MAX_HEADER_COUNT = 100
# Content codings a request body may use: aiohttp decodes these itself, and `_read_json`
# bounds the decoded size by the body limit.
CONTENT_CODINGS = ("gzip", "deflate")

# code -> (HTTP status, message) of every refusal made on the HTTP layer; `{h}` is
# max_header_bytes, `{n}` max_header_count, `{line}` the request line limit, `{body}`
# max_body_bytes. The 400s name what is wrong with the request's framing.
CODES: dict[str, tuple[int, str]] = {
    "invalid_request_line": (400, "The request line is not valid HTTP/1.1 (method, URL, version)."),
    "invalid_header": (400, "A request header line is malformed or holds a control character."),
    "missing_host": (400, "An HTTP/1.1 request must have a Host header."),
    "invalid_content_length": (400, "The Content-Length header is malformed or repeated."),
    "invalid_transfer_encoding": (
        400,
        "The Transfer-Encoding header is not supported or malformed.",
    ),
    "ambiguous_body_length": (400, "The request has both Transfer-Encoding and Content-Length."),
    "invalid_chunked_body": (400, "The chunked request body is malformed."),
    "invalid_content_encoding": (400, "The request body does not decode as its Content-Encoding."),
    "bad_request": (400, "The request is not valid HTTP/1.1."),
    "request_too_large": (413, "The request body is too large (limit {body} bytes)."),
    "uri_too_long": (414, "The request line is too long (limit {line} bytes)."),
    "unsupported_content_encoding": (
        415,
        "The request's Content-Encoding is not supported; send the body as it is, or as gzip"
        " or deflate.",
    ),
    "expectation_failed": (417, "Only 'Expect: 100-continue' is supported."),
    "request_header_fields_too_large": (
        431,
        "The request headers are too large (limit {h} bytes).",
    ),
    "too_many_headers": (431, "The request has more than {n} header lines."),
}
# Errors after which the rest of the connection's bytes cannot be trusted or were not read.
_CLOSING_CODES = frozenset(CODES) | {"request_timeout"}


@dataclass(frozen=True)
class HttpLimits:
    """Limits of one HTTP request. `max_body_bytes`: the body after content decoding (413).
    `max_header_bytes`: the request line and all header lines with their CRLFs (431).
    `max_header_count`: header lines (431)."""

    max_body_bytes: int
    max_header_bytes: int = 16 * 1024
    max_header_count: int = MAX_HEADER_COUNT

    @property
    def request_line_bytes(self) -> int:
        """The request line's limit (414 past it)."""
        return min(REQUEST_LINE_BYTES, self.max_header_bytes)

    def parser_kwargs(self) -> dict[str, int]:
        """aiohttp's parser limits: a header line may be one byte longer than the whole head
        (so the limit in a `LineTooLong` tells a header line from the request line, and the
        head is refused as a whole), and it may count two lines more than ours (the Python
        parser counts the request line and the blank line), so our exact count answers."""
        return {
            "max_line_size": self.request_line_bytes,
            "max_field_size": self.max_header_bytes + 1,
            "max_headers": self.max_header_count + 2,
        }

    def error(self, code: str) -> APIError:
        """The `APIError` of `code` in `CODES`, its message filled in with these limits."""
        return api_error(
            code,
            h=self.max_header_bytes,
            n=self.max_header_count,
            line=self.request_line_bytes,
            body=self.max_body_bytes,
        )


def api_error(code: str, **values: int) -> APIError:
    """The `APIError` of `code` in `CODES`; `values` fill in its message."""
    status, message = CODES[code]
    return APIError(status, message.format(**values), code=code)


def _json_dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def error_response(err: APIError, request_id: str) -> web.Response:
    """The JSON error response for `err`, with `Retry-After` on 429/503. An error of the HTTP
    layer (any code in `CODES`, and 408) also closes the connection (`Connection: close`):
    aiohttp still drains an unread body for its lingering time, then closes."""
    headers = {"x-request-id": request_id}
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(err.retry_after_s)
    if err.code == "unsupported_content_encoding":
        headers["Accept-Encoding"] = ", ".join(CONTENT_CODINGS)  # RFC 9110 section 12.5.3
    closing = err.code in _CLOSING_CODES
    if closing:  # aiohttp writes it itself on HTTP/1.1 only
        headers["Connection"] = "close"
    response = web.json_response(err.body(), status=err.status, headers=headers, dumps=_json_dumps)
    if closing:
        response.force_close()
    return response


def parser_error(exc: HttpProcessingError, *, in_body: bool, limits: HttpLimits) -> APIError:
    """The error answered for aiohttp's parser refusing a request with `exc`; `in_body`: the
    head was parsed and the refusal is about the body (chunk framing or trailers).

    Both parsers raise the same classes, but with different texts; the texts matched here
    are pinned for both by tests/unit/gateway/test_http_server.py.
    """
    if in_body:
        return limits.error("invalid_chunked_body")
    # Classes whose text holds the client's bytes first; then aiohttp's and llhttp's fixed
    # descriptions (the first line: llhttp appends a dump of the offending bytes).
    if isinstance(exc, LineTooLong):
        line_limit = exc.args[1] if len(exc.args) > 1 else None
        if line_limit == limits.request_line_bytes:
            return limits.error("uri_too_long")
        return limits.error("request_header_fields_too_large")
    if isinstance(exc, InvalidHeader):
        if exc.hdr.lower() == "content-length":
            return limits.error("invalid_content_length")
        return limits.error("invalid_header")
    if isinstance(exc, BadStatusLine | InvalidURLError):
        return limits.error("invalid_request_line")
    if isinstance(exc, ContentEncodingError):  # br or zstd without their decoder installed
        return limits.error("unsupported_content_encoding")
    if isinstance(exc, TransferEncodingError):
        return limits.error("invalid_chunked_body")
    desc = exc.message.split("\n", 1)[0]
    if "Too many headers" in desc:
        return limits.error("too_many_headers")
    if "chunk" in desc.lower():
        return limits.error("invalid_chunked_body")
    if "Transfer-Encoding" in desc:
        if "Content-Length" in desc:
            return limits.error("ambiguous_body_length")
        return limits.error("invalid_transfer_encoding")
    if "Content-Length" in desc:
        return limits.error("invalid_content_length")
    if "Missing 'Host'" in desc:
        return limits.error("missing_host")
    if "header" in desc.lower():
        return limits.error("invalid_header")
    return limits.error("bad_request")


def body_error(exc: Exception) -> APIError:
    """The error answered when reading a request body raised `exc` (aiohttp's
    `RequestPayloadError`, or the Python parser's own error): 400 `invalid_content_encoding`
    for a body that does not decode as its Content-Encoding, `invalid_chunked_body` for bad
    chunk framing, else `bad_request` (a body cut short: the client has gone)."""
    cause = exc.__cause__ if isinstance(exc, web.RequestPayloadError) else exc
    if isinstance(cause, ContentEncodingError):
        return api_error("invalid_content_encoding")
    if isinstance(cause, TransferEncodingError | LineTooLong) or "chunk" in str(cause).lower():
        return api_error("invalid_chunked_body")
    return api_error("bad_request")


def head_error(message: RawRequestMessage, limits: HttpLimits) -> APIError | None:
    """A refusal due before the body is read or `100 Continue` is sent: an `Expect` other than
    `100-continue` (417; RFC 9110 section 10.1.1), or `Expect: 100-continue` with a
    `Content-Length` over the body limit (413)."""
    expect = message.headers.get("Expect")
    if expect is None:
        return None
    if expect.strip().lower() != "100-continue":
        return limits.error("expectation_failed")
    length = message.headers.get("Content-Length", "")
    if length.isdigit() and int(length) > limits.max_body_bytes:
        return limits.error("request_too_large")
    return None


class ParserRejection(BadHttpMessage):
    """What `ParserGuard` raises in place of a parser error: aiohttp hands it to
    `GatewayProtocol.handle_error`, which answers `error`."""

    def __init__(self, error: APIError) -> None:
        super().__init__(error.message)
        self.error = error


_NOTHING: tuple[tuple[()], bool, bytes] = ((), False, b"")


class ParserGuard:
    """Wraps aiohttp's request parser (all else is delegated to it).

    It counts the bytes of a request head still being received and refuses the head past
    `max_header_bytes` (431), so a head trickled in many reads is bounded as a whole, not
    only per line; a head that completes within one read is measured exactly by the
    middleware instead. Parser errors become `ParserRejection`s; when the refusal concerns the
    body of a request already being handled, that body gets the error too (the handler's read
    raises it at once instead of waiting for the body timeout). After a refusal the rest of
    the connection is ignored.
    """

    def __init__(self, parser: Any, limits: HttpLimits) -> None:
        self._parser = parser
        self._limits = limits
        self._head_bytes = 0
        self._body: StreamReader | None = None  # payload of the last request parsed
        self._failed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)

    def feed_data(self, data: bytes) -> Any:
        """aiohttp's `feed_data`: (messages, upgraded, tail)."""
        if self._failed:
            return _NOTHING
        body = self._body
        in_body = body is not None and not body.is_eof()
        if not in_body:
            self._head_bytes += len(data)
        try:
            result = self._parser.feed_data(data)
        except HttpProcessingError as exc:
            raise self._reject(parser_error(exc, in_body=in_body, limits=self._limits)) from exc
        messages = result[0]
        if messages:
            self._head_bytes = 0
            self._body = messages[-1][1]
            for message, _ in messages:
                refusal = head_error(message, self._limits)
                if refusal is not None:
                    raise self._reject(refusal)
        elif not in_body and self._head_bytes > self._limits.max_header_bytes:
            raise self._reject(self._limits.error("request_header_fields_too_large"))
        self._end_failed_body()
        return result

    def _reject(self, error: APIError) -> ParserRejection:
        self._failed = True
        body = self._body
        if body is not None and not body.is_eof():
            body.set_exception(error)
        self._end_failed_body()
        return ParserRejection(error)

    def _end_failed_body(self) -> None:
        """A body that failed (here, or in aiohttp's decoding) gets no more data: mark it
        ended, so aiohttp does not linger reading it after the error response."""
        body = self._body
        if body is not None and body.exception() is not None and not body.is_eof():
            body.feed_eof()


class GatewayProtocol(RequestHandler):
    """aiohttp's HTTP/1.1 protocol with `ParserGuard` and JSON error responses."""

    __slots__ = ("_limits",)

    def __init__(self, manager: web.Server, *, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._limits = limits
        self._parser = ParserGuard(self._parser, limits)  # private: see the module docstring

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The response for a request aiohttp could not hand to the application (a parser
        refusal) or whose handling raised outside our middleware (500)."""
        request_id = new_request_id(None)
        if isinstance(exc, ParserRejection):
            err = exc.error
        elif isinstance(exc, HttpProcessingError):
            err = parser_error(exc, in_body=False, limits=self._limits)
        else:
            log.error("internal_error", request_id=request_id, exc_info=exc)
            err = internal_error()
        if err.status < 500:
            log_rejection(request_id, err, api="http", stage="parser")
        if request.writer.output_size > 0:  # a response already began: nothing more to say
            raise ConnectionError("response already started")
        response = error_response(err, request_id)
        response.force_close()
        return response


class _GatewayServer(web.Server):
    """`web.Server` whose connections use `GatewayProtocol`."""

    def __init__(self, base: web.Server, limits: HttpLimits) -> None:
        kwargs = dict(base._kwargs)  # private: the handler settings AppRunner collected
        super().__init__(
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            **kwargs,
        )
        self._protocol_kwargs = kwargs
        self._protocol_loop = asyncio.get_running_loop()
        self._limits = limits

    def __call__(self) -> RequestHandler:
        return GatewayProtocol(
            self, loop=self._protocol_loop, limits=self._limits, **self._protocol_kwargs
        )


class GatewayRunner(web.AppRunner):
    """`web.AppRunner` serving `app` with `limits` on the parser and `GatewayProtocol`;
    other keyword arguments are aiohttp's (`keepalive_timeout`, `lingering_time`, ...)."""

    def __init__(self, app: web.Application, *, limits: HttpLimits, **kwargs: Any) -> None:
        super().__init__(app, **kwargs, **limits.parser_kwargs())
        self.limits = limits

    async def _make_server(self) -> web.Server:  # private: see the module docstring
        return _GatewayServer(await super()._make_server(), self.limits)
