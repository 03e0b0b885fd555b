"""JsonArrayParser (output under `required_schema`) and NamedFunctionParser (output under
`named_schema`), and the schemas themselves."""

from __future__ import annotations

import json
from functools import partial

import pytest

from homing.text.output import CallStart, merge
from homing.text.tools.base import ToolSpec
from homing.text.tools.json_array import (
    JsonArrayParser,
    NamedFunctionParser,
    named_schema,
    required_schema,
)
from tests.unit.text.tools.cases import TIME_ARGS, TRICKY_ARGS, calls, fuzz
from tests.unit.text.tools.invariance import TIME, TOOLS, WEATHER, assert_invariant

array_factory = partial(JsonArrayParser, TOOLS)
named_factory = partial(NamedFunctionParser, TOOLS, "get_weather")


def element(name: str, args: str) -> str:
    """One array element, as a constrained engine writes it."""
    return f'{{"name": {json.dumps(name)}, "parameters": {args}}}'


WEATHER_EL = element("get_weather", TRICKY_ARGS)
TIME_EL = element("get_time", TIME_ARGS)


# JsonArrayParser


def test_array_of_one_call_is_parsed() -> None:
    parsed = assert_invariant(array_factory, "[" + WEATHER_EL + "]")
    assert parsed.content == ""
    assert parsed.calls == calls(("get_weather", TRICKY_ARGS))


def test_array_of_parallel_calls_with_whitespace_is_parsed_in_order() -> None:
    text = (
        "\n[\n  "
        + WEATHER_EL
        + " ,\n  "
        + TIME_EL
        + ",\n"
        + element("web.search-v2", "{}")
        + "\n]\n"
    )
    parsed = assert_invariant(array_factory, text)
    assert parsed.content == ""
    assert parsed.calls == calls(
        ("get_weather", TRICKY_ARGS), ("get_time", TIME_ARGS), ("web.search-v2", "{}")
    )


def test_two_calls_in_one_chunk_both_parsed() -> None:
    events = JsonArrayParser(TOOLS).feed("[" + WEATHER_EL + ", " + TIME_EL + "]")
    assert [e for e in events if isinstance(e, CallStart)] == [
        CallStart(0, "get_weather"),
        CallStart(1, "get_time"),
    ]
    assert merge(events).calls == calls(("get_weather", TRICKY_ARGS), ("get_time", TIME_ARGS))


def test_a_bare_object_is_one_call() -> None:
    parsed = assert_invariant(array_factory, TIME_EL + "\n")
    assert parsed.content == ""
    assert parsed.calls == calls(("get_time", TIME_ARGS))


def test_arguments_key_is_accepted_too() -> None:
    text = '[{"name": "get_time", "arguments": ' + TIME_ARGS + "}]"
    assert assert_invariant(array_factory, text).calls == calls(("get_time", TIME_ARGS))


def test_array_plain_text_is_content() -> None:
    parsed = assert_invariant(array_factory, "I cannot call tools.")
    assert parsed.content == "I cannot call tools."
    assert parsed.calls == []


def test_array_arguments_cut_mid_escape_and_mid_unicode_are_invariant() -> None:
    for args in ('{"q": "a\\"b"}', '{"q": "\\u00e9\\ud83d\\ude00"}', '{"q": "é😀\\\\"}'):
        parsed = assert_invariant(array_factory, "[" + element("get_weather", args) + "]")
        assert parsed.calls == calls(("get_weather", args))


def test_array_cut_at_length_leaves_partial_arguments() -> None:
    text = "[" + WEATHER_EL + "]"
    parsed = assert_invariant(array_factory, text[: text.index("😀") + 1])
    assert parsed.content == ""
    assert parsed.calls == calls(("get_weather", TRICKY_ARGS[: TRICKY_ARGS.index("😀") + 1]))


@pytest.mark.parametrize("cut", ['"get_weather"', '"get_weather", ', '"get_weather", "param'])
def test_array_cut_after_the_name_is_a_call_without_arguments(cut: str) -> None:
    """A call cut at length after its declared name and before its arguments' `{` is that
    call with empty arguments, as the model formats' parsers give it, not the raw JSON."""
    text = '[{"name": ' + cut
    parsed = assert_invariant(array_factory, text)
    assert parsed.content == ""
    assert parsed.calls == calls(("get_weather", ""))


@pytest.mark.parametrize("cut", ["[", " [ ", "[{", '[{"name": "get_wea', "[" + TIME_EL + ", "])
def test_array_cut_before_a_name_drops_the_frame(cut: str) -> None:
    """Cut before a call's name is whole, the constraint's JSON is no content."""
    parsed = assert_invariant(array_factory, cut)
    assert parsed.content == ""
    assert parsed.calls == (calls(("get_time", TIME_ARGS)) if "get_time" in cut else [])


def test_array_undeclared_function_is_content_from_there_on() -> None:
    text = "[" + TIME_EL + ", " + element("delete_all", "{}") + "]"
    parsed = assert_invariant(array_factory, text)
    assert parsed.calls == calls(("get_time", TIME_ARGS))
    assert parsed.content == " " + element("delete_all", "{}") + "]"


def test_array_garbage_where_a_comma_belongs_is_content() -> None:
    text = "[" + TIME_EL + " oops]"
    parsed = assert_invariant(array_factory, text)
    assert parsed.calls == calls(("get_time", TIME_ARGS))
    assert parsed.content == " oops]"


def test_array_fuzzed_texts_never_raise_and_stay_invariant() -> None:
    assert fuzz(array_factory, ("[", "]", ", ", WEATHER_EL, TIME_EL, '{"name": '), seed=6) > 0


