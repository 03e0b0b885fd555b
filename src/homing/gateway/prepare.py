"""Request preparation: a front end's `Intake` (a validated body and what its transport
carried beside it) becomes a `PreparedRequest` ready to route (`Preparer.prepare`).

Rule of the file: pure validation and tokenization of one request against one served model
(chat template, prompt token ids, context window, stop tokens); a client's mistake raises
`APIError` 4xx. Nothing here routes, charges a quota or talks to a worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

from homing.clock import Clock
from homing.fleet import Fleet, ModelDispatch, UnknownModel
from homing.gateway.auth import Principal, check_model
from homing.gateway.errors import APIError, invalid, model_not_found
from homing.gateway.output import OutputPlan
from homing.gateway.request_log import TraceContext
from homing.gateway.requests import ChatMessage, ChatRequest, CompletionRequest, shown
from homing.gateway.tool_plan import ToolPlan, plan_tools, plans_costly
from homing.text.call_arguments import template_arguments
from homing.text.stops import StopSet
from homing.text.tokenizer import ChatTemplateError, TextTokenizer

Kind = Literal["chat", "text"]

# Prompts costing more than this many characters to tokenize are tokenized in a worker thread
# (~5 ms inline). A chat message costs ENCODE_MESSAGE_CHARS more than its content: with the
# served tokenizer (DeepSeek's), one core, encode_chat takes ~0.6 us per character and ~12 us
# per message (the template renders twice; each content is a tokenizer call of its own).
_T = TypeVar("_T")

THREADED_ENCODE_CHARS = 8192
ENCODE_MESSAGE_CHARS = 32


@dataclass(frozen=True)
class PreparedRequest:
    """A validated request with its prompt tokenized; ready to route."""

    request_id: str
    kind: Kind
    model: ModelDispatch
    prompt_ids: list[int]
    max_new_tokens: int
    max_tokens_given: bool
    n: int
    temperature: float
    top_p: float
    top_k: int
    frequency_penalty: float
    presence_penalty: float
    min_p: float
    repetition_penalty: float
    logit_bias: dict[int, float]  # token id -> bias in [-100, 100], ids < vocab size
    json_schema: str | None  # JSON schema text decoding is constrained to (response_format)
    stop_strings: list[str]
    stop_set: StopSet  # stop_strings compiled once, shared by the choices
    stop_token_ids: list[int]
    ignore_eos: bool
    skip_special_tokens: bool
    stream: bool
    include_usage: bool
    session_key: str | None
    tenant: str | None = None
    principal: Principal | None = None
    created: int = field(kw_only=True)  # Unix seconds (the gateway clock's `wall`)
    # The gateway clock's `now` when the request arrived (TTFT and end-to-end time count
    # from it).
    arrived_at: float = field(kw_only=True)
    trace: TraceContext | None = None  # the client's W3C traceparent
    version_pin: str | None = None  # the version the client asked for (`pin_version`)
    # What the version split hashes (`ModelDispatch.choose_version`); None: the session key,
    # else the first prompt block. A chat without a session key: its tenant and first user
    # message, the same in every turn and apart between conversations that share a system
    # prompt (a client that trims the history's start moves its conversation).
    split_key: str | None = None
    # How answers split into content, reasoning and tool calls (None: all text is content).
    output: OutputPlan | None = None
    structural_tag: str | None = None  # SGLang structural_tag JSON (strict tools)
    seed: int | None = None
    # Log probabilities: per generated token (`logprobs`), with `top_logprobs` most likely
    # entries per position (chat `top_logprobs`, completions `logprobs`: N).
    logprobs: bool = False
    top_logprobs: int = 0
    # Completions `echo`: the prompt's text, sent before the completion (prompt logprobs too
    # when `logprobs`); None without echo.
    echo: str | None = None

    @property
    def detailed(self) -> bool:
        """The choices need more than text (logprobs or echo): `homing.gateway.decoding`'s
        `DetailedDecoder` runs instead of the plain one."""
        return self.logprobs or self.echo is not None

    @property
    def system_fingerprint(self) -> str:
        """The served configuration's fingerprint (`ModelDispatch.system_fingerprint`)."""
        return self.model.system_fingerprint

    @property
    def constrained(self) -> bool:
        """Decoding follows a grammar (a JSON schema or a structural tag)."""
        return self.json_schema is not None or self.structural_tag is not None


