"""A chat answer split into content, reasoning and tool calls: the non-streamed body and the
streamed deltas agree for any chunking, and reasoning never reaches the tool-call parser."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from homing.gateway.output import (
    DeltaBuilder,
    OutputPlan,
    finish_reason,
    message_body,
    parse_whole,
)
from homing.text.parsers import think_parser_factory, tool_parser_factory
from homing.text.tools.base import ToolSpec

TOOLS = (ToolSpec("get_weather", {"type": "object"}), ToolSpec("get_time", None))
BEGIN, END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"


def _call(name: str, arguments: str) -> str:
    return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{arguments}<｜tool▁call▁end｜>"


def _plan(reasoning: bool = False, **fields: Any) -> OutputPlan:
    return OutputPlan(
        tools=tool_parser_factory("deepseek_v31", TOOLS),
        reasoning=think_parser_factory(True) if reasoning else None,
        parses_calls=True,
        **fields,
    )


def _streamed(plan: OutputPlan, pieces: list[str]) -> dict[str, Any]:
    """The message the SDK accumulates from the streamed deltas of `pieces`."""
    parser = plan.parser()
    builder = DeltaBuilder(plan.legacy)
    deltas: list[dict[str, Any]] = []
    for piece in pieces:
        deltas += builder.deltas(parser.feed(piece), parser.ids)
    deltas += builder.deltas(parser.finish(), parser.ids)
    message: dict[str, Any] = {"content": "", "reasoning_content": "", "tool_calls": []}
    for delta in deltas:
        message["content"] += delta.get("content", "")
        message["reasoning_content"] += delta.get("reasoning_content", "")
        for call in delta.get("tool_calls", []):
            if "id" in call:
                assert call["index"] == len(message["tool_calls"])
                message["tool_calls"].append({**call, "function": dict(call["function"])})
            else:
                message["tool_calls"][call["index"]]["function"]["arguments"] += call["function"][
                    "arguments"
                ]
    return message


def _cuts(text: str, rng: random.Random) -> list[str]:
    pieces, i = [], 0
    while i < len(text):
        k = rng.randint(1, 7)
        pieces.append(text[i : i + k])
        i += k
    return pieces


def test_streamed_deltas_accumulate_to_the_non_streamed_message() -> None:
    """Reasoning, content and two calls: for random chunkings the accumulated deltas give
    the same content, reasoning, names, ids' order and arguments as the whole parse."""
    text = (
        "Thinking about the call.</think>Sure: "
        + BEGIN
        + _call("get_weather", '{"city": "Pa\\"ris é"}')
        + _call("get_time", "{}")
        + END
    )
    plan = _plan(reasoning=True)
    parsed, ids = parse_whole(plan, text)
    whole = message_body(parsed, ids, plan)
    assert whole["content"] == "Sure: "
    assert whole["reasoning_content"] == "Thinking about the call."
    assert [c["function"]["name"] for c in whole["tool_calls"]] == ["get_weather", "get_time"]
    rng = random.Random(7)
    for _ in range(50):
        streamed = _streamed(plan, _cuts(text, rng))
        assert streamed["content"] == whole["content"]
        assert streamed["reasoning_content"] == whole["reasoning_content"]
        assert [
            (c["function"]["name"], c["function"]["arguments"]) for c in streamed["tool_calls"]
        ] == [(c["function"]["name"], c["function"]["arguments"]) for c in whole["tool_calls"]]
    assert json.loads(whole["tool_calls"][0]["function"]["arguments"]) == {"city": 'Pa"ris é'}


def test_a_call_written_inside_the_reasoning_stays_reasoning() -> None:
    """Reasoning text never reaches the tool-call parser: a call format inside the thought
    is part of `reasoning_content`, and no call is reported."""
    thought = "I could write " + BEGIN + _call("get_time", "{}") + END + " but I will not."
    parsed, _ = parse_whole(_plan(reasoning=True), thought + "</think>It is noon.")
    assert parsed.reasoning == thought
    assert parsed.content == "It is noon."
    assert not parsed.calls


def test_parallel_tool_calls_false_keeps_the_first_call_only() -> None:
    """`max_calls=1` drops the second call, streamed and not."""
    text = BEGIN + _call("get_weather", "{}") + _call("get_time", "{}") + END
    plan = _plan(max_calls=1)
    parsed, ids = parse_whole(plan, text)
    assert [c.name for c in parsed.calls] == ["get_weather"] and len(ids) == 1
    assert [c["function"]["name"] for c in _streamed(plan, list(text))["tool_calls"]] == [
        "get_weather"
    ]


