"""The OpenAI-compatible HTTP API on aiohttp: chat and text completions with SSE streaming.

Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`,
`GET /health` (the process is alive), `GET /ready` (at least one healthy worker) and
`GET /metrics` (Prometheus: router and gateway series).
Every response carries `x-request-id`; inference responses also carry `x-homing-worker`
(the replica that served them) and `x-homing-version` (its version label). A request header
`x-homing-version` pins the request to that version of the model (400 `unknown_version` for
one the model does not have), past its weighted split. Errors are OpenAI-shaped JSON
(`homing.gateway.errors`); a client's mistake is never a 5xx. Streaming follows OpenAI: one
`data: {chunk}\\n\\n` event per chunk, the first delta of each choice carries the role, an
optional usage chunk (`stream_options.include_usage`), then `data: [DONE]`. An error after
streaming began is sent as a `data: {"error": ...}` event before `[DONE]` (what vLLM and
SGLang do).
The handler is cancelled when the client disconnects (`handler_cancellation=True`), which
closes the generation and aborts the engine requests.
With tenants configured, `/v1/*` needs `Authorization: Bearer KEY` (`homing.gateway.auth`);
`/health`, `/ready` and `/metrics` stay open. Input limits: body size after decoding (413, also
at once from `Content-Length`), all header lines together and their count (431), the time to
receive a request head (the connection is closed) and a body (408); see `HttpApi`. The body
must be UTF-8 JSON (400 `invalid_json`; RFC 8259's, so no `NaN` or `Infinity`, and no number
beyond a double), plain or gzip/deflate (415 for other codings). Malformed HTTP is answered
by `homing.gateway.http_server` with the same error bodies.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from homing.aio import off_loop_if
from homing.clock import Clock
from homing.gateway.auth import KeyRing, Principal
from homing.gateway.decoding import LoggedToken
from homing.gateway.errors import APIError, internal_error
from homing.gateway.generation import Generation, LogprobDelta, TextDelta
from homing.gateway.http_server import (
    HttpLimits,
    body_error,
    content_coding,
    decode_body,
    error_response,
)
from homing.gateway.http_server import json_dumps as _json_dumps
from homing.gateway.logprobs import LogprobFormat
from homing.gateway.output import (
    DeltaBuilder,
    finish_reason,
    heavy_output,
    message_body,
    parse_whole,
    reasoning_tokens,
)
from homing.gateway.prepare import VERSION_HEADER, Intake, PreparedRequest, header_text
from homing.gateway.request_log import RequestLog, new_request_id, parse_traceparent
from homing.gateway.requests import (
    THREADED_BODY_BYTES,
    ChatRequest,
    CompletionRequest,
    loads_json,
    parse_chat,
    parse_completion,
)
from homing.gateway.service import InferenceService
from homing.obs.process_metrics import ProcessMetrics
from homing.text.output import ContentDelta

log = structlog.get_logger("homing.http")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

REQUEST_ID = web.RequestKey("request_id", str)
ARRIVED_AT = web.RequestKey("arrived_at", float)  # the clock's time when the handler began
# Set once a request reaches a Generation, which writes its request_done line itself.
SERVED = web.RequestKey("served", bool)
LINGERING_S = 1.0
#: Fresh `/metrics` expositions per second at most (a scraper per second or two, with
#: room for a person's curl); a flood of scrapes gets the latest one.
METRICS_PER_SECOND = 4


def _errors_middleware(
    request_log: RequestLog,
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """Middleware: the request id, OpenAI-shaped errors, and the one report of a request
    that ended before it reached a `Generation` (`request_log`)."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        request_id = new_request_id(request.headers.get("x-request-id"))
        request[REQUEST_ID] = request_id
        request[ARRIVED_AT] = arrived_at = request_log.clock.now()
        try:
            response = await handler(request)
        except asyncio.CancelledError:  # the client went away (handler_cancellation)
            if not request.get(SERVED, False):
                request_log.cancelled(request_id, api="http", path=request.path)
            raise
        except APIError as err:
            request_log.rejected(
                request_id, err, started_at=arrived_at, api="http", path=request.path
            )
            return error_response(err, request_id)
        except web.HTTPException as err:
            if err.status < 400:
                raise
            code = {404: "not_found", 405: "method_not_allowed"}.get(err.status, "invalid_request")
            api_err = APIError(err.status, err.reason, code=code)
            request_log.rejected(
                request_id, api_err, started_at=arrived_at, api="http", path=request.path
            )
            return error_response(api_err, request_id)
        except Exception:
            log.exception("internal_error", request_id=request_id, path=request.path)
            err = internal_error()
            if not request.get(SERVED, False):  # a Generation reports its own end
                request_log.rejected(
                    request_id, err, started_at=arrived_at, api="http", path=request.path
                )
            return error_response(err, request_id)
        if not response.prepared:
            response.headers["x-request-id"] = request_id
        return response

    return errors


