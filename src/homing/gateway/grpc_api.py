"""homing's gRPC client API (`homing.v1.Inference`, proto/homing/v1/inference.proto).

Same semantics and validation as the HTTP API: each call is converted to the OpenAI JSON body,
validated by `homing.gateway.requests` and served by the same `InferenceService`. Errors end
the call with the gRPC status mapped from the HTTP one (`APIError.grpc_code`), the message as
details, and the OpenAI error JSON in the trailing metadata key `x-error-json`.
Initial metadata carries `x-request-id`, `x-homing-worker` and `x-homing-version`; a call's
metadata `x-homing-version` pins the version, as the HTTP header does. Server reflection and
the standard health service are enabled; health is SERVING while a worker is healthy.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
import structlog
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from homing.aio import off_loop_if
from homing.gateway.auth import KeyRing, Principal
from homing.gateway.decoding import LoggedToken
from homing.gateway.errors import APIError, internal_error, invalid
from homing.gateway.generation import ChoiceFinished, Generation, LogprobDelta, TextDelta
from homing.gateway.logprobs import LogprobFormat
from homing.gateway.output import finish_reason, heavy_output, parse_whole, reasoning_tokens
from homing.gateway.prepare import VERSION_HEADER, Intake, PreparedRequest
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
from homing.text.output import CallArguments, CallStart, ContentDelta, ReasoningDelta
from homing.text.output import Event as OutputEvent
from homing.v1 import inference_pb2 as pb
from homing.v1 import inference_pb2_grpc as pb_grpc

log = structlog.get_logger("homing.grpc")

SERVICE_NAME = "homing.v1.Inference"


def _sampling_to_body(sampling: pb.SamplingOptions, body: dict[str, Any], *, chat: bool) -> None:
    """Copy the set options into `body` under their OpenAI names; raises `APIError` 400 when
    `response_format` is not JSON text as the HTTP API reads a body (`loads_json`). Log
    probabilities: chat's `logprobs`/`top_logprobs` as they are; for completions `logprobs`
    becomes the body's integer `logprobs` (`top_logprobs`, 0 when unset), and `echo` goes
    to the body (a chat body does not know it: 400)."""
    for name in (
        "max_tokens",
        "temperature",
        "top_p",
        "n",
        "seed",
        "ignore_eos",
        "frequency_penalty",
        "presence_penalty",
        "top_k",
        "min_p",
        "repetition_penalty",
    ):
        if sampling.HasField(name):
            body[name] = getattr(sampling, name)
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.logit_bias:
        body["logit_bias"] = {str(token): bias for token, bias in sampling.logit_bias.items()}
    if sampling.HasField("response_format"):
        body["response_format"] = _json_field(sampling.response_format, "response_format")
    if chat:
        for name in ("logprobs", "top_logprobs", "echo"):
            if sampling.HasField(name):
                body[name] = getattr(sampling, name)
    else:
        if sampling.HasField("echo"):
            body["echo"] = sampling.echo
        top = sampling.top_logprobs if sampling.HasField("top_logprobs") else None
        if sampling.HasField("logprobs") and sampling.logprobs:
            body["logprobs"] = top or 0
        elif top:
            raise invalid(
                "The 'top_logprobs' parameter is only allowed when 'logprobs' is enabled.",
                "top_logprobs",
            )


def _json_field(text: str, name: str) -> Any:
    """A request field holding JSON text, parsed as the HTTP API reads a body; 400 names it
    when it is not JSON."""
    try:
        return loads_json(text)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply
        raise invalid(f"Invalid value for '{name}': not valid JSON text.", name) from None


def _chat_message(m: pb.ChatMessage) -> dict[str, Any]:
    message: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.HasField("tool_call_id"):
        message["tool_call_id"] = m.tool_call_id
    if m.HasField("name"):
        message["name"] = m.name
    if m.HasField("reasoning"):
        message["reasoning_content"] = m.reasoning
    return message


def _large(request: Message) -> bool:
    """Whether `request` is parsed in a worker thread: over `THREADED_BODY_BYTES`, as the
    HTTP API parses a large body."""
    return request.ByteSize() > THREADED_BODY_BYTES


def chat_body(request: pb.ChatCompletionRequest) -> dict[str, Any]:
    """The OpenAI chat body equivalent to a gRPC `ChatCompletionRequest`."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": [_chat_message(m) for m in request.messages],
        "stream": request.stream,
    }
    if request.user:
        body["user"] = request.user
    if request.HasField("sampling"):
        _sampling_to_body(request.sampling, body, chat=True)
    for name in ("tools", "chat_template_kwargs"):
        if request.HasField(name):
            body[name] = _json_field(getattr(request, name), name)
    if request.HasField("tool_choice"):
        choice = request.tool_choice
        body["tool_choice"] = (
            _json_field(choice, "tool_choice") if choice.lstrip().startswith("{") else choice
        )
    if request.HasField("parallel_tool_calls"):
        body["parallel_tool_calls"] = request.parallel_tool_calls
    if request.HasField("reasoning_effort"):
        body["reasoning_effort"] = request.reasoning_effort
    return body


