"""Instances of JSON schemas and regular expressions, drawn deterministically: what the
simulated worker writes under a `json_schema` or `regex` constraint.

Rule of this file: pure functions of (schema or pattern, `random.Random`, words). No I/O, no
globals. Errors are `ConstraintError`s whose text is what SGLang 0.5.23's xgrammar backend
says for the same input (its scheduler prefixes "Failed to compile json grammar: ").

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
`MAX_EXTRA_REPEATS` times beyond its minimum). Lookarounds are ignored (an instance may then
not match). A pattern Python cannot parse is refused with Python's message.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterator, Mapping, Sequence
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


# ------------------------------------------------------------------------------- instances


class _Drawer:
    """One instance's draws: the root (for $ref), the rng and the words."""

    def __init__(self, root: Any, rng: random.Random, words: Sequence[str]) -> None:
        self.root = root
        self.rng = rng
        given = tuple(dict.fromkeys(w for w in words if w))
        self.given = bool(given)
        self.words = given or DEFAULT_WORDS

    def value(self, schema: Any, depth: int) -> Any:
        if depth > MAX_DEPTH * 8:
            raise ConstraintError("The schema has no finite instance (a required recursion)")
        if schema is True or schema == {} or schema is None:
            return self.text(1, 3)
        if not isinstance(schema, dict):
            return self.text(1, 3)
        if "$ref" in schema:
            return self.value(_resolve(self.root, schema["$ref"]), depth + 1)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return self.rng.choice(list(schema["enum"]))
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                if depth >= MAX_DEPTH:
                    plain = [b for b in branches if not (isinstance(b, dict) and "$ref" in b)]
                    branches = plain or branches
                base = {k: v for k, v in schema.items() if k != key}
                return self.value({**base, **self.rng.choice(branches)}, depth + 1)
        if isinstance(schema.get("allOf"), list):
            merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                if isinstance(part, dict) and "$ref" in part:
                    part = _resolve(self.root, part["$ref"])
                if isinstance(part, dict):
                    merged = _merge(merged, part)
            return self.value(merged, depth + 1)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = self.rng.choice(kind) if kind else None
        if kind is None:
            kind = _implied_type(schema)
        if kind == "object":
            return self.object(schema, depth)
        if kind == "array":
            return self.array(schema, depth)
        if kind == "integer":
            return self.integer(schema)
        if kind == "number":
            return self.number(schema)
        if kind == "boolean":
            return self.rng.random() < 0.5
        if kind == "null":
            return None
        return self.string(schema)

    def object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties") or {}
        required = [str(name) for name in schema.get("required") or ()]
        out: dict[str, Any] = {}
        for name, sub in properties.items():
            if name in required or (depth < MAX_DEPTH and self.rng.random() < 0.5):
                out[name] = self.value(sub, depth + 1)
        for name in required:
            if name not in out:
                out[name] = self.text(1, 2)
        return out

    def array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
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
        out = []
        for i in range(count):
            sub = prefix[i] if i < len(prefix) else items
            out.append(self.value(sub, depth + 1))
        return out

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

    def string(self, schema: Mapping[str, Any]) -> str:
        fmt = schema.get("format")
        if fmt in XGRAMMAR_STRING_FORMATS:
            return self.rng.choice(XGRAMMAR_STRING_FORMATS[fmt])
        if "pattern" in schema:
            return regex_instance(str(schema["pattern"]), self.rng)
        value = self.text(1, 3)
        low = int(schema.get("minLength", 0))
        high = schema.get("maxLength")
        while len(value) < low:
            value = f"{value} {self.rng.choice(self.words)}"
        if high is not None and len(value) > int(high):
            value = value[: int(high)]
        return value


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


def schema_instance(schema: Any, rng: random.Random, words: Sequence[str] = ()) -> Any:
    """A value of `schema` drawn with `rng`, strings made of `words` (see the module
    docstring). Raises ConstraintError for a schema `check_schema` refuses."""
    check_schema(schema)
    return _Drawer(schema, rng, words).value(schema, 0)


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
_CATEGORY_CHARS = {
    _sre_constants.CATEGORY_DIGIT: "0123456789",
    _sre_constants.CATEGORY_WORD: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_",
    _sre_constants.CATEGORY_SPACE: " ",
    _sre_constants.CATEGORY_NOT_DIGIT: "abcxyz",
    _sre_constants.CATEGORY_NOT_WORD: " -.,",
    _sre_constants.CATEGORY_NOT_SPACE: "abcxyz",
}


def parse_regex(pattern: str) -> Any:
    """Python's parse of `pattern`; ConstraintError with its message when it has none."""
    try:
        return _sre_parser.parse(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        raise ConstraintError(f"Regex parsing error: {exc}") from None


def regex_instance(pattern: str, rng: random.Random) -> str:
    """A string `pattern` matches in full (see the module docstring), drawn with `rng`."""
    out: list[str] = []
    groups: dict[int, str] = {}
    _emit(parse_regex(pattern), rng, out, groups)
    return "".join(out)


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


def _emit(parsed: Any, rng: random.Random, out: list[str], groups: dict[int, str]) -> None:
    for op, arg in parsed:
        if op is _sre_constants.LITERAL:
            out.append(chr(arg))
        elif op is _sre_constants.NOT_LITERAL:
            out.append(rng.choice([c for c in _PRINTABLE if ord(c) != arg]))
        elif op is _sre_constants.ANY:
            out.append(rng.choice(_PRINTABLE[16:90]))  # no newline, mostly alphanumerics
        elif op is _sre_constants.IN:
            negate, chars = _class_chars(arg)
            if negate:
                listed = set(chars)
                chars = [c for c in _PRINTABLE if c not in listed]
            out.append(rng.choice(chars or ["a"]))
        elif op is _sre_constants.BRANCH:
            _emit(rng.choice(arg[1]), rng, out, groups)
        elif op is _sre_constants.SUBPATTERN:
            group, _, _, body = arg
            start = len(out)
            _emit(body, rng, out, groups)
            if group is not None:
                groups[group] = "".join(out[start:])
        elif op in (
            _sre_constants.MAX_REPEAT,
            _sre_constants.MIN_REPEAT,
            getattr(_sre_constants, "POSSESSIVE_REPEAT", _sre_constants.MAX_REPEAT),
        ):
            low, high, body = arg
            top = low + MAX_EXTRA_REPEATS if high == _sre_constants.MAXREPEAT else high
            for _ in range(rng.randint(low, max(low, top))):
                _emit(body, rng, out, groups)
        elif op is _sre_constants.GROUPREF:
            out.append(groups.get(arg, ""))
        elif op is getattr(_sre_constants, "ATOMIC_GROUP", None):
            _emit(arg, rng, out, groups)
        elif op is _sre_constants.CATEGORY:
            out.append(rng.choice(_CATEGORY_CHARS.get(arg, "a")))
        # AT (anchors), ASSERT / ASSERT_NOT (lookarounds): nothing to write
