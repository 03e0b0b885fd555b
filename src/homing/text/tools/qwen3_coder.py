"""Qwen3-Coder XML tool calls (Qwen3-Coder-480B-A35B / 30B-A3B-Instruct, Qwen3-Next).

Format (the Qwen3-Coder chat template; SGLang's and vLLM's `qwen3_coder` parsers):

    <tool_call>
    <function=NAME>
    <parameter=P>
    VALUE
    </parameter>
    <parameter=Q>
    VALUE
    </parameter>
    </function>
    </tool_call>

A call opens with `<tool_call>` (or a bare `<function=`, which the models sometimes write
without it). Its header is `<function=NAME>`: `CallStart` comes at its `>` when NAME is a
declared function (else the call's text is content, verbatim). Parameter values are text:
one line break after `<parameter=P>` and one before `</parameter>` are the template's and
are dropped. A value ends at `</parameter>`, or where the model forgot it: at the next
`<parameter=`, `</function>` or `</tool_call>`.

Arguments are JSON text built from the parameters, `{"P": VALUE, "Q": VALUE}`, each value
converted by the type its declared schema gives P (as SGLang's detector does): `string`
(and a parameter without a type, or not in the schema) stays a string, streamed as it comes;
`integer`, `number`, `boolean`, `object`, `array` and other types are read whole and parsed
as JSON (`True`/`False` too, and Python literals for objects and arrays), falling back to
the string; a value `null` (any case) is JSON null whatever the type. `{` comes with the
header, `}` at `</function>` (or `</tool_call>`), so a well-formed call's merged arguments
are valid JSON; a text cut short leaves them partial (an unfinished value is written as the
model's text so far). Text inside a call between the tags (line breaks) is dropped.
Whitespace between calls and after the last is dropped; text before, between and after
calls is content.

Rule of the file: malformed output follows `homing.text.tools.base`.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from typing import Any

from homing.text.output import Event
from homing.text.tools._common import Markers, StepParser, drop, skip_space
from homing.text.tools._schemas import arguments_schema
from homing.text.tools.base import MAX_NAME_CHARS, ToolSpec

TOOL_CALL = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
FUNCTION = "<function="
FUNCTION_END = "</function>"
PARAMETER = "<parameter="
PARAMETER_END = "</parameter>"

_TEXT_MARKERS = Markers(TOOL_CALL, FUNCTION)
_FRAME_MARKERS = Markers(TOOL_CALL, TOOL_CALL_END, FUNCTION)
_BODY_MARKERS = Markers(PARAMETER, FUNCTION_END, TOOL_CALL_END)
_FUNCTION_MARKERS = Markers(FUNCTION)
_VALUE_MARKERS = Markers(PARAMETER_END, PARAMETER, FUNCTION_END, TOOL_CALL_END)

_STRING_TYPES = frozenset({"string", "str", "text", "varchar", "char", "enum"})

# States.
_TEXT, _OPEN, _NAME, _BODY, _PNAME, _VALUE, _AFTER_FN, _BETWEEN = range(8)


def _param_types(tool: ToolSpec) -> dict[str, str]:
    """Parameter name -> its schema type, lower case ("string" when it has none)."""
    props = arguments_schema(tool).get("properties")
    if not isinstance(props, dict):
        return {}
    out: dict[str, str] = {}
    for name, schema in props.items():
        kind: Any = schema.get("type", "string") if isinstance(schema, dict) else "string"
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "string")
        out[str(name)] = str(kind).strip().lower()
    return out


def convert_value(value: str, kind: str) -> Any:
    """A parameter's text as the JSON value its schema type asks for (the text itself when
    it does not parse)."""
    if value.lower() == "null":
        return None
    if kind in _STRING_TYPES:
        return value
    if kind in ("boolean", "bool"):
        low = value.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        return value
    try:
        return _json_value(json.loads(value), value)
    except (ValueError, RecursionError):
        pass
    if kind in ("object", "array") or kind.startswith(("dict", "list")):
        try:
            parsed = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return value
        return _json_value(parsed, value)
    return value


def _json_value(parsed: Any, text: str) -> Any:
    """`parsed` when it is a JSON value (no NaN or infinity, which strict JSON lacks), else
    `text`."""
    try:
        json.dumps(parsed, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return text
    return parsed


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class Qwen3CoderParser(StepParser):
    """Incremental parser of Qwen3-Coder `<tool_call>` XML tool calls."""

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        super().__init__()
        self._types = {tool.name: _param_types(tool) for tool in tools}
        self._state = _TEXT
        self._pending: list[str] = []
        """Text read but not decided: content if the call fails (or the frame is not)."""
        self._region: list[str] = []
        """The name being read (function or parameter)."""
        self._calls = 0
        self._params = 0
        self._kinds: dict[str, str] = {}
        self._kind = "string"
        self._value: list[str] = []
        """A parameter's value read so far (all of it for non-strings; the undecided
        start of a string)."""
        self._started = False
        """Whether the current string value's opening has been emitted."""
        self._lead = True
        """Whether the value's first character (a dropped line break) is still to come."""
        self._nl = False
        """Whether a streamed string holds back one trailing line break."""
        self._key = ""
        """The current parameter's `"P": ` (with its separator)."""
        self._key_name = ""

    # -- finish ----------------------------------------------------------------------

    def finish(self) -> list[Event]:
        """Events for the text still held back; the model wrote its last text."""
        held, self._held = self._held, ""
        out = self._out
        state = self._state
        if state in (_TEXT, _OPEN, _NAME):
            out.content(*self._pending, *self._region, held)
        elif state == _BETWEEN:
            if held:
                out.content(*self._pending, held)
        elif state == _VALUE:
            self._value_text(held)
            self._flush_partial()
        elif state == _PNAME:
            pass
        self._pending = []
        self._region = []
        self._state = _TEXT
        return out.take()

    # -- helpers ---------------------------------------------------------------------

    def _give_back(self) -> None:
        self._out.content(*self._pending, *self._region)
        self._pending = []
        self._region = []
        self._state = _TEXT

    def _args(self, text: str) -> None:
        self._out.args(self._calls - 1, text)

    def _open_value(self) -> str:
        name = "".join(self._region)
        self._region = []
        sep = ", " if self._params else ""
        self._params += 1
        return sep + _dumps(name) + ": "

    def _value_text(self, text: str) -> None:
        """Take `text` of the current value (no marker in it)."""
        if not text:
            return
        if self._lead:
            self._lead = False
            if text[0] == "\n":
                text = text[1:]
                if not text:
                    return
        if self._kind not in _STRING_TYPES or not self._started:
            self._value.append(text)
            if self._kind in _STRING_TYPES:
                so_far = "".join(self._value)
                if not "null\n".startswith(so_far.lower()):
                    self._value = []
                    self._started = True
                    self._args(self._key + '"')
                    self._stream(so_far)
            return
        self._stream(text)

    def _stream(self, text: str) -> None:
        """Emit string text, holding back one trailing line break."""
        if self._nl:
            text = "\n" + text
            self._nl = False
        if text.endswith("\n"):
            self._nl = True
            text = text[:-1]
        if text:
            self._args(_dumps(text)[1:-1])

    def _end_value(self) -> None:
        """The value is whole."""
        if self._started:
            self._args('"')
        else:
            value = "".join(self._value)
            if value.endswith("\n"):
                value = value[:-1]
            self._args(self._key + _dumps(convert_value(value, self._kind)))
        self._value = []

    def _flush_partial(self) -> None:
        """The text was cut inside a value: write what the model wrote so far."""
        if self._started:
            if self._nl:
                self._args("\\n")
        else:
            self._args(self._key + "".join(self._value))
        self._value = []

    def _start_param(self) -> None:
        self._key = self._open_value()
        kind = self._kinds.get(self._key_name, "string")
        self._kind = kind if kind not in _STRING_TYPES else "string"
        self._value = []
        self._started = False
        self._lead = True
        self._nl = False
        self._state = _VALUE

    # -- the state machine -------------------------------------------------------------

    def _read_name(self, buf: str, pos: int) -> tuple[str | None, int]:
        """Read a name up to `>`: (name, index past `>`), (None, index) when the name
        region fails at index, or ("", -1) when the text ends first."""
        n = len(buf)
        got = sum(len(r) for r in self._region)
        j = buf.find(">", pos)
        end = n if j < 0 else j
        bad = next((k for k in range(pos, end) if buf[k] in "<\n"), -1)
        if bad >= 0:
            self._region.append(buf[pos:bad])
            return None, bad
        if got + (end - pos) > MAX_NAME_CHARS:
            cut = pos + max(0, MAX_NAME_CHARS - got)
            self._region.append(buf[pos:cut])
            return None, cut
        self._region.append(buf[pos:end])
        if j < 0:
            return "", -1
        return "".join(self._region).strip(), j + 1

    def _step(self, buf: str, pos: int) -> int:
        n = len(buf)
        state = self._state
        out = self._out
        if state == _TEXT:
            found = self._until(_TEXT_MARKERS, buf, pos)
            if found is None:
                return n
            i, marker = found
            self._pending = [marker]
            self._state = _OPEN if marker == TOOL_CALL else _NAME
            return i + len(marker)
        if state == _OPEN:
            j = skip_space(buf, pos)
            self._pending.append(buf[pos:j])
            if j == n:
                return n
            marker = self._marker_at(_FUNCTION_MARKERS, buf, j)
            if marker == "":
                return n
            if marker == FUNCTION:
                self._pending.append(marker)
                self._state = _NAME
                return j + len(marker)
            self._give_back()
            return j
        if state == _NAME:
            name, k = self._read_name(buf, pos)
            if k < 0:
                return n
            if name is None:
                self._give_back()
                return k
            if name not in self._types:
                # undeclared: the text up to `>` is content, and so is the `>`
                self._give_back()
                return k - 1
            self._pending = []
            self._region = []
            out.start(self._calls, name)
            self._calls += 1
            self._kinds = self._types[name]
            self._params = 0
            self._args("{")
            self._state = _BODY
            return k
        if state == _BODY:  # text between the tags is dropped
            found = self._until(_BODY_MARKERS, buf, pos, drop)
            if found is None:
                return n
            i, marker = found
            return self._at_body_marker(marker, i)
        if state == _PNAME:
            name, k = self._read_name(buf, pos)
            if k < 0:
                return n
            if name is None:
                # a broken parameter tag: its text is dropped, the body goes on
                self._region = []
                self._state = _BODY
                return k
            self._key_name = name
            self._region = [name]
            self._start_param()
            return k
        if state == _VALUE:
            found = self._until(_VALUE_MARKERS, buf, pos, self._value_text)
            if found is None:
                return n
            i, marker = found
            self._end_value()
            if marker == PARAMETER_END:
                self._state = _BODY
                return i + len(marker)
            return self._at_body_marker(marker, i)
        # _AFTER_FN (inside <tool_call>, after </function>) or _BETWEEN (after a call)
        j = skip_space(buf, pos)
        if state == _BETWEEN:
            self._pending.append(buf[pos:j])
        if j == n:
            return n
        marker = self._marker_at(_FRAME_MARKERS, buf, j)
        if marker == "":
            return n
        if marker == TOOL_CALL_END and state == _AFTER_FN:
            self._pending = []
            self._state = _BETWEEN
            return j + len(marker)
        if marker == TOOL_CALL or (marker == FUNCTION and state == _AFTER_FN):
            self._pending = [marker]
            self._state = _OPEN if marker == TOOL_CALL else _NAME
            return j + len(marker)
        self._out.content(*self._pending)
        self._pending = []
        self._state = _TEXT
        return j

    def _at_body_marker(self, marker: str, i: int) -> int:
        if marker == PARAMETER:
            self._region = []
            self._state = _PNAME
            return i + len(marker)
        self._args("}")
        if marker == FUNCTION_END:
            self._state = _AFTER_FN
        else:
            self._pending = []
            self._state = _BETWEEN
        return i + len(marker)


def structural_tag(tools: Sequence[ToolSpec]) -> dict | None:
    """None: the legacy `structural_tag` shape (`begin`, a JSON `schema`, `end`) cannot
    express this format, whose arguments are XML parameters, not a JSON object (xgrammar's
    own `qwen_xml_parameter` content can, but the simulated worker lacks it)."""
    return None
