"""Pythonic tool calls: Llama 3.2 (1B/3B) and Llama 4, and models tuned to the same style.

Format (Meta's Llama 3.2 and Llama 4 model cards, "pythonic" tool calling; SGLang's and
vLLM's `pythonic` parsers):

    [get_weather(city="Paris", unit="c"), get_time(tz="UTC")]

A Python list of calls with keyword arguments whose values are Python literals. Llama 4
may frame the list with `<|python_start|>` ... `<|python_end|>` (special tokens, dropped
wherever they come). A `[` opens a call list when a declared function's name and `(`
follow it (whitespace allowed); anything else (`[1]`, a Markdown link, an undeclared name)
gives the text back as content, verbatim. `CallStart` comes at the `(`.

Arguments are JSON text of the keyword arguments, `{"city": "Paris", "unit": "c"}`: `{`
comes with the header, each argument when it is whole (at its top-level `,` or the call's
`)`: its value read with `ast.literal_eval` and written with `json.dumps`), `}` at `)`.
Broken arguments are written, not dropped: a value that is not a literal (a name, an
expression) or not JSON (a set, bytes, `nan`) is its source text as a JSON string, and a
positional argument is keyed by its position (`"0"`, `"1"`...), so the arguments stay a
JSON object. A text cut inside a call leaves the arguments partial (an unfinished argument
is `"key": ` and its source so far). After a call, `,` leads to the next call and `]` ends
the list; whitespace between calls is dropped; text before and after the list (or after a
call that is followed by neither) is content.

No `structural_tag` (see `structural_tag`).

Rule of the file: malformed output follows `homing.text.tools.base`.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import Any

from homing.text.output import Event
from homing.text.tools._common import Markers, StepParser, declared, skip_space
from homing.text.tools.base import MAX_NAME_CHARS, ToolSpec

PYTHON_START = "<|python_start|>"
PYTHON_END = "<|python_end|>"

_TEXT_MARKERS = Markers("[", PYTHON_START, PYTHON_END)
_NAME_CHARS = re.compile(r"[A-Za-z0-9_.\-\s]*")
_KEYWORD = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=(?!=)(.*)", re.DOTALL)
_OPENERS = {"(": ")", "[": "]", "{": "}"}
_CLOSERS = frozenset(")]}")

_TEXT, _NAME, _ARGS, _AFTER = range(4)


def literal_json(source: str) -> str:
    """A Python literal's source as JSON text (the source as a JSON string when it is no
    literal or no JSON value)."""
    try:
        value: Any = ast.literal_eval(source.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return json.dumps(source.strip(), ensure_ascii=False)
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return json.dumps(source.strip(), ensure_ascii=False)


class PythonicParser(StepParser):
    """Incremental parser of pythonic `[f(a=1), g()]` tool calls."""

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        super().__init__()
        self._names = declared(tools)
        self._state = _TEXT
        self._pending: list[str] = []
        """Text read but not decided: content if the call fails."""
        self._name_len = 0
        self._calls = 0
        self._item: list[str] = []
        """The argument being read (its source)."""
        self._items = 0
        self._depth = 0
        self._quote = ""
        self._escape = False

    def _fast(self, text: str) -> bool:
        return self._state == _TEXT and not _TEXT_MARKERS.may_occur(text)

    def finish(self) -> list[Event]:
        """Events for the text still held back; the model wrote its last text."""
        held, self._held = self._held, ""
        state = self._state
        if state == _ARGS:
            self._item.append(held)
            m = _KEYWORD.match("".join(self._item))
            if m is not None:
                sep = ", " if self._items else ""
                key = json.dumps(m.group(1), ensure_ascii=False)
                self._args(sep + key + ": " + m.group(2).lstrip())
        elif state != _AFTER:
            self._out.content(*self._pending, held)
        self._pending = []
        self._item = []
        self._state = _TEXT
        return self._out.take()

    def _args(self, text: str) -> None:
        self._out.args(self._calls - 1, text)

    def _give_back(self) -> None:
        self._out.content(*self._pending)
        self._pending = []
        self._state = _TEXT

    def _to_name(self, marker: str) -> None:
        self._pending = [marker]
        self._name_len = 0
        self._state = _NAME

    def _end_item(self) -> None:
        source = "".join(self._item)
        self._item = []
        if not source.strip():
            return
        m = _KEYWORD.match(source)
        if m is not None:
            key, value = m.group(1), m.group(2)
        else:
            key, value = str(self._items), source
        sep = ", " if self._items else ""
        self._items += 1
        self._args(sep + json.dumps(key, ensure_ascii=False) + ": " + literal_json(value))

    def _step(self, buf: str, pos: int) -> int:
        n = len(buf)
        state = self._state
        out = self._out
        if state == _TEXT:
            found = self._until(_TEXT_MARKERS, buf, pos)
            if found is None:
                return n
            i, marker = found
            if marker == "[":
                self._to_name(marker)
            return i + len(marker)
        if state == _NAME:
            m = _NAME_CHARS.match(buf, pos)
            assert m is not None
            end = m.end()
            room = MAX_NAME_CHARS - self._name_len
            if end - pos > room:
                self._pending.append(buf[pos : pos + room])
                self._give_back()
                return pos + room
            self._pending.append(buf[pos:end])
            self._name_len += end - pos
            if end == n:
                return n
            name = "".join(self._pending[1:]).strip()
            if buf[end] != "(" or name not in self._names:
                self._give_back()
                return end
            self._pending = []
            out.start(self._calls, name)
            self._calls += 1
            self._args("{")
            self._items = 0
            self._item = []
            self._depth = 0
            self._quote = ""
            self._escape = False
            self._state = _ARGS
            return end + 1
        if state == _ARGS:
            return self._scan_args(buf, pos)
        # _AFTER: after a call's `)`
        j = skip_space(buf, pos)
        if j == n:
            return n
        c = buf[j]
        if c == ",":
            self._to_name(c)
            return j + 1
        self._state = _TEXT
        return j + 1 if c == "]" else j

    def _scan_args(self, buf: str, pos: int) -> int:
        n = len(buf)
        start = pos
        i = pos
        while i < n:
            c = buf[i]
            if self._quote:
                if self._escape:
                    self._escape = False
                elif c == "\\":
                    self._escape = True
                elif c == self._quote:
                    self._quote = ""
            elif c in "'\"":
                self._quote = c
            elif c in _OPENERS:
                self._depth += 1
            elif c in _CLOSERS and self._depth > 0:
                self._depth -= 1
            elif self._depth == 0 and c in ",)":
                self._item.append(buf[start:i])
                self._end_item()
                if c == ")":
                    self._args("}")
                    self._state = _AFTER
                    return i + 1
                start = i + 1
            i += 1
        self._item.append(buf[start:n])
        return n


def structural_tag(tools: Sequence[ToolSpec]) -> dict | None:
    """None: the legacy `structural_tag` shape writes `begin`, a JSON `schema`, `end`, and
    pythonic arguments are Python keyword arguments, not a JSON object (no JSON schema
    constrains `city="Paris"`); xgrammar's format has no Python-call content either."""
    return None