def test_legacy_functions_answer_one_function_call() -> None:
    """The legacy shape: `function_call` {name, arguments} and finish reason
    "function_call"; the streamed deltas carry `function_call` pieces."""
    text = BEGIN + _call("get_weather", '{"a": 1}') + END
    plan = _plan(legacy=True)
    parsed, ids = parse_whole(plan, text)
    message = message_body(parsed, ids, plan)
    assert message == {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "get_weather", "arguments": '{"a": 1}'},
    }
    assert finish_reason("stop", len(parsed.calls), legacy=True) == "function_call"
    parser = plan.parser()
    deltas = DeltaBuilder(True).deltas(parser.feed(text) + parser.finish(), parser.ids)
    assert deltas[0]["function_call"] == {"name": "get_weather", "arguments": ""}
    assert "".join(d["function_call"]["arguments"] for d in deltas) == '{"a": 1}'


def test_a_calls_first_delta_has_empty_arguments_as_openai_streams_it() -> None:
    """Even when one engine chunk holds a whole call, its first delta is index, id, type and
    name with `arguments: ""`, and the arguments follow in a delta of their own."""
    parser = _plan().parser()
    text = BEGIN + _call("get_weather", '{"a": 1}') + END
    deltas = DeltaBuilder(False).deltas(parser.feed(text) + parser.finish(), parser.ids)
    first, rest = deltas[0]["tool_calls"][0], deltas[1:]
    assert first == {
        "index": 0,
        "id": parser.ids[0],
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    args = [c["function"]["arguments"] for d in rest for c in d["tool_calls"]]
    assert "".join(args) == '{"a": 1}' and all(args)


def test_finish_reason_is_tool_calls_only_for_a_call_that_stopped() -> None:
    """A call that stopped: "tool_calls"; cut at the length limit: "length" stays; no call:
    the engine's reason."""
    assert finish_reason("stop", 1, legacy=False) == "tool_calls"
    assert finish_reason("length", 1, legacy=False) == "length"
    assert finish_reason("stop", 0, legacy=False) == "stop"


def test_a_call_of_an_undeclared_function_is_content() -> None:
    """A malformed call (a function the request did not declare) comes back as text."""
    text = BEGIN + _call("rm_rf", "{}") + END
    parsed, _ = parse_whole(_plan(), text)
    assert not parsed.calls
    assert "rm_rf" in parsed.content


@pytest.mark.parametrize("seed", range(5))
def test_whitespace_before_the_calls_is_no_content(seed: int) -> None:
    """`</think>\n\n` then calls (Qwen 3's shape), or whitespace after the calls: the
    message is reasoning and calls with null content, streamed as whole; whitespace before
    text stays part of the text, and an answer of whitespace alone is that content."""
    rng = random.Random(seed)
    plan = _plan(reasoning=True)
    called = "Plan it.</think>\n\n" + BEGIN + _call("get_time", "{}") + END
    parsed, ids = parse_whole(plan, called)
    whole = message_body(parsed, ids, plan)
    assert whole["content"] is None and whole["reasoning_content"] == "Plan it."
    streamed = _streamed(plan, _cuts(called, rng))
    assert streamed["content"] == "" and len(streamed["tool_calls"]) == 1
    for text, content in [
        ("Plan it.</think>\n\nIt is noon.", "\n\nIt is noon."),
        ("Plan it.</think>\n \n", "\n \n"),
        ("Plan it.</think>" + BEGIN + _call("get_time", "{}") + END + "\n\n", None),
        ("</think>Sure\n" + BEGIN + _call("get_time", "{}") + END + "\n", "Sure\n"),
        ("Plan it.</think>" + BEGIN + _call("get_time", "{}") + END + "\nDone.", "\nDone."),
    ]:
        parsed, ids = parse_whole(plan, text)
        assert message_body(parsed, ids, plan)["content"] == content
        assert _streamed(plan, _cuts(text, rng))["content"] == (content or "")


def test_long_parsed_answers_are_work_for_a_thread() -> None:
    """Parsing and counting go off the loop only for parsed answers over the bound."""
    from types import SimpleNamespace

    from homing.gateway.output import HEAVY_OUTPUT_CHARS, heavy_output

    parsed = SimpleNamespace(output=_plan(reasoning=True), model=None)
    plain = SimpleNamespace(output=None, model=None)
    long = ["x" * (HEAVY_OUTPUT_CHARS // 2 + 1)] * 2
    assert heavy_output(parsed, long) and not heavy_output(parsed, ["x" * 10])
    assert not heavy_output(plain, long)
