"""Tool calling and reasoning end to end over simulated workers: unmodified clients (the
official OpenAI SDK, LangChain) run an agent loop; the exact 400 bodies of what a request
gets wrong; hostile tool input costs the event loop no long callback."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import grpc
import pydantic
import pytest
from loop_watch import Callbacks, LoopWatch, least_longest, report
from openai import AsyncOpenAI, pydantic_function_tool

from homing.app import App
from homing.v1 import inference_pb2 as pb
from homing.v1 import inference_pb2_grpc as pb_grpc

pytestmark = pytest.mark.asyncio(loop_scope="module")

LOOP_BUDGET_MS = 10.0
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


def _client(app: App) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"http://127.0.0.1:{app.http_port}/v1", api_key="unused")


async def _post(app: App, body: dict[str, Any] | bytes) -> tuple[int, Any]:
    """POST `body` (or its JSON bytes, encoded beforehand) to the chat endpoint."""
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"http://127.0.0.1:{app.http_port}/v1/chat/completions",
            data=body if isinstance(body, bytes) else json.dumps(body),
            headers={"content-type": "application/json"},
        ) as resp:
            return resp.status, await resp.json()


def _chat(app: App, **fields: Any) -> dict[str, Any]:
    return {"model": app.model.model_id, "messages": ASK, **fields}


def _err(message: str, param: str | None, code: str) -> dict[str, Any]:
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    return {"error": error}


async def test_sdk_agent_loop_calls_a_tool_then_answers_from_its_result(gateway: App) -> None:
    """The SDK's non-streamed call gives `tool_calls` (finish "tool_calls", no content);
    sent back with the tool's result, the next turn answers from it in text."""
    client = _client(gateway)
    model = gateway.model.model_id
    first = await client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    turn = choice.message.model_dump(exclude_none=True)
    result = {"role": "tool", "tool_call_id": call.id, "content": "21 C and sunny"}
    second = await client.chat.completions.create(
        model=model, messages=[*ASK, turn, result], tools=[WEATHER]
    )
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "The tool returned: 21 C and sunny"
    assert not second.choices[0].message.tool_calls


async def test_sdk_stream_helper_accumulates_the_streamed_call(gateway: App) -> None:
    """Streamed, the call arrives as a first delta (index, id, type, name) and argument
    fragments; the SDK's stream helper accumulates them into the non-streamed call."""
    client = _client(gateway)
    fields: dict[str, Any] = {
        "model": gateway.model.model_id,
        "messages": ASK,
        "tools": [WEATHER],
        "stream_options": {"include_usage": True},
    }
    deltas = []
    async with client.chat.completions.stream(**fields) as stream:
        async for event in stream:
            if event.type == "chunk" and event.chunk.choices:
                deltas.extend(event.chunk.choices[0].delta.tool_calls or [])
        final = await stream.get_final_completion()
    first, *rest = deltas
    assert (first.index, first.type, first.function.name) == (0, "function", "get_weather")
    assert first.id is not None and first.id.startswith("call_")
    assert all(d.id is None and d.function.name is None for d in rest)
    arguments = (first.function.arguments or "") + "".join(d.function.arguments for d in rest)
    (call,) = final.choices[0].message.tool_calls or []
    assert call.function.arguments == arguments
    assert json.loads(arguments) == {"city": "Paris"}
    assert final.choices[0].finish_reason == "tool_calls"
    assert final.choices[0].message.content is None  # as the non-streamed message


class GetWeather(pydantic.BaseModel):
    """The weather of a city."""

    city: str


async def test_sdk_parse_with_a_pydantic_tool_gives_parsed_arguments(gateway: App) -> None:
    """`chat.completions.parse` with `pydantic_function_tool` (a strict function: the call is
    constrained by the DeepSeek V3.1 structural tag) gives the parsed pydantic arguments."""
    client = _client(gateway)
    parsed = await client.chat.completions.parse(
        model=gateway.model.model_id, messages=ASK, tools=[pydantic_function_tool(GetWeather)]
    )
    (call,) = parsed.choices[0].message.tool_calls or []
    assert call.function.parsed_arguments == GetWeather(city="Paris")