# NamedFunctionParser


def test_named_output_is_the_call_arguments() -> None:
    parsed = assert_invariant(named_factory, "\n " + TRICKY_ARGS + "\n")
    assert parsed.content == ""
    assert parsed.calls == calls(("get_weather", TRICKY_ARGS))


def test_named_output_in_one_chunk_starts_the_call_at_once() -> None:
    events = NamedFunctionParser(TOOLS, "get_weather").feed(TRICKY_ARGS)
    assert events[0] == CallStart(0, "get_weather")
    assert merge(events).calls == calls(("get_weather", TRICKY_ARGS))


def test_named_arguments_cut_mid_escape_and_mid_unicode_are_invariant() -> None:
    for args in ('{"q": "a\\"b"}', '{"q": "\\u00e9\\ud83d\\ude00"}', '{"q": "é😀\\\\"}'):
        assert assert_invariant(named_factory, args).calls == calls(("get_weather", args))


def test_named_cut_at_length_leaves_partial_arguments() -> None:
    cut = TRICKY_ARGS[: TRICKY_ARGS.index("😀") + 1]
    parsed = assert_invariant(named_factory, cut)
    assert parsed.calls == calls(("get_weather", cut))


def test_named_text_that_is_not_an_object_is_content() -> None:
    for text in ("no", "  [1]", '"x"'):
        parsed = assert_invariant(named_factory, text)
        assert parsed.content == text
        assert parsed.calls == []


def test_named_text_after_the_object_is_content() -> None:
    parsed = assert_invariant(named_factory, TIME_ARGS + " trailing")
    assert parsed.calls == calls(("get_weather", TIME_ARGS))
    assert parsed.content == " trailing"


def test_named_undeclared_function_raises() -> None:
    with pytest.raises(ValueError, match="not among"):
        NamedFunctionParser(TOOLS, "delete_all")


def test_named_fuzzed_texts_never_raise_and_stay_invariant() -> None:
    assert fuzz(named_factory, (TRICKY_ARGS, "{", "}"), seed=7) > 0


# Schemas

DEFS_TOOL = ToolSpec(
    "set_point",
    {
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/point"}},
        "required": ["p"],
        "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}}}},
    },
)


def test_required_schema_is_valid_and_its_instances_validate() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    tools = (*TOOLS, DEFS_TOOL)
    schema = required_schema(tools, parallel=True)
    jsonschema.Draft202012Validator.check_schema(schema)
    instance = [
        {"name": "get_weather", "parameters": json.loads(TRICKY_ARGS) | {"unit": "c"}},
        {"name": "get_time", "parameters": {}},
        {"name": "set_point", "parameters": {"p": {"x": 1.5}}},
    ]
    jsonschema.validate(instance, schema)
    for bad in (
        [],
        [{"name": "delete_all", "parameters": {}}],
        [{"name": "get_weather", "parameters": {}}],
        [{"name": "set_point", "parameters": {"p": {"x": "no"}}}],
        [{"name": "get_time", "parameters": {}, "extra": 1}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_required_schema_not_parallel_allows_one_call() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = required_schema(TOOLS, parallel=False)
    jsonschema.Draft202012Validator.check_schema(schema)
    one = [{"name": "get_time", "parameters": {}}]
    jsonschema.validate(one, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(one * 2, schema)


def test_required_schema_output_parses_to_the_calls() -> None:
    instance = [
        {"name": "get_weather", "parameters": {"city": "Zürich 😀", "unit": "f"}},
        {"name": "web.search-v2", "parameters": {}},
    ]
    parsed = assert_invariant(array_factory, json.dumps(instance), rounds=5)
    assert parsed.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        (i["name"], i["parameters"]) for i in instance
    ]


def test_required_schema_lifts_draft_7_definitions_too() -> None:
    """`#/definitions/...` (draft 7's name for `$defs`) still resolves once wrapped."""
    jsonschema = pytest.importorskip("jsonschema")
    old_style = ToolSpec(
        "set_point",
        {
            "type": "object",
            "properties": {"p": {"$ref": "#/definitions/point"}},
            "required": ["p"],
            "definitions": {"point": {"type": "object", "properties": {"x": {"type": "number"}}}},
        },
    )
    schema = required_schema((old_style,), parallel=True)
    assert "point" in schema["definitions"]
    jsonschema.validate([{"name": "set_point", "parameters": {"p": {"x": 1}}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "set_point", "parameters": {"p": {"x": "no"}}}], schema)


def test_required_schema_refuses_no_tools_and_clashing_defs() -> None:
    with pytest.raises(ValueError, match="at least one tool"):
        required_schema((), parallel=True)
    other = ToolSpec("other", {"type": "object", "$defs": {"point": {"type": "string"}}})
    with pytest.raises(ValueError, match="differently"):
        required_schema((DEFS_TOOL, other), parallel=True)


def test_required_schema_leaves_the_tools_untouched() -> None:
    before = json.dumps(DEFS_TOOL.parameters, sort_keys=True)
    required_schema((DEFS_TOOL,), parallel=True)
    assert json.dumps(DEFS_TOOL.parameters, sort_keys=True) == before


def test_named_schema_is_the_parameters_and_its_instances_validate() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    assert named_schema(WEATHER) == WEATHER.parameters
    assert named_schema(ToolSpec("free")) == {"type": "object"}
    schema = named_schema(TIME)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(json.loads(TIME_ARGS), schema)
    parsed = assert_invariant(partial(NamedFunctionParser, TOOLS, "get_time"), TIME_ARGS)
    assert parsed.calls == calls(("get_time", TIME_ARGS))