def completion_body(request: pb.CompletionRequest) -> dict[str, Any]:
    """The OpenAI completions body equivalent to a gRPC `CompletionRequest`."""
    body: dict[str, Any] = {"model": request.model, "stream": request.stream}
    which = request.WhichOneof("prompt")
    if which == "text":
        body["prompt"] = request.text
    elif which == "token_ids":
        body["prompt"] = list(request.token_ids.ids)
    if request.HasField("allow_special_tokens"):
        body["allow_special_tokens"] = request.allow_special_tokens
    if request.user:
        body["user"] = request.user
    if request.HasField("sampling"):
        _sampling_to_body(request.sampling, body, chat=False)
    return body


class InferenceServicer(pb_grpc.InferenceServicer):
    """gRPC front of `InferenceService`; the API key comes in the `authorization` metadata
    (`Bearer KEY`), as on HTTP."""

    def __init__(self, service: InferenceService, keyring: KeyRing | None = None) -> None:
        self.service = service
        self.keyring = keyring if keyring is not None else KeyRing(())

    def _principal(self, context: grpc.aio.ServicerContext) -> Principal | None:
        value = dict(context.invocation_metadata() or ()).get("authorization")
        return self.keyring.authenticate(value if isinstance(value, str) else None)

    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        principal: Principal | None = None
        try:
            principal = self._principal(context)
        except APIError as err:  # reported as HTTP's GET /v1/models refusal is
            request_id = _request_id(context)
            self.service.request_log.rejected(request_id, err, api="grpc", path="ListModels")
            await _abort(context, err, request_id)  # raises
        return pb.ListModelsResponse(
            models=[
                pb.Model(
                    id=m.model_id,
                    owned_by="homing",
                    created=m.created,
                    max_context_length=m.max_context_length,
                )
                for m in self.service.fleet.models.values()
                if principal is None or principal.may_see(m.model_id)
            ]
        )

    # The streaming calls write their messages with `context.write` (grpc.aio's coroutine
    # form of a server-streaming handler) rather than yield them through async generators.

    async def ChatCompletion(
        self, request: pb.ChatCompletionRequest, context: grpc.aio.ServicerContext
    ) -> None:
        await self._handle(request, lambda: parse_chat(chat_body(request)), request.user, context)

    async def Completion(
        self, request: pb.CompletionRequest, context: grpc.aio.ServicerContext
    ) -> None:
        await self._handle(
            request, lambda: parse_completion(completion_body(request)), request.user, context
        )

    async def _handle(
        self,
        request: Message,
        parse: Callable[[], ChatRequest | CompletionRequest],
        user: str,
        context: grpc.aio.ServicerContext,
    ) -> None:
        """Authenticate, parse `request` with `parse` (in a thread when `_large`), prepare
        its `Intake` and serve it; a refusal before serving is reported and ends the call."""
        request_id = _request_id(context)
        request_log = self.service.request_log
        arrived_at = self.service.clock.now()
        try:
            principal = self._principal(context)
            intake = Intake(
                request=await off_loop_if(_large(request), parse),
                request_id=request_id,
                session_key=user or None,
                principal=principal,
                arrived_at=arrived_at,
                trace=parse_traceparent(_metadata_value(context, "traceparent")),
                version=_metadata_value(context, VERSION_HEADER),
            )
            prepared = await self.service.prepare.prepare(intake)
        except APIError as err:
            request_log.rejected(request_id, err, started_at=arrived_at, api="grpc")
            await _abort(context, err, request_id)
            return
        except asyncio.CancelledError:
            request_log.cancelled(request_id, api="grpc")
            raise
        except Exception:  # a fault of ours: reported and answered like any refusal
            log.exception("internal_error", request_id=request_id)
            err = internal_error()
            request_log.rejected(request_id, err, started_at=arrived_at, api="grpc")
            await _abort(context, err, request_id)
            return
        await self._serve(prepared, context)

    async def _serve(self, prepared: PreparedRequest, context: grpc.aio.ServicerContext) -> None:
        error: APIError | None = None
        try:
            async with self.service.open(prepared) as generation:
                # A streamed call's metadata goes out now; a non-streamed one's once its
                # answer is whole (it may run again on another worker until then).
                if prepared.stream:
                    await _send_metadata(context, prepared, generation)
                    await _write_stream(context, prepared, generation)
                else:
                    whole = await _whole_answer(prepared, generation)
                    await _send_metadata(context, prepared, generation)
                    await context.write(whole)
        except APIError as err:
            error = err
        if error is not None:
            await _abort(context, error, prepared.request_id)