async def test_langchain_agent_loop_with_bound_tools(gateway: App) -> None:
    """LangChain's `ChatOpenAI(...).bind_tools(...)`: the model calls the tool, the loop runs
    it and sends a `ToolMessage` back, and the final answer is text from its result."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        return f"21 C in {city}"

    llm = ChatOpenAI(
        model=gateway.model.model_id,
        base_url=f"http://127.0.0.1:{gateway.http_port}/v1",
        api_key="unused",  # type: ignore[arg-type]
        max_retries=0,
    ).bind_tools([get_weather])
    messages: list[Any] = [HumanMessage("What is the weather in Paris?")]
    for _ in range(3):
        answer = await llm.ainvoke(messages)
        messages.append(answer)
        if not answer.tool_calls:  # type: ignore[attr-defined]
            break
        for call in answer.tool_calls:  # type: ignore[attr-defined]
            output = get_weather.invoke(call["args"])
            messages.append(ToolMessage(output, tool_call_id=call["id"]))
    kinds = [type(m).__name__ for m in messages]
    assert kinds == ["HumanMessage", "AIMessage", "ToolMessage", "AIMessage"]
    assert messages[1].tool_calls[0]["args"] == {"city": "Paris"}
    assert messages[-1].content == "The tool returned: 21 C in Paris"


async def test_a_stop_string_inside_a_call_cuts_it_alike_streamed_and_whole(
    gateway: App,
) -> None:
    """A stop string the call's arguments hold ends the answer there: the call's arguments
    are the text before it, streamed as whole (the SDK's stream helper accumulates them)."""
    client = _client(gateway)
    fields: dict[str, Any] = {
        "model": gateway.model.model_id,
        "messages": ASK,
        "tools": [WEATHER],
        "stop": ["Paris"],
    }
    whole = await client.chat.completions.create(**fields)
    (call,) = whole.choices[0].message.tool_calls or []
    assert call.function.arguments == '{"city": "'
    async with client.chat.completions.stream(**fields) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    (streamed,) = final.choices[0].message.tool_calls or []
    assert (streamed.function.name, streamed.function.arguments) == (
        call.function.name,
        call.function.arguments,
    )
    assert final.choices[0].finish_reason == whole.choices[0].finish_reason


async def test_legacy_functions_answer_in_the_function_call_shape(gateway: App) -> None:
    """`functions` gives `message.function_call` and finish reason "function_call"."""
    status, body = await _post(gateway, _chat(gateway, functions=[WEATHER["function"]]))
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["finish_reason"] == "function_call"
    assert choice["message"]["function_call"] == {
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    assert "tool_calls" not in choice["message"]


async def test_tool_choice_none_answers_in_text(gateway: App) -> None:
    """`tool_choice: "none"`: the tools are not offered, the answer is text."""
    status, body = await _post(gateway, _chat(gateway, tools=[WEATHER], tool_choice="none"))
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and "tool_calls" not in choice["message"]
    assert "<｜tool" not in choice["message"]["content"]


async def test_reasoning_effort_splits_reasoning_content_off(gateway: App) -> None:
    """`reasoning_effort` reaches the template (it opens `<think>`): the reasoning comes
    back as `reasoning_content`, counted in `completion_tokens_details.reasoning_tokens`,
    and streamed as `reasoning_content` deltas joining to the same text."""
    fields = {"reasoning_effort": "high", "temperature": 0}
    status, body = await _post(gateway, _chat(gateway, **fields))
    assert status == 200, body
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] and "</think>" not in message["reasoning_content"]
    assert message["content"] and "<think>" not in message["content"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
    client = _client(gateway)
    stream = await client.chat.completions.create(
        model=gateway.model.model_id, messages=ASK, stream=True, **fields
    )
    reasoning, content = [], []
    async for chunk in stream:
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            reasoning.append(extra.get("reasoning_content") or "")
            content.append(choice.delta.content or "")
    assert "".join(reasoning) == message["reasoning_content"]
    assert "".join(content) == message["content"]


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": [WEATHER], "tool_choice": "required"},
        {
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "w", "schema": WEATHER["function"]["parameters"]},
            }
        },
    ],
    ids=["required", "named", "json_schema"],
)
async def test_a_json_constraint_after_an_opened_think_is_the_answer_not_reasoning(
    gateway: App, fields: dict[str, Any]
) -> None:
    """With `reasoning_effort` the prompt opens `<think>`, but a JSON constraint binds from
    the first token: the JSON is the call (or the content), and nothing is reasoning."""
    status, body = await _post(gateway, _chat(gateway, reasoning_effort="high", **fields))
    assert status == 200, body
    choice = body["choices"][0]
    message = choice["message"]
    assert "reasoning_content" not in message
    assert "reasoning_tokens" not in body["usage"].get("completion_tokens_details", {})
    if "tools" in fields:
        assert choice["finish_reason"] == "tool_calls" and message["content"] is None
        call = message["tool_calls"][0]["function"]
        assert call["name"] == "get_weather" and "city" in json.loads(call["arguments"])
    else:
        assert "city" in json.loads(message["content"])


