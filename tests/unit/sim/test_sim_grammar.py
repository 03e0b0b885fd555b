"""The simulated grammar backend (`homing.sim.grammar`): each constraint kind compiles to a
`Constraint` whose text is an instance of it (cut at its character budget, in time
proportional to the budget), and refusals carry SGLang's "Failed to compile ... grammar"
message."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest

from homing.sim.grammar import (
    EBNF_UNSUPPORTED,
    GrammarRefused,
    compile_constraint,
)
from homing.sim.instances import Written, instance_errors

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


def texts(field: str, value: Any, n: int = 20) -> list[str]:
    text = value if isinstance(value, str) else json.dumps(value)
    constraint = compile_constraint(field, text)
    written = [constraint.text(random.Random(seed), ["Paris"]) for seed in range(n)]
    assert all(w.complete for w in written)
    return [w.text for w in written]


def test_a_json_schema_answer_is_one_instance_written_without_free_whitespace() -> None:
    for text in texts("json_schema", SCHEMA):
        assert instance_errors(SCHEMA, json.loads(text)) == []
        assert json.dumps(json.loads(text), ensure_ascii=False) == text


def test_a_regex_answer_matches_the_pattern_in_full() -> None:
    pattern = r"(yes|no), because [a-z]{3,8}\."
    for text in texts("regex", pattern):
        assert re.fullmatch(pattern, text)


def test_a_legacy_structural_tag_answer_is_one_structure_begin_instance_end() -> None:
    tag = {
        "type": "structural_tag",
        "structures": [
            {"begin": "<function=get_weather>", "schema": SCHEMA, "end": "</function>"},
            {"begin": "<function=now>", "schema": {"type": "object"}, "end": "</function>"},
        ],
        "triggers": ["<function="],
    }
    seen = set()
    for text in texts("structural_tag", tag, 40):
        match = re.fullmatch(r"<function=(\w+)>(.*)</function>", text)
        assert match, text
        seen.add(match.group(1))
        if match.group(1) == "get_weather":
            assert instance_errors(SCHEMA, json.loads(match.group(2))) == []
    assert seen == {"get_weather", "now"}


def test_a_structural_tag_format_answer_writes_its_format() -> None:
    tag = {
        "type": "structural_tag",
        "format": {
            "type": "sequence",
            "elements": [
                {"type": "const_string", "value": "Answer: "},
                {
                    "type": "tag",
                    "begin": "<json>",
                    "content": {"type": "json_schema", "json_schema": SCHEMA},
                    "end": ["</json>", "</JSON>"],
                },
                {"type": "regex", "pattern": "!{1,3}"},
            ],
        },
    }
    for text in texts("structural_tag", tag):
        match = re.fullmatch(r"Answer: <json>(.*)</json>!{1,3}", text)
        assert match, text
        assert instance_errors(SCHEMA, json.loads(match.group(1))) == []


def test_the_same_draws_give_the_same_text_and_compiles_are_cached() -> None:
    assert texts("json_schema", SCHEMA) == texts("json_schema", SCHEMA)
    text = json.dumps(SCHEMA)
    assert compile_constraint("json_schema", text) is compile_constraint("json_schema", text)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("ebnf_grammar", 'root ::= "a"', f"Failed to compile ebnf grammar: {EBNF_UNSUPPORTED}"),
        ("json_schema", "{not json", "Failed to compile json grammar: "),
        (
            "json_schema",
            json.dumps({"type": "integer", "multipleOf": 2}),
            "Failed to compile json grammar: JSON Schema at # is not supported by xgrammar",
        ),
        ("regex", "(open", "Failed to compile regex grammar: Regex parsing error"),
        (
            "structural_tag",
            json.dumps({"type": "structural_tag", "format": {"type": "nonsense"}}),
            "Failed to compile structural_tag grammar: Invalid structural tag error: "
            "Format type not recognized: nonsense",
        ),
        (
            "structural_tag",
            json.dumps(
                {
                    "type": "structural_tag",
                    "structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}],
                    "triggers": ["<b"],
                }
            ),
            "Failed to compile structural_tag grammar: Invalid structural tag error",
        ),
        (
            "structural_tag",
            json.dumps({"type": "structural_tag"}),
            "Failed to compile structural_tag grammar: Grammar compilation failed",
        ),
        (
            "structural_tag",
            json.dumps({"type": "structural_tag", "format": {"type": "grammar", "grammar": ""}}),
            "does not write structural tag format",
        ),
    ],
)
def test_refused_constraints_carry_sglangs_message(field: str, value: str, message: str) -> None:
    with pytest.raises(GrammarRefused) as refused:
        compile_constraint(field, value)
    assert str(refused.value).startswith(message) or message in str(refused.value)


# ---- the character budget


def tag_of(fmt: dict[str, Any]) -> str:
    return json.dumps({"type": "structural_tag", "format": fmt})


def budgeted_text(field: str, value: str, budget: int) -> Written:
    """The constraint's text within `budget` characters (the whole instance: hours)."""
    return compile_constraint(field, value).text(random.Random(1), ["Paris"], budget=budget)


def test_a_regex_constraint_of_a_billion_characters_is_cut_at_the_budget() -> None:
    written = budgeted_text("regex", "(a{1000}){1000000}", 700)
    assert written == Written("a" * 700, complete=False)


def test_a_structural_tag_repeated_a_billion_times_is_cut_at_the_budget() -> None:
    """Each round writes a tag around a JSON instance; the cut text is the rounds up to the
    budget, the whole ones each a tag holding an instance."""
    content = {
        "type": "tag",
        "begin": "<j>",
        "content": {"type": "json_schema", "json_schema": SCHEMA},
        "end": "</j>",
    }
    value = tag_of({"type": "repeat", "min": 1_000_000_000, "content": content})
    written = budgeted_text("structural_tag", value, 1500)
    assert not written.complete and len(written.text) == 1500
    rounds = written.text.split("</j>")[:-1]
    assert len(rounds) > 10
    for part in rounds:
        assert part.startswith("<j>")
        assert instance_errors(SCHEMA, json.loads(part[len("<j>") :])) == []
    longer = budgeted_text("structural_tag", value, 3000)
    assert longer.text.startswith(written.text)


def test_a_structural_tag_repeat_of_nothing_ends_within_its_steps() -> None:
    value = tag_of({"type": "repeat", "min": 1_000_000_000, "content": {"type": "any_text"}})
    assert budgeted_text("structural_tag", value, 100).text == ""


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("json_schema", json.dumps(SCHEMA)),
        ("regex", r"(yes|no), because [a-z]{3,8}\."),
        (
            "structural_tag",
            tag_of({"type": "repeat", "min": 3, "content": {"type": "regex", "pattern": "x{2}"}}),
        ),
    ],
)
def test_an_instance_within_the_budget_is_complete_and_unchanged_by_it(
    field: str, value: str
) -> None:
    constraint = compile_constraint(field, value)
    for seed in range(10):
        small = constraint.text(random.Random(seed), ["Paris"], budget=2000)
        large = constraint.text(random.Random(seed), ["Paris"])
        assert small.complete and small == large
