"""Reading chat prompts of the served template (`homing.sim.chat.read_prompt`): plain prompts
ask for nothing, and thinking, declared tools and tool results are read back exactly."""

from __future__ import annotations

from typing import Any

from homing.sim.chat import (
    TOOL_RESULT_QUOTE_CHARS,
    ChatTokens,
    PromptFacts,
    Tool,
    argument_words,
    object_schema,
    parse_tools,
    quote_tool_output,
    read_prompt,
)
from homing.text.served import load_served_tokenizer

TOKENIZER = load_served_tokenizer()
TOKENS = ChatTokens.from_tokenizer(TOKENIZER, TOKENIZER.bos_token_id)
WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "now", "parameters": {}}},
]


def decode(ids: Any) -> str:
    return TOKENIZER.decode(ids, skip_special_tokens=False)


def facts(messages: list[dict[str, Any]], **variables: Any) -> PromptFacts | None:
    assert TOKENS is not None
    ids = TOKENIZER.encode_chat(messages, variables=variables)
    return read_prompt(ids, TOKENS, decode)


def test_the_served_tokenizer_has_every_chat_token() -> None:
    assert TOKENS is not None
    assert TOKENIZER.decode([TOKENS.think_end], skip_special_tokens=False) == "</think>"


def test_a_plain_chat_prompt_and_raw_text_ask_for_nothing() -> None:
    assert facts([{"role": "user", "content": "Hello there"}]) is None
    assert TOKENS is not None
    assert read_prompt(TOKENIZER.encode("just some text"), TOKENS, decode) is None
    assert read_prompt([], TOKENS, decode) is None


def test_a_prompt_ending_with_think_asks_for_reasoning() -> None:
    got = facts([{"role": "user", "content": "Why is the sky blue?"}], thinking=True)
    assert got == PromptFacts(thinking=True)


def test_declared_tools_and_the_user_message_are_read_when_the_user_spoke_last() -> None:
    got = facts([{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS)
    assert got is not None
    assert got.tools == (Tool("get_weather", WEATHER), Tool("now", {}))
    assert got.user_text == "Weather in Paris?"
    assert got.tool_output is None and not got.thinking


def test_tools_with_thinking_keep_both() -> None:
    got = facts([{"role": "user", "content": "Weather?"}], tools=TOOLS, thinking=True)
    assert (
        got is not None
        and got.thinking
        and [t.name for t in got.tools]
        == [
            "get_weather",
            "now",
        ]
    )


def test_a_prompt_ending_after_a_tool_result_carries_that_result() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}],
        },
        {"role": "tool", "content": '{"temp_c": 21}'},
    ]
    got = facts(messages, tools=TOOLS)
    assert got == PromptFacts(tool_output='{"temp_c": 21}')


def test_tools_are_not_offered_when_the_assistant_spoke_last() -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
    ]
    assert TOKENS is not None
    ids = TOKENIZER.encode_chat(messages, add_generation_prompt=False, variables={"tools": TOOLS})
    assert read_prompt(ids, TOKENS, decode) is None


def test_parse_tools_keeps_an_empty_schema_for_parameters_that_are_not_json() -> None:
    text = "## Tools\nYou can call these functions:\n\n### f\nParameters: {oops\n"
    assert parse_tools(text) == (Tool("f", {}),)
    assert parse_tools("no tools here") == ()


def test_argument_words_prefer_names_then_other_content_words() -> None:
    assert argument_words("What is the weather in Paris and Lyon?") == ["Paris", "Lyon"]
    assert argument_words("what is the weather in paris") == ["weather", "paris"]


def test_object_schema_makes_a_type_less_schema_an_object() -> None:
    assert object_schema({}) == {"type": "object"}
    assert object_schema(WEATHER) is WEATHER


def test_a_quoted_tool_result_is_collapsed_and_cut() -> None:
    assert quote_tool_output(" a \n b ") == "The tool returned: a b"
    assert quote_tool_output("") == "The tool returned nothing."
    long = quote_tool_output("x" * 500)
    assert long.endswith("…") and len(long) == len("The tool returned: ") + TOOL_RESULT_QUOTE_CHARS