async def test_a_reasoning_turn_sent_back_as_the_sdk_gives_it_is_served(gateway: App) -> None:
    """An assistant message the SDK returned, `reasoning_content` and `annotations` (null)
    included, goes back into the next request as it is (OpenAI-compatible clients append
    the message object)."""
    client = _client(gateway)
    first = await client.chat.completions.create(
        model=gateway.model.model_id, messages=ASK, reasoning_effort="high"
    )
    turn = first.choices[0].message.model_dump()
    assert turn["reasoning_content"] and "annotations" in turn
    again = [*ASK, turn, {"role": "user", "content": "And in Rome?"}]
    second = await client.chat.completions.create(model=gateway.model.model_id, messages=again)
    assert second.choices[0].message.content


async def test_chat_template_kwargs_reach_the_template(gateway: App) -> None:
    """`chat_template_kwargs` the template reads are served (`thinking` opens `<think>`);
    a name it does not read is 400 `unsupported_parameter`, as is `reasoning_effort` on a
    model whose template takes none (checked on the name the template lacks)."""
    status, body = await _post(gateway, _chat(gateway, chat_template_kwargs={"thinking": True}))
    assert status == 200, body
    assert body["choices"][0]["message"]["reasoning_content"]
    status, body = await _post(gateway, _chat(gateway, chat_template_kwargs={"bogus": 1}))
    assert (status, body) == (
        400,
        _err(
            "Invalid value for 'chat_template_kwargs': the model's chat template does not read "
            "'bogus'.",
            "chat_template_kwargs",
            "unsupported_parameter",
        ),
    )
    status, body = await _post(gateway, _chat(gateway, chat_template_kwargs={"messages": []}))
    assert status == 400 and body["error"]["param"] == "chat_template_kwargs"