@dataclass(frozen=True)
class Intake:
    """One chat or completions request as a front end received it: the parsed body and
    what its transport carried beside it (HTTP headers or gRPC metadata). Both front ends
    hand it to `Preparer.prepare`."""

    request: ChatRequest | CompletionRequest
    request_id: str
    # The front end's session key (`x-session-id`, a gRPC call's `user`); None: the body's.
    session_key: str | None = None
    principal: Principal | None = None  # None: no tenants configured
    # The gateway clock's `now` when the request arrived; None: when it is prepared.
    arrived_at: float | None = None
    trace: TraceContext | None = None  # the client's W3C traceparent
    # `VERSION_HEADER`'s value as the transport gave it, unchecked (an HTTP header of bytes
    # that are not UTF-8 holds surrogate escapes); None or "": not pinned. Checked when the
    # request is pinned, after the model's own errors (`pin_version`).
    version: str | None = None


class Preparer:
    """Validates and tokenizes requests for the fleet's served models (each request against
    the model it names).

    `max_messages`: chat messages per request (400 past it; None = no limit). `clock`: each
    request's `created` stamp, and its arrival time when the caller gives none.
    """

    def __init__(self, fleet: Fleet, *, clock: Clock, max_messages: int | None = None) -> None:
        self.fleet = fleet
        self.clock = clock
        self.max_messages = max_messages

    def _model(self, name: str, principal: Principal | None) -> ModelDispatch:
        try:
            model = self.fleet.model(name)
        except UnknownModel:
            raise model_not_found(shown(name)) from None
        check_model(principal, name)  # 404 for the tenant, 403 for the key
        return model

    async def _encode(self, encode: Callable[[], _T], cost: int, param: str) -> _T:
        """What `encode()` gives (the ids) for a prompt whose tokenizing costs `cost`
        characters' worth (see ENCODE_MESSAGE_CHARS); costly prompts are encoded off the event
        loop (the `tokenizers` library releases the GIL), so one large prompt does not stall
        other requests. A chat template failure is 400 "Invalid messages"; text the tokenizer
        refuses is 400 on `param`."""
        try:
            if cost > THREADED_ENCODE_CHARS:
                return await asyncio.to_thread(encode)
            return encode()
        except ChatTemplateError as err:
            raise invalid(f"Invalid messages: {err}", "messages") from err
        except (TypeError, ValueError) as err:  # e.g. a lone surrogate in the text
            raise invalid(
                f"'{param}' contains text that cannot be tokenized: {err}", param
            ) from None

    async def prepare(self, intake: Intake) -> PreparedRequest:
        """`intake`'s request validated, tokenized and pinned to `intake.version`; raises
        `APIError`: 404/403 for the model, then the kind's own 400s (chat: too many messages,
        a template failure, names and tools; completions: an empty or untokenizable prompt,
        token ids past the vocabulary), then 400 for the context window, stop token ids and
        logit bias, last the version's 400s (`invalid_header_value`, `unknown_version`:
        `pin_version`)."""
        req = intake.request
        model = self._model(req.model, intake.principal)
        if isinstance(req, ChatRequest):
            plan, prompt_ids = await self._chat_prompt(req, model)
        else:
            plan, prompt_ids = None, await self._text_prompt(req, model)
        prepared = self._prepared(intake, model, prompt_ids, plan)
        return pin_version(prepared, intake.version)

    async def _chat_prompt(
        self, req: ChatRequest, model: ModelDispatch
    ) -> tuple[ToolPlan, list[int]]:
        """The tool plan and the prompt's ids: the chat template applied and tokenized,
        message content as plain text (a special token's text in it never becomes that
        token); raises `APIError` 400 (too many messages, names, tools, template failure)."""
        if self.max_messages is not None and len(req.messages) > self.max_messages:
            raise invalid(
                f"Invalid value for 'messages': at most {self.max_messages} messages are "
                f"allowed, got {len(req.messages)}.",
                "messages",
            )
        tokenizer = model.tokenizer
        cost = ENCODE_MESSAGE_CHARS * len(req.messages)
        if cost <= THREADED_ENCODE_CHARS:  # few messages: their length decides
            cost += sum(len(m.text()) + len(m.name or "") for m in req.messages)
        if plans_costly(req):  # schemas are copied, checked and rendered in the thread
            cost = THREADED_ENCODE_CHARS + 1

        def encode() -> tuple[ToolPlan, list[int]]:  # messages are gathered there too
            _check_names(tokenizer, req.messages)
            plan = plan_tools(req, model)  # 400s of what the model's template or parsers lack
            plan.check(tokenizer)
            messages = [_template_message(m) for m in req.messages]
            return plan, tokenizer.encode_chat(messages, True, plan.variables)

        return await self._encode(encode, cost, "messages")

    async def _text_prompt(self, req: CompletionRequest, model: ModelDispatch) -> list[int]:
        """The prompt's ids: a text prompt tokenized (special-token texts as plain text
        unless the request sets `allow_special_tokens`), a token-id prompt checked against
        the vocabulary; raises `APIError` 400 (empty, untokenizable, ids out of range)."""
        if isinstance(req.prompt, str):
            text, tokenizer = req.prompt, model.tokenizer
            encode = tokenizer.encode if req.allow_special_tokens else tokenizer.encode_plain
            prompt_ids = await self._encode(lambda: encode(text), len(text), "prompt")
            if not prompt_ids:
                raise invalid("The prompt must not be empty.", "prompt")
            return prompt_ids
        prompt_ids = list(req.prompt)
        _check_ids(prompt_ids, model.tokenizer.vocab_size, "prompt")
        return prompt_ids

    def _prepared(
        self,
        intake: Intake,
        model: ModelDispatch,
        prompt_ids: list[int],
        plan: ToolPlan | None,
    ) -> PreparedRequest:
        """The checks both kinds share (context window, stop token ids, logit bias) and the
        record; raises `APIError` 400."""
        req = intake.request
        kind: Kind = "chat" if isinstance(req, ChatRequest) else "text"
        max_new_tokens = req.max_new_tokens
        limit = model.max_context_length
        longest = model.max_prompt_tokens
        if len(prompt_ids) > longest:
            raise APIError(
                400,
                f"This model's maximum prompt length is {longest} tokens. However, your prompt "
                f"has {len(prompt_ids)} tokens. Please reduce the prompt length.",
                param="messages" if kind == "chat" else "prompt",
                code="context_length_exceeded",
            )
        room = limit - len(prompt_ids)
        wanted = room if max_new_tokens is None else max_new_tokens
        if room < 1 or wanted > room:
            asked = len(prompt_ids) + (max_new_tokens or 1)
            raise APIError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{asked} tokens ({len(prompt_ids)} in the prompt, {max_new_tokens or 1} for the "
                "completion). Please reduce the prompt or the completion length.",
                param="messages" if kind == "chat" else "prompt",
                code="context_length_exceeded",
            )
        vocab = model.tokenizer.vocab_size
        _check_ids(req.stop_token_ids, vocab, "stop_token_ids")
        logit_bias = req.logit_bias_ids
        _check_ids(logit_bias, vocab, "logit_bias")
        stop_token_ids = list(req.stop_token_ids)
        for stop in req.stop_strings:
            if len(stop) > model.tokenizer.max_token_chars:
                continue  # too long to be one token: matched on the text only
            ids = model.tokenizer.encode(stop)
            if len(ids) == 1 and ids[0] not in stop_token_ids:
                stop_token_ids.append(ids[0])  # single-token stops also go to the engine
        principal = intake.principal
        tenant = principal.tenant if principal is not None else None
        session_key = intake.session_key or req.session_key
        if isinstance(req, ChatRequest):
            logprobs, echo = bool(req.logprobs), None
            top_logprobs = (req.top_logprobs or 0) if logprobs else 0
            split_key = _chat_split_key(req, tenant) if session_key is None else None
        else:
            logprobs, top_logprobs = req.logprobs is not None, req.logprobs or 0
            echo = None
            if req.echo:  # the prompt as given; a token-id prompt as its decoded text
                prompt = req.prompt
                echo = prompt if isinstance(prompt, str) else model.tokenizer.decode(prompt_ids)
            split_key = None
        return PreparedRequest(
            request_id=intake.request_id,
            kind=kind,
            model=model,
            prompt_ids=prompt_ids,
            max_new_tokens=wanted,
            max_tokens_given=max_new_tokens is not None,
            n=req.n,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            frequency_penalty=req.frequency_penalty,
            presence_penalty=req.presence_penalty,
            min_p=req.min_p,
            repetition_penalty=req.repetition_penalty,
            logit_bias=logit_bias,
            json_schema=plan.json_schema if plan is not None else req.json_schema_constraint,
            structural_tag=plan.structural_tag if plan is not None else None,
            output=plan.output(prompt_ids) if plan is not None else None,
            seed=req.seed,
            stop_strings=req.stop_strings,
            stop_set=StopSet(req.stop_strings),
            stop_token_ids=stop_token_ids,
            ignore_eos=req.ignore_eos,
            skip_special_tokens=req.skip_special_tokens and not (plan and plan.keeps_special),
            stream=req.stream,
            include_usage=req.include_usage,
            session_key=session_key,
            tenant=tenant,
            principal=principal,
            created=int(self.clock.wall()),
            arrived_at=self.clock.now() if intake.arrived_at is None else intake.arrived_at,
            trace=intake.trace,
            split_key=split_key,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            echo=echo,
        )