def _request_limits(limits: HttpLimits) -> Callable[[web.Request, Handler], Awaitable[Any]]:
    """Middleware, before any body is read: 431 when all request header lines together exceed
    `max_header_bytes` (name + value + 4 bytes of `: ` and CRLF per line, plus the request
    line) or there are more than `max_header_count`; 413 for a `Content-Length` over the
    body limit; 415 for a `Content-Encoding` other than one gzip or deflate
    (`http_server.content_coding`). A head larger than a read, or a line past the parser's
    limits, is refused earlier by `homing.gateway.http_server` with the same codes."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        size = len(request.method) + len(request.raw_path) + 12  # "M PATH HTTP/1.1\r\n"
        size += sum(len(k) + len(v) + 4 for k, v in request.raw_headers)
        if size > limits.max_header_bytes:
            raise limits.error("request_header_fields_too_large")
        if len(request.raw_headers) > limits.max_header_count:
            raise limits.error("too_many_headers")
        length = request.content_length  # the parser accepts digits only
        if length is not None and length > limits.max_body_bytes:
            raise limits.error("request_too_large")
        content_coding(request.headers)  # raises the 415
        return await handler(request)

    return check


async def _read_json(
    request: web.Request,
    limits: HttpLimits,
    clock: Clock,
    timeout_s: float | None = None,
    parse: Callable[[Any], Any] = lambda body: body,
) -> Any:
    """The body as JSON, decoded as its Content-Encoding (`http_server.decode_body`). It must
    be UTF-8 (RFC 8259 section 8.1; `json.loads` of bytes would also take UTF-16/32 and pass
    encoded surrogates through), so every string in it can be encoded again (tokenizer,
    hashing, logs), and JSON as `loads_json` reads it. 408, 413, 400 `invalid_json`, 400
    `invalid_content_encoding` for a body that does not decode as its Content-Encoding, and
    the chunk-framing errors of `http_server.body_error`. Returns `parse(body)`, run with the
    decoding in a thread for a body over `THREADED_BODY_BYTES`."""
    try:
        async with clock.timeout(timeout_s):
            raw = await request.read()  # raises HTTPRequestEntityTooLarge past client_max_size
    except TimeoutError:
        raise APIError(
            408,
            f"The request body was not received within {timeout_s:g} s.",
            code="request_timeout",
        ) from None
    except web.HTTPRequestEntityTooLarge:
        raise limits.error("request_too_large") from None
    except (web.RequestPayloadError, HttpProcessingError) as err:
        raise body_error(err, limits) from None
    coding = content_coding(request.headers)
    heavy = len(raw) > THREADED_BODY_BYTES or coding is not None
    return await off_loop_if(heavy, lambda: parse(_decode_json(raw, coding, limits)))


def _decode_json(raw: bytes, coding: str | None, limits: HttpLimits) -> Any:
    """`_read_json`'s checks of the received bytes (CPU work only)."""
    raw = decode_body(raw, coding, limits)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise APIError(
            400,
            f"The request body is not valid UTF-8 (byte {err.start}: {err.reason}).",
            code="invalid_json",
        ) from None
    try:
        body = loads_json(text)
    except ValueError as err:  # JSONDecodeError, huge ints
        raise APIError(
            400, f"The request body is not valid JSON: {err}", code="invalid_json"
        ) from None
    except RecursionError:
        raise APIError(
            400, "The request body is JSON nested too deeply to be read.", code="invalid_json"
        ) from None
    if b"\\ud" in raw or b"\\uD" in raw:  # escapes may encode lone surrogates
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise APIError(
                400,
                "The request body contains an unpaired UTF-16 surrogate escape.",
                code="invalid_json",
            ) from None
    return body


