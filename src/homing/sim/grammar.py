"""The simulated worker's grammar backend: a constraint becomes the text of one instance.

Rule of this file: `compile_constraint` checks a request's constraint once (cached by its
text, as SGLang caches compiled grammars) and either refuses it with SGLang 0.5.23's message
("Failed to compile {json|regex|ebnf|structural_tag} grammar: ..." , a 400 its servicer maps to
INVALID_ARGUMENT) or returns a `Constraint`, whose `text(rng, words, budget=...)` is a
deterministic instance, written into a sink of `budget` characters
(`homing.sim.instances.Sink`): the whole text when it fits (`complete`), else exactly its
first `budget` characters (`complete` False). A real engine writes an instance token by token
and `max_new_tokens` cuts it; any prefix of an instance is what it may have written by then,
so the planner (`homing.sim.generation`) asks for a budget sized to the request's tokens, ends
a complete instance with EOS and leaves a cut one without, for the scheduler to end at
"length". Every writer (JSON, regex, structural tag, each `repeat` round) writes through the
sink, so no number in a constraint (`minItems`, `a{999999999}`, a `repeat`'s `min`) makes
the work larger than the budget.

- `json_schema`: a JSON instance of the schema (`homing.sim.instances`: OpenAI's structured
  outputs subset, xgrammar's refusals), written as xgrammar writes JSON without free
  whitespace (`", "` and `": "` separators).
- `regex`: a string the pattern matches in full (Python's regex syntax).
- `ebnf_grammar`: refused (`EBNF_UNSUPPORTED`): the simulated backend writes no grammar's
  sentences.
- `structural_tag`, SGLang's JSON text in either form:
  legacy `{"type": "structural_tag", "structures": [{"begin", "schema", "end"}, ...],
  "triggers": [...]}` (every structure's `begin` must start with one of the triggers), and
  xgrammar's `{"type": "structural_tag", "format": FORMAT}`. The answer is exactly one
  structure: for the legacy form one structure (drawn): begin + schema instance + end; for a
  format, its text: `const_string` its value, `json_schema` an instance (style "json" only),
  `regex` an instance, `any_text` nothing, `sequence` its elements in order, `or` one element
  (drawn), `tag` begin + content + end (the first end when there are several),
  `triggered_tags` / `tags_with_separator` one tag (drawn), `optional` / `plus` / `star` the
  content once, `repeat` the content `min` times (once when `min` is 0), `token` the token's
  text. `grammar`, `qwen_xml_parameter`, `dispatch` and the token-id formats are refused
  (`FORMAT_UNSUPPORTED`); an unknown format type gets xgrammar's "Format type not recognized".
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from homing.sim.instances import (
    DEFAULT_BUDGET,
    ConstraintError,
    Sink,
    Written,
    check_schema,
    parse_regex,
    write_all,
    write_regex,
    write_schema,
)

CONSTRAINT_KINDS: dict[str, str] = {
    "json_schema": "json",
    "regex": "regex",
    "ebnf_grammar": "ebnf",
    "structural_tag": "structural_tag",
}
"""`SamplingParams` constraint field -> the name SGLang's messages give its grammar."""

EBNF_UNSUPPORTED = (
    "the simulated worker's grammar backend does not write EBNF grammars (it honours "
    "json_schema, regex and structural_tag)"
)
"""Why an `ebnf_grammar` constraint is refused (after SGLang's "Failed to compile ebnf
grammar: ")."""

FORMAT_UNSUPPORTED = (
    'the simulated worker\'s grammar backend does not write structural tag format "{type}"'
)
"""Why a structural-tag format the simulated backend cannot write is refused."""

KNOWN_FORMATS = frozenset(
    {
        "const_string",
        "json_schema",
        "any_text",
        "token",
        "exclude_token",
        "any_tokens",
        "grammar",
        "regex",
        "sequence",
        "or",
        "tag",
        "triggered_tags",
        "token_triggered_tags",
        "tags_with_separator",
        "optional",
        "plus",
        "star",
        "repeat",
        "dispatch",
        "token_dispatch",
        "qwen_xml_parameter",
    }
)
"""Format types xgrammar 0.2.7 knows (others: "Format type not recognized")."""

