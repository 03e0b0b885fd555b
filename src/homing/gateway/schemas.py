"""Checks of the JSON Schemas a request carries (tool `parameters`), before any engine sees
them.

Rule of the file: a schema is walked once, iteratively (no recursion, so no depth can
overflow the stack), in time linear in its size; each keyword homing knows must have the
shape JSON Schema 2020-12 gives it (`type` a type name or a list of them, `properties` an
object of schemas, `required` a list of strings, ...); unknown keywords are left alone, as
validators do. A schema deeper than `MAX_SCHEMA_DEPTH` is refused: engines compile a schema
into a grammar recursively (xgrammar), and OpenAI's own structured outputs stop at 10
levels. Raises `APIError` 400 naming the path of the first bad keyword. The walk costs
20-60 ms per MB of schema (the more, the smaller its members): callers run it off the event
loop.
"""

from __future__ import annotations

from typing import Any

from homing.gateway.errors import invalid
from homing.gateway.requests import shown

MAX_SCHEMA_DEPTH = 64
"""Nesting of schemas inside a schema (each `properties` entry, `items`, `anyOf` member...
is one level); homing's bound, well above real tools' (OpenAI's strict mode allows 10)."""

_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("not", "if", "then", "else", "contains", "propertyNames")
_SCHEMA_OR_BOOL = ("additionalProperties", "items", "unevaluatedProperties")


def check_schema(schema: Any, param: str) -> None:
    """400 on `param` (with the keyword's path) when `schema` is not a JSON Schema object
    of known-keyword shapes within `MAX_SCHEMA_DEPTH` levels."""
    stack: list[tuple[Any, str, int]] = [(schema, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, bool) and path:
            continue  # true / false are schemas too, except at the top
        if not isinstance(node, dict):
            _bad(param, path, "a schema must be a JSON object")
        if depth > MAX_SCHEMA_DEPTH:
            _bad(param, path, f"schemas may nest at most {MAX_SCHEMA_DEPTH} levels deep")
        kind = node.get("type")
        if kind is not None:
            kinds = kind if isinstance(kind, list) else [kind]
            if not kinds or not all(isinstance(k, str) and k in _TYPES for k in kinds):
                names = ", ".join(sorted(_TYPES))
                _bad(param, f"{path}.type", f"'type' must be one of {names}, or a list of them")
        required = node.get("required")
        if required is not None and not (
            isinstance(required, list) and all(isinstance(r, str) for r in required)
        ):
            _bad(param, f"{path}.required", "'required' must be a list of property names")
        enum = node.get("enum")
        if enum is not None and not isinstance(enum, list):
            _bad(param, f"{path}.enum", "'enum' must be a list")
        for key in _SCHEMA_MAPS:
            members = node.get(key)
            if members is None:
                continue
            if not isinstance(members, dict):
                _bad(param, f"{path}.{key}", f"'{key}' must be an object of schemas")
            stack.extend((sub, f"{path}.{key}.{name}", depth + 1) for name, sub in members.items())
        for key in _SCHEMA_LISTS:
            members = node.get(key)
            if members is None:
                continue
            if not isinstance(members, list) or not members:
                _bad(param, f"{path}.{key}", f"'{key}' must be a non-empty list of schemas")
            stack.extend((sub, f"{path}.{key}[{i}]", depth + 1) for i, sub in enumerate(members))
        for key in (*_SCHEMA_ONE, *_SCHEMA_OR_BOOL):
            if key in node:
                stack.append((node[key], f"{path}.{key}", depth + 1))


def check_parameters(schema: Any, param: str) -> None:
    """`check_schema` for a function's `parameters`, whose root must also describe an object
    (OpenAI's rule: arguments are a JSON object): a root `type` other than "object" is 400;
    a root without `type` is taken as an object schema."""
    if isinstance(schema, dict) and "type" in schema and schema["type"] != "object":
        _bad(param, ".type", f"function parameters must be an object schema ('type': 'object'), "
             f"got {shown(repr(schema['type']))}")  # fmt: skip
    check_schema(schema, param)


def _bad(param: str, path: str, why: str) -> None:
    where = shown(f"{param}{path}")  # a path 64 levels deep is long
    raise invalid(f"Invalid schema for '{where}': {why}.", param, "invalid_function_parameters")