def _intake(
    request: web.Request, req: ChatRequest | CompletionRequest, principal: Principal | None
) -> Intake:
    """The `Intake` of `req` from `request`'s headers: `x-session-id` (400 when it is not
    UTF-8), `traceparent` and `x-homing-version` (unchecked here: `Preparer.prepare` checks it
    last, after the model's own errors)."""
    return Intake(
        request=req,
        request_id=request[REQUEST_ID],
        session_key=_session_key(request),
        principal=principal,
        arrived_at=request[ARRIVED_AT],
        trace=parse_traceparent(request.headers.get("traceparent")),
        version=request.headers.get(VERSION_HEADER),
    )


def _session_key(request: web.Request) -> str | None:
    """`x-session-id` (None when absent or empty); 400 when it is not UTF-8 (`header_text`)."""
    return header_text("x-session-id", request.headers.get("x-session-id"))


class HttpApi:
    """The aiohttp application for one `InferenceService`.

    `keyring`: API keys (None or empty: auth off). `max_body_bytes` (413),
    `max_header_bytes` (all header lines), `max_header_count` (lines): 431 past them
    (`HttpLimits`; the defaults are `homing.config.GatewaySettings`').
    `header_timeout_s`: a connection must deliver a complete request head within this time
    of connecting or of its previous response, else it is closed (slowloris); it is also the
    idle keep-alive timeout. `body_timeout_s`: 408 when the body takes longer.
    Serve `app` with `http_server.GatewayRunner(app, **runner_kwargs())`.
    """

    def __init__(
        self,
        service: InferenceService,
        *,
        max_body_bytes: int,
        max_header_bytes: int,
        max_header_count: int,
        keyring: KeyRing | None = None,
        header_timeout_s: float = 30.0,
        body_timeout_s: float = 30.0,
    ) -> None:
        self.service = service
        self.keyring = keyring if keyring is not None else KeyRing(())
        self.limits = HttpLimits(
            max_body_bytes=max_body_bytes,
            max_header_bytes=max_header_bytes,
            max_header_count=max_header_count,
        )
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.app = web.Application(
            client_max_size=max_body_bytes,
            middlewares=[
                _errors_middleware(service.request_log),
                _request_limits(self.limits),
            ],
        )
        self.app.router.add_post("/v1/chat/completions", self.chat_completions)
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_get("/health", self.health)
        self.app.router.add_get("/ready", self.ready)
        # Prometheus exposition of this registry (set by the App; 404 while None).
        self.metrics_registry: CollectorRegistry | None = None
        # Several gateway processes: every one's series in each answer.
        self.process_metrics: ProcessMetrics | None = None
        # (the clock's time of each of the last fresh expositions, the latest body)
        self._expositions: deque[float] = deque(maxlen=METRICS_PER_SECOND)
        self._exposition = b""
        self.app.router.add_get("/metrics", self.metrics)

    def runner_kwargs(self) -> dict[str, Any]:
        """Settings of the `GatewayRunner` (homing.gateway.http_server) that serves `app`:
        the limits and aiohttp's keep-alive (= head) timeout and lingering time."""
        return {
            "limits": self.limits,
            "keepalive_timeout": self.header_timeout_s,
            # After answering before a body was read in full (408, 413, auth errors), keep
            # draining it this long so the client sees the answer, then close.
            "lingering_time": LINGERING_S,
            "request_log": self.service.request_log,
        }

    def _principal(self, request: web.Request) -> Principal | None:
        return self.keyring.authenticate(request.headers.get("Authorization"))

    # -- simple routes --

    async def health(self, request: web.Request) -> web.Response:
        """Liveness: 200 while the process serves."""
        return web.json_response({"status": "ok"})

    async def ready(self, request: web.Request) -> web.Response:
        """Readiness: 200 when some served model has a ready, healthy worker or is scaled to
        zero with its autoscaler ready to start one (the instance can serve), else 503.
        The body counts them over all models and per model."""
        fleet = self.service.fleet.models.values()
        models = {
            m.model_id: {
                "ready_workers": m.ready_workers,
                "workers": len(m.workers()),
                **({"scales_from_zero": True} if m.scales_from_zero else {}),
            }
            for m in fleet
        }
        ready = any(m.can_serve for m in fleet)
        body = {
            "ready": ready,
            "healthy_workers": sum(m["ready_workers"] for m in models.values()),
            "workers": sum(m["workers"] for m in models.values()),
            "models": models,
        }
        return web.json_response(body, status=200 if ready else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        """`GET /metrics`: Prometheus text format of `metrics_registry` (router, gateway),
        with every gateway process's series when there are several (`process_metrics`).
        At most `METRICS_PER_SECOND` expositions are built a second; a scrape past that gets
        the latest one (the endpoint is open, and building one costs the event loop ms)."""
        if self.metrics_registry is None:
            raise web.HTTPNotFound()
        now = self.service.clock.now()
        done = self._expositions
        if len(done) < METRICS_PER_SECOND or now - done[0] >= 1.0:
            done.append(now)
            own = generate_latest(self.metrics_registry)
            if self.process_metrics is not None:
                own = await self.process_metrics.exposition(own)
            self._exposition = own
        body = self._exposition
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, request: web.Request) -> web.Response:
        """`GET /v1/models`: the served models the caller may use, with context windows (a
        model with no ready worker stays listed)."""
        principal = self._principal(request)
        data = [
            {
                "id": m.model_id,
                "object": "model",
                "created": m.created,
                "owned_by": "homing",
                "max_model_len": m.max_context_length,
            }
            for m in self.service.fleet.models.values()
            if principal is None or principal.may_see(m.model_id)
        ]
        return web.json_response({"object": "list", "data": data})

    # -- completions --

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        """`POST /v1/chat/completions`."""
        return await self._complete(request, parse_chat)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """`POST /v1/completions` (prompt as a string or a list of token ids)."""
        return await self._complete(request, parse_completion)

    async def _complete(
        self, request: web.Request, parse: Callable[[Any], ChatRequest | CompletionRequest]
    ) -> web.StreamResponse:
        """Authenticate, read the body with `parse`, prepare its `Intake` and serve it."""
        principal = self._principal(request)
        req = await _read_json(request, self.limits, self.service.clock, self.body_timeout_s, parse)
        prepared = await self.service.prepare.prepare(_intake(request, req, principal))
        return await self._serve(request, prepared)

    async def _serve(self, request: web.Request, prepared: PreparedRequest) -> web.StreamResponse:
        request[SERVED] = True
        try:
            async with self.service.open(prepared) as generation:
                if not prepared.stream:
                    texts = await generation.collect_texts()  # may run again elsewhere
                    heavy = heavy_output(prepared, texts)
                    return web.json_response(
                        await off_loop_if(heavy, full_body, prepared, generation, texts),
                        headers=_served_headers(prepared, generation),
                        dumps=_json_dumps,
                    )
                headers = _served_headers(prepared, generation)
                response = await self._stream(request, prepared, generation, headers)
        except APIError as err:  # the generation logged its own request_done line
            return error_response(err, prepared.request_id)
        # The generation is closed (quota settled, stream slot released) before the client
        # sees the end of the stream, so its next request finds the slot free.
        await response.write_eof(b"data: [DONE]\n\n")
        return response

    async def _stream(
        self,
        request: web.Request,
        prepared: PreparedRequest,
        generation: Generation,
        headers: dict[str, str],
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            status=200,
            headers={
                **headers,
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            },
        )
        await response.prepare(request)

        def event(obj: Any) -> bytes:
            return f"data: {_json_dumps(obj)}\n\n".encode()

        chunker = ChunkBuilder(prepared)
        # The events ready at the same moment go out as one write; none waits for another.
        out: list[bytes] = []
        plan = prepared.output
        if prepared.kind == "chat":
            # null content until the answer says otherwise where it may be calls alone, as
            # OpenAI streams it (and as `message_body` gives it)
            first = None if plan is not None and plan.parses_calls else ""
            out.extend(event(chunker.chunk(i, role=True, content=first)) for i in range(prepared.n))
        parsers = [plan.parser() for _ in range(prepared.n)] if plan is not None else []
        builder = DeltaBuilder(plan.legacy) if plan is not None else None
        lp = chunker.logprobs  # None unless the request asked for log probabilities
        # Parsed chat with logprobs: per choice, the tokens not yet sent; they ride on the
        # choice's next chunk (a delta, or its finish).
        waiting: list[list[LoggedToken]] = [[] for _ in range(prepared.n)]
        try:
            async for batch in generation.batches():
                for item in batch:
                    if not parsers:  # the plain path: text is content
                        if isinstance(item, TextDelta):
                            if lp is None:
                                out.append(chunker.content_event(item.index, item.text))
                            else:
                                out.append(event(chunker.logged_chunk(item)))
                        else:
                            out.append(event(chunker.chunk(item.index, finish_reason=item.reason)))
                        continue
                    assert plan is not None and builder is not None
                    parser = parsers[item.index]
                    held = waiting[item.index]
                    if isinstance(item, TextDelta):
                        events = parser.feed(item.text)
                        if isinstance(item, LogprobDelta):
                            held.extend(item.logprobs)
                        elif (
                            len(events) == 1 and type(events[0]) is ContentDelta and events[0].text
                        ):
                            # content alone (most steps of a reasoning model's answer): the
                            # plain path's pre-encoded event, same bytes as the delta's
                            out.append(chunker.content_event(item.index, events[0].text))
                            continue
                    else:
                        events = parser.finish()
                    deltas = builder.deltas(events, parser.ids)
                    # The tokens ride on the last delta of their text that is not a call's
                    # header (else on the choice's next chunk: its finish at the latest).
                    last = max((k for k, d in enumerate(deltas) if not _header(d)), default=-1)
                    for position, delta in enumerate(deltas):
                        logged = None
                        if position == last:
                            logged = chunker.chat_logprobs(held)
                            held.clear()
                        out.append(event(chunker.delta_chunk(item.index, delta, logged)))
                    if not isinstance(item, TextDelta):
                        reason = finish_reason(item.reason, parser.calls, plan.legacy)
                        logged = chunker.chat_logprobs(held)
                        held.clear()
                        out.append(
                            event(chunker.chunk(item.index, finish_reason=reason, logprobs=logged))
                        )
                if prepared.include_usage and generation.finished:
                    thoughts = [p.reasoning_text for p in parsers]
                    reasoning = await off_loop_if(
                        heavy_output(prepared, thoughts), reasoning_tokens, prepared, thoughts
                    )
                    usage = generation.finalize_usage()
                    out.append(event(chunker.usage_chunk(usage, reasoning)))
                await response.write(b"".join(out))
                out.clear()
        except APIError as err:
            out.append(event(err.body()))
        if out:
            await response.write(b"".join(out))
        return response


