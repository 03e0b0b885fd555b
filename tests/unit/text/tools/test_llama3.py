"""Llama3JsonParser: `{"name": ..., "parameters": {...}}` at the start or after
`<|python_tag|>`, calls separated by `;`."""

from __future__ import annotations

import json
from functools import partial

from homing.text.output import CallStart, merge
from homing.text.tools.llama3 import PYTHON_TAG, Llama3JsonParser, structural_tag
from tests.unit.text.tools.cases import TIME_ARGS, TRICKY_ARGS, calls, fuzz
from tests.unit.text.tools.invariance import TOOLS, WEATHER, assert_invariant

factory = partial(Llama3JsonParser, TOOLS)


def obj(name: str, args: str) -> str:
    """One call object as Llama 3.1 / 3.2 / 3.3 write it."""
    return f'{{"name": {json.dumps(name)}, "parameters": {args}}}'


WEATHER_CALL = obj("get_weather", TRICKY_ARGS)
TIME_CALL = obj("get_time", TIME_ARGS)


def test_plain_answer_is_content() -> None:
    text = 'Here is JSON: {"name": "get_time", "parameters": {}} as an example.'
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_a_json_answer_that_is_no_call_is_content() -> None:
    for text in ('{"answer": 42}', '{"name": "Bob", "parameters": {}}', "{not json"):
        parsed = assert_invariant(factory, text)
        assert parsed.content == text
        assert parsed.calls == []


def test_text_before_a_tagged_call_stays_content() -> None:
    parsed = assert_invariant(factory, "Let me look.\n" + PYTHON_TAG + WEATHER_CALL)
    assert parsed.content == "Let me look.\n"
    assert parsed.calls == calls(("get_weather", TRICKY_ARGS))


def test_one_call_at_the_start_gives_name_and_verbatim_arguments() -> None:
    parsed = assert_invariant(factory, "\n " + WEATHER_CALL)
    assert parsed.content == ""
    assert parsed.calls == calls(("get_weather", TRICKY_ARGS))


def test_type_function_key_before_the_name_is_skipped() -> None:
    text = '{"type": "function", "name": "get_time", "parameters": ' + TIME_ARGS + "}"
    parsed = assert_invariant(factory, text)
    assert parsed.calls == calls(("get_time", TIME_ARGS))


def test_parallel_calls_separated_by_semicolons_are_parsed_in_order() -> None:
    text = PYTHON_TAG + WEATHER_CALL + "; " + TIME_CALL + ";" + obj("web.search-v2", "{}")
    parsed = assert_invariant(factory, text)
    assert parsed.content == ""
    assert parsed.calls == calls(
        ("get_weather", TRICKY_ARGS), ("get_time", TIME_ARGS), ("web.search-v2", "{}")
    )


def test_two_calls_in_one_chunk_both_parsed() -> None:
    events = Llama3JsonParser(TOOLS).feed(WEATHER_CALL + "; " + TIME_CALL)
    assert [e for e in events if isinstance(e, CallStart)] == [
        CallStart(0, "get_weather"),
        CallStart(1, "get_time"),
    ]
    assert merge(events).calls == calls(("get_weather", TRICKY_ARGS), ("get_time", TIME_ARGS))


def test_text_after_a_call_is_content() -> None:
    parsed = assert_invariant(factory, TIME_CALL + " Done.")
    assert parsed.calls == calls(("get_time", TIME_ARGS))
    assert parsed.content.strip() == "Done."


def test_arguments_cut_mid_escape_and_mid_unicode_are_invariant() -> None:
    for args in ('{"q": "a\\"b"}', '{"q": "\\u00e9\\ud83d\\ude00"}', '{"q": "é😀\\\\"}'):
        parsed = assert_invariant(factory, PYTHON_TAG + obj("get_weather", args))
        assert parsed.calls == calls(("get_weather", args))


def test_call_cut_at_length_leaves_partial_arguments() -> None:
    parsed = assert_invariant(factory, WEATHER_CALL[: WEATHER_CALL.index("😀") + 1])
    assert parsed.content == ""
    assert parsed.calls == calls(("get_weather", TRICKY_ARGS[: TRICKY_ARGS.index("😀") + 1]))


def test_cut_inside_the_header_gives_the_text_back() -> None:
    text = PYTHON_TAG + '{"name": "get_ti'
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_undeclared_function_is_content_verbatim() -> None:
    text = PYTHON_TAG + obj("delete_all", "{}")
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_builtin_tool_code_after_the_tag_is_content() -> None:
    text = PYTHON_TAG + 'brave_search.call(query="weather")'
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_the_tag_ends_broken_arguments() -> None:
    text = obj("get_time", '{"tz": "UT')[:-1] + PYTHON_TAG + WEATHER_CALL
    parsed = assert_invariant(factory, text)
    assert parsed.calls == calls(("get_time", '{"tz": "UT'), ("get_weather", TRICKY_ARGS))


def test_fuzzed_texts_never_raise_and_stay_invariant() -> None:
    markers = (PYTHON_TAG, "<|python", ";", '{"name": ', WEATHER_CALL, TIME_CALL, "; ")
    assert fuzz(factory, markers, seed=5) > 0


def test_structural_tag_has_sglang_shape() -> None:
    tag = structural_tag(TOOLS)
    assert tag is not None
    assert tag["type"] == "structural_tag"
    assert tag["triggers"] == [PYTHON_TAG]
    assert tag["structures"][0] == {
        "begin": PYTHON_TAG + '{"name": "get_weather", "parameters": ',
        "schema": WEATHER.parameters,
        "end": "}",
    }
    assert tag["structures"][2]["schema"] == {"type": "object"}
    assert structural_tag(()) is None


def test_structural_tag_output_parses_to_the_call() -> None:
    tag = structural_tag(TOOLS)
    assert tag is not None
    for tool, s in zip(TOOLS, tag["structures"], strict=True):
        parsed = assert_invariant(factory, "Sure. " + s["begin"] + TIME_ARGS + s["end"], rounds=5)
        assert parsed.content == "Sure. "
        assert parsed.calls == calls((tool.name, TIME_ARGS))
