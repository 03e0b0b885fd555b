"""Qwen3-Coder XML tool calls: content, calls, typed arguments, chunk invariance, malformed."""

from __future__ import annotations

import json

from unit.text.tools.invariance import TOOLS, ToolSpec, assert_invariant, fuzz_texts

from homing.text.output import parse_chunks
from homing.text.tools.qwen3_coder import Qwen3CoderParser, structural_tag

TYPED = ToolSpec(
    "set_alarm",
    {
        "type": "object",
        "properties": {
            "hour": {"type": "integer"},
            "ratio": {"type": "number"},
            "loud": {"type": "boolean"},
            "days": {"type": "array"},
            "meta": {"type": "object"},
            "label": {"type": ["string", "null"]},
        },
    },
)
ALL = (*TOOLS, TYPED)


def factory() -> Qwen3CoderParser:
    return Qwen3CoderParser(ALL)


def call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


# Published shape (Qwen3-Coder chat template / model card example).
WEATHER_CALL = call("get_weather", city="Paris", unit="c")


def test_plain_answer_is_content() -> None:
    text = "The capital of France is Paris. 1 < 2 and <b>bold</b>."
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_text_before_a_call_stays_content_and_the_call_is_parsed() -> None:
    parsed = assert_invariant(factory, "I'll check the weather.\n" + WEATHER_CALL)
    assert parsed.content == "I'll check the weather.\n"
    assert [c.name for c in parsed.calls] == ["get_weather"]
    assert json.loads(parsed.calls[0].arguments) == {"city": "Paris", "unit": "c"}


def test_several_calls_in_one_feed_chunk_are_all_parsed() -> None:
    text = WEATHER_CALL + "\n" + call("get_time", tz="UTC") + "\n" + call("get_time", tz="CET")
    parsed = parse_chunks(factory(), [text])
    assert [c.name for c in parsed.calls] == ["get_weather", "get_time", "get_time"]
    assert [json.loads(c.arguments) for c in parsed.calls] == [
        {"city": "Paris", "unit": "c"},
        {"tz": "UTC"},
        {"tz": "CET"},
    ]
    assert parsed.content == ""
    assert assert_invariant(factory, text) == parsed


def test_values_are_converted_by_the_declared_schema_type() -> None:
    text = call(
        "set_alarm",
        hour="7",
        ratio="0.5",
        loud="True",
        days='["mon", "tue"]',
        meta="{'a': 1}",
        label="null",
    )
    parsed = assert_invariant(factory, text)
    assert json.loads(parsed.calls[0].arguments) == {
        "hour": 7,
        "ratio": 0.5,
        "loud": True,
        "days": ["mon", "tue"],
        "meta": {"a": 1},
        "label": None,
    }


def test_a_value_that_does_not_parse_as_its_type_falls_back_to_the_string() -> None:
    parsed = assert_invariant(factory, call("set_alarm", hour="seven", loud="maybe"))
    assert json.loads(parsed.calls[0].arguments) == {"hour": "seven", "loud": "maybe"}


def test_a_number_strict_json_lacks_stays_the_model_text() -> None:
    """NaN, infinities and a number past a double's range would make the arguments invalid
    JSON: such a value is kept as the text the model wrote."""
    text = call("set_alarm", hour="NaN", ratio="1e400", days="[1, Infinity]")
    parsed = assert_invariant(factory, text)
    arguments = json.loads(parsed.calls[0].arguments, parse_constant=_refuse)
    assert arguments == {"hour": "NaN", "ratio": "1e400", "days": "[1, Infinity]"}


def _refuse(constant: str) -> None:
    raise ValueError(f"not JSON: {constant}")


def test_a_multiline_string_value_keeps_its_inner_line_breaks() -> None:
    code = 'def f():\n    return "<x>"\n\n'
    parsed = assert_invariant(factory, call("web.search-v2", query=code))
    assert json.loads(parsed.calls[0].arguments) == {"query": code}


def test_arguments_split_mid_escape_and_mid_unicode_merge_to_the_same_json() -> None:
    value = 'Zürich "quoted" \\ back\\slash 東京 😀👍🏽 \\u00e9'
    parsed = assert_invariant(factory, call("get_weather", city=value))
    assert json.loads(parsed.calls[0].arguments) == {"city": value}


def test_a_call_without_parameters_has_empty_object_arguments() -> None:
    parsed = assert_invariant(
        factory, "<tool_call>\n<function=get_time>\n</function>\n</tool_call>"
    )
    assert parsed.calls[0].arguments == "{}"


def test_a_bare_function_tag_without_tool_call_is_a_call() -> None:
    text = "<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>"
    parsed = assert_invariant(factory, text)
    assert json.loads(parsed.calls[0].arguments) == {"tz": "UTC"}


def test_a_missing_parameter_end_ends_the_value_at_the_next_tag() -> None:
    text = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "<parameter=unit>\nc\n</function>\n</tool_call>"
    )
    parsed = assert_invariant(factory, text)
    assert json.loads(parsed.calls[0].arguments) == {"city": "Paris", "unit": "c"}


def test_a_call_cut_at_length_gives_partial_arguments() -> None:
    parsed = assert_invariant(factory, WEATHER_CALL[: WEATHER_CALL.index("Paris") + 3])
    assert parsed.calls[0].name == "get_weather"
    assert parsed.calls[0].arguments == '{"city": "Par'
    parsed = assert_invariant(factory, "<tool_call>\n<function=set_alarm>\n<parameter=hour>\n1")
    assert parsed.calls[0].arguments == '{"hour": 1'


def test_a_text_cut_inside_the_header_is_content_verbatim() -> None:
    text = "Hi <tool_call>\n<function=get_wea"
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_an_undeclared_function_is_content_verbatim() -> None:
    text = (
        "<tool_call>\n<function=rm_rf>\n<parameter=path>\n/\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    parsed = assert_invariant(factory, text)
    assert parsed.content == text
    assert parsed.calls == []


def test_a_name_region_longer_than_the_limit_is_content_verbatim() -> None:
    text = "<function=" + "x" * 400 + ">"
    parsed = assert_invariant(factory, text)
    assert parsed.content == text


def test_fuzzed_texts_of_the_format_markers_never_raise_and_stay_invariant() -> None:
    fragments = [
        "<tool_call>",
        "</tool_call>",
        "<function=get_weather>",
        "<function=get_time>",
        "<function=nope>",
        "<function=",
        "<parameter=city>",
        "<parameter=tz>",
        "</parameter>",
        "</function>",
        "\n",
        "Paris",
        "<",
        ">",
        '"\\',
        "😀",
        " text ",
    ]
    for text in fuzz_texts(fragments, seed=7, count=150):
        assert_invariant(factory, text, rounds=6)


def test_structural_tag_is_none() -> None:
    """The format's XML parameters have no legacy structural tag: strict is refused."""
    assert structural_tag(ALL) is None