async def test_grpc_tool_call_streamed_and_whole(gateway: App) -> None:
    """Over the gRPC API a tool call comes as `tool_calls` deltas (id and name first, then
    argument fragments) that join to the non-streamed call; the tokens the parser holds back
    (call markers) send no empty entries."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.grpc_port}") as channel:
        stub = pb_grpc.InferenceStub(channel)
        request = pb.ChatCompletionRequest(
            model=gateway.model.model_id,
            messages=[pb.ChatMessage(role="user", content=ASK[0]["content"])],
            tools=json.dumps([WEATHER]),
            stream=True,
        )
        chunks = [c async for c in stub.ChatCompletion(request)]
        request.stream = False
        (whole,) = [c async for c in stub.ChatCompletion(request)]
    entries = [ch for c in chunks for ch in c.choices]
    said = [
        ch.role or ch.text or ch.reasoning or ch.tool_calls or ch.finish_reason for ch in entries
    ]
    assert all(said), [str(ch) for ch in entries]
    deltas = [d for ch in entries for d in ch.tool_calls]
    assert deltas[0].name == "get_weather" and deltas[0].id.startswith("call_")
    assert all(not d.name and not d.id for d in deltas[1:])
    (call,) = whole.choices[0].tool_calls
    assert call.name == "get_weather"
    assert "".join(d.arguments for d in deltas) == call.arguments == '{"city": "Paris"}'
    assert whole.choices[0].finish_reason == "tool_calls"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert whole.system_fingerprint.startswith("fp_")


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def _tool(name: str, parameters: Any = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"tools": [_tool("f"), _tool("f")]},
            _err(
                "Invalid value for 'tools.[1].function.name': duplicate function name 'f' in "
                "'tools'.",
                "tools.[1].function.name",
                "invalid_value",
            ),
        ),
        (
            {
                "tools": [_tool("f")],
                "tool_choice": {"type": "function", "function": {"name": "g"}},
            },
            _err(
                "Invalid value for 'tool_choice': no function named 'g' in 'tools'.",
                "tool_choice",
                "invalid_value",
            ),
        ),
        (
            {"tool_choice": "required"},
            _err(
                "Invalid value for 'tool_choice': 'tool_choice' other than 'none' or 'auto' is "
                "only allowed when 'tools' are specified.",
                "tool_choice",
                "invalid_value",
            ),
        ),
        (
            {"tools": [_tool("f", {"type": "object", "properties": {"a": {"type": "objekt"}}})]},
            _err(
                "Invalid schema for 'tools.[0].function.parameters.properties.a.type': 'type' "
                "must be one of array, boolean, integer, null, number, object, string, or a "
                "list of them.",
                "tools.[0].function.parameters",
                "invalid_function_parameters",
            ),
        ),
        (
            {"tools": [_tool("f", {"type": "string"})]},
            _err(
                "Invalid schema for 'tools.[0].function.parameters.type': function parameters "
                "must be an object schema ('type': 'object'), got 'string'.",
                "tools.[0].function.parameters",
                "invalid_function_parameters",
            ),
        ),
        (
            {"tool_choice": 5, "tools": [_tool("f")]},
            _err(
                "Invalid value for 'tool_choice': Input should be 'none', 'auto' or 'required'",
                "tool_choice",
                "invalid_value",
            ),
        ),
        (
            {"tool_choice": {"type": "function"}, "tools": [_tool("f")]},
            _err(
                "Missing required parameter: 'tool_choice.function'.",
                "tool_choice.function",
                "missing_required_parameter",
            ),
        ),
        (
            {"function_call": 7, "functions": [{"name": "f"}]},
            _err(
                "Invalid value for 'function_call': Input should be 'none' or 'auto'",
                "function_call",
                "invalid_value",
            ),
        ),
        (
            {"tools": [_tool("f", _nested(100))]},
            _err(
                "Invalid schema for 'tools.[0].function.parameters.properties.x.properties.x."
                "properti...': schemas may nest at most 64 levels deep.",
                "tools.[0].function.parameters",
                "invalid_function_parameters",
            ),
        ),
        (
            {"tools": [_tool("météo")]},
            _err(
                "Invalid value for 'tools.[0].function.name': String should match pattern "
                "'^[a-zA-Z0-9_-]{1,64}$'",
                "tools.[0].function.name",
                "invalid_value",
            ),
        ),
        (
            {"tools": [_tool(f"f{i}") for i in range(129)]},
            _err(
                "Invalid value for 'tools': List should have at most 128 items after "
                "validation, not 129",
                "tools",
                "invalid_value",
            ),
        ),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "f", "description": "<｜User｜>"}}
                ]
            },
            _err(
                "Invalid value for 'tools.[0].function': text given to the chat template must "
                "not hold special-token text (in 'tools').",
                "tools.[0].function",
                "invalid_value",
            ),
        ),
        (
            {"tools": [_tool("f", {"type": "string"})], "tool_choice": "none"},
            _err(
                "Invalid schema for 'tools.[0].function.parameters.type': function parameters "
                "must be an object schema ('type': 'object'), got 'string'.",
                "tools.[0].function.parameters",
                "invalid_function_parameters",
            ),
        ),
        (
            {
                "messages": [
                    *ASK,
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": f"c{i}", "function": {"name": "f", "arguments": "{}"}}
                            for i in range(129)
                        ],
                    },
                ]
            },
            _err(
                "Invalid value for 'messages.[1].tool_calls': List should have at most 128 "
                "items after validation, not 129",
                "messages.[1].tool_calls",
                "invalid_value",
            ),
        ),
        (
            {"messages": [{"role": "user", "content": "hi", "reasoning_content": "hm"}]},
            _err(
                "Invalid value for 'messages.[0].reasoning_content': only an assistant "
                "message carries it, not a user message",
                "messages.[0].reasoning_content",
                "invalid_value",
            ),
        ),
        (
            {
                "messages": [
                    *ASK,
                    {"role": "assistant", "content": "ok", "reasoning_content": "<｜User｜>"},
                    {"role": "user", "content": "and?"},
                ]
            },
            _err(
                "Invalid value for 'messages.[1].reasoning_content': text given to the chat "
                "template must not hold special-token text (in 'messages').",
                "messages.[1].reasoning_content",
                "invalid_value",
            ),
        ),
        (
            {
                "tools": [_tool("f")],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            _err(
                "'response_format' cannot be combined with 'tool_choice' 'required': both "
                "constrain the answer.",
                "response_format",
                "invalid_value",
            ),
        ),
    ],
)
async def test_bad_tool_requests_get_exact_400s(
    gateway: App, fields: dict[str, Any], expected: dict[str, Any]
) -> None:
    """Each tool mistake is a 400 naming the parameter, in OpenAI's codes."""
    status, body = await _post(gateway, _chat(gateway, **fields))
    assert (status, body) == (400, expected)


def _wide_schema(chars: int) -> dict[str, Any]:
    """An object schema of about `chars` characters of JSON (many string properties)."""
    count = chars // 60
    props = {f"property_{i:06d}": {"type": "string", "description": "x" * 20} for i in range(count)}
    return {"type": "object", "properties": props}


