"""Instances of JSON schemas and regular expressions, drawn deterministically: what the
simulated worker writes under a `json_schema` or `regex` constraint.

Rule of this file: pure functions of (schema or pattern, `random.Random`, words, budget). No
I/O, no globals. Errors are `ConstraintError`s whose text is what SGLang 0.5.23's xgrammar
backend says for the same input (its scheduler prefixes "Failed to compile json grammar: ").

Budget: writers append their text to a `Sink` as they draw it, at most `budget` characters
(and `STEPS_PER_CHAR` steps of work per character). A writer that reaches the budget keeps
the text up to it exactly and stops (`InstanceCut`); the text is then a prefix of an
instance, what a real engine cut at `max_new_tokens` has written, and the work is
proportional to the budget, never to the numbers a schema or pattern holds (`minItems`,
`minLength`, `a{999999999}`). JSON is written as it is drawn, in the format of
`json.dumps(value, ensure_ascii=False)` (`", "` and `": "` separators), so a cut keeps a
prefix of that text; `schema_instance` and `regex_instance`, which return a whole instance,
raise InstanceCut instead.

JSON schemas: the subset OpenAI structured outputs allow, and what xgrammar 0.2.7 compiles:
- `type` (a name or a list of names: object, array, string, number, integer, boolean, null);
  `properties`, `required` (every required property is written, each optional one with odds
  of one half), `additionalProperties` (no property beyond the declared ones is ever written);
  `enum`, `const`; `anyOf` / `oneOf` (one branch, drawn), `allOf` (the branches merged);
  `$ref` to `#`, `#/$defs/NAME` or `#/definitions/NAME` (recursion ends: past
  `MAX_DEPTH` arrays take their `minItems`, objects their required properties only and
  `anyOf` a branch that is not a `$ref` where there is one); `items` (or `prefixItems`),
  `minItems` / `maxItems`; `minimum` / `maximum` / `exclusiveMinimum` / `exclusiveMaximum`;
  `minLength` / `maxLength`, `pattern` (a `regex_instance`) and `format` (the formats xgrammar
  implements, each with a fixed-form value); a schema `true` or `{}` (any value: a string).
- refused as SGLang refuses them (`check_schema`): the keywords xgrammar would ignore
  (`XGRAMMAR_UNSUPPORTED_KEYWORDS`), a `format` it does not implement, a string with more than
  one of format / pattern / minLength-maxLength, an unknown `type` name, a `$ref` that does not
  resolve, a schema that is neither an object nor a boolean.
- strings are made of `words` (a tool call's arguments take the words of the user's message,
  so a demo reads well), else of `DEFAULT_WORDS`; numbers are small (0..100 unless bounded).

Regular expressions (Python's syntax, which covers what JSON schemas and OpenAI clients
write): literals, `.`, classes (ranges, negation, \\d \\w \\s), groups, alternation, anchors
(skipped), back-references, and repeats (an unbounded one repeats at most
`MAX_EXTRA_REPEATS` times beyond its minimum; a repeat of something that matches only the
empty string is written once at most). Lookarounds are ignored (an instance may then not
match). A pattern Python cannot parse is refused with Python's message.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

try:  # Python 3.11+: the parser behind `re`
    import re._constants as _sre_constants
    import re._parser as _sre_parser
except ImportError:  # pragma: no cover - older interpreters keep the public names
    import sre_constants as _sre_constants  # type: ignore[no-redef]
    import sre_parse as _sre_parser  # type: ignore[no-redef]

MAX_DEPTH = 6
"""Nesting depth past which recursive schemas take their smallest instance."""

MAX_EXTRA_REPEATS = 3
"""How many times an unbounded regex repeat (`*`, `+`, `{n,}`) may go past its minimum."""

DEFAULT_WORDS: tuple[str, ...] = (
    "alpha",
    "blue",
    "cache",
    "delta",
    "river",
    "north",
    "quiet",
    "signal",
    "tensor",
    "window",
)
"""Words strings are made of when the caller gives none."""

JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
"""The type names a schema may use."""

XGRAMMAR_UNSUPPORTED_KEYWORDS = frozenset(
    {
        "contains",
        "dependentRequired",
        "dependentSchemas",
        "else",
        "if",
        "maxContains",
        "minContains",
        "multipleOf",
        "not",
        "then",
        "uniqueItems",
    }
)
"""Keywords SGLang 0.5.23 refuses for xgrammar (it would accept them without enforcing them)."""

XGRAMMAR_STRING_FORMATS: dict[str, tuple[str, ...]] = {
    "date": ("2024-05-17", "2025-01-02", "2023-11-30"),
    "date-time": ("2024-05-17T09:30:00Z", "2025-01-02T18:05:12Z"),
    "duration": ("P3D", "PT1H30M", "P1Y2M"),
    "email": ("ada@example.com", "lin@example.org"),
    "hostname": ("example.com", "node-1.example.net"),
    "ipv4": ("192.0.2.10", "198.51.100.7"),
    "ipv6": ("2001:db8::1", "2001:db8::beef"),
    "json-pointer": ("/items/0", "/name"),
    "relative-json-pointer": ("0/name", "1"),
    "time": ("09:30:00Z", "18:05:12Z"),
    "uri": ("https://example.com/a", "https://example.org/docs"),
    "uri-reference": ("/docs/intro", "https://example.com/a"),
    "uri-template": ("https://example.com/{id}", "/users/{name}"),
    "uuid": ("123e4567-e89b-12d3-a456-426614174000", "9b2f1d3c-8a4e-4c1b-9f0d-2e6a7b8c9d0e"),
}
"""The string formats xgrammar implements, with the values an instance takes."""

_SUBSCHEMA = ("additionalProperties", "items", "additionalItems", "propertyNames", "contains")
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("$defs", "definitions", "properties", "patternProperties")


class ConstraintError(ValueError):
    """A schema or pattern the worker refuses; the text is the backend's own account."""