def _header(delta: dict[str, Any]) -> bool:
    """Whether a streamed delta is a call's first (its id and name, `arguments: ""`)."""
    calls = delta.get("tool_calls")
    if calls is not None:
        return "id" in calls[0]
    return "name" in delta.get("function_call", ())


def _served_headers(prepared: PreparedRequest, generation: Generation) -> dict[str, str]:
    return {
        "x-request-id": prepared.request_id,
        "x-homing-worker": generation.worker_id or "",
        VERSION_HEADER: generation.version,
    }


class ChunkBuilder:
    """Builds OpenAI streaming chunk objects (`chat.completion.chunk` / `text_completion`)."""

    def __init__(self, prepared: PreparedRequest) -> None:
        self.p = prepared
        prefix = "chatcmpl-" if prepared.kind == "chat" else "cmpl-"
        self.id = prefix + prepared.request_id
        self.object = "chat.completion.chunk" if prepared.kind == "chat" else "text_completion"
        # A content delta's SSE event is these constant parts around the choice index and
        # the text: encoded once here, not per token (same bytes as the dict path).
        envelope = _json_dumps(
            {"id": self.id, "object": self.object, "created": prepared.created,
             "model": prepared.model.model_id, "system_fingerprint": prepared.system_fingerprint}
        )  # fmt: skip
        self._head = "data: " + envelope[:-1] + ',"choices":[{"index":'
        self._field = ',"delta":{"content":' if prepared.kind == "chat" else ',"text":'
        self._tail = (
            ("}" if prepared.kind == "chat" else "")
            + ',"logprobs":null,"finish_reason":null}]'
            + (',"usage":null' if prepared.include_usage else "")
            + "}\n\n"
        ).encode()
        self._heads: dict[int, bytes] = {}  # choice index -> the event's bytes before the text
        #: The request's logprob shapes, None when it asked for none.
        self.logprobs = (
            LogprobFormat(prepared.model.tokenizer, prepared.top_logprobs)
            if prepared.logprobs
            else None
        )

    def chat_logprobs(self, logged: list[LoggedToken]) -> dict[str, Any] | None:
        """A chat chunk's `logprobs` for `logged` (None: none asked for, or no token)."""
        return self.logprobs.chat_chunk(logged) if self.logprobs is not None else None

    def logged_chunk(self, item: TextDelta) -> dict[str, Any]:
        """The chunk of a text delta with its tokens' `logprobs` (a logprobs request)."""
        assert self.logprobs is not None
        logged = item.logprobs if isinstance(item, LogprobDelta) else ()
        if self.p.kind == "chat":
            shaped = self.logprobs.chat_chunk(logged)
        else:
            shaped = self.logprobs.completion_chunk(logged)
        return self.chunk(item.index, content=item.text, logprobs=shaped)

    def content_event(self, index: int, text: str) -> bytes:
        """The SSE event (`data: ...` and the blank line) of `chunk(index, content=text)`:
        orjson's string, the same bytes as `json_dumps`'s encoded (UnicodeEncodeError
        becomes orjson's TypeError for a lone surrogate, which no tokenizer gives)."""
        head = self._heads.get(index)
        if head is None:
            head = self._heads[index] = f"{self._head}{index}{self._field}".encode()
        return head + orjson.dumps(text) + self._tail

    def delta_chunk(
        self, index: int, delta: dict[str, Any], logprobs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A chat chunk carrying `delta` (`homing.gateway.output.DeltaBuilder`'s) and its
        tokens' `logprobs` (None: none)."""
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}
        return self._base([choice])

    def _base(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": self.object,
            "created": self.p.created,
            "model": self.p.model.model_id,
            "system_fingerprint": self.p.system_fingerprint,
            "choices": choices,
        }
        if self.p.include_usage:
            body["usage"] = None
        return body

    def chunk(
        self,
        index: int,
        *,
        content: str | None = None,
        role: bool = False,
        finish_reason: str | None = None,
        logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A chunk for one choice: a content delta, the role delta, or the finish; `logprobs`
        the choice's `logprobs` object (`homing.gateway.logprobs`), None for null."""
        if self.p.kind == "chat":
            delta: dict[str, Any] = {}
            if role:  # the role delta carries `content` even when null
                delta["role"] = "assistant"
                delta["content"] = content
            elif content is not None:
                delta["content"] = content
            choice: dict[str, Any] = {
                "index": index,
                "delta": delta,
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
        else:
            choice = {
                "index": index,
                "text": content or "",
                "logprobs": logprobs,
                "finish_reason": finish_reason,
            }
        return self._base([choice])

    def usage_chunk(self, usage: Any, reasoning_tokens: int | None = None) -> dict[str, Any]:
        """The final usage chunk: empty `choices` and the request's `usage`."""
        body = self._base([])
        body["usage"] = usage_body(usage, reasoning_tokens)
        return body


def usage_body(usage: Any, reasoning_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage object including `prompt_tokens_details.cached_tokens`, and
    `completion_tokens_details.reasoning_tokens` when the answer was parsed for reasoning."""
    body = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }
    if reasoning_tokens is not None:
        body["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return body


def full_body(
    prepared: PreparedRequest, generation: Generation, texts: list[str]
) -> dict[str, Any]:
    """The non-streamed response body (`chat.completion` or `text_completion`)."""
    usage = generation.finalize_usage()
    choices: list[dict[str, Any]] = []
    plan = prepared.output
    reasoning: list[str] = []
    lp = (
        LogprobFormat(prepared.model.tokenizer, prepared.top_logprobs)
        if prepared.logprobs
        else None
    )
    for index, text in enumerate(texts):
        reason = generation.finish_reasons.get(index)
        logprobs: dict[str, Any] | None = None
        if lp is not None:
            logged = generation.logprobs[index] if index < len(generation.logprobs) else []
            logprobs = lp.chat(logged) if prepared.kind == "chat" else lp.completion(logged)
        if prepared.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if plan is not None:
                parsed, ids = parse_whole(plan, text)
                message = message_body(parsed, ids, plan)
                reason = finish_reason(reason, len(parsed.calls), plan.legacy)
                reasoning.append(parsed.reasoning)
            choices.append(
                {"index": index, "message": message, "logprobs": logprobs, "finish_reason": reason}
            )
        else:
            choices.append(
                {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}
            )
    return {
        "id": ("chatcmpl-" if prepared.kind == "chat" else "cmpl-") + prepared.request_id,
        "object": "chat.completion" if prepared.kind == "chat" else "text_completion",
        "created": prepared.created,
        "model": prepared.model.model_id,
        "system_fingerprint": prepared.system_fingerprint,
        "choices": choices,
        "usage": usage_body(usage, reasoning_tokens(prepared, reasoning)),
    }
