"""HermesParser: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen)."""

from __future__ import annotations

import json
from functools import partial

from homing.text.output import CallStart, ContentDelta, merge, parse_chunks
from homing.text.tools.hermes import CLOSE, OPEN, HermesParser, structural_tag
from tests.unit.text.tools.cases import TIME_ARGS, TRICKY_ARGS, assert_json_calls, calls, fuzz
from tests.unit.text.tools.invariance import TOOLS, WEATHER, assert_invariant, feeds

factory = partial(HermesParser, TOOLS)


def call(name: str, args: str) -> str:
    """One call as Qwen 2.5 / Qwen 3 write it."""
    return f'{OPEN}\n{{"name": {json.dumps(name)}, "arguments": {args}}}\n{CLOSE}'


WEATHER_CALL = call("get_weather", TRICKY_ARGS)
TIME_CALL = call("get_time", TIME_ARGS)


def test_plain_answer_is_content() -> None:
    parsed = assert_invariant(factory, "The weather is <b>fine</b> < 3 > 2.")
    assert parsed.content == "The weather is <b>fine</b> < 3 > 2."
    assert parsed.calls == []


def test_text_before_a_call_stays_content() -> None:
    parsed = assert_invariant(factory, "Let me check.\n" + WEATHER_CALL)
    assert parsed.content == "Let me check.\n"
    assert parsed.calls == calls(("get_weather", TRICKY_ARGS))
    assert_json_calls(parsed)


def test_one_call_gives_name_and_verbatim_arguments() -> None:
    parsed = assert_invariant(factory, WEATHER_CALL)
    assert parsed.content == ""
    assert parsed.calls == calls(("get_weather", TRICKY_ARGS))


def test_parallel_calls_are_parsed_in_order() -> None:
    parsed = assert_invariant(factory, WEATHER_CALL + "\n" + TIME_CALL + "\n")
    assert parsed.content == ""
    assert parsed.calls == calls(("get_weather", TRICKY_ARGS), ("get_time", TIME_ARGS))


def test_two_calls_in_one_chunk_both_parsed() -> None:
    events = HermesParser(TOOLS).feed(WEATHER_CALL + "\n" + TIME_CALL)
    assert [e for e in events if isinstance(e, CallStart)] == [
        CallStart(0, "get_weather"),
        CallStart(1, "get_time"),
    ]
    assert merge(events).calls == calls(("get_weather", TRICKY_ARGS), ("get_time", TIME_ARGS))


def test_text_between_and_after_calls_is_content_verbatim() -> None:
    text = "a" + WEATHER_CALL + " and " + TIME_CALL + " done"
    parsed = assert_invariant(factory, text)
    assert parsed.content == "a and  done"
    assert [c.name for c in parsed.calls] == ["get_weather", "get_time"]


def test_streamed_arguments_come_before_the_call_ends() -> None:
    events = feeds(factory, list(WEATHER_CALL))
    args_feeds = [
        i for i, ev in enumerate(events) if any(not isinstance(e, ContentDelta) for e in ev)
    ]
    assert args_feeds[0] < len(WEATHER_CALL) - len(CLOSE)


def test_arguments_cut_mid_escape_and_mid_unicode_are_invariant() -> None:
    for args in ('{"q": "a\\"b"}', '{"q": "\\u00e9\\ud83d\\ude00"}', '{"q": "é😀\\\\"}'):
        parsed = assert_invariant(factory, call("get_weather", args))
        assert parsed.calls == calls(("get_weather", args))


def test_call_cut_at_length_leaves_partial_arguments() -> None:
    cut = WEATHER_CALL.index("é 😀") + 2
    parsed = assert_invariant(factory, WEATHER_CALL[:cut])
    assert parsed.content == ""
    assert parsed.calls == calls(("get_weather", TRICKY_ARGS[: cut - WEATHER_CALL.index('{"city')]))


def test_cut_inside_the_header_gives_the_text_back() -> None:
    text = OPEN + '\n{"name": "get_wea'
    parsed = assert_invariant(factory, text)
    assert parsed == parse_chunks(factory(), [text])
    assert parsed.content == text
    assert parsed.calls == []


def test_a_call_without_an_arguments_key_is_a_call_of_no_arguments() -> None:
    """`{"name": "get_time"}` (a model's call of a function without parameters) is that
    call with `{}`, as a JSON parser of the whole object reads it; the next call follows."""
    text = f'{OPEN}\n{{"name": "get_time"}}\n{CLOSE}\n' + WEATHER_CALL
    parsed = assert_invariant(factory, text)
    assert parsed.content == ""
    assert parsed.calls == calls(("get_time", "{}"), ("get_weather", TRICKY_ARGS))


def test_undeclared_function_is_content_verbatim() -> None:
    text = "x" + call("delete_all", "{}") + "y"
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_garbage_after_the_open_tag_is_content() -> None:
    text = OPEN + "I changed my mind." + CLOSE
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_broken_arguments_run_to_the_close_tag() -> None:
    text = OPEN + '{"name": "get_time", "arguments": {"tz": "UT' + CLOSE + "after"
    parsed = assert_invariant(factory, text)
    assert parsed.calls == calls(("get_time", '{"tz": "UT'))
    assert parsed.content == "after"


def test_fuzzed_texts_never_raise_and_stay_invariant() -> None:
    markers = (OPEN, CLOSE, "<tool", "</tool_", WEATHER_CALL, TIME_CALL, '{"name": "get_time", ')
    assert fuzz(factory, markers, seed=1) > 0


def test_structural_tag_has_sglang_shape() -> None:
    tag = structural_tag(TOOLS)
    assert tag is not None
    assert tag["type"] == "structural_tag"
    assert tag["triggers"] == [OPEN]
    assert [set(s) for s in tag["structures"]] == [{"begin", "schema", "end"}] * len(TOOLS)
    assert tag["structures"][0]["schema"] == WEATHER.parameters
    assert tag["structures"][2]["schema"] == {"type": "object"}
    assert all(s["begin"].startswith(OPEN) for s in tag["structures"])
    assert structural_tag(()) is None


def test_structural_tag_output_parses_to_the_call() -> None:
    tag = structural_tag(TOOLS)
    assert tag is not None
    for tool, s in zip(TOOLS, tag["structures"], strict=True):
        parsed = assert_invariant(factory, s["begin"] + TIME_ARGS + s["end"], rounds=5)
        assert parsed.content == ""
        assert parsed.calls == calls((tool.name, TIME_ARGS))


def test_close_tag_after_a_backslash_still_ends_the_call() -> None:
    text = OPEN + '{"name": "get_time", "arguments": {"tz": "a\\' + CLOSE + "after"
    parsed = assert_invariant(factory, text)
    assert parsed.calls == calls(("get_time", '{"tz": "a\\'))
    assert parsed.content == "after"


def test_a_header_over_the_name_limit_is_content() -> None:
    text = OPEN + '{"name": "' + "x" * 400 + '", "arguments": {}}' + CLOSE
    parsed = assert_invariant(factory, text, rounds=3)
    assert parsed.content == text
    assert parsed.calls == []