async def _send_metadata(
    context: grpc.aio.ServicerContext, prepared: PreparedRequest, generation: Generation
) -> None:
    await context.send_initial_metadata(
        (
            ("x-request-id", prepared.request_id),
            ("x-homing-worker", generation.worker_id or ""),
            (VERSION_HEADER, generation.version),
        )
    )


def _message(
    prepared: PreparedRequest, generation: Generation, choices: list[pb.Choice]
) -> pb.CompletionChunk:
    return pb.CompletionChunk(
        id=prepared.request_id,
        model=prepared.model.model_id,
        created=prepared.created,
        choices=choices,
        worker=generation.worker_id or "",
        system_fingerprint=prepared.system_fingerprint,
    )


async def _whole_answer(prepared: PreparedRequest, generation: Generation) -> pb.CompletionChunk:
    """The non-streamed answer: one message with every choice's whole text and the usage
    (built in a thread when long texts are parsed and counted: `heavy_output`)."""
    texts = await generation.collect_texts()
    return await off_loop_if(heavy_output(prepared, texts), _whole_message, prepared,
                             generation, texts)  # fmt: skip


def _whole_message(
    prepared: PreparedRequest, generation: Generation, texts: list[str]
) -> pb.CompletionChunk:
    role = "assistant" if prepared.kind == "chat" else ""
    plan = prepared.output
    lp = _format(prepared)
    choices: list[pb.Choice] = []
    reasoning: list[str] = []
    for i, text in enumerate(texts):
        reason = generation.finish_reasons.get(i, "")
        if plan is None:
            choice = pb.Choice(index=i, text=text, role=role, finish_reason=reason)
        else:
            parsed, ids = parse_whole(plan, text)
            reasoning.append(parsed.reasoning)
            choice = pb.Choice(
                index=i,
                text=parsed.content,
                role=role,
                finish_reason=finish_reason(reason, len(parsed.calls), plan.legacy) or "",
                reasoning=parsed.reasoning,
                tool_calls=[
                    pb.ToolCallDelta(index=k, id=ids[k], name=c.name, arguments=c.arguments)
                    for k, c in enumerate(parsed.calls)
                ],
            )
        if lp is not None and i < len(generation.logprobs):
            _add_logprobs(choice, lp, generation.logprobs[i])
        choices.append(choice)
    whole = _message(prepared, generation, choices)
    whole.usage.CopyFrom(_usage(generation, reasoning_tokens(prepared, reasoning)))
    return whole


