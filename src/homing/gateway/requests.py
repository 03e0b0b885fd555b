"""Parsing and validation of OpenAI chat and completion request bodies.

The rule of this file: a body either becomes a typed request (`ChatRequest` or
`CompletionRequest`) or raises `APIError(400, ...)` with OpenAI's error shape and the
offending `param`. Nothing here tokenizes or touches a worker; the context-length check that
needs the prompt's token count lives in `homing.gateway.prepare`.
Ranges follow the OpenAI API reference: temperature in [0, 2], top_p in (0, 1] (vLLM's
bound: 0 would sample nothing), presence/frequency penalty in [-2, 2], at most 4 stop
sequences; `n` is capped at 16 here to bound the engine work one request can ask for.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
)

from homing.gateway.errors import APIError, invalid

MAX_N = 16
MAX_INT32 = 2**31 - 1
MAX_STOP_SEQUENCES = 4

Role = Literal["system", "user", "assistant", "tool", "developer"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ContentPart(_Strict):
    """One part of a message's content list; only text parts are served."""

    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    """A chat message. `content` is text or a list of text parts, joined."""

    role: Role
    content: str | list[ContentPart]

    def text(self) -> str:
        """The message's content as one string."""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Strict):
    include_usage: StrictBool = False


class _Common(_Strict):
    model: str = Field(min_length=1)
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: StrictInt = -1
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] = 1
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    seed: Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)] | None = None
    user: str | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] = 0.0
    # Extensions SGLang and vLLM accept as well.
    ignore_eos: StrictBool = False
    stop_token_ids: list[Annotated[StrictInt, Field(ge=0)]] = Field(default_factory=list)
    skip_special_tokens: StrictBool = True

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, value: int) -> int:
        if value != -1 and not 1 <= value <= MAX_INT32:
            raise ValueError(f"top_k must be -1 (off) or between 1 and {MAX_INT32}")
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed")
        if any(s == "" for s in stops):
            raise ValueError("stop sequences must be non-empty strings")
        return value

    @property
    def stop_strings(self) -> list[str]:
        """The stop sequences as a list (possibly empty)."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatRequest(_Common):
    """`POST /v1/chat/completions` body."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None

    @property
    def max_new_tokens(self) -> int | None:
        """`max_completion_tokens` (newer name) or `max_tokens`; None means up to the context."""
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )


class CompletionRequest(_Common):
    """`POST /v1/completions` body; `prompt` is a string or a list of token ids."""

    prompt: str | list[int]

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, value: Any) -> str | list[int]:
        if isinstance(value, str):
            return value
        if (
            isinstance(value, list)
            and value
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
        ):
            return value
        raise ValueError("prompt must be a string or a non-empty list of non-negative token ids")

    @property
    def max_new_tokens(self) -> int | None:
        """`max_tokens`; OpenAI's legacy default for completions is 16."""
        return 16 if self.max_tokens is None else self.max_tokens


_UNSUPPORTED = ("tools", "functions", "logprobs", "top_logprobs", "echo", "best_of", "suffix")


def _param(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in ("str", "list[ContentPart]"):
            continue  # union branch names from pydantic, not part of the user's path
        else:
            parts.append(str(item))
    return ".".join(parts) if parts else "body"


def _to_api_error(err: ValidationError) -> APIError:
    first = err.errors(include_url=False)[0]
    loc = tuple(first["loc"])
    param = _param(loc) if loc else None
    if first["type"] == "missing":
        return invalid(
            f"Missing required parameter: '{param}'.", param, "missing_required_parameter"
        )
    msg = first["msg"].removeprefix("Value error, ")
    if param is None:
        return invalid(msg, None, "invalid_value")
    return invalid(f"Invalid value for '{param}': {msg}", param, "invalid_value")


def _check_body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.", None, "invalid_body")
    for name in _UNSUPPORTED:
        if body.get(name) not in (None, False, 0, [], ""):
            raise invalid(
                f"'{name}' is not supported by this gateway.", name, "unsupported_parameter"
            )
    return body


def _check_stream_options(request: _Common) -> None:
    if request.stream_options is not None and not request.stream:
        raise invalid(
            "The 'stream_options' parameter is only allowed when 'stream' is true.",
            "stream_options",
        )


def parse_chat(body: Any) -> ChatRequest:
    """Validate a chat completions body; raises `APIError` 400 with the offending param."""
    try:
        request = ChatRequest.model_validate(_check_body(body))
    except ValidationError as err:
        raise _to_api_error(err) from None
    _check_stream_options(request)
    return request


def parse_completion(body: Any) -> CompletionRequest:
    """Validate a completions body; raises `APIError` 400 with the offending param."""
    try:
        request = CompletionRequest.model_validate(_check_body(body))
    except ValidationError as err:
        raise _to_api_error(err) from None
    _check_stream_options(request)
    return request
