"""Instances of JSON schemas and regexes (`homing.sim.instances`): every drawn instance is
valid (by `instance_errors`, and by the `jsonschema` package when it is installed), draws
are deterministic, and refused schemas say why as xgrammar does."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

from homing.sim.instances import (
    ConstraintError,
    check_schema,
    instance_errors,
    regex_instance,
    schema_instance,
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