async def _write_stream(
    context: grpc.aio.ServicerContext, prepared: PreparedRequest, generation: Generation
) -> None:
    """One message per batch of events that were ready at once, with at most one entry per
    choice (its texts joined, its finish reason once it ended); the usage rides on the last
    message. A chat choice's first entry carries the role. An entry with nothing to say is
    left out; a parsed choice's token logprobs ride on its next entry that says something,
    as over HTTP."""
    role = "assistant" if prepared.kind == "chat" else ""
    first = set(range(prepared.n))
    plan = prepared.output
    parsers = [plan.parser() for _ in range(prepared.n)] if plan is not None else []
    lp = _format(prepared)
    waiting: list[list[LoggedToken]] = [[] for _ in range(prepared.n)]  # parsed, not yet sent
    async for batch in generation.batches():
        entries: dict[int, pb.Choice] = {}
        for event in batch:
            choice = entries.get(event.index)
            if choice is None:
                choice = entries[event.index] = pb.Choice(index=event.index)
                if event.index in first:
                    choice.role = role
                    first.discard(event.index)
            if lp is not None and isinstance(event, LogprobDelta):
                if plan is None:
                    _add_logprobs(choice, lp, event.logprobs)
                else:  # sent with the text they release (the parser may hold it back)
                    waiting[event.index].extend(event.logprobs)
            if plan is not None:
                parser = parsers[event.index]
                parsed = (
                    parser.feed(event.text) if isinstance(event, TextDelta) else parser.finish()
                )
                _add_events(choice, parsed, parser.ids)
                if isinstance(event, ChoiceFinished):
                    reason = finish_reason(event.reason, parser.calls, plan.legacy)
                    choice.finish_reason = reason or ""
            elif isinstance(event, TextDelta):
                choice.text += event.text
            elif isinstance(event, ChoiceFinished):
                choice.finish_reason = event.reason
        # A parser holding text back (a possible call marker) yields nothing for its delta.
        sent = [c for c in entries.values() if _has_output(c)]
        if lp is not None and plan is not None:
            for choice in sent:
                if choice.text or choice.reasoning or choice.tool_calls or choice.finish_reason:
                    _add_logprobs(choice, lp, waiting[choice.index])
                    waiting[choice.index].clear()
        if not sent and not generation.finished:
            continue
        message = _message(prepared, generation, sent)
        if generation.finished:
            texts = [p.reasoning_text for p in parsers]
            counted = await off_loop_if(
                heavy_output(prepared, texts), reasoning_tokens, prepared, texts
            )
            message.usage.CopyFrom(_usage(generation, counted))
        await context.write(message)


def _has_output(choice: pb.Choice) -> bool:
    """Whether a streamed entry says anything: a role, text, reasoning, a call, logprobs or
    its finish reason."""
    return bool(
        choice.role
        or choice.text
        or choice.reasoning
        or choice.tool_calls
        or choice.logprobs
        or choice.finish_reason
    )


def _format(prepared: PreparedRequest) -> LogprobFormat | None:
    """The request's logprob shapes, None when it asked for none."""
    if not prepared.logprobs:
        return None
    return LogprobFormat(prepared.model.tokenizer, prepared.top_logprobs)


def _add_logprobs(choice: pb.Choice, lp: LogprobFormat, logged: Sequence[LoggedToken]) -> None:
    """Append `logged`'s tokens to the entry's `logprobs` (`TokenLogprob`: an echoed prompt's
    first token has no `logprob`)."""
    for token, raw, value, top, offset in lp.entries(logged):
        entry = choice.logprobs.add(token=token, bytes=raw, text_offset=offset)
        if value is not None:
            entry.logprob = value
        for top_token, top_raw, top_value in top:
            entry.top.add(token=top_token, logprob=top_value, bytes=top_raw)