def _chat_split_key(req: ChatRequest, tenant: str | None) -> str | None:
    """The version split's key of a chat without a session key: its tenant and first user
    message (a tenant's "hi" and another's are different conversations); None without one."""
    first = next((m for m in req.messages if m.role == "user"), None)
    if first is None:
        return None
    return f"first-user:{tenant or ''}:{first.text()}"


#: The request header (HTTP) or metadata key (gRPC) that pins a model version, and the
#: response header that names the version served.
VERSION_HEADER = "x-homing-version"


def pin_version(prepared: PreparedRequest, value: str | None) -> PreparedRequest:
    """`prepared` pinned to version `value` of its model (`VERSION_HEADER`, unchecked; None
    or "": not pinned). 400 `invalid_header_value` when `value` is not UTF-8 text
    (`header_text`), 400 `unknown_version` when the model has no such version (no worker
    carries it and its split does not name it)."""
    value = header_text(VERSION_HEADER, value)
    if value is None:
        return prepared
    known = prepared.model.versions()
    if value not in known:
        listed = ", ".join(repr(v) for v in known if v) or "none"
        raise APIError(
            400,
            f"Model '{prepared.model.model_id}' has no version {shown(value)!r} "
            f"(versions: {listed}).",
            param=VERSION_HEADER,
            code="unknown_version",
        )
    return replace(prepared, version_pin=value)


