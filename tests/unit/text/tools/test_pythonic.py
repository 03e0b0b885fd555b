"""Pythonic tool calls (Llama 3.2 / Llama 4): content, calls, literals, invariance, malformed."""

from __future__ import annotations

import json

from unit.text.tools.invariance import TOOLS, assert_invariant, fuzz_texts

from homing.text.output import parse_chunks
from homing.text.tools.pythonic import PythonicParser, structural_tag


def factory() -> PythonicParser:
    return PythonicParser(TOOLS)


# Published shape (Llama 3.2 model card, pythonic tool calling).
TWO_CALLS = '[get_weather(city="San Francisco", unit="f"), get_time(tz="America/Los_Angeles")]'


def test_plain_answer_is_content() -> None:
    text = "Arrays look like [1, 2, 3]; see [the docs](https://example.com) (page 2)."
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_text_before_a_call_list_stays_content() -> None:
    parsed = assert_invariant(factory, 'Let me look. [get_weather(city="Paris")]')
    assert parsed.content == "Let me look. "
    assert json.loads(parsed.calls[0].arguments) == {"city": "Paris"}


def test_several_calls_in_one_feed_chunk_are_all_parsed() -> None:
    parsed = parse_chunks(factory(), [TWO_CALLS])
    assert [c.name for c in parsed.calls] == ["get_weather", "get_time"]
    assert [json.loads(c.arguments) for c in parsed.calls] == [
        {"city": "San Francisco", "unit": "f"},
        {"tz": "America/Los_Angeles"},
    ]
    assert parsed.content == ""
    assert assert_invariant(factory, TWO_CALLS) == parsed


def test_llama4_python_tokens_are_dropped() -> None:
    parsed = assert_invariant(factory, '<|python_start|>[get_time(tz="UTC")]<|python_end|>')
    assert parsed.content == ""
    assert json.loads(parsed.calls[0].arguments) == {"tz": "UTC"}


def test_python_literal_values_become_json() -> None:
    text = (
        "[web.search-v2(q='a \"b\"', n=3, x=1.5, ok=True, none=None, tags=('a', 'b'),"
        " m={'k': [1, {2: 3}]})]"
    )
    parsed = assert_invariant(factory, text)
    assert json.loads(parsed.calls[0].arguments) == {
        "q": 'a "b"',
        "n": 3,
        "x": 1.5,
        "ok": True,
        "none": None,
        "tags": ["a", "b"],
        "m": {"k": [1, {"2": 3}]},
    }


def test_arguments_split_mid_escape_and_mid_unicode_merge_to_the_same_json() -> None:
    text = '[get_weather(city="Z\\u00fcrich \\"q\\" \\\\ 東京 😀👍🏽", unit="c")]'
    parsed = assert_invariant(factory, text)
    assert json.loads(parsed.calls[0].arguments) == {
        "city": 'Zürich "q" \\ 東京 😀👍🏽',
        "unit": "c",
    }


def test_a_call_without_arguments_has_empty_object_arguments() -> None:
    assert assert_invariant(factory, "[get_time()]").calls[0].arguments == "{}"


def test_non_literal_and_positional_arguments_stay_a_json_object() -> None:
    parsed = assert_invariant(factory, "[get_weather(paris, city=PARIS, unit={1, 2})]")
    assert json.loads(parsed.calls[0].arguments) == {
        "0": "paris",
        "city": "PARIS",
        "unit": "{1, 2}",
    }


def test_a_call_cut_at_length_gives_partial_arguments() -> None:
    parsed = assert_invariant(factory, '[get_weather(city="Paris", unit="')
    assert parsed.calls[0].arguments == '{"city": "Paris", "unit": "'


def test_text_after_the_list_is_content() -> None:
    parsed = assert_invariant(factory, '[get_time(tz="UTC")] Done.')
    assert parsed.content == " Done."


def test_an_undeclared_name_is_content_verbatim() -> None:
    text = '[delete_all(force=True), get_time(tz="UTC")]'
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_a_text_cut_inside_the_name_is_content_verbatim() -> None:
    parsed = assert_invariant(factory, "[get_wea")
    assert parsed.content == "[get_wea"


def test_fuzzed_texts_of_the_format_markers_never_raise_and_stay_invariant() -> None:
    fragments = [
        "[",
        "]",
        "get_weather(",
        "get_time(",
        "nope(",
        "city=",
        "'Paris'",
        '"Pa\\"',
        "(",
        ")",
        ", ",
        "{",
        "}",
        "<|python_start|>",
        "<|python_end|>",
        "😀",
        " x ",
        "=",
    ]
    for text in fuzz_texts(fragments, seed=11, count=150):
        assert_invariant(factory, text, rounds=6)


def test_structural_tag_is_none() -> None:
    assert structural_tag(TOOLS) is None