CACHE_SIZE = 256
"""Compiled constraints kept (by kind and text)."""

TokenText = Callable[[int], str]
"""A token id's text (for the `token` format)."""


class GrammarRefused(ValueError):
    """A constraint the backend refuses; `str()` is SGLang's whole message."""


Writer = Callable[[random.Random, Sequence[str], TokenText, Sink], None]
"""Writes one instance into the sink (`homing.sim.instances.Sink`): InstanceCut at its
budget."""


@dataclass(frozen=True)
class Constraint:
    """A compiled constraint: `kind` (SGLang's name: json, regex, structural_tag) and its
    writer."""

    kind: str
    writer: Writer

    def text(
        self,
        rng: random.Random,
        words: Sequence[str] = (),
        token_text: TokenText = str,
        budget: int = DEFAULT_BUDGET,
    ) -> Written:
        """One instance of the constraint, drawn with `rng`, strings from `words`: its text
        and `complete` True, or its first `budget` characters and `complete` False when it is
        longer (see the module docstring)."""
        return write_all(lambda sink: self.writer(rng, words, token_text, sink), budget)


def compile_constraint(field: str, value: str) -> Constraint:
    """The `Constraint` of a request's `field` (a SamplingParams constraint name) holding
    `value`; raises GrammarRefused with SGLang's message. Cached by (field, value)."""
    return _compile(field, value)