def _add_events(choice: pb.Choice, events: list[OutputEvent], ids: list[str]) -> None:
    """Add parsed events to a streamed entry: content to `text`, reasoning to `reasoning`,
    a call's start as a new `tool_calls` delta, its argument fragments to its last delta."""
    for event in events:
        if isinstance(event, ContentDelta):
            choice.text += event.text
        elif isinstance(event, ReasoningDelta):
            choice.reasoning += event.text
        elif isinstance(event, CallStart):
            choice.tool_calls.add(index=event.index, id=ids[event.index], name=event.name)
        elif isinstance(event, CallArguments):
            calls = choice.tool_calls
            if calls and calls[-1].index == event.index:
                calls[-1].arguments += event.fragment
            else:
                calls.add(index=event.index, arguments=event.fragment)


def _usage(generation: Generation, reasoning: int | None = None) -> pb.Usage:
    usage = generation.finalize_usage()
    return pb.Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.total_tokens,
        cached_tokens=usage.cached_tokens,
        reasoning_tokens=reasoning or 0,
    )


def _metadata_value(context: grpc.aio.ServicerContext, key: str) -> str | None:
    """The call's metadata value of `key` (None when absent or binary)."""
    for k, v in context.invocation_metadata() or ():
        if k == key and isinstance(v, str):
            return v
    return None


def _request_id(context: grpc.aio.ServicerContext) -> str:
    """The client's `x-request-id` when sane (see `new_request_id`), else a new one."""
    supplied = dict(context.invocation_metadata() or ()).get("x-request-id")
    return new_request_id(supplied if isinstance(supplied, str) else None)


async def _abort(context: grpc.aio.ServicerContext, err: APIError, request_id: str) -> None:
    trailing: list[tuple[str, str]] = [
        ("x-error-json", json.dumps(err.body(), ensure_ascii=True)),
        ("x-request-id", request_id),
    ]
    if err.retry_after_s is not None:
        # Seconds as on HTTP, and gRPC's own retry pushback (milliseconds) that clients with
        # a retry policy honour.
        trailing.append(("retry-after", str(err.retry_after_s)))
        trailing.append(("grpc-retry-pushback-ms", str(err.retry_after_s * 1000)))
    context.set_trailing_metadata(tuple(trailing))
    await context.abort(err.grpc_code, err.message)


class _Refused:
    """Stands for a request message refused before it is parsed (over the size limit) or
    that protobuf could not parse (a string field that is not UTF-8, or a corrupt message),
    so the call is answered with `error` rather than failed by grpc."""

    __slots__ = ("error",)

    def __init__(self, error: APIError) -> None:
        self.error = error


UNDECODABLE_MESSAGE = (
    "The request message could not be decoded: it is not valid protobuf for this method,"
    " or a string field in it is not valid UTF-8."
)


def message_too_large(max_bytes: int) -> APIError:
    """413 `request_too_large` (gRPC: INVALID_ARGUMENT) for a message over `max_bytes`."""
    return APIError(
        413,
        f"The request message is too large (limit {max_bytes} bytes).",
        code="request_too_large",
    )


def _lenient(message_type: Any, max_bytes: int) -> Callable[[bytes], Any]:
    """A request deserializer that returns `_Refused` instead of raising (grpc would answer
    UNKNOWN with protobuf's exception text): for a message over `max_bytes` (unparsed; gRPC
    core's own limit is higher, see `GrpcApi`) and for one that does not parse."""

    def parse(data: bytes) -> Any:
        if len(data) > max_bytes:
            return _Refused(message_too_large(max_bytes))
        try:
            return message_type.FromString(data)
        except DecodeError:
            return _Refused(APIError(400, UNDECODABLE_MESSAGE, code="invalid_message"))

    return parse


async def _refuse(
    context: grpc.aio.ServicerContext, refused: _Refused, request_log: RequestLog
) -> None:
    """End the call with the refusal's status and the `x-error-json` trailer (raises)."""
    request_id = _request_id(context)
    request_log.rejected(request_id, refused.error, api="grpc")
    await _abort(context, refused.error, request_id)


