"""gpt-oss Harmony answers at text level: reasoning, content, calls, invariance, malformed."""

from __future__ import annotations

import json

from unit.text.tools.invariance import TOOLS, assert_invariant, fuzz_texts

from homing.text.output import parse_chunks
from homing.text.tools.gpt_oss import GptOssParser


def factory() -> GptOssParser:
    return GptOssParser(TOOLS)


# Published shapes (OpenAI's Harmony response format guide); the prompt ends with
# `<|start|>assistant`, so the answer starts with `<|channel|>`.
ANSWER = (
    "<|channel|>analysis<|message|>User asks a simple question.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>"
)
CALL = (
    "<|channel|>analysis<|message|>Need to use function get_weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city":"Tokyo"}<|call|>'
)


def test_plain_answer_with_reasoning_splits_analysis_and_final() -> None:
    parsed = assert_invariant(factory, ANSWER)
    assert parsed.reasoning == "User asks a simple question."
    assert parsed.content == "2 + 2 = 4."
    assert parsed.calls == []


def test_text_without_harmony_tokens_is_content() -> None:
    text = "Just text, with <b>tags</b> and to=x."
    assert assert_invariant(factory, text).content == text


def test_a_commentary_preamble_before_a_call_is_content() -> None:
    text = (
        "<|channel|>commentary<|message|>Checking the weather now.<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city":"Oslo"}<|call|>'
    )
    parsed = assert_invariant(factory, text)
    assert parsed.content == "Checking the weather now."
    assert json.loads(parsed.calls[0].arguments) == {"city": "Oslo"}


def test_one_call_after_analysis() -> None:
    parsed = assert_invariant(factory, CALL)
    assert parsed.reasoning == "Need to use function get_weather."
    assert [c.name for c in parsed.calls] == ["get_weather"]
    assert parsed.calls[0].arguments == '{"city":"Tokyo"}'


def test_a_recipient_in_the_role_part_is_a_call() -> None:
    text = ' to=functions.get_time<|channel|>commentary json<|message|>{"tz":"UTC"}<|call|>'
    parsed = assert_invariant(factory, text)
    assert parsed.calls[0].name == "get_time"
    assert parsed.calls[0].arguments == '{"tz":"UTC"}'


def test_several_calls_in_one_feed_chunk_are_all_parsed() -> None:
    text = (
        CALL + "<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json"
        '<|message|>{"tz":"JST"}<|call|>'
        "<|start|>assistant<|channel|>commentary to=functions.web.search-v2 <|constrain|>json"
        '<|message|>{"q":"x"}<|call|>'
    )
    parsed = parse_chunks(factory(), [text])
    assert [c.name for c in parsed.calls] == ["get_weather", "get_time", "web.search-v2"]
    assert assert_invariant(factory, text) == parsed


def test_arguments_split_mid_escape_and_mid_unicode_are_verbatim() -> None:
    args = '{"city":"Z\\u00fcrich \\"q\\" \\\\ 東京 😀👍🏽"}'
    text = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    parsed = assert_invariant(factory, text + args + "<|call|>")
    assert parsed.calls[0].arguments == args
    assert json.loads(parsed.calls[0].arguments) == {"city": 'Zürich "q" \\ 東京 😀👍🏽'}


def test_a_call_cut_at_length_gives_partial_arguments() -> None:
    parsed = assert_invariant(factory, CALL[: CALL.index("Tokyo") + 2])
    assert parsed.calls[0].arguments == '{"city":"To'


def test_a_text_cut_in_the_analysis_is_reasoning() -> None:
    parsed = assert_invariant(factory, "<|channel|>analysis<|message|>Let me thi")
    assert parsed.reasoning == "Let me thi"


def test_an_undeclared_function_is_content_verbatim() -> None:
    text = (
        '<|channel|>commentary to=functions.rm_rf <|constrain|>json<|message|>{"path":"/"}<|call|>'
    )
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_a_builtin_tool_recipient_is_content_verbatim() -> None:
    text = '<|channel|>analysis to=browser.search code<|message|>{"query":"x"}<|call|>'
    assert assert_invariant(factory, text).content == text


def test_a_header_longer_than_the_limit_is_content_verbatim() -> None:
    text = "<|channel|>commentary to=functions." + "x" * 400 + "<|message|>{}"
    parsed = assert_invariant(factory, text)
    assert parsed.content == text


def test_fuzzed_texts_of_the_format_markers_never_raise_and_stay_invariant() -> None:
    fragments = [
        "<|start|>assistant",
        "<|channel|>",
        "analysis",
        "final",
        "commentary",
        " to=functions.get_weather ",
        " to=functions.nope",
        "<|constrain|>json",
        "<|message|>",
        "<|end|>",
        "<|call|>",
        "<|return|>",
        '{"city":"Pa',
        "😀",
        "<|",
        " text ",
    ]
    for text in fuzz_texts(fragments, seed=5, count=150):
        assert_invariant(factory, text, rounds=6)
