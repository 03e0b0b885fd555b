"""Mistral tool calls, both tokenizer generations.

Formats (mistral-common's tokenizers; Mistral-7B-Instruct-v0.3, Mistral-Nemo,
Mistral-Small-3.1 write v3; Mistral-Small-3.2, Magistral, Devstral write v11+):

    v3:   [TOOL_CALLS] [{"name": "NAME", "arguments": {ARGS}}, {"name": ...}]
    v11+: [TOOL_CALLS]NAME[ARGS]{ARGS}[TOOL_CALLS]NAME[ARGS]{ARGS}

After `[TOOL_CALLS]` (and whitespace), a `[` starts the v3 JSON array, anything else the
v11 name. v3 objects are read by `JsonCallParser` (see `homing.text.tools._json_calls`):
the name first, then `"arguments"` (`"parameters"` is accepted too); keys after the
arguments (Mistral-Nemo's `"id"`) are skipped; keys with string values before them too. In
v11 the name is the text up to `[ARGS]`, stripped (an optional `[CALL_ID]ID` before `[ARGS]`
is dropped: events carry no ids). Either way the arguments are the model's text from their
`{` to the `}` that closes them (found by the JSON scanner), verbatim. `[TOOL_CALLS]` ends a
call wherever it comes. Whitespace between and after calls is dropped.

Rule of the file: malformed output follows `homing.text.tools.base`; a call that fails
before its header is whole gives back its `[TOOL_CALLS]` and text as content (in a v3
array, the calls before it stay calls).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from homing.text.jsonscan import JsonScanner
from homing.text.tools._common import Markers, skip_space
from homing.text.tools._json_calls import J_ARGS, JsonCallParser
from homing.text.tools._schemas import legacy_structural_tag
from homing.text.tools.base import ToolSpec

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"

_TEXT, _MARK, _ARRAY, _ARRAY_NEXT, _NAME, _V11_OPEN, _BETWEEN = range(10, 17)

_TEXT_MARKERS = Markers(TOOL_CALLS)
_NAME_MARKERS = Markers(ARGS, TOOL_CALLS)


class MistralParser(JsonCallParser):
    """Incremental parser of Mistral `[TOOL_CALLS]` tool calls (v3 array and v11+)."""

    STOP = TOOL_CALLS
    TEXT_STATE = _TEXT

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        super().__init__(tools)
        self._v11 = False
        self._region = ""
        self._name = ""

    def _fast(self, text: str) -> bool:
        return self._state == _TEXT and not _TEXT_MARKERS.may_occur(text)

    def _call_done(self, i: int) -> int:
        self._state = _BETWEEN if self._v11 else _ARRAY_NEXT
        return i

    def _args_closed(self, i: int) -> int:
        # v11 arguments stand alone: what follows them is not the rest of a call object.
        return self._call_done(i) if self._v11 else super()._args_closed(i)

    def _stopped(self, i: int) -> int:
        self._state = _BETWEEN
        return i

    def _give_back(self, i: int) -> int:
        self._region = ""
        return super()._give_back(i)

    def _finish_frame(self, held: str) -> None:
        if self._state in (_ARRAY_NEXT, _BETWEEN) and not held:
            return
        self._out.content(*self._pending, self._region, held)
        self._region = ""

    def _frame_step(self, buf: str, pos: int) -> int:
        n = len(buf)
        state = self._state
        out = self._out
        if state == _TEXT:
            return self._text_step(_TEXT_MARKERS, buf, pos, _MARK)
        if state == _NAME:
            i, marker = self._region_until(_NAME_MARKERS, buf, pos, len(self._region))
            self._region += buf[pos:i]
            if marker == "":
                return n
            self._pending.append(self._region)
            if marker != ARGS:  # `[TOOL_CALLS]`, or a name over the cap
                return self._give_back(i)
            self._pending.append(marker)
            name = self._region.partition(CALL_ID)[0].strip()
            if name not in self._names:
                return self._give_back(i + len(marker))
            self._region = ""
            self._name = name
            self._state = _V11_OPEN
            return i + len(marker)
        j = skip_space(buf, pos)
        self._pending.append(buf[pos:j])
        if j == n:
            return n
        c = buf[j]
        if state == _MARK:
            if c == "[":
                self._pending.append(c)
                self._state = _ARRAY
                return j + 1
            self._region = ""
            self._state = _NAME
            return j
        if state == _ARRAY:
            if c == "{":
                self._v11 = False
                return self._begin_call(j)
            return self._give_back(j)
        if state == _V11_OPEN:
            if c != "{":
                return self._give_back(j)
            self._pending = []
            out.start(self._calls, self._name)
            self._calls += 1
            self._v11 = True
            self._scanner = JsonScanner(stops=TOOL_CALLS[0])
            self._state = J_ARGS
            return j
        if state == _ARRAY_NEXT:
            if c == ",":
                self._pending.append(c)
                self._state = _ARRAY
                return j + 1
            if c == "]":
                self._pending = []
                self._state = _BETWEEN
                return j + 1
        # _BETWEEN, or _ARRAY_NEXT at neither `,` nor `]`: `[TOOL_CALLS]` may come
        marker = self._marker_at(_TEXT_MARKERS, buf, j)
        if marker == "":
            return n
        if marker:
            self._pending = [marker]
            self._state = _MARK
            return j + len(marker)
        return self._give_back(j)


def structural_tag(tools: Sequence[ToolSpec], *, v11: bool = True) -> dict | None:
    """The legacy `structural_tag` constraint of one call, triggered by `[TOOL_CALLS]`.
    v11+ (the default): `begin` is `[TOOL_CALLS]NAME[ARGS]`, `end` empty, so each call
    writes its own `[TOOL_CALLS]` and parallel calls stay possible. v3 (`v11=False`,
    SGLang's shape): `begin` is `[TOOL_CALLS] [{"name": "NAME", "arguments": `, `end` `}]`,
    one call per array. The schema is the tool's parameters (any object when None). None
    without tools."""
    if v11:
        return legacy_structural_tag(tools, lambda name: TOOL_CALLS + name + ARGS, "", TOOL_CALLS)
    return legacy_structural_tag(
        tools,
        lambda name: TOOL_CALLS + ' [{"name": ' + json.dumps(name) + ', "arguments": ',
        "}]",
        TOOL_CALLS,
    )
