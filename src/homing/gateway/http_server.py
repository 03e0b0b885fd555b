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
that what the parsers let through is refused on the head (`head_error`): a version other than
HTTP/1.0 or 1.1 (400; llhttp takes a request line without one as HTTP/0.9), a
`Transfer-Encoding` other than `chunked` (400), an `Expect` other than `100-continue` (417)
and an `Expect: 100-continue` request whose `Content-Length` is over the body limit (413),
the last two before `100 Continue` is sent. The requests parsed before a refusal in the same
read are answered first, then the refusal, then the connection closes (as nginx does with
pipelined requests): the guard runs the parser one request at a time, since a parser that
raises loses the requests it parsed in that call. Request bodies reach the application as
sent (aiohttp's `auto_decompress` is off, since it takes a gzip stream cut short as whole):
`decode_body` decodes them.

aiohttp offers no public hook for either: the protocol class a `web.Server` builds and the
parser a `RequestHandler` holds are fixed. So this module, and only it, uses three private
names of aiohttp 3.14: `AppRunner._make_server` (overridden to build our `web.Server`
subclass), `web.Server._kwargs` (the handler settings aiohttp collected) and
`RequestHandler._parser` (replaced by `request_parser`'s). It also relies on aiohttp 3.14's
parsers stopping after `max_msg_queue_size` requests until `message_consumed()`.
`tests/unit/gateway/test_http_server.py` fails if any of it changes.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web
from aiohttp.helpers import DEFAULT_CHUNK_SIZE
from aiohttp.http import HttpRequestParser, HttpVersion10, HttpVersion11
from aiohttp.http_exceptions import (
    BadHttpMessage,
    BadStatusLine,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    TransferEncodingError,
)
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import MAX_MSG_QUEUE_SIZE, RequestHandler

from homing.gateway.errors import APIError, internal_error
from homing.gateway.request_log import RequestLog, new_request_id

if TYPE_CHECKING:
    from multidict import CIMultiDictProxy  # aiohttp's header mappings

log = structlog.get_logger("homing.http")

# The request line's limit in bytes (at most `max_header_bytes`): Apache's LimitRequestLine
# default, also aiohttp's default `max_line_size`.
REQUEST_LINE_BYTES = 8190
# Content codings a request body may use (`decode_body`), with zlib's window bits for each:
# gzip (RFC 1952), and deflate as the zlib format (RFC 9110's, RFC 1950) or raw (RFC 1951),
# which some clients send and aiohttp took too.
CONTENT_CODINGS = ("gzip", "deflate")
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_ZLIB_WBITS = zlib.MAX_WBITS
_RAW_DEFLATE_WBITS = -zlib.MAX_WBITS

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
# Errors after which the rest of the connection's bytes cannot be trusted or were not read,
# and the 503 of a gateway that drains (the client's retry then reaches another instance).
_CLOSING_CODES = frozenset(CODES) | {"request_timeout", "shutting_down"}


@dataclass(frozen=True)
class HttpLimits:
    """Limits of one HTTP request (their defaults are `homing.config.GatewaySettings`').
    `max_body_bytes`: the body as sent and after content decoding (413). `max_header_bytes`:
    the request line and all header lines with their CRLFs, and each trailer line (431).
    `max_header_count`: header lines (431)."""

    max_body_bytes: int
    max_header_bytes: int
    max_header_count: int

    @property
    def request_line_bytes(self) -> int:
        """The request line's limit (414 past it)."""
        return min(REQUEST_LINE_BYTES, self.max_header_bytes)

    @property
    def field_line_bytes(self) -> int:
        """aiohttp's limit of one header or trailer line: one byte more than the whole head,
        so the limit in a `LineTooLong` tells such a line from the request line (and a
        chunk-size line) and the head is refused as a whole."""
        return self.max_header_bytes + 1

    def parser_kwargs(self) -> dict[str, int | bool]:
        """aiohttp's parser settings: the line limits, and two lines more than our count (the
        Python parser counts the request line and the blank line), so our exact count
        answers; bodies are not decoded by aiohttp (`decode_body` does it)."""
        return {
            "max_line_size": self.request_line_bytes,
            "max_field_size": self.field_line_bytes,
            "max_headers": self.max_header_count + 2,
            "auto_decompress": False,
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


def json_dumps(obj: Any) -> str:
    """Compact JSON text of `obj`, non-ASCII characters as they are (the gateway's bodies)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def error_response(err: APIError, request_id: str) -> web.Response:
    """The JSON error response for `err`, with `Retry-After` on 429/503. An error of the HTTP
    layer (any code in `CODES`, and 408) and 503 `shutting_down` also close the connection
    (`Connection: close`): aiohttp still drains an unread body for its lingering time, then
    closes."""
    headers = {"x-request-id": request_id}
    if err.retry_after_s is not None:
        headers["Retry-After"] = str(err.retry_after_s)
    if err.code == "unsupported_content_encoding":
        headers["Accept-Encoding"] = ", ".join(CONTENT_CODINGS)  # RFC 9110 section 12.5.3
    closing = err.code in _CLOSING_CODES
    if closing:  # aiohttp writes it itself on HTTP/1.1 only
        headers["Connection"] = "close"
    response = web.json_response(err.body(), status=err.status, headers=headers, dumps=json_dumps)
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
        return _trailer_error(exc, limits) or limits.error("invalid_chunked_body")
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


def _trailer_error(exc: BaseException | None, limits: HttpLimits) -> APIError | None:
    """431 when `exc` refuses a chunked body's trailer section as a head's would be refused:
    a line over the field limit, or more lines (with the head's) than the parser takes."""
    if isinstance(exc, LineTooLong):
        if exc.args[1:2] == (limits.field_line_bytes,):
            return limits.error("request_header_fields_too_large")
        return None
    if isinstance(exc, HttpProcessingError) and exc.message.startswith("Too many"):
        return limits.error("too_many_headers")  # llhttp's "headers", Python's "trailers"
    return None


def body_error(exc: Exception, limits: HttpLimits) -> APIError:
    """The error answered when reading a request body raised `exc` (aiohttp's
    `RequestPayloadError` with the Python parser's error as its cause): 431 for its trailer
    section as in `parser_error`, 400 `invalid_chunked_body` for bad chunk framing, else
    `bad_request` (a body cut short: the client has gone)."""
    cause = exc.__cause__ if isinstance(exc, web.RequestPayloadError) else exc
    trailer = _trailer_error(cause, limits)
    if trailer is not None:
        return trailer
    if isinstance(cause, TransferEncodingError | LineTooLong) or "chunk" in str(cause).lower():
        return limits.error("invalid_chunked_body")
    return limits.error("bad_request")


def head_error(message: RawRequestMessage, limits: HttpLimits) -> APIError | None:
    """A refusal due before the body is read or `100 Continue` is sent:

    - a version other than HTTP/1.0 or 1.1 (400 `invalid_request_line`): llhttp reads a
      request line without one as HTTP/0.9 (aiohttp would answer `HTTP/0.9 200 OK` with
      headers), the Python parser takes any `HTTP/d.d`;
    - a `Transfer-Encoding` other than one `chunked` (400): the parsers take a list such as
      `gzip, chunked` and would ignore the other codings;
    - any `Expect` line other than `100-continue` (417; RFC 9110 section 10.1.1), a second
      `Expect: foo` included (aiohttp reads only the first line);
    - `Expect: 100-continue` with a `Content-Length` over the body limit (413).
    """
    if not HttpVersion10 <= message.version <= HttpVersion11:
        return limits.error("invalid_request_line")
    headers = message.headers
    codings = headers.getall("Transfer-Encoding", ())
    if codings and [c.strip().lower() for c in codings] != ["chunked"]:
        return limits.error("invalid_transfer_encoding")
    expects = headers.getall("Expect", ())
    if not expects:
        return None
    if any(e.strip().lower() != "100-continue" for e in expects):
        return limits.error("expectation_failed")
    length = headers.get("Content-Length", "")
    if length.isdigit() and int(length) > limits.max_body_bytes:
        return limits.error("request_too_large")
    return None


def content_coding(headers: CIMultiDictProxy[str]) -> str | None:
    """The request's one content coding, one of `CONTENT_CODINGS` (None: the body is sent as
    it is, `identity`); 415 `unsupported_content_encoding` for any other value or for more
    than one coding (RFC 9110 section 15.5.16)."""
    values = [
        coding.strip().lower()
        for line in headers.getall("Content-Encoding", ())
        for coding in line.split(",")
    ]
    values = [v for v in values if v not in ("", "identity")]
    if not values:
        return None
    if len(values) > 1 or values[0] not in CONTENT_CODINGS:
        raise api_error("unsupported_content_encoding")
    return values[0]


def decode_body(raw: bytes, coding: str | None, limits: HttpLimits) -> bytes:
    """`raw` (a body as sent) decoded as `coding` (see `content_coding`), at most
    `limits.max_body_bytes` decoded bytes: 413 `request_too_large` past them (decoding stops
    there, so a small bomb costs little); 400 `invalid_content_encoding` for data that is not
    of its coding, a stream cut short (no gzip trailer, an unfinished deflate stream, an empty
    body) or any byte after the stream's end. That includes a second gzip member (RFC 1952
    section 2.2): clients send one, and each member costs a decoder (about 2 us per 20-byte
    empty member: a 4 MiB body of them would hold the event loop 0.4 s)."""
    if coding is None:
        return raw
    if coding == "gzip":
        wbits = _GZIP_WBITS
    else:  # RFC 1950's header: compression method 8 in the low four bits of byte 0
        wbits = _ZLIB_WBITS if raw[:1] and (raw[0] & 0x0F) == 8 else _RAW_DEFLATE_WBITS
    decoder = zlib.decompressobj(wbits)
    try:
        decoded = decoder.decompress(raw, limits.max_body_bytes + 1)
    except zlib.error:
        raise limits.error("invalid_content_encoding") from None
    if len(decoded) > limits.max_body_bytes:
        raise limits.error("request_too_large")
    if not decoder.eof or decoder.unused_data:
        raise limits.error("invalid_content_encoding")
    return decoded


class ParserRejection(BadHttpMessage):
    """What `ParserGuard` raises in place of a parser error: aiohttp hands it to
    `GatewayProtocol.handle_error`, which answers `error`."""

    def __init__(self, error: APIError) -> None:
        super().__init__(error.message)
        self.error = error


_Parsed = list[tuple[RawRequestMessage, StreamReader]]
_NOTHING: tuple[Sequence[tuple[RawRequestMessage, StreamReader]], bool, bytes] = ((), False, b"")


def request_parser(
    protocol: Any,
    loop: asyncio.AbstractEventLoop,
    limits: HttpLimits,
    *,
    read_bufsize: int = DEFAULT_CHUNK_SIZE,
    parser_class: type = HttpRequestParser,
) -> ParserGuard:
    """The guarded request parser of one connection: `parser_class` (aiohttp's, llhttp unless
    `AIOHTTP_NO_EXTENSIONS` is set) with `limits`, made to stop after each request
    (`max_msg_queue_size=1`) so that `ParserGuard` can step it. `read_bufsize`: the payload
    buffer's size in bytes, aiohttp's `read_bufsize`."""
    parser = parser_class(
        protocol,
        loop,
        read_bufsize,
        payload_exception=web.RequestPayloadError,
        max_msg_queue_size=1,
        **limits.parser_kwargs(),
    )
    return ParserGuard(parser, limits)


class ParserGuard:
    """Wraps aiohttp's request parser (all else is delegated to it), which must stop after
    each request (see `request_parser`).

    It counts the bytes of a request head still being received and refuses the head past
    `max_header_bytes` (431), so a head trickled in many reads is bounded as a whole, not
    only per line; a head that completes within one read is measured exactly by the
    middleware instead. Parser errors and `head_error`s become `ParserRejection`s. A read is
    parsed one request at a time, so the requests before a refusal are handed on and the
    refusal is raised by the next call (`rejection_due`): aiohttp answers it after them. When
    the refusal concerns the body of a request already being handled, that body gets the
    error too (the handler's read raises it at once instead of waiting for the body timeout).
    After a refusal the rest of the connection is ignored. At most aiohttp's
    `MAX_MSG_QUEUE_SIZE` (32) requests wait unanswered; the rest of a read waits in the
    parser until the connection consumes them (aiohttp then feeds `b""`).
    """

    def __init__(self, parser: Any, limits: HttpLimits) -> None:
        self._parser = parser
        self._limits = limits
        self._head_bytes = 0
        self._body: StreamReader | None = None  # payload of the last request handed on
        self._failed = False
        self._due: ParserRejection | None = None  # raised by the next feed_data
        self._queued = 0  # requests handed on and not yet consumed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)

    @property
    def rejection_due(self) -> bool:
        """A refusal waits for the next `feed_data` call, after the requests handed on."""
        return self._due is not None

    def message_consumed(self) -> None:
        """aiohttp's connection took a request (or a parser error) off its queue."""
        self._queued = max(0, self._queued - 1)

    def feed_data(
        self, data: bytes
    ) -> tuple[Sequence[tuple[RawRequestMessage, StreamReader]], bool, bytes]:
        """aiohttp's `feed_data`: (requests, upgraded, tail); raises `ParserRejection`."""
        if self._due is not None:
            due, self._due = self._due, None
            raise due
        if self._failed:
            return _NOTHING
        in_body = self._in_body()
        if not in_body:
            self._head_bytes += len(data)
        messages: _Parsed = []
        upgraded, tail = False, b""
        try:
            upgraded, tail = self._step(data, messages)
        except ParserRejection as rejection:
            if not messages:
                raise
            self._due = rejection
        if messages:
            self._head_bytes = 0
            self._queued += len(messages)
        elif not in_body and self._head_bytes > self._limits.max_header_bytes:
            raise self._reject(self._limits.error("request_header_fields_too_large"))
        self._end_failed_body()
        return messages, upgraded, tail

    def _step(self, data: bytes, messages: _Parsed) -> tuple[bool, bytes]:
        """Feed `data`, then `b""` while the parser may hold a next request (it stopped after
        one whose body is complete) and the queue has room, appending each request to
        `messages`: (upgraded, tail). Data that arrives with the queue full is still fed:
        the parser takes one more request of it at most, as aiohttp's own does."""
        first = True
        while True:
            if not data and self._queued + len(messages) >= MAX_MSG_QUEUE_SIZE:
                return False, b""
            in_body = self._in_body()
            self._parser.message_consumed()  # lets it go on to one more request
            try:
                step, upgraded, tail = self._parser.feed_data(data)
            except HttpProcessingError as exc:
                raise self._reject(parser_error(exc, in_body=in_body, limits=self._limits)) from exc
            for message, payload in step:
                refusal = head_error(message, self._limits)
                if refusal is not None:
                    raise self._reject(refusal)
                messages.append((message, payload))
                self._body = payload
            if upgraded or (not step and not first) or self._in_body():
                return upgraded, tail
            data, first = b"", False

    def _in_body(self) -> bool:
        """The body of the last request handed on is still being received."""
        return self._body is not None and not self._body.is_eof()

    def _reject(self, error: APIError) -> ParserRejection:
        self._failed = True
        if self._in_body():
            assert self._body is not None
            self._body.set_exception(error)
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

    __slots__ = ("_limits", "_request_log")

    def __init__(
        self,
        manager: web.Server,
        *,
        loop: asyncio.AbstractEventLoop,
        limits: HttpLimits,
        request_log: RequestLog | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        self._limits = limits
        self._request_log = request_log
        # private: see the module docstring (aiohttp's own parser is dropped unused)
        self._parser = request_parser(
            self, loop, limits, read_bufsize=kwargs.get("read_bufsize", DEFAULT_CHUNK_SIZE)
        )

    def data_received(self, data: bytes) -> None:
        """aiohttp's, then once more with no data when the parser has a refusal due after the
        requests it handed on: aiohttp queues it behind them, so they are answered first."""
        super().data_received(data)
        parser = self._parser
        if isinstance(parser, ParserGuard) and parser.rejection_due:
            super().data_received(b"")

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
        if err.status < 500 and self._request_log is not None:
            self._request_log.rejected(request_id, err, api="http", stage="parser")
        if request.writer.output_size > 0:  # a response already began: nothing more to say
            raise ConnectionError("response already started")
        response = error_response(err, request_id)
        response.force_close()
        return response


class _GatewayServer(web.Server):
    """`web.Server` whose connections use `GatewayProtocol`."""

    def __init__(
        self, base: web.Server, limits: HttpLimits, request_log: RequestLog | None
    ) -> None:
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
        self._request_log = request_log

    def __call__(self) -> RequestHandler:
        return GatewayProtocol(
            self,
            loop=self._protocol_loop,
            limits=self._limits,
            request_log=self._request_log,
            **self._protocol_kwargs,
        )


class GatewayRunner(web.AppRunner):
    """`web.AppRunner` serving `app` with `limits` on the parser and `GatewayProtocol`;
    `request_log` reports the requests the parser refuses. Other keyword arguments are
    aiohttp's (`keepalive_timeout`, `lingering_time`, ...)."""

    def __init__(
        self,
        app: web.Application,
        *,
        limits: HttpLimits,
        request_log: RequestLog | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs, **limits.parser_kwargs())
        self.limits = limits
        self.request_log = request_log

    async def _make_server(self) -> web.Server:  # private: see the module docstring
        return _GatewayServer(await super()._make_server(), self.limits, self.request_log)