def header_text(name: str, value: str | None) -> str | None:
    """`value` of header `name` (None when it is None or empty), which must be UTF-8 text:
    400 `invalid_header_value` otherwise (aiohttp decodes header bytes with surrogateescape,
    and the value is hashed and logged as text)."""
    if not value:
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(
            400,
            f"The {name} header is not valid UTF-8.",
            param=name,
            code="invalid_header_value",
        ) from None
    return value


def _template_message(message: ChatMessage) -> dict[str, Any]:
    """What the chat template gets of a message: role, content as text, name if set, an
    assistant turn's `tool_calls` (OpenAI's shape, arguments as `template_arguments` gives
    them) and `reasoning_content`, and a tool turn's `tool_call_id`. A legacy `function`
    turn is a tool turn answering the call named by its function (`ChatMessage.calls`)."""
    fields: dict[str, Any] = {"role": message.role, "content": message.text()}
    if message.name is not None:
        fields["name"] = message.name
    calls = message.calls()
    if calls:
        fields["tool_calls"] = [
            {
                "id": call.id,
                "type": call.type,
                "function": {
                    "name": call.function.name,
                    "arguments": template_arguments(call.function.arguments),
                },
            }
            for call in calls
        ]
    if message.reasoning_content is not None:
        fields["reasoning_content"] = message.reasoning_content
    if message.role == "function":
        fields["role"] = "tool"
        fields["tool_call_id"] = message.name
    elif message.tool_call_id is not None:
        fields["tool_call_id"] = message.tool_call_id
    return fields


def _check_names(tokenizer: TextTokenizer, messages: Sequence[ChatMessage]) -> None:
    """400 for a message `name` that spells a special token: a name is template input (only
    content is kept apart as plain text)."""
    for index, message in enumerate(messages):
        if message.name is not None and tokenizer.holds_special(message.name):
            param = f"messages.[{index}].name"
            raise invalid(
                f"Invalid value for '{param}': a name must not hold special-token text.", param
            )


def _check_ids(ids: Iterable[int], vocab: int, param: str) -> None:
    """400 naming the first of `ids` at or past the vocabulary size."""
    bad = next((t for t in ids if t >= vocab), None)
    if bad is not None:
        raise invalid(
            f"Token id {bad} in '{param}' is out of range for the vocabulary (size {vocab}).",
            param,
        )
