"""Tool calls written under an engine's JSON-schema constraint (no model format at all).

What the gateway asks of the engine for `tool_choice: "required"` or a named function, and
the parsers of what comes back:

- `required` → `required_schema(tools, parallel)`: a JSON array of calls (SGLang's
  constrained form), parsed by `JsonArrayParser`:

      [{"name": "NAME", "parameters": {ARGS}}, {"name": ..., "parameters": ...}]

  Each element is read by `JsonCallParser` (see `homing.text.tools._json_calls`): the
  name first, then `"parameters"` (`"arguments"` is accepted too); the arguments are the
  model's text from their `{` to the `}` that closes them, verbatim; keys after them are
  skipped. The commas and brackets are dropped, and so is whitespace around them. A single
  object without the array is accepted too.
- a named function → `named_schema(tool)`: the function's arguments object itself, parsed
  by `NamedFunctionParser`: the call (index 0) starts at the first non-whitespace character,
  which must be `{`, and its arguments are the text from there to the `}` that closes the
  object, verbatim.

Rule of the file: malformed output follows `homing.text.tools.base`; as nothing but calls
is expected, from the first element that fails before its header is whole (or text where
a comma or bracket should be) the rest of the output is content, verbatim; whitespace
after the array (or object) is dropped. Output cut at the length limit is no content: a call
cut after its name is that call (its arguments as far as written), and the array's frame or
a call cut before its name is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

from homing.text.jsonscan import JsonScanner, Scan
from homing.text.output import Event
from homing.text.tools._common import StepParser, declared, skip_space
from homing.text.tools._json_calls import JsonCallParser
from homing.text.tools._schemas import arguments_schema
from homing.text.tools.base import ToolSpec

_START, _ARRAY, _ARRAY_NEXT, _END, _REST = range(10, 15)


class JsonArrayParser(JsonCallParser):
    """Incremental parser of a constrained JSON array of calls."""

    ARG_KEYS = ("parameters", "arguments")
    TEXT_STATE = _REST
    CUT_HEADER_IS_CONTENT = False  # the constraint allows nothing but calls

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        super().__init__(tools)
        self._state = _START
        self._bare = False

    def _fast(self, text: str) -> bool:
        return self._state == _REST

    def _call_done(self, i: int) -> int:
        self._state = _END if self._bare else _ARRAY_NEXT
        return i

    def _stopped(self, i: int) -> int:  # pragma: no cover - no stop marker
        raise AssertionError("JsonArrayParser has no stop marker")

    def _finish_frame(self, held: str) -> None:
        state = self._state
        if state in (_ARRAY, _ARRAY_NEXT, _END):  # a cut inside the frame: no text
            return
        self._out.content(*self._pending, held)

    def _frame_step(self, buf: str, pos: int) -> int:
        n = len(buf)
        state = self._state
        if state == _REST:
            self._out.content(buf[pos:])
            return n
        j = skip_space(buf, pos)
        self._pending.append(buf[pos:j])
        if j == n:
            return n
        c = buf[j]
        if state == _START:
            if c == "[":
                self._pending.append(c)
                self._state = _ARRAY
                return j + 1
            if c == "{":
                self._bare = True
                return self._begin_call(j)
            return self._give_back(j)
        if state == _ARRAY:
            if c == "{":
                return self._begin_call(j)
            return self._give_back(j)
        if state == _ARRAY_NEXT:
            if c == ",":
                self._pending = []
                self._state = _ARRAY
                return j + 1
            if c == "]":
                self._pending = []
                self._state = _END
                return j + 1
            return self._give_back(j)
        # _END
        return self._give_back(j)


_N_START, _N_ARGS, _N_END, _N_REST = range(4)


class NamedFunctionParser(StepParser):
    """Incremental parser of output constrained to one function's arguments object."""

    def __init__(self, tools: Sequence[ToolSpec], name: str) -> None:
        if name not in declared(tools):
            raise ValueError(f"function {name!r} is not among the declared tools")
        super().__init__()
        self._name = name
        self._state = _N_START
        self._pending: list[str] = []
        self._scanner = JsonScanner()

    def _fast(self, text: str) -> bool:
        return self._state == _N_REST

    def _step(self, buf: str, pos: int) -> int:
        out = self._out
        state = self._state
        if state == _N_ARGS:
            result, k = self._scanner.scan(buf, pos)
            out.args(0, buf[pos:k])
            if result is Scan.CLOSED:
                self._state = _N_END
            return k
        n = len(buf)
        if state == _N_REST:
            out.content(buf[pos:])
            return n
        j = skip_space(buf, pos)
        self._pending.append(buf[pos:j])
        if j == n:
            return n
        if state == _N_START and buf[j] == "{":
            self._pending = []
            out.start(0, self._name)
            self._state = _N_ARGS
        else:
            out.content(*self._pending)
            self._pending = []
            self._state = _N_REST
        return j

    def finish(self) -> list[Event]:
        """Events for the text still held back (leading whitespace only); the model wrote its
        last text."""
        if self._state == _N_START:
            self._out.content(*self._pending)
        self._pending = []
        return self._out.take()


def required_schema(tools: Sequence[ToolSpec], parallel: bool) -> dict:
    """The JSON Schema of `tool_choice: "required"`: an array of at least one call (at most
    one when not `parallel`), each `{"name": NAME, "parameters": ARGS}` for a declared
    function, ARGS matching its parameters (any object when None). The tools' `$defs` and
    `definitions` are lifted to the top (so `#/$defs/...` and `#/definitions/...` references
    still resolve); raises ValueError when two tools define one name differently, or when
    there are no tools. (A reference to a tool's own root, `#`, would point at the array.)"""
    if not tools:
        raise ValueError("tool_choice required needs at least one tool")
    lifted: dict[str, dict[str, object]] = {"$defs": {}, "definitions": {}}
    variants = []
    for tool in tools:
        params = arguments_schema(tool)
        for where, defs in lifted.items():
            held = params.pop(where, None)
            for key, value in (held if isinstance(held, dict) else {}).items():
                if key in defs and defs[key] != value:
                    raise ValueError(f"tools define {where}/{key} differently")
                defs[key] = value
        variants.append(
            {
                "type": "object",
                "properties": {"name": {"const": tool.name}, "parameters": params},
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
        )
    schema: dict = {"type": "array", "items": {"anyOf": variants}, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    schema.update((where, defs) for where, defs in lifted.items() if defs)
    return schema


def named_schema(tool: ToolSpec) -> dict:
    """The JSON Schema of a named `tool_choice`: the function's parameters (a copy), or any
    object when None."""
    return arguments_schema(tool)
