"""Arguments texts and checks the per-format tool-call parser tests share."""

from __future__ import annotations

import json
from collections.abc import Sequence

from homing.text.output import Parsed, ParsedCall
from tests.unit.text.tools.invariance import Factory, assert_invariant, fuzz_texts

TRICKY_ARGS = (
    '{"city": "Pa\\"ris \\u00e9 \\ud83d\\ude00 é 😀 中文 }{][ \\\\", '
    '"unit": "c", "n": [1, {"a": null}]}'
)
"""Arguments holding escaped quotes, `\\u` escapes (a surrogate pair too), multi-byte and
astral characters, brackets inside a string and a string ending in an escaped backslash."""

TIME_ARGS = '{"tz": "Europe/Paris"}'

JSON_PIECES = (
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    " ",
    "\n",
    '"',
    "\\",
    '\\"',
    "\\u00e9",
    "😀",
    '"get_weather"',
    '"name"',
    '"arguments"',
    '"parameters"',
    ": ",
    TIME_ARGS,
    "hello",
)
"""JSON pieces the fuzzed texts mix with a format's markers."""


def calls(*pairs: tuple[str, str]) -> list[ParsedCall]:
    """ParsedCalls from (name, arguments) pairs."""
    return [ParsedCall(name, args) for name, args in pairs]


def assert_json_calls(parsed: Parsed) -> None:
    """Every call's arguments are a JSON object."""
    for call in parsed.calls:
        assert isinstance(json.loads(call.arguments), dict)


def fuzz(factory: Factory, markers: Sequence[str], seed: int, count: int = 150) -> int:
    """Fuzz `factory` with seeded texts of `markers` and JSON pieces: no exception, chunk
    invariance holds. Returns how many texts gave at least one call (so a test can assert
    the fuzz reached calls)."""
    with_calls = 0
    for text in fuzz_texts((*markers, *JSON_PIECES), seed, count):
        parsed = assert_invariant(factory, text, seed=seed, rounds=4)
        with_calls += bool(parsed.calls)
    return with_calls