def _add_inference_servicer(
    servicer: InferenceServicer, server: grpc.aio.Server, max_message_bytes: int
) -> None:
    """Register `servicer` as the generated `add_InferenceServicer_to_server` does, but with
    request deserializers that do not raise (`_lenient`, with `max_message_bytes`)."""

    def unary(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Refused):
                await _refuse(context, request, servicer.service.request_log)
            return await method(request, context)

        return handle

    def streaming(method: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        async def handle(request: Any, context: grpc.aio.ServicerContext) -> None:
            if isinstance(request, _Refused):
                await _refuse(context, request, servicer.service.request_log)
            await method(request, context)

        return handle

    handlers = {
        "ChatCompletion": grpc.unary_stream_rpc_method_handler(
            streaming(servicer.ChatCompletion),
            request_deserializer=_lenient(pb.ChatCompletionRequest, max_message_bytes),
            response_serializer=pb.CompletionChunk.SerializeToString,
        ),
        "Completion": grpc.unary_stream_rpc_method_handler(
            streaming(servicer.Completion),
            request_deserializer=_lenient(pb.CompletionRequest, max_message_bytes),
            response_serializer=pb.CompletionChunk.SerializeToString,
        ),
        "ListModels": grpc.unary_unary_rpc_method_handler(
            unary(servicer.ListModels),
            request_deserializer=_lenient(pb.ListModelsRequest, max_message_bytes),
            response_serializer=pb.ListModelsResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


class GrpcApi:
    """The gRPC server: `homing.v1.Inference`, health and reflection.

    `keyring`: API keys (None or empty: auth off). `max_message_bytes`: the HTTP body limit's
    counterpart (a larger message is 413 `request_too_large`, INVALID_ARGUMENT; one over
    twice it is refused by gRPC core with RESOURCE_EXHAUSTED). `max_metadata_bytes`: the HTTP
    header limit's counterpart (larger metadata is refused by gRPC core, RESOURCE_EXHAUSTED:
    grpc has no hook before it). `idle_timeout_s`:
    a connection with no call in progress is closed after this long.
    `tls`: (certificate chain PEM, private key PEM) to serve TLS instead of plaintext.
    `reuse_port`: bind with SO_REUSEPORT (the gateway processes of one box share the port).
    """

    def __init__(
        self,
        service: InferenceService,
        *,
        host: str,
        port: int,
        max_message_bytes: int,
        keyring: KeyRing | None = None,
        max_metadata_bytes: int = 16 * 1024,
        idle_timeout_s: float = 30.0,
        tls: tuple[bytes, bytes] | None = None,
        reuse_port: bool = False,
    ) -> None:
        self.service = service
        self.server = grpc.aio.server(
            options=[
                # Twice the body limit, so that a message over the limit reaches `_lenient`,
                # which refuses it with our error body; gRPC core's own refusal (no
                # `x-error-json`) only bounds what is read. Capped to core's int32 option.
                ("grpc.max_receive_message_length", min(2 * max_message_bytes, 2**31 - 1)),
                # Soft and hard limit equal: every call above it is refused, none at random.
                ("grpc.max_metadata_size", max_metadata_bytes),
                ("grpc.absolute_max_metadata_size", max_metadata_bytes),
                ("grpc.max_connection_idle_ms", int(idle_timeout_s * 1000)),
                # On only where several gateway processes share the port: otherwise a
                # second gateway on it must fail to bind, not take half its connections.
                ("grpc.so_reuseport", int(reuse_port)),
            ]
        )
        _add_inference_servicer(InferenceServicer(service, keyring), self.server, max_message_bytes)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        if tls is not None:
            cert, key = tls
            credentials = grpc.ssl_server_credentials([(key, cert)])
            self.port = self.server.add_secure_port(f"{host}:{port}", credentials)
        else:
            self.port = self.server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"cannot bind gRPC API on {host}:{port}")

    async def start(self) -> None:
        """Start serving; health SERVING."""
        await self.server.start()
        await self.set_serving(True)

    async def set_serving(self, serving: bool) -> None:
        """Set the health status of the overall server and of `homing.v1.Inference`."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        await self.health.set("", status)
        await self.health.set(SERVICE_NAME, status)

    async def stop(self, grace_s: float) -> None:
        """Stop accepting calls; let running ones finish up to `grace_s`."""
        await self.set_serving(False)
        await self.server.stop(grace_s)