# ------------------------------------------------------------------------------- checking


def _walk(schema: Any, pointer: str = "#") -> Iterator[tuple[dict[str, Any], str]]:
    """Every schema-valued place under `schema` (objects only) with its JSON pointer."""
    if not isinstance(schema, dict):
        return
    yield schema, pointer
    for key in _SUBSCHEMA:
        child = schema.get(key)
        if isinstance(child, dict):
            yield from _walk(child, f"{pointer}/{key}")
        elif key == "items" and isinstance(child, list):
            for i, item in enumerate(child):
                yield from _walk(item, f"{pointer}/items/{i}")
    for key in _SUBSCHEMA_LISTS:
        children = schema.get(key)
        if isinstance(children, list):
            for i, child in enumerate(children):
                yield from _walk(child, f"{pointer}/{key}/{i}")
    for key in _SUBSCHEMA_MAPS:
        children = schema.get(key)
        if isinstance(children, dict):
            for name, child in children.items():
                escaped = str(name).replace("~", "~0").replace("/", "~1")
                yield from _walk(child, f"{pointer}/{key}/{escaped}")


def _describes_string(schema: Mapping[str, Any]) -> bool:
    kind = schema.get("type")
    return kind is None or kind == "string" or (isinstance(kind, list) and "string" in kind)


def check_schema(schema: Any) -> None:
    """Raise ConstraintError (xgrammar's / SGLang's words) for a schema the backend refuses;
    see the module docstring for the rules."""
    if isinstance(schema, bool):
        if not schema:
            raise ConstraintError("The schema false admits no value")
        return
    if not isinstance(schema, dict):
        raise ConstraintError(f"Schema should be an object or bool, but got {json_kind(schema)}")
    for sub, pointer in _walk(schema):
        unsupported = sorted(XGRAMMAR_UNSUPPORTED_KEYWORDS & sub.keys())
        if unsupported:
            raise ConstraintError(
                f"JSON Schema at {pointer} is not supported by xgrammar: keyword(s) "
                f"{', '.join(unsupported)} would be ignored"
            )
        if _describes_string(sub):
            if "format" in sub and sub["format"] not in XGRAMMAR_STRING_FORMATS:
                raise ConstraintError(
                    f"JSON Schema at {pointer} is not supported by xgrammar: string format "
                    f"{sub['format']!r} is not implemented"
                )
            groups = [
                name
                for name, present in (
                    ("format", "format" in sub),
                    ("pattern", "pattern" in sub),
                    ("minLength/maxLength", "minLength" in sub or "maxLength" in sub),
                )
                if present
            ]
            if len(groups) > 1:
                raise ConstraintError(
                    f"JSON Schema at {pointer} is not supported by xgrammar: constraints "
                    f"{', '.join(groups)} cannot be enforced together"
                )
        kinds = sub.get("type")
        for kind in kinds if isinstance(kinds, list) else [kinds] if kinds is not None else []:
            if kind not in JSON_TYPES:
                raise ConstraintError(f'Unsupported type "{kind}"')
        if "pattern" in sub:
            parse_regex(str(sub["pattern"]))
        ref = sub.get("$ref")
        if ref is not None:
            _resolve(schema, ref)


