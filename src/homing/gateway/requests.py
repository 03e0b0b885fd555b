"""Parsing and validation of OpenAI chat and completion request bodies.

The rule of this file: a body either becomes a typed request (`ChatRequest` or
`CompletionRequest`) or raises `APIError(400, ...)` with OpenAI's error shape and the
offending `param`. Nothing here tokenizes or touches a worker; the context-length check that
needs the prompt's token count lives in `homing.gateway.prepare`.
Ranges follow the OpenAI API reference: temperature in [0, 2], top_p in (0, 1] (vLLM's
bound: 0 would sample nothing), presence/frequency penalty in [-2, 2], at most 4 stop
sequences, logit_bias values in [-100, 100] for at most 300 token ids; `n` is capped at 16
here to bound the engine work one request can ask for. The SGLang extensions take SGLang's
ranges: min_p in [0, 1], repetition_penalty in (0, 2].

Every top-level parameter is one of three kinds (the table is in README.md, "APIs"):
served (a field of the model, forwarded to the engine or used by the gateway), refused by name
(`_CHAT_REFUSED`/`_COMPLETION_REFUSED`: 400 `unsupported_parameter` unless null or the value
that means "off"), or unknown (400 `unknown_parameter`, as OpenAI answers "Unrecognized
request argument supplied"). Nested objects other than messages refuse unknown keys too.
Numbers are strict: `"0.5"` or `true` is not a temperature. JSON text is RFC 8259's
(`loads_json`). What an error shows of a client's string (a name, a key, a model) is cut to
`MAX_NAME_SHOWN` characters (`shown`), so an error body or log line is never as large as the
input that caused it.
"""

from __future__ import annotations

import json
import math
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from homing.gateway.errors import APIError, invalid

MAX_N = 16
MAX_INT32 = 2**31 - 1
MAX_STOP_SEQUENCES = 4
# Characters (code points) per stop sequence. OpenAI documents no length; real stops are
# end-of-turn markers and delimiters of a few dozen characters. The cap bounds the stop text one
# request makes the gateway compile and match to 4 x 1,024 characters: one automaton per request
# (homing.text.stops), under 1 MB with every depth built.
MAX_STOP_LENGTH = 1024
# Ids in `stop_token_ids` (an SGLang/vLLM extension, unbounded there). A model has a handful of
# end-of-turn ids; the list goes to the engine with every choice and is checked on every token.
MAX_STOP_TOKEN_IDS = 256
# logit_bias: OpenAI's bounds (a bias in [-100, 100]; its API refuses more than 300 ids).
MAX_LOGIT_BIAS = 300
LOGIT_BIAS_LIMIT = 100.0
# What `response_format: {"type": "json_object"}` constrains to: SGLang's own OpenAI server
# sends this schema (sglang/srt/entrypoints/openai/protocol.py, 0.5.23).
JSON_OBJECT_SCHEMA = '{"type": "object"}'
# `metadata`: OpenAI's bounds (16 pairs, keys up to 64 characters, values up to 512).
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512

THREADED_BODY_BYTES = 64 * 1024
"""A request body (HTTP JSON, or gRPC message) over this many bytes is parsed and validated
in a worker thread: at ~8 ms of CPU per MB of long strings (JSON and pydantic), and several
times that for many small objects (2,048 short named messages, 180 KB, took ~10 ms on one
core), a larger one would hold the event loop."""

_INT_ONLY = frozenset({int})
"""The element types of a token-id list: exact `int` (a bool, or any subclass, is refused)."""

# Tools: OpenAI's bounds (at most 128 tools; a function name is 1-64 of [a-zA-Z0-9_-]).
MAX_TOOLS = 128
FUNCTION_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
# A tool call id a history may carry (OpenAI's are ~30 characters; vLLM/SGLang's ~32).
MAX_TOOL_CALL_ID = 256
# `seed`: OpenAI documents an integer; engines take a signed 64-bit one.
MIN_SEED, MAX_SEED = -(2**63), 2**63 - 1
# Log probabilities: OpenAI's bounds (chat `top_logprobs` 0..20, completions `logprobs` 0..5).
MAX_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5

Role = Literal["system", "user", "assistant", "tool", "developer", "function"]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high"]


class _Closed(BaseModel):
    """A nested object whose unknown keys are refused (400 `unknown_parameter`)."""

    model_config = ConfigDict(extra="forbid")