def _many(count: int) -> dict[str, Any]:
    """An object schema of `count` bare string properties."""
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(count)}}


def _calls_and_results(count: int) -> list[dict[str, Any]]:
    """A history of `count` assistant turns of one call each, each answered by a tool."""
    turns: list[dict[str, Any]] = []
    for i in range(count):
        call = {"id": f"c{i}", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}  # fmt: skip
        turns.append({"role": "assistant", "content": None, "tool_calls": [call]})
        turns.append({"role": "tool", "tool_call_id": f"c{i}", "content": "21 C"})
    return turns


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": [_tool("big", _wide_schema(1_000_000))], "max_tokens": 4},
        {"tools": [_tool(f"f{i}", _wide_schema(6_000)) for i in range(128)], "max_tokens": 4},
        {"tools": [_tool("deep", _nested(100))]},
        {"tools": [_tool("wide", _many(30_000))], "tool_choice": "required", "max_tokens": 4},
        {"tools": [_tool("wide", _many(30_000))], "max_tokens": 4},
        {"messages": [{"role": "user", "content": "x", "name": "<" * 64}] * 2048},
        {"messages": [*ASK, *_calls_and_results(1_000)], "max_tokens": 4},
    ],
    ids=[
        "1MB-schema",
        "128-tools",
        "100-deep",
        "30k-props-required",
        "30k-props-auto",
        "2048-names",
        "1000-past-calls",
    ],
)
async def test_hostile_tools_hold_the_loop_under_10ms(gateway: App, fields: dict[str, Any]) -> None:
    """A 1 MB schema, 128 tools of 6 KB, a schema nested 100 deep, 2,048 named messages and
    a history of 1,000 calls are served or refused, and no loop callback holds the loop
    10 ms of CPU: the body parse, the schema walk, the special-text scans and the template
    run in threads. The least of 3 readings (one reading has a tail on a shared VM, see
    `loop_watch`)."""
    served: list[Callbacks] = []
    data = json.dumps(_chat(gateway, **fields)).encode()  # the client's work, not measured
    with LoopWatch() as watch:
        for _ in range(3):
            with watch.recording() as callbacks:
                status, body = await _post(gateway, data)
            assert status in (200, 400), body
            served.append(callbacks)
    assert least_longest(served) < LOOP_BUDGET_MS, report(served)


async def test_hostile_grpc_history_holds_the_loop_under_10ms(gateway: App) -> None:
    """Over gRPC, 2,048 named messages and a history of 1,000 calls cost the loop no
    callback of 10 ms either: the message is converted and validated in a thread."""
    named = [pb.ChatMessage(role="user", content="x", name="<" * 64)] * 2048
    calls = [
        pb.ChatMessage(
            role=turn["role"],
            content=turn["content"] or "",
            tool_calls=[
                pb.ToolCall(
                    id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"]
                )
                for c in turn.get("tool_calls", [])
            ],
            tool_call_id=turn.get("tool_call_id"),
        )
        for turn in [*ASK, *_calls_and_results(1_000)]
    ]
    served: list[Callbacks] = []
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.grpc_port}") as channel:
        stub = pb_grpc.InferenceStub(channel)
        with LoopWatch() as watch:
            for messages in (named, calls, named):
                request = pb.ChatCompletionRequest(
                    model=gateway.model.model_id,
                    messages=messages,
                    sampling=pb.SamplingOptions(max_tokens=4),
                )
                with watch.recording() as callbacks:
                    answers = [a async for a in stub.ChatCompletion(request)]
                assert answers[-1].choices[0].finish_reason
                served.append(callbacks)
    assert least_longest(served) < LOOP_BUDGET_MS, report(served)


async def test_required_call_cut_at_length_is_a_call_never_the_constraint_json(
    gateway: App,
) -> None:
    """`tool_choice: "required"` cut by `max_tokens` anywhere in its call: once the name is
    written the answer is that call (partial arguments, finish "length"); the engine's JSON
    array never reaches `content`."""
    names = []
    for max_tokens in range(2, 16):
        fields = {"tools": [WEATHER], "tool_choice": "required", "max_tokens": max_tokens}
        status, body = await _post(gateway, _chat(gateway, **fields))
        assert status == 200, body
        choice = body["choices"][0]
        assert choice["finish_reason"] == "length", choice
        assert '"name"' not in (choice["message"]["content"] or ""), (max_tokens, choice)
        calls = choice["message"].get("tool_calls") or []
        names += [c["function"]["name"] for c in calls]
    assert names and set(names) == {"get_weather"}
