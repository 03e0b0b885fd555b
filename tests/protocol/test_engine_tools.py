"""Tool calling and constrained answers on both engines: `tool_choice: "required"`, a named
function and `response_format` json_schema reach the engine as a `json_schema` constraint,
so even the random-weight model answers with a schema-valid call or object; `seed` is
served on both (honoured by the simulator only). Checked through the official SDK."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from engine_fleet import Fleet
from openai import AsyncOpenAI

from homing.app import App

pytestmark = pytest.mark.asyncio(loop_scope="module")

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"],
    "additionalProperties": False,
}
UNIT = {
    "type": "object",
    "properties": {"unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": CITY}},
    {"type": "function", "function": {"name": "set_unit", "parameters": UNIT}},
]
SCHEMAS = {"get_weather": CITY, "set_unit": UNIT}
MESSAGES: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]


def _client(app: App) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"http://127.0.0.1:{app.http_port}/v1", api_key="unused")


def _valid_call(call: Any, name: str | None = None) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in SCHEMAS if name is None else call.function.name == name
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


async def test_required_tool_choice_gives_a_schema_valid_call(gateway: App, fleet: Fleet) -> None:
    """`tool_choice: "required"` with one call allowed: the answer is one call of a declared
    function whose arguments match its schema, finish reason "tool_calls", streamed (as the
    SDK's stream helper accumulates it) and not."""
    client = _client(gateway)
    fields: dict[str, Any] = {
        "model": gateway.model.model_id,
        "messages": MESSAGES,
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 200,
        "temperature": 0,
    }
    whole = await client.chat.completions.create(**fields)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None
    assert len(choice.message.tool_calls or []) == 1
    _valid_call(choice.message.tool_calls[0])  # type: ignore[index]
    async with client.chat.completions.stream(**fields) as stream:
        async for _ in stream:
            pass
        streamed = await stream.get_final_completion()
    calls = streamed.choices[0].message.tool_calls or []
    assert [(c.function.name, c.function.arguments) for c in calls] == [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls or []
    ]
    assert streamed.choices[0].finish_reason == "tool_calls"


async def test_a_named_tool_choice_calls_that_function(gateway: App, fleet: Fleet) -> None:
    """A named `tool_choice` constrains the answer to that function's arguments."""
    client = _client(gateway)
    answer = await client.chat.completions.create(
        model=gateway.model.model_id,
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "set_unit"}},
        max_tokens=200,
        temperature=0,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert len(choice.message.tool_calls or []) == 1
    _valid_call(choice.message.tool_calls[0], "set_unit")  # type: ignore[index]


async def test_response_format_json_schema_gives_a_valid_object(gateway: App, fleet: Fleet) -> None:
    """`response_format` json_schema: the content is an instance of the schema."""
    client = _client(gateway)
    answer = await client.chat.completions.create(
        model=gateway.model.model_id,
        messages=MESSAGES,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}},
        max_tokens=200,
        temperature=0,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "stop", choice
    jsonschema.validate(json.loads(choice.message.content or ""), CITY)


async def test_seed_is_served_on_both_engines(gateway: App, fleet: Fleet) -> None:
    """`seed` is accepted by both engines (SGLang ignores it in `custom_params`); the
    simulator gives the same sampled answer for the same seed."""
    client = _client(gateway)
    texts = []
    for _ in range(2):
        answer = await client.chat.completions.create(
            model=gateway.model.model_id, messages=MESSAGES, seed=5, max_tokens=8, temperature=1
        )
        assert answer.system_fingerprint and answer.system_fingerprint.startswith("fp_")
        texts.append(answer.choices[0].message.content)
    if fleet.engine == "sim":
        assert texts[0] == texts[1]