def _refused(value: Any) -> Any:
    """A nested field served only when off (null or empty): else 400 `unsupported_parameter`
    (see `_to_api_error`)."""
    if value not in (None, []):
        raise PydanticCustomError("unsupported_parameter", "not supported by this gateway")
    return None


class ContentPart(_Closed):
    """One part of a message's content list; only text parts are served."""

    type: Literal["text"]
    text: str


FunctionName = Annotated[str, Field(pattern=FUNCTION_NAME_PATTERN)]


class FunctionDefinition(_Closed):
    """A function the model may call (`tools[].function`, or a legacy `functions[]` entry):
    `parameters` is its JSON Schema (checked by `homing.gateway.schemas`), `strict` asks the
    engine to constrain a call's arguments to it."""

    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(_Closed):
    """One entry of `tools`: only function tools are served."""

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Closed):
    name: str


class NamedToolChoice(_Closed):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`."""

    type: Literal["function"]
    function: NamedFunction


class CalledFunction(_Closed):
    """A call's function in a history: its name and arguments as the model wrote them (JSON
    text, not checked: a model may have written broken JSON, and the history replays it)."""

    name: str = Field(min_length=1, max_length=64)
    arguments: str


class ToolCall(_Closed):
    """One of an assistant message's `tool_calls` in a history."""

    id: str = Field(min_length=1, max_length=MAX_TOOL_CALL_ID)
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(_Closed):
    """A chat message. `content` is text or a list of text parts, joined; null (or left out) only
    for an assistant turn (an empty one, or one that only calls tools). `name` (at most 64
    characters, OpenAI's bound) goes to the chat template with the message (the template
    decides whether it shows). An assistant turn may carry `tool_calls` (or the legacy
    `function_call`), a tool turn names the call it answers in `tool_call_id` (a legacy
    `function` turn names the function in `name`); `ChatRequest` checks that they match.
    An assistant turn's `refusal` and `audio` (as OpenAI returns them in a history) are
    served only as null: no audio or refusal replay is served. Its `reasoning_content` (as
    a reasoning model returned it) goes to the chat template, which may show it or drop it;
    `annotations` (citations of the content) are accepted and not shown to the model."""

    role: Role
    content: str | list[ContentPart] | None
    name: Annotated[str, Field(max_length=64)] | None = None
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_TOOLS)] | None = None
    tool_call_id: str | None = Field(default=None, max_length=MAX_TOOL_CALL_ID)
    refusal: Annotated[Any, AfterValidator(_refused)] = None
    audio: Annotated[Any, AfterValidator(_refused)] = None
    function_call: CalledFunction | None = None
    reasoning_content: str | None = None
    annotations: list[Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _assistant_content_optional(cls, data: Any) -> Any:
        """An assistant turn may leave `content` out (the SDKs do for a turn of calls)."""
        if isinstance(data, dict) and data.get("role") == "assistant" and "content" not in data:
            return {**data, "content": None}
        return data

    @field_validator("content")
    @classmethod
    def _content_unless_assistant(cls, value: Any, info: ValidationInfo) -> Any:
        role = info.data.get("role")
        if value is None and role is not None and role != "assistant":
            raise ValueError(f"must not be null for a {role} message")
        return value

    @field_validator("reasoning_content")
    @classmethod
    def _reasoning_of_assistant(cls, value: Any, info: ValidationInfo) -> Any:
        role = info.data.get("role")
        if value is not None and role is not None and role != "assistant":
            raise ValueError(f"only an assistant message carries it, not a {role} message")
        return value

    def calls(self) -> list[ToolCall]:
        """The calls this assistant turn made (`tool_calls`, or the legacy `function_call` as
        one call whose id is its function's name)."""
        if self.tool_calls:
            return self.tool_calls
        if self.function_call is not None:
            return [ToolCall(id=self.function_call.name, function=self.function_call)]
        return []

    def text(self) -> str:
        """The message's content as one string ("" for null)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(_Closed):
    """`stream_options`; `include_obfuscation` is served only as false (no padding is sent)."""

    include_usage: StrictBool = False
    include_obfuscation: StrictBool = False


class JSONSchemaFormat(_Closed):
    """`response_format.json_schema`: the schema the answer is constrained to (any `strict`:
    the engine always enforces it)."""

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(_Closed):
    """`response_format`: "text" (no constraint), "json_object" or "json_schema"."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("'json_schema' is required when 'type' is 'json_schema'")
        if self.type != "json_schema" and self.json_schema is not None:
            raise ValueError("'json_schema' is only allowed when 'type' is 'json_schema'")
        return self

    def constraint(self) -> str | None:
        """The JSON schema text the engine constrains decoding to; None for "text"."""
        if self.type == "json_object":
            return JSON_OBJECT_SCHEMA
        if self.json_schema is not None:
            return json.dumps(self.json_schema.schema_, separators=(",", ":"))
        return None


Bias = Annotated[StrictFloat, Field(ge=-LOGIT_BIAS_LIMIT, le=LOGIT_BIAS_LIMIT, allow_inf_nan=False)]


class _Common(_Closed):
    model: str = Field(min_length=1)
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[StrictFloat, Field(ge=0.0, le=2.0, allow_inf_nan=False)] = 1.0
    top_p: Annotated[StrictFloat, Field(gt=0.0, le=1.0, allow_inf_nan=False)] = 1.0
    top_k: StrictInt = -1
    n: Annotated[StrictInt, Field(ge=1, le=MAX_N)] = 1
    stop: str | list[str] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: Annotated[StrictFloat, Field(ge=-2.0, le=2.0, allow_inf_nan=False)] = 0.0
    frequency_penalty: Annotated[StrictFloat, Field(ge=-2.0, le=2.0, allow_inf_nan=False)] = 0.0
    logit_bias: dict[str, Bias] | None = None
    response_format: ResponseFormat | None = None
    # Extensions SGLang and vLLM accept as well.
    ignore_eos: StrictBool = False
    stop_token_ids: list[Annotated[StrictInt, Field(ge=0)]] = Field(default_factory=list)
    skip_special_tokens: StrictBool = True
    min_p: Annotated[StrictFloat, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = 0.0
    repetition_penalty: Annotated[StrictFloat, Field(gt=0.0, le=2.0, allow_inf_nan=False)] = 1.0
    # Best effort, as OpenAI documents it: engines that take a seed get it (homing.engines).
    seed: Annotated[StrictInt, Field(ge=MIN_SEED, le=MAX_SEED)] | None = None

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
        longest = max(map(len, stops), default=0)
        if longest > MAX_STOP_LENGTH:
            raise ValueError(
                f"each stop sequence must be at most {MAX_STOP_LENGTH} characters, got {longest}"
            )
        return value

    @field_validator("stop_token_ids", mode="before")
    @classmethod
    def _stop_token_ids(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) > MAX_STOP_TOKEN_IDS:
            raise ValueError(
                f"at most {MAX_STOP_TOKEN_IDS} stop token ids are allowed, got {len(value)}"
            )
        return value

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        if len(value) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} token ids are allowed, got {len(value)}")
        for key in value:
            # a token id fits in 10 digits (ids are int32); longer keys are not parsed at all
            if not (key.isascii() and key.isdigit() and len(key) <= 10 and str(int(key)) == key):
                raise ValueError(f"keys must be token ids as decimal integers, got {shown(key)!r}")
        return value

    @property
    def logit_bias_ids(self) -> dict[int, float]:
        """`logit_bias` keyed by token id (possibly empty)."""
        return {int(key): bias for key, bias in (self.logit_bias or {}).items()}

    @property
    def json_schema_constraint(self) -> str | None:
        """The JSON schema text `response_format` constrains decoding to, else None."""
        return None if self.response_format is None else self.response_format.constraint()

    @property
    def stop_strings(self) -> list[str]:
        """The stop sequences as a list (possibly empty)."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def session_key(self) -> str | None:
        """The body's conversation key for prefix affinity: `user`, else None."""
        return self.user or None

    @property
    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ChatRequest(_Common):
    """`POST /v1/chat/completions` body."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    # Used as the session key (prefix affinity), before `user`.
    prompt_cache_key: str | None = None
    # No effect by definition here (see README.md, "APIs"): nothing is stored, no tools can be
    # given, no abuse monitoring runs on the end-user id.
    metadata: (
        dict[
            Annotated[str, Field(max_length=MAX_METADATA_KEY)],
            Annotated[str, Field(max_length=MAX_METADATA_VALUE)],
        ]
        | None
    ) = Field(default=None, max_length=MAX_METADATA_PAIRS)
    parallel_tool_calls: StrictBool | None = None
    safety_identifier: str | None = None
    tools: Annotated[list[Tool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    functions: Annotated[list[FunctionDefinition], Field(max_length=MAX_TOOLS)] | None = None
    function_call: Literal["none", "auto"] | NamedFunction | None = None
    # Go to the chat template when it reads them (homing.gateway.prepare), else 400.
    reasoning_effort: ReasoningEffort | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # Each generated token's log probability, and that many most likely tokens per position.
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    @model_validator(mode="after")
    def _tools_agree(self) -> ChatRequest:
        _check_tools(self)
        # OpenAI's rule and wording; 0 (no top entries) stays the no-op it always was here.
        if self.top_logprobs and not self.logprobs:
            raise invalid(
                "The 'top_logprobs' parameter is only allowed when 'logprobs' is enabled.",
                "top_logprobs",
            )
        return self

    @property
    def legacy_functions(self) -> bool:
        """The request declares legacy `functions` (answers in the legacy shape)."""
        return bool(self.functions)

    @cached_property
    def declared_functions(self) -> list[FunctionDefinition]:
        """The functions the model may call (`tools` or legacy `functions`), in order."""
        if self.functions:
            return list(self.functions)
        return [tool.function for tool in self.tools or []]

    @property
    def tool_mode(self) -> str:
        """How the answer may call tools: "none" (no functions declared, or choice "none"),
        "auto" (OpenAI's default when functions are declared), "required", or "named"
        (`forced_function` names it)."""
        if not self.declared_functions:
            return "none"
        choice = self.function_call if self.legacy_functions else self.tool_choice
        if choice is None:
            return "auto"
        if isinstance(choice, str):
            return choice
        return "named"

    @property
    def forced_function(self) -> str | None:
        """The function `tool_choice` (or `function_call`) names, else None."""
        choice = self.function_call if self.legacy_functions else self.tool_choice
        if isinstance(choice, NamedToolChoice):
            return choice.function.name
        if isinstance(choice, NamedFunction):
            return choice.name
        return None

    @property
    def session_key(self) -> str | None:
        """`prompt_cache_key` (OpenAI's newer cache-routing key), else `user`, else None."""
        return self.prompt_cache_key or self.user or None

    @property
    def max_new_tokens(self) -> int | None:
        """`max_completion_tokens` (newer name) or `max_tokens`; None means up to the context."""
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else self.max_tokens
        )


def _check_tools(req: ChatRequest) -> None:
    """Cross-field rules of tool calling, as OpenAI's: `tools` and `functions` exclusive;
    unique function names; a forced function declared; `required`/named only with
    functions; tool calls only on assistant turns, each tool turn answering an earlier call
    by id (a legacy function turn, deprecated, only names its function: few-shot histories
    send one without a call). Raises `APIError` 400 with the offending `param`."""
    if req.tools and req.functions:  # empty lists are the "off" values
        raise invalid("'tools' and 'functions' cannot both be given; use 'tools'.", "functions")
    if req.tool_choice is not None and req.functions:
        raise invalid("'tool_choice' goes with 'tools'; 'functions' takes 'function_call'.",
                      "tool_choice")  # fmt: skip
    if req.function_call is not None and req.tools:
        raise invalid("'function_call' goes with 'functions'; 'tools' takes 'tool_choice'.",
                      "function_call")  # fmt: skip
    where = "functions" if req.legacy_functions else "tools"
    path = "functions.[{}].name" if req.legacy_functions else "tools.[{}].function.name"
    seen: set[str] = set()
    for index, function in enumerate(req.declared_functions):
        if function.name in seen:
            param = path.format(index)
            raise invalid(
                f"Invalid value for '{param}': duplicate function name '{function.name}' in "
                f"'{where}'.",
                param,
            )
        seen.add(function.name)
    choice_param = "function_call" if req.legacy_functions else "tool_choice"
    choice = req.function_call if req.legacy_functions else req.tool_choice
    if not seen and (choice == "required" or isinstance(choice, (NamedToolChoice, NamedFunction))):
        raise invalid(
            f"Invalid value for '{choice_param}': '{choice_param}' other than 'none' or 'auto' "
            f"is only allowed when '{where}' are specified.",
            choice_param,
        )
    forced = req.forced_function
    if forced is not None and forced not in seen:
        raise invalid(
            f"Invalid value for '{choice_param}': no function named '{shown(forced)}' in "
            f"'{where}'.",
            choice_param,
        )
    called: set[str] = set()
    for index, message in enumerate(req.messages):
        if message.role != "assistant" and (message.tool_calls or message.function_call):
            field = "tool_calls" if message.tool_calls else "function_call"
            param = f"messages.[{index}].{field}"
            raise invalid(f"Invalid value for '{param}': only assistant messages make calls.",
                          param)  # fmt: skip
        ids: set[str] = set()
        for position, call in enumerate(message.tool_calls or ()):
            if call.id in ids:
                param = f"messages.[{index}].tool_calls.[{position}].id"
                raise invalid(
                    f"Invalid value for '{param}': duplicate tool call id '{shown(call.id)}' "
                    "in one message.",
                    param,
                )
            ids.add(call.id)
        called.update(call.id for call in message.calls())
        if message.role == "tool":
            param = f"messages.[{index}].tool_call_id"
            if message.tool_call_id is None:
                raise invalid(
                    f"Missing required parameter: '{param}'.", param, "missing_required_parameter"
                )
            if message.tool_call_id not in called:
                raise invalid(
                    f"Invalid value for '{param}': no earlier assistant message has a tool call "
                    f"with id '{shown(message.tool_call_id)}'.",
                    param,
                )
        elif message.tool_call_id is not None:
            param = f"messages.[{index}].tool_call_id"
            raise invalid(f"Invalid value for '{param}': only tool messages answer a call.",
                          param)  # fmt: skip
        if message.role == "function" and message.name is None:
            param = f"messages.[{index}].name"
            raise invalid(
                f"Missing required parameter: '{param}'.", param, "missing_required_parameter"
            )


class CompletionRequest(_Common):
    """`POST /v1/completions` body; `prompt` is a string or a list of token ids."""

    prompt: str | list[int]
    # Extension beyond OpenAI's API, in the style of SGLang's and vLLM's extra parameters:
    # true lets a text prompt's special-token texts (e.g. "<｜User｜>") encode as those tokens;
    # by default they are plain text. Chat has no such switch: only its template places them.
    allow_special_tokens: StrictBool = False
    # Served only as `n` (then it changes nothing): ranking candidates needs logprobs.
    best_of: Annotated[StrictInt, Field(ge=1, le=MAX_N)] | None = None
    # Log probabilities of each token and of the `logprobs` most likely ones (None: off).
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_COMPLETION_LOGPROBS)] | None = None
    # The prompt before the completion in `text` (and its tokens first in `logprobs`).
    echo: StrictBool = False

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, value: Any) -> str | list[int]:
        if isinstance(value, str):
            return value
        # Exact ints only (not bool or another int subclass); the type set and `min` run in C,
        # ~2.4x faster than a generator over a long prompt's ids.
        if isinstance(value, list) and value and set(map(type, value)) == _INT_ONLY:
            if min(value) >= 0:
                return value
        raise ValueError("prompt must be a string or a non-empty list of non-negative token ids")

    @property
    def max_new_tokens(self) -> int | None:
        """`max_tokens`; OpenAI's legacy default for completions is 16."""
        return 16 if self.max_tokens is None else self.max_tokens


# Parameters refused by name, each with the values that mean "off" and are served as no-ops
# (null is always off). Compared by type and value, so `0` is not `false`. Why each is refused
# is in README.md, "APIs".
_CHAT_REFUSED: dict[str, tuple[object, ...]] = {
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "service_tier": ("auto", "default"),
    "store": (False,),
    "verbosity": (),
    "web_search_options": (),
}
_COMPLETION_REFUSED: dict[str, tuple[object, ...]] = {
    "suffix": ("",),
}
# Longest client string (parameter name or path, key, model, number) an error shows.
MAX_NAME_SHOWN = 64


def shown(text: str) -> str:
    """`text` as an error message, `param` or log line may show it: its first
    `MAX_NAME_SHOWN` characters, then "..." when it is longer."""
    return text if len(text) <= MAX_NAME_SHOWN else text[:MAX_NAME_SHOWN] + "..."


def _refuse_constant(name: str) -> Any:
    """`json.loads`'s `parse_constant`: `NaN`, `Infinity` and `-Infinity` are not JSON."""
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    """`json.loads`'s `parse_float`: a number beyond a double (`1e999`) would become `inf`
    and reach the engine as `Infinity`."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {shown(text)} is out of range")
    return value


def loads_json(text: str) -> Any:
    """`text` (a client's) parsed as RFC 8259 JSON: `json.loads`, but `NaN`, `Infinity`,
    `-Infinity` and numbers beyond a double raise `ValueError`, as malformed text and
    integers over Python's 4,300 digits do (nesting too deep: `RecursionError`)."""
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)


_BRANCH_NAMES = frozenset({"str", "list[ContentPart]", "function-after[_refused(), any]"})


def _param(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in _BRANCH_NAMES or item.startswith("literal[") or item[:1].isupper():
            continue  # union branch tags from pydantic (a type or model), not the user's path
        else:
            parts.append(str(item))
    return ".".join(parts) if parts else "body"


def _to_api_error(err: ValidationError) -> APIError:
    # The deepest error names the most specific mistake (a union tries each branch: a bad
    # content part is an error inside the list branch, not "not a string").
    errors = err.errors(include_url=False)
    first = max(errors, key=lambda e: len(e["loc"]))
    loc = tuple(first["loc"])
    param = shown(_param(loc)) if loc else None
    if first["type"] == "missing":
        return invalid(
            f"Missing required parameter: '{param}'.", param, "missing_required_parameter"
        )
    if first["type"] == "extra_forbidden" and param is not None:
        return _unknown(param)
    if first["type"] == "unsupported_parameter" and param is not None:
        return _unsupported(param)
    msg = first["msg"].removeprefix("Value error, ")
    if param is None:
        return invalid(msg, None, "invalid_value")
    return invalid(f"Invalid value for '{param}': {msg}", param, "invalid_value")


def _unsupported(name: str) -> APIError:
    return invalid(f"'{name}' is not supported by this gateway.", name, "unsupported_parameter")


def _unknown(name: str) -> APIError:
    name = shown(name)
    return invalid(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")


def _is_off(value: object, off: tuple[object, ...]) -> bool:
    return value is None or any(type(value) is type(o) and value == o for o in off)


def _check_body(
    body: Any, model: type[_Common], refused: dict[str, tuple[object, ...]]
) -> dict[str, Any]:
    """The body's served parameters, in order; a refused one set to anything but off is 400
    `unsupported_parameter`, a name the endpoint does not know 400 `unknown_parameter`. A null
    optional parameter means its default (OpenAI's parameters are nullable) and is dropped."""
    if not isinstance(body, dict):
        raise invalid("The request body must be a JSON object.", None, "invalid_body")
    fields = model.model_fields
    served: dict[str, Any] = {}
    for name, value in body.items():
        if name in refused:
            if not _is_off(value, refused[name]):
                raise _unsupported(name)
            continue
        field = fields.get(name)
        if field is None:
            raise _unknown(name)
        if value is None and not field.is_required():
            continue
        served[name] = value
    return served


def _check_common(request: _Common) -> None:
    options = request.stream_options
    if options is not None and not request.stream:
        raise invalid(
            "The 'stream_options' parameter is only allowed when 'stream' is true.",
            "stream_options",
        )
    if options is not None and options.include_obfuscation:
        raise _unsupported("stream_options.include_obfuscation")


def parse_chat(body: Any) -> ChatRequest:
    """Validate a chat completions body; raises `APIError` 400 with the offending param."""
    try:
        request = ChatRequest.model_validate(_check_body(body, ChatRequest, _CHAT_REFUSED))
    except ValidationError as err:
        raise _to_api_error(err) from None
    _check_common(request)
    return request


def parse_completion(body: Any) -> CompletionRequest:
    """Validate a completions body; raises `APIError` 400 with the offending param."""
    try:
        request = CompletionRequest.model_validate(
            _check_body(body, CompletionRequest, _COMPLETION_REFUSED)
        )
    except ValidationError as err:
        raise _to_api_error(err) from None
    _check_common(request)
    if request.best_of is not None and request.best_of != request.n:
        raise _unsupported("best_of")
    return request
