"""What a chat request's tools make of its template variables, engine constraint and answer
parsing (`plan_tools`), and the 400s of what the model cannot serve."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer

from homing.engines.client import GenerateDone
from homing.gateway.decoding import ChoiceDecoder
from homing.gateway.errors import APIError
from homing.gateway.output import parse_whole
from homing.gateway.requests import parse_chat
from homing.gateway.tool_plan import plan_tools, plans_costly
from homing.text.served import load_served_tokenizer, served_tokenizer_files
from homing.text.stops import StopSet
from homing.text.tokenizer import TextTokenizer

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


def _opened_think_prompt() -> list[int]:
    tokenizer = load_served_tokenizer()
    return [1, tokenizer.token_to_id("<｜Assistant｜>"), tokenizer.token_to_id("<think>")]


@pytest.mark.parametrize("reasoning", ["deepseek_v31", "qwen3", "gpt_oss"])
@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_a_json_constrained_call_is_parsed_as_json_without_reasoning(
    reasoning: str, choice: Any
) -> None:
    """Under `required` or a named function the engine writes JSON from the first token,
    even after a prompt that opened `<think>` or for Harmony's gpt-oss: the answer is the
    call, never content or reasoning."""
    model = _model(tool_call_parser="gpt_oss" if reasoning == "gpt_oss" else "qwen3",
                   reasoning=reasoning)  # fmt: skip
    plan = _plan(model, tools=[TOOL], tool_choice=choice)
    assert not plan.keeps_special
    output = plan.output(_opened_think_prompt())
    assert output is not None and output.reasoning is None and not output.combined
    answer = (
        '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'
        if choice == "required"
        else '{"city": "Paris"}'
    )
    parsed, ids = parse_whole(output, answer)
    assert (parsed.content, parsed.reasoning) == ("", "")
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", '{"city": "Paris"}')]
    assert len(ids) == 1


@pytest.mark.parametrize("reasoning", ["deepseek_v31", "qwen3", "gpt_oss"])
def test_a_json_schema_answer_is_content_even_after_an_opened_think(reasoning: str) -> None:
    """`response_format` json_schema constrains from the first token: the answer is all
    content (no reasoning parser, no Harmony parsing)."""
    model = _model(tool_call_parser=None, reasoning=reasoning)
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}
    plan = _plan(model, response_format=fmt)
    assert plan.json_schema is not None
    assert plan.output(_opened_think_prompt()) is None


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


def test_a_marker_the_tokenizer_flags_special_reaches_the_parser() -> None:
    """Mistral's `[TOOL_CALLS]` is a special token of its tokenizer. Under `auto` the answer
    is decoded with special tokens kept (as SGLang does for tool requests), the model's EOS
    still not shown, so the call parses; decoded as plain requests are, the marker is gone."""
    files = served_tokenizer_files()
    raw = Tokenizer.from_str(files["tokenizer.json"].decode())
    raw.add_special_tokens([AddedToken("[TOOL_CALLS]", special=True)])
    tokenizer = TextTokenizer.from_files({**files, "tokenizer.json": raw.to_str().encode()})
    model = SimpleNamespace(tokenizer=tokenizer, tool_call_parser="mistral", reasoning_parser=None)
    plan = _plan(model, tools=[TOOL])
    assert plan.keeps_special
    output = plan.output([1])
    assert output is not None
    marker = tokenizer.token_to_id("[TOOL_CALLS]")
    (eos,) = tokenizer.eos_token_ids
    call = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    ids = [marker, *tokenizer.encode_plain(call), eos]

    def decoded(skip_special_tokens: bool, silent: frozenset[int]) -> str:
        decoder = ChoiceDecoder(tokenizer, stop_set=StopSet([]), silent_ids=silent,
                                skip_special_tokens=skip_special_tokens)  # fmt: skip
        done = GenerateDone(
            token_ids=tuple(ids), prompt_tokens=3, completion_tokens=len(ids),
            finish_reason="stop", cached_tokens=0, matched_stop=eos,
        )  # fmt: skip
        return "".join(decoder.push(done).texts)

    kept = decoded(False, frozenset({eos}))
    assert kept == "[TOOL_CALLS]" + call
    parsed, _ = parse_whole(output, kept)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", '{"city": "Paris"}')]
    assert parsed.content == ""
    assert decoded(True, frozenset()) == call  # the marker would be lost


HARMONY_CALL = (
    "<|channel|>analysis<|message|>Need the weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city":"Tokyo"}'
)  # the final <|call|> is the EOS the engine stopped on, not shown
HARMONY_ANSWER = (
    "<|channel|>analysis<|message|>A simple question.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4."
)


def test_gpt_oss_answers_are_parsed_with_tools_and_without() -> None:
    """gpt-oss: one Harmony parser splits the analysis channel off as reasoning and reads
    calls, with `auto` tools and for a plain chat alike; only the former may hold calls
    (a plain answer's content is never null)."""
    model = _model(tool_call_parser="gpt_oss", reasoning="gpt_oss")
    with_tools = _plan(model, tools=[TOOL]).output([1])
    assert with_tools is not None and with_tools.parses_calls
    parsed, _ = parse_whole(with_tools, HARMONY_CALL)
    assert (parsed.reasoning, parsed.content) == ("Need the weather.", "")
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", '{"city":"Tokyo"}')]
    plain = _plan(model).output([1])
    assert plain is not None and not plain.parses_calls
    parsed, _ = parse_whole(plain, HARMONY_ANSWER)
    assert (parsed.reasoning, parsed.content, parsed.calls) == (
        "A simple question.",
        "2 + 2 = 4.",
        [],
    )