@functools.lru_cache(maxsize=CACHE_SIZE)
def _compile(field: str, value: str) -> Constraint:
    kind = CONSTRAINT_KINDS[field]
    try:
        if field == "json_schema":
            writer = _json_writer(json.loads(value))
        elif field == "regex":
            writer = _regex_writer(value)
        elif field == "structural_tag":
            writer = _structural_tag_writer(json.loads(value))
        else:
            raise ConstraintError(EBNF_UNSUPPORTED)
    except (ConstraintError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GrammarRefused(f"Failed to compile {kind} grammar: {exc}") from None
    except (KeyError, TypeError, AttributeError) as exc:
        # shapes SGLang's own code trips over (a missing key, a list for a dict): its
        # compile thread raises, and the request gets "Grammar compilation failed"
        raise GrammarRefused(
            f"Failed to compile {kind} grammar: Grammar compilation failed: {exc!r}"
        ) from None
    return Constraint(kind, writer)


def _json_writer(schema: Any) -> Writer:
    check_schema(schema)

    def write(rng: random.Random, words: Sequence[str], _: TokenText, sink: Sink) -> None:
        write_schema(schema, rng, sink, words)

    return write


def _regex_writer(pattern: str) -> Writer:
    parsed = parse_regex(pattern)

    def write(rng: random.Random, words: Sequence[str], _: TokenText, sink: Sink) -> None:
        write_regex(parsed, rng, sink)

    return write


def _structural_tag_writer(tag: Any) -> Writer:
    if not isinstance(tag, dict):
        raise ConstraintError("Invalid structural tag error: the structural tag must be an object")
    if tag.get("structures") is not None:
        return _legacy_writer(tag)
    fmt = tag.get("format")
    if fmt is None:
        raise KeyError("format")
    return _format_writer(fmt)


def _legacy_writer(tag: Mapping[str, Any]) -> Writer:
    triggers = tag.get("triggers")
    if triggers is None:
        raise KeyError("triggers")
    structures = list(tag["structures"])
    if not structures:
        raise ConstraintError("Invalid structural tag error: no structures")
    parts: list[tuple[str, Writer, str]] = []
    for structure in structures:
        begin, end = str(structure["begin"]), str(structure["end"])
        if not any(begin.startswith(str(t)) for t in triggers):
            raise ConstraintError(
                f"Invalid structural tag error: the begin tag {begin!r} matches no trigger"
            )
        schema = structure.get("schema")
        parts.append((begin, _json_writer({} if schema is None else schema), end))

    def write(rng: random.Random, words: Sequence[str], token_text: TokenText, sink: Sink) -> None:
        begin, content, end = parts[rng.randrange(len(parts))]
        sink.write(begin)
        content(rng, words, token_text, sink)
        sink.write(end)

    return write


def _const(text: str) -> Writer:
    return lambda rng, words, token_text, sink: sink.write(text)


def _sequence(elements: Sequence[Writer]) -> Writer:
    def write(rng: random.Random, words: Sequence[str], token_text: TokenText, sink: Sink) -> None:
        for element in elements:
            element(rng, words, token_text, sink)

    return write


def _one_of(elements: Sequence[Writer]) -> Writer:
    return lambda rng, words, tt, sink: elements[rng.randrange(len(elements))](rng, words, tt, sink)


def _repeat(content: Writer, times: int) -> Writer:
    def write(rng: random.Random, words: Sequence[str], token_text: TokenText, sink: Sink) -> None:
        for _ in range(times):
            sink.step()  # a content that writes nothing still ends at the sink's steps
            content(rng, words, token_text, sink)

    return write


def _format_writer(fmt: Any) -> Writer:
    """The writer of one structural-tag format (see the module docstring)."""
    if not isinstance(fmt, dict):
        raise ConstraintError("Invalid structural tag error: a format must be an object")
    kind = fmt.get("type")
    if kind not in KNOWN_FORMATS:
        raise ConstraintError(f"Invalid structural tag error: Format type not recognized: {kind}")
    if kind == "const_string":
        return _const(str(fmt["value"]))
    if kind == "json_schema":
        style = fmt.get("style", "json")
        if style != "json":
            raise ConstraintError(FORMAT_UNSUPPORTED.format(type=f"json_schema (style {style})"))
        schema = fmt.get("json_schema")
        return _json_writer({} if schema is None else schema)
    if kind == "regex":
        return _regex_writer(str(fmt["pattern"]))
    if kind == "any_text":
        return _const("")
    if kind == "token":
        token = fmt["token"]
        if isinstance(token, str):
            return _const(token)
        return lambda rng, words, token_text, sink: sink.write(token_text(int(token)))
    if kind in ("sequence", "or"):
        elements = [_format_writer(e) for e in fmt["elements"]]
        if kind == "sequence":
            return _sequence(elements)
        if not elements:
            raise ConstraintError("Invalid structural tag error: an or format needs elements")
        return _one_of(elements)
    if kind == "tag":
        return _tag_writer(fmt)
    if kind in ("triggered_tags", "tags_with_separator"):
        tags = [_tag_writer(t) for t in fmt["tags"]]
        if kind == "triggered_tags":
            triggers = [str(t) for t in fmt["triggers"]]
            for t in fmt["tags"]:
                if not any(str(t["begin"]).startswith(trigger) for trigger in triggers):
                    raise ConstraintError(
                        f"Invalid structural tag error: the tag {t['begin']!r} matches no trigger"
                    )
        if not tags:
            return _const("")
        return _one_of(tags)
    if kind in ("optional", "plus", "star"):
        return _format_writer(fmt["content"])
    if kind == "repeat":
        content = _format_writer(fmt["content"])
        times = max(int(fmt.get("min", 0)), 1)
        if fmt.get("max") is not None and int(fmt["max"]) < times:
            times = int(fmt["max"])
        return _repeat(content, times)
    raise ConstraintError(FORMAT_UNSUPPORTED.format(type=kind))


def _tag_writer(fmt: Mapping[str, Any]) -> Writer:
    if fmt.get("type", "tag") != "tag":
        raise ConstraintError(f"Invalid structural tag error: expected a tag, got {fmt['type']}")
    begin = _edge(fmt["begin"])
    end_value = fmt["end"]
    end = _edge(end_value[0] if isinstance(end_value, list) and end_value else end_value)
    content = _format_writer(fmt["content"])
    return _sequence((begin, content, end))


def _edge(value: Any) -> Writer:
    """A tag's begin or end: a string, or a `token` format."""
    if isinstance(value, dict):
        return _format_writer(value)
    return _const(str(value))