def json_kind(value: Any) -> str:
    """The JSON name of `value`'s kind."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _resolve(root: Any, ref: Any) -> Any:
    """The schema `ref` points at within `root` (xgrammar's error when it does not)."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise ConstraintError(f"Unsupported $ref {ref!r}: only local references (#...) resolve")
    node = root
    for part in [p for p in ref[1:].split("/") if p]:
        name = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or name not in node:
            raise ConstraintError(f"Cannot find field {name} in {ref}")
        node = node[name]
    return node


# ------------------------------------------------------------------------------- writing


DEFAULT_BUDGET = 1 << 20
"""Characters an instance may take when the caller names no budget (1 MiB of text)."""

STEPS_PER_CHAR = 8
"""Work steps a writer may take per character of its budget. A step is one JSON value, one
regex item or repeat round, or one structural-tag repeat round. Ordinary instances take one
to three per character written and a repeated optional part (`(a?){n}`) about seven, so only
a writer that mostly writes nothing runs out, and stops there as if cut; the bound keeps its
work, like the text's length, proportional to the budget."""

STEP_SLACK = 1024
"""Steps every writer may take beyond `STEPS_PER_CHAR` per character (small budgets)."""


class InstanceCut(Exception):
    """Writing stopped at its budget: the sink holds the text written up to there, a prefix
    of an instance (what a real engine cut at `max_new_tokens` would have written)."""


@dataclass(frozen=True)
class Written:
    """What a writer wrote: `text`, and whether it is a whole instance (`complete`) or a
    prefix of one cut at the budget."""

    text: str
    complete: bool


class Sink:
    """Where writers append text: at most `budget` characters and `STEPS_PER_CHAR * budget +
    STEP_SLACK` steps. A write that passes the budget keeps the text up to it exactly and
    raises InstanceCut; so does a step past the steps."""

    __slots__ = ("_parts", "left", "steps")

    def __init__(self, budget: int = DEFAULT_BUDGET) -> None:
        self._parts: list[str] = []
        self.left = max(0, budget)
        self.steps = STEPS_PER_CHAR * self.left + STEP_SLACK

    def write(self, text: str) -> None:
        """Append `text`; InstanceCut (after appending what fits) past the budget."""
        if len(text) > self.left:
            self._parts.append(text[: self.left])
            self.left = 0
            raise InstanceCut
        self._parts.append(text)
        self.left -= len(text)

    def step(self) -> None:
        """Count one step of work; InstanceCut when they are spent."""
        self.steps -= 1
        if self.steps < 0:
            raise InstanceCut

    def text(self) -> str:
        """Everything written so far."""
        return "".join(self._parts)


def write_all(write: Callable[[Sink], None], budget: int) -> Written:
    """Run `write` on a fresh sink of `budget` characters: its text, complete or cut."""
    sink = Sink(budget)
    try:
        write(sink)
    except InstanceCut:
        return Written(sink.text(), complete=False)
    return Written(sink.text(), complete=True)


# ------------------------------------------------------------------------------- instances


class _Drawer:
    """One instance's draws, written as JSON text into `sink` as they are drawn: the root
    (for $ref), the rng, the words and the sink. The text is `json.dumps(value,
    ensure_ascii=False)` of the value drawn, so a cut leaves a prefix of it."""

    def __init__(self, root: Any, rng: random.Random, words: Sequence[str], sink: Sink) -> None:
        self.root = root
        self.rng = rng
        self.sink = sink
        given = tuple(dict.fromkeys(w for w in words if w))
        self.given = bool(given)
        self.words = given or DEFAULT_WORDS

    def value(self, schema: Any, depth: int) -> None:
        if depth > MAX_DEPTH * 8:
            raise ConstraintError("The schema has no finite instance (a required recursion)")
        self.sink.step()
        if schema is True or schema == {} or schema is None or not isinstance(schema, dict):
            self.sink.write(_dumps(self.text(1, 3)))
            return
        if "$ref" in schema:
            self.value(_resolve(self.root, schema["$ref"]), depth + 1)
            return
        if "const" in schema:
            self.sink.write(_dumps(schema["const"]))
            return
        if schema.get("enum"):
            self.sink.write(_dumps(self.rng.choice(list(schema["enum"]))))
            return
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                if depth >= MAX_DEPTH:
                    plain = [b for b in branches if not (isinstance(b, dict) and "$ref" in b)]
                    branches = plain or branches
                base = {k: v for k, v in schema.items() if k != key}
                self.value({**base, **self.rng.choice(branches)}, depth + 1)
                return
        if isinstance(schema.get("allOf"), list):
            merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                if isinstance(part, dict) and "$ref" in part:
                    part = _resolve(self.root, part["$ref"])
                if isinstance(part, dict):
                    merged = _merge(merged, part)
            self.value(merged, depth + 1)
            return
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = self.rng.choice(kind) if kind else None
        if kind is None:
            kind = _implied_type(schema)
        if kind == "object":
            self.object(schema, depth)
        elif kind == "array":
            self.array(schema, depth)
        elif kind == "integer":
            self.sink.write(_dumps(self.integer(schema)))
        elif kind == "number":
            self.sink.write(_dumps(self.number(schema)))
        elif kind == "boolean":
            self.sink.write("true" if self.rng.random() < 0.5 else "false")
        elif kind == "null":
            self.sink.write("null")
        else:
            self.string(schema)

    def _key(self, name: str, first: bool) -> None:
        self.sink.write(f"{_dumps(name)}: " if first else f", {_dumps(name)}: ")

    def object(self, schema: Mapping[str, Any], depth: int) -> None:
        properties = schema.get("properties") or {}
        required = [str(name) for name in schema.get("required") or ()]
        written: set[str] = set()
        self.sink.write("{")
        for name, sub in properties.items():
            if name in required or (depth < MAX_DEPTH and self.rng.random() < 0.5):
                self._key(name, not written)
                written.add(name)
                self.value(sub, depth + 1)
        for name in required:
            if name not in written:
                self._key(name, not written)
                written.add(name)
                self.sink.write(_dumps(self.text(1, 2)))
        self.sink.write("}")

    def array(self, schema: Mapping[str, Any], depth: int) -> None:
        low = int(schema.get("minItems", 0))
        high = int(schema.get("maxItems", max(low, 3)))
        prefix = schema.get("prefixItems")
        items = schema.get("items", {})
        if isinstance(items, list):  # draft-4 tuple form
            prefix, items = items, {}
        prefix = list(prefix) if isinstance(prefix, list) else []
        if depth >= MAX_DEPTH:
            count = low
        else:
            count = self.rng.randint(max(low, 1 if high >= 1 else 0), max(low, min(high, 3)))
        count = max(count, min(len(prefix), high))
        self.sink.write("[")
        for i in range(count):
            if i:
                self.sink.write(", ")
            self.value(prefix[i] if i < len(prefix) else items, depth + 1)
        self.sink.write("]")

    def _bounds(self, schema: Mapping[str, Any], step: float) -> tuple[float, float]:
        low = schema.get("minimum")
        high = schema.get("maximum")
        if "exclusiveMinimum" in schema and not isinstance(schema["exclusiveMinimum"], bool):
            low = schema["exclusiveMinimum"] + step
        if "exclusiveMaximum" in schema and not isinstance(schema["exclusiveMaximum"], bool):
            high = schema["exclusiveMaximum"] - step
        if low is None and high is None:
            low, high = 0, 100
        elif low is None:
            low = min(0, high - 100)
        elif high is None:
            high = max(100, low + 100)
        return float(low), float(high)

    def integer(self, schema: Mapping[str, Any]) -> int:
        low, high = self._bounds(schema, 1)
        lo, hi = math.ceil(low), math.floor(high)
        return self.rng.randint(lo, hi) if lo <= hi else lo

    def number(self, schema: Mapping[str, Any]) -> float | int:
        low, high = self._bounds(schema, 0.01)
        value = round(self.rng.uniform(low, high), 2)
        return min(max(value, low), high)

    def text(self, low: int, high: int) -> str:
        """`low`..`high` distinct words (at most two of the caller's, which read as a
        phrase of the message)."""
        if self.given:
            high = min(high, 2)
        count = max(1, min(self.rng.randint(low, high), len(self.words)))
        return " ".join(self.rng.sample(self.words, count))

    def string(self, schema: Mapping[str, Any]) -> None:
        """A string value: a format's value, a pattern's instance, or words (at least
        `minLength` characters, cut to `maxLength`), written as it is drawn."""
        fmt = schema.get("format")
        if fmt in XGRAMMAR_STRING_FORMATS:
            self.sink.write(_dumps(self.rng.choice(XGRAMMAR_STRING_FORMATS[fmt])))
            return
        write = self.sink.write
        if "pattern" in schema:
            write('"')
            _Emitter(self.rng, self.sink, _json_escaped).emit(parse_regex(str(schema["pattern"])))
            write('"')
            return
        low = int(schema.get("minLength", 0))
        high = None if schema.get("maxLength") is None else int(schema["maxLength"])
        piece = self.text(1, 3)
        drawn = kept = 0  # characters drawn; characters written (at most maxLength)
        write('"')
        while True:
            drawn += len(piece)
            if high is not None:
                piece = piece[: max(0, high - kept)]
            write(_json_escaped(piece))
            kept += len(piece)
            if drawn >= low or (high is not None and kept >= high):
                break
            self.sink.step()
            piece = f" {self.rng.choice(self.words)}"
        write('"')


def _implied_type(schema: Mapping[str, Any]) -> str:
    """The type a schema without `type` describes by its keywords (string otherwise)."""
    if "properties" in schema or "required" in schema or "additionalProperties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema or "minItems" in schema:
        return "array"
    if any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return "number"
    return "string"


def _merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Two object schemas as one (properties and required lists joined)."""
    merged = {**a, **b}
    if "properties" in a or "properties" in b:
        merged["properties"] = {**(a.get("properties") or {}), **(b.get("properties") or {})}
    if "required" in a or "required" in b:
        merged["required"] = [*(a.get("required") or ()), *(b.get("required") or ())]
    return merged


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _json_escaped(text: str) -> str:
    """`text` as it reads inside a JSON string (`json.dumps(..., ensure_ascii=False)`)."""
    return encode_basestring(text)[1:-1]


def write_schema(schema: Any, rng: random.Random, sink: Sink, words: Sequence[str] = ()) -> None:
    """Write the JSON text of an instance of `schema` (one `check_schema` passed) into
    `sink`, drawn with `rng`, strings made of `words`; InstanceCut at the sink's budget."""
    _Drawer(schema, rng, words, sink).value(schema, 0)


def schema_text(
    schema: Any, rng: random.Random, words: Sequence[str] = (), budget: int = DEFAULT_BUDGET
) -> Written:
    """The JSON text of an instance of `schema` (`json.dumps(value, ensure_ascii=False)`), or
    its first `budget` characters when it is longer. Raises ConstraintError for a schema
    `check_schema` refuses."""
    check_schema(schema)
    return write_all(lambda sink: write_schema(schema, rng, sink, words), budget)


def schema_instance(
    schema: Any, rng: random.Random, words: Sequence[str] = (), budget: int = DEFAULT_BUDGET
) -> Any:
    """A value of `schema` drawn with `rng`, strings made of `words` (see the module
    docstring). Raises ConstraintError for a schema `check_schema` refuses, InstanceCut when
    the value's JSON text would pass `budget` characters."""
    written = schema_text(schema, rng, words, budget)
    if not written.complete:
        raise InstanceCut(f"the schema's instance is longer than its budget of {budget} characters")
    return json.loads(written.text)


# ------------------------------------------------------------------------------- validating


def instance_errors(schema: Any, value: Any, root: Any = None, path: str = "$") -> list[str]:
    """Where `value` breaks `schema` (the subset above), one line each; empty when it is an
    instance. For tests and self-checks, not the request path."""
    root = schema if root is None else root
    if schema is True or schema == {} or schema is None:
        return []
    if schema is False:
        return [f"{path}: no value is allowed"]
    if "$ref" in schema:
        return instance_errors(_resolve(root, schema["$ref"]), value, root, path)
    errors: list[str] = []
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: {value!r} is not the const {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']!r}")
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            if not any(not instance_errors(b, value, root, path) for b in schema[key]):
                errors.append(f"{path}: matches no branch of {key}")
    for part in schema.get("allOf") or ():
        errors += instance_errors(part, value, root, path)
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    actual = json_kind(value)
    if kinds and actual not in kinds and not (actual == "integer" and "number" in kinds):
        errors.append(f"{path}: {actual} is not {kinds}")
        return errors
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        for name in schema.get("required") or ():
            if name not in value:
                errors.append(f"{path}: required property {name!r} is missing")
        for name, item in value.items():
            if name in properties:
                errors += instance_errors(properties[name], item, root, f"{path}.{name}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}: property {name!r} is not allowed")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{path}: fewer than minItems items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: more than maxItems items")
        prefix = schema.get("prefixItems") or []
        for i, item in enumerate(value):
            sub = prefix[i] if i < len(prefix) else schema.get("items", {})
            errors += instance_errors(sub, item, root, f"{path}[{i}]")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: below minimum")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: above maximum")
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            errors.append(f"{path}: not above exclusiveMinimum")
        if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
            errors.append(f"{path}: not below exclusiveMaximum")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errors.append(f"{path}: shorter than minLength")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: longer than maxLength")
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            errors.append(f"{path}: does not match {schema['pattern']!r}")
    return errors


# ------------------------------------------------------------------------------- regex


_PRINTABLE = tuple(chr(c) for c in range(0x20, 0x7F))
_ANY_CHARS = _PRINTABLE[16:90]  # no newline, mostly alphanumerics
_CATEGORY_CHARS = {
    _sre_constants.CATEGORY_DIGIT: "0123456789",
    _sre_constants.CATEGORY_WORD: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_",
    _sre_constants.CATEGORY_SPACE: " ",
    _sre_constants.CATEGORY_NOT_DIGIT: "abcxyz",
    _sre_constants.CATEGORY_NOT_WORD: " -.,",
    _sre_constants.CATEGORY_NOT_SPACE: "abcxyz",
}
_REPEATS = (
    _sre_constants.MAX_REPEAT,
    _sre_constants.MIN_REPEAT,
    getattr(_sre_constants, "POSSESSIVE_REPEAT", _sre_constants.MAX_REPEAT),
)


def parse_regex(pattern: str) -> Any:
    """Python's parse of `pattern`; ConstraintError with its message when it has none."""
    try:
        return _sre_parser.parse(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        raise ConstraintError(f"Regex parsing error: {exc}") from None


def write_regex(parsed: Any, rng: random.Random, sink: Sink) -> None:
    """Write a string the parsed pattern (`parse_regex`) matches in full into `sink`, drawn
    with `rng`; InstanceCut at the sink's budget."""
    _Emitter(rng, sink).emit(parsed)


def regex_text(pattern: str, rng: random.Random, budget: int = DEFAULT_BUDGET) -> Written:
    """A string `pattern` matches in full, or its first `budget` characters when it is
    longer (see the module docstring), drawn with `rng`."""
    parsed = parse_regex(pattern)
    return write_all(lambda sink: write_regex(parsed, rng, sink), budget)


def regex_instance(pattern: str, rng: random.Random, budget: int = DEFAULT_BUDGET) -> str:
    """A string `pattern` matches in full (see the module docstring), drawn with `rng`.
    InstanceCut when it would pass `budget` characters."""
    written = regex_text(pattern, rng, budget)
    if not written.complete:
        raise InstanceCut(
            f"the pattern's instance is longer than its budget of {budget} characters"
        )
    return written.text


def _class_chars(items: Sequence[tuple[Any, Any]]) -> tuple[bool, list[str]]:
    """A class's (negated, characters it lists) from its parsed items."""
    negate = False
    chars: list[str] = []
    for op, arg in items:
        if op is _sre_constants.NEGATE:
            negate = True
        elif op is _sre_constants.LITERAL:
            chars.append(chr(arg))
        elif op is _sre_constants.RANGE:
            low, high = arg
            chars.extend(chr(c) for c in range(low, min(high, low + 255) + 1))
        elif op is _sre_constants.CATEGORY:
            chars.extend(_CATEGORY_CHARS.get(arg, "a"))
    return negate, chars


class _Emitter:
    """One regex instance's draws, written into `sink` as they are drawn (through `escape`,
    when the instance is a JSON string's content). It keeps the raw text for
    back-references, and each class's characters (worked out once per instance)."""

    def __init__(
        self, rng: random.Random, sink: Sink, escape: Callable[[str], str] | None = None
    ) -> None:
        self.rng = rng
        self.sink = sink
        self.escape = escape
        self.raw: list[str] = []
        self.groups: dict[int, str] = {}
        self._classes: dict[int, Sequence[str]] = {}
        self._writes: dict[int, bool] = {}
        self._literals: dict[int, str | None] = {}
        self._others: dict[int, Sequence[str]] = {}

    def put(self, text: str) -> None:
        self.raw.append(text)
        self.sink.write(text if self.escape is None else self.escape(text))

    def _class(self, items: Sequence[tuple[Any, Any]]) -> Sequence[str]:
        chars = self._classes.get(id(items))
        if chars is None:
            negate, chars = _class_chars(items)
            if negate:
                listed = set(chars)
                chars = [c for c in _PRINTABLE if c not in listed]
            chars = chars or ["a"]
            self._classes[id(items)] = chars
        return chars

    def _not_literal(self, code: int) -> Sequence[str]:
        """The printable characters other than `code` (what `[^x]` draws from)."""
        chars = self._others.get(code)
        if chars is None:
            chars = self._others[code] = [c for c in _PRINTABLE if ord(c) != code]
        return chars

    def _can_write(self, body: Any) -> bool:
        """Whether `body` matches anything but the empty string (a repeat of one that cannot
        writes it once at most: the text is the same, the loop is not run)."""
        can = self._writes.get(id(body))
        if can is None:
            try:
                can = body.getwidth()[1] > 0
            except Exception:  # a parse Python cannot size: assume it writes
                can = True
            self._writes[id(body)] = can
        return can

    def _literal(self, body: Any) -> str | None:
        """The text of a body made of literals only (None for any other body)."""
        key = id(body)
        if key not in self._literals:
            items = list(getattr(body, "data", body))
            literal = all(op is _sre_constants.LITERAL for op, _ in items)
            self._literals[key] = "".join(chr(a) for _, a in items) if literal else None
        return self._literals[key]

    def _repeat_literal(self, text: str, count: int) -> None:
        """`text` `count` times, written in pieces no longer than the budget needs (a
        literal draws nothing, so this is the same as writing it round by round)."""
        while count > 0:
            rounds = min(count, self.sink.left // len(text) + 1)
            self.sink.step()
            self.put(text * rounds)
            count -= rounds

    def emit(self, parsed: Any) -> None:
        rng, sink = self.rng, self.sink
        for op, arg in getattr(parsed, "data", parsed):  # a SubPattern's list: quicker
            sink.steps -= 1  # Sink.step, inline: this loop is the hot one
            if sink.steps < 0:
                raise InstanceCut
            if op is _sre_constants.LITERAL:
                self.put(chr(arg))
            elif op is _sre_constants.NOT_LITERAL:
                self.put(rng.choice(self._not_literal(arg)))
            elif op is _sre_constants.ANY:
                self.put(rng.choice(_ANY_CHARS))
            elif op is _sre_constants.IN:
                self.put(rng.choice(self._class(arg)))
            elif op is _sre_constants.BRANCH:
                self.emit(rng.choice(arg[1]))
            elif op is _sre_constants.SUBPATTERN:
                group, _, _, body = arg
                start = len(self.raw)
                self.emit(body)
                if group is not None:
                    self.groups[group] = "".join(self.raw[start:])
            elif op in _REPEATS:
                low, high, body = arg
                top = low + MAX_EXTRA_REPEATS if high == _sre_constants.MAXREPEAT else high
                count = rng.randint(low, max(low, top))
                if count > 1 and not self._can_write(body):
                    count = 1
                literal = self._literal(body)
                if literal:
                    self._repeat_literal(literal, count)
                    continue
                for _ in range(count):
                    self.sink.step()
                    self.emit(body)
            elif op is _sre_constants.GROUPREF:
                self.put(self.groups.get(arg, ""))
            elif op is getattr(_sre_constants, "ATOMIC_GROUP", None):
                self.emit(arg)
            elif op is _sre_constants.CATEGORY:
                self.put(rng.choice(_CATEGORY_CHARS.get(arg, "a")))
            # AT (anchors), ASSERT / ASSERT_NOT (lookarounds): nothing to write
