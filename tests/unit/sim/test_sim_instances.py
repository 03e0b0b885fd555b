"""Instances of JSON schemas and regexes (`homing.sim.instances`): every drawn instance is
valid (by `instance_errors`, and by the `jsonschema` package when it is installed), draws
are deterministic, refused schemas say why as xgrammar does, and an instance longer than its
character budget is cut there, in time proportional to the budget."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from typing import Any

import pytest

from homing.sim.instances import (
    DEFAULT_WORDS,
    ConstraintError,
    InstanceCut,
    Written,
    check_schema,
    instance_errors,
    regex_instance,
    regex_text,
    schema_instance,
    schema_text,
)

SCHEMAS: dict[str, Any] = {
    "object": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 2, "maxLength": 12},
            "age": {"type": "integer", "minimum": 18, "maximum": 30},
            "score": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "ok": {"type": "boolean"},
            "none": {"type": "null"},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "array": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4},
    "enum_const": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green"]}, "v": {"const": 3}},
        "required": ["color", "v"],
    },
    "any_of": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    "all_of": {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "string"}}, "required": ["b"]},
        ]
    },
    "ref_recursive": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["value", "children"],
            }
        },
        "$ref": "#/$defs/node",
    },
    "pattern": {"type": "string", "pattern": "^[A-Z]{3}-\\d{2,4}$"},
    "format": {"type": "string", "format": "date"},
    "prefix_items": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}]},
    "type_list": {"type": ["integer", "null"]},
    "empty": {},
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_drawn_instance_validates(name: str) -> None:
    schema = SCHEMAS[name]
    for seed in range(25):
        value = schema_instance(schema, random.Random(seed), ["Paris", "Lyon"])
        assert instance_errors(schema, value) == [], (seed, value)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_drawn_instances_validate_against_the_jsonschema_package(name: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = SCHEMAS[name]
    for seed in range(25):
        jsonschema.validate(schema_instance(schema, random.Random(seed)), schema)


def test_the_same_rng_seed_draws_the_same_instance() -> None:
    schema = SCHEMAS["object"]
    assert schema_instance(schema, random.Random(5)) == schema_instance(schema, random.Random(5))
    drawn = {repr(schema_instance(schema, random.Random(s))) for s in range(20)}
    assert len(drawn) > 1


def test_strings_are_made_of_the_given_words() -> None:
    value = schema_instance({"type": "string"}, random.Random(1), ["Paris"])
    assert "Paris" in value


def test_instance_errors_finds_what_is_wrong() -> None:
    schema = SCHEMAS["object"]
    assert instance_errors(schema, {"name": "ab"})  # age missing
    assert instance_errors(schema, {"name": "ab", "age": 99})  # above maximum
    assert instance_errors(schema, {"name": "ab", "age": 20, "extra": 1})  # not allowed
    assert instance_errors(schema, "text")


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "integer", "multipleOf": 3}, "multipleOf would be ignored"),
        ({"type": "string", "format": "color"}, "string format 'color' is not implemented"),
        ({"type": "string", "format": "date", "pattern": "x"}, "cannot be enforced together"),
        ({"type": "int"}, 'Unsupported type "int"'),
        ({"$ref": "#/$defs/missing"}, "Cannot find field $defs"),
        ([1, 2], "Schema should be an object or bool, but got array"),
        ({"type": "string", "pattern": "(unclosed"}, "Regex parsing error"),
    ],
)
def test_schemas_xgrammar_refuses_are_refused_with_its_reason(schema: Any, words: str) -> None:
    with pytest.raises(ConstraintError, match=re.escape(words)):
        check_schema(schema)


@pytest.mark.parametrize(
    "pattern",
    [
        r"[a-z]+@[a-z]+\.(com|org)",
        r"\d{3}-\d{4}",
        r"(ab|cd){2,3}x?",
        r"(?P<w>[A-Z])-(?P=w)",
        r"^yes|no$",
        r"[^0-9]{4}",
        r"\w+\s\w+",
    ],
)
def test_a_regex_instance_matches_the_pattern_in_full(pattern: str) -> None:
    for seed in range(20):
        text = regex_instance(pattern, random.Random(seed))
        assert re.fullmatch(pattern, text), (pattern, text)


# ---- the character budget

HUGE_ARRAY: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "array", "minItems": 100_000_000, "items": {"type": "string"}}},
    "required": ["a"],
}
HUGE_STRING: dict[str, Any] = {"type": "string", "minLength": 1_000_000_000}
HUGE_PATTERN: dict[str, Any] = {"type": "string", "pattern": "a{999999999}"}


def bounded(write: Callable[[], Written]) -> Written:
    """`write()`, which the budget bounds (a written-out instance of these: hours)."""
    return write()


@pytest.mark.parametrize("budget", [1, 7, 100, 999])
@pytest.mark.parametrize("schema", [HUGE_ARRAY, HUGE_STRING, HUGE_PATTERN])
def test_a_huge_schema_instance_is_cut_at_the_budget_as_a_prefix_of_a_longer_writing(
    schema: dict[str, Any], budget: int
) -> None:
    """The text is exactly `budget` characters, marked cut, and the same draws with a larger
    budget write it as their first characters: a cut keeps a prefix of the one instance."""
    written = bounded(lambda: schema_text(schema, random.Random(3), ["Paris"], budget))
    longer = bounded(lambda: schema_text(schema, random.Random(3), ["Paris"], 4000))
    assert not written.complete and not longer.complete
    assert len(written.text) == budget and len(longer.text) == 4000
    assert longer.text.startswith(written.text)


def test_a_cut_array_of_a_hundred_million_items_is_json_once_closed() -> None:
    """Closed after its last whole item, the cut text parses and is a valid (short) value."""
    text = bounded(lambda: schema_text(HUGE_ARRAY, random.Random(1), (), 1000)).text
    assert text.startswith('{"a": ["')
    closed = json.loads(text[: text.rindex('", "') + 1] + "]}")
    assert instance_errors({**HUGE_ARRAY, "properties": {"a": {"type": "array"}}}, closed) == []
    assert all(set(item.split()) <= set(DEFAULT_WORDS) for item in closed["a"])


def test_a_cut_string_of_a_billion_characters_is_words_up_to_the_budget() -> None:
    text = bounded(lambda: schema_text(HUGE_STRING, random.Random(1), (), 500)).text
    assert len(text) == 500 and text.startswith('"')
    *whole, last = text[1:].split(" ")
    assert set(whole) <= set(DEFAULT_WORDS)
    assert any(word.startswith(last) for word in DEFAULT_WORDS)


def test_a_cut_pattern_instance_is_its_characters_up_to_the_budget() -> None:
    assert bounded(lambda: schema_text(HUGE_PATTERN, random.Random(1), (), 300)).text == (
        '"' + "a" * 299
    )


def test_a_nested_regex_repeat_of_a_billion_characters_is_cut_at_the_budget() -> None:
    written = bounded(lambda: regex_text("(a{1000}){1000000}", random.Random(1), 2500))
    assert written == Written("a" * 2500, complete=False)


def test_a_repeated_back_reference_is_cut_at_the_budget() -> None:
    written = bounded(lambda: regex_text(r"(ab{3})\1{999999999}", random.Random(1), 1001))
    assert written == Written(("abbb" * 300)[:1001], complete=False)


@pytest.mark.parametrize("pattern", [r"(){1000000000}x", r"(\b|(?=a)){1000000000}x"])
def test_a_repeat_of_the_empty_string_is_written_at_once(pattern: str) -> None:
    assert bounded(lambda: regex_text(pattern, random.Random(1), 100)) == Written("x", True)


def test_a_repeat_that_mostly_writes_nothing_stops_within_its_steps() -> None:
    """Nested optional branches write a character once in 512 rounds: the writer stops, as
    cut, after the steps its budget allows, with a prefix of the instance."""
    pattern = "((((((((((|a)|)|)|)|)|)|)|)|)|){1000000000}b"
    written = bounded(lambda: regex_text(pattern, random.Random(1), 1000))
    assert not written.complete and set(written.text) <= {"a"}


def test_an_instance_within_the_budget_is_whole_and_the_same_as_without_one() -> None:
    schema = SCHEMAS["object"]
    for seed in range(10):
        written = schema_text(schema, random.Random(seed), ["Paris"], 10_000)
        assert written.complete
        assert json.loads(written.text) == schema_instance(schema, random.Random(seed), ["Paris"])
        assert written.text == json.dumps(json.loads(written.text), ensure_ascii=False)


def test_schema_instance_refuses_an_instance_longer_than_its_budget() -> None:
    with pytest.raises(InstanceCut, match="longer than its budget of 200 characters"):
        schema_instance(HUGE_ARRAY, random.Random(1), (), 200)
    with pytest.raises(InstanceCut):
        regex_instance("a{999999999}", random.Random(1), 200)
