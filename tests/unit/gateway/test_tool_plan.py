"""What a chat request's tools make of its template variables, engine constraint and answer
parsing (`plan_tools`), and the 400s of what the model cannot serve."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from homing.gateway.errors import APIError
from homing.gateway.requests import parse_chat
from homing.gateway.tool_plan import plan_tools, plans_costly
from homing.text.served import load_served_tokenizer

ASK = [{"role": "user", "content": "weather?"}]
TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object"}},
}


def _model(tool_call_parser: str | None = "deepseek_v31", reasoning: str | None = None) -> Any:
    return SimpleNamespace(
        tokenizer=load_served_tokenizer(),
        tool_call_parser=tool_call_parser,
        reasoning_parser=reasoning,
    )


def _plan(model: Any = None, **fields: Any) -> Any:
    req = parse_chat({"model": "m", "messages": ASK, **fields})
    return plan_tools(req, model or _model())


def test_plain_request_has_no_parsing_and_no_constraint() -> None:
    """Without tools or a reasoning parser the answer takes the plain path."""
    plan = _plan()
    assert plan.output([1, 2, 3]) is None
    assert (plan.json_schema, plan.structural_tag) == (None, None)
    assert not plans_costly(parse_chat({"model": "m", "messages": ASK}))
    assert "tools" not in plan.variables


def test_auto_gives_the_tools_to_the_template_and_parses_calls() -> None:
    """`auto`: tools in transformers' shape for the template, the model's parser, no
    constraint (planned and checked in the encode thread: `plans_costly`)."""
    plan = _plan(tools=[TOOL])
    assert plan.variables["tools"] == [TOOL]
    assert plan.json_schema is None
    assert plans_costly(parse_chat({"model": "m", "messages": ASK, "tools": [TOOL]}))
    output = plan.output([1])
    assert output is not None and output.tools is not None and output.reasoning is None


def test_tool_choice_none_hides_the_tools() -> None:
    """`none`: the tools are not shown to the model and the answer is not parsed."""
    plan = _plan(tools=[TOOL], tool_choice="none")
    assert "tools" not in plan.variables and plan.output([1]) is None


def test_required_is_constrained_to_an_array_of_calls() -> None:
    """`required` with `parallel_tool_calls: false`: a one-call array schema."""
    plan = _plan(tools=[TOOL], tool_choice="required", parallel_tool_calls=False)
    schema = json.loads(plan.json_schema)
    assert schema["type"] == "array" and schema["maxItems"] == 1
    assert plan.output([1]).max_calls == 1


def test_named_function_is_constrained_to_its_arguments() -> None:
    """A named function: the engine is constrained to its parameters schema."""
    choice = {"type": "function", "function": {"name": "get_weather"}}
    plan = _plan(tools=[TOOL], tool_choice=choice)
    assert json.loads(plan.json_schema) == {"type": "object"}


def test_strict_auto_is_constrained_by_the_family_structural_tag() -> None:
    """A strict function with `auto`: DeepSeek V3.1's structural tag."""
    strict = {"type": "function", "function": {**TOOL["function"], "strict": True}}
    tag = json.loads(_plan(tools=[strict]).structural_tag)
    assert tag["type"] == "structural_tag"
    assert tag["structures"][0]["begin"] == "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"


def test_auto_without_a_tool_call_parser_is_400() -> None:
    """A model with no parser cannot answer `auto` calls: 400 naming `tools`."""
    with pytest.raises(APIError) as info:
        _plan(_model(tool_call_parser=None), tools=[TOOL])
    assert (info.value.status, info.value.param) == (400, "tools")
    assert "tool_call_parser" in info.value.message


def test_strict_with_a_format_that_cannot_be_constrained_is_400() -> None:
    """Pythonic calls have no structural tag: a strict function is refused by name."""
    strict = {"type": "function", "function": {**TOOL["function"], "strict": True}}
    with pytest.raises(APIError) as info:
        _plan(_model(tool_call_parser="pythonic"), tools=[strict])
    assert (info.value.param, info.value.code) == (
        "tools.[0].function.strict",
        "unsupported_parameter",
    )


def test_deepseek_v31_reasons_only_after_a_prompt_that_opened_think() -> None:
    """The reasoning parser runs when the prompt ends with `<think>`, not otherwise."""
    tokenizer = load_served_tokenizer()
    plan = _plan(_model(reasoning="deepseek_v31"))
    think = tokenizer.token_to_id("<think>")
    assistant = tokenizer.token_to_id("<｜Assistant｜>")
    assert plan.output([1, assistant]) is None
    opened = plan.output([1, assistant, think])
    assert opened is not None and opened.reasoning is not None


def test_reserved_template_kwargs_are_400() -> None:
    """`chat_template_kwargs` cannot set what the gateway sets (`messages`, `tools`)."""
    for key in ("messages", "tools", "add_generation_prompt"):
        with pytest.raises(APIError) as info:
            _plan(chat_template_kwargs={key: 1})
        assert (info.value.param, info.value.code) == (
            "chat_template_kwargs",
            "unsupported_parameter",
        )


def test_a_history_of_calls_is_planned_in_the_thread() -> None:
    """Past calls and tool results are scanned for special-token text, so a request carrying
    them is planned in the encode thread even with `tool_choice: "none"`."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    req = parse_chat({"model": "m", "messages": messages, "tools": [TOOL], "tool_choice": "none"})
    assert req.tool_mode == "none" and plans_costly(req)
