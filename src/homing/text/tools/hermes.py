"""Hermes-style tool calls: Hermes 2 Pro / Hermes 3, Qwen 2.5, Qwen 3 (one parser).

Format (NousResearch Hermes-2-Pro and Hermes-3 function calling; Qwen2.5-Instruct and
Qwen3 chat templates):

    <tool_call>
    {"name": "NAME", "arguments": {ARGS}}
    </tool_call>
    <tool_call>
    ...
    </tool_call>

Each call is a JSON object inside its own `<tool_call>` ... `</tool_call>` tags (the line
breaks are optional whitespace). The object is read by `JsonCallParser` (see
`homing.text.tools._json_calls`): the name first, then `"arguments"` (`"parameters"` is
accepted too); the arguments are the model's text from their `{` to the `}` that closes
them (found by the JSON scanner), verbatim; keys after them are skipped. `</tool_call>` ends
a call wherever it comes, inside broken JSON too. Whitespace between a call and the next
`<tool_call>` (and after the last) is dropped; text before the first call, and between calls,
is content.

Rule of the file: malformed output follows `homing.text.tools.base`; a call object that fails
before its header is whole gives back its `<tool_call>` and text as content.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from homing.text.tools._common import Markers, skip_space
from homing.text.tools._json_calls import JsonCallParser
from homing.text.tools._schemas import legacy_structural_tag
from homing.text.tools.base import ToolSpec

OPEN = "<tool_call>"
CLOSE = "</tool_call>"

_TEXT, _OPEN, _CLOSE, _BETWEEN = 10, 11, 12, 13

_TEXT_MARKERS = Markers(OPEN)
_TAG_MARKERS = Markers(OPEN, CLOSE)


class HermesParser(JsonCallParser):
    """Incremental parser of `<tool_call>` JSON tool calls."""

    STOP = CLOSE
    TEXT_STATE = _TEXT

    def _fast(self, text: str) -> bool:
        return self._state == _TEXT and not _TEXT_MARKERS.may_occur(text)

    def _call_done(self, i: int) -> int:
        self._state = _CLOSE
        return i

    def _stopped(self, i: int) -> int:
        self._state = _CLOSE
        return i

    def _finish_frame(self, held: str) -> None:
        if self._state in (_CLOSE, _BETWEEN) and not held:
            return
        self._out.content(*self._pending, held)

    def _frame_step(self, buf: str, pos: int) -> int:
        n = len(buf)
        state = self._state
        if state == _TEXT:
            return self._text_step(_TEXT_MARKERS, buf, pos, _OPEN)
        j = skip_space(buf, pos)
        self._pending.append(buf[pos:j])
        if j == n:
            return n
        if state == _OPEN:
            if buf[j] == "{":
                return self._begin_call(j)
            return self._give_back(j)
        # _CLOSE (after a call object) or _BETWEEN (after its `</tool_call>`)
        marker = self._marker_at(_TAG_MARKERS, buf, j)
        if marker == "":
            return n
        if marker == OPEN:
            self._pending = [marker]
            self._state = _OPEN
            return j + len(marker)
        if marker == CLOSE and state == _CLOSE:
            self._pending = []
            self._state = _BETWEEN
            return j + len(marker)
        return self._give_back(j)


def structural_tag(tools: Sequence[ToolSpec]) -> dict | None:
    """The legacy `structural_tag` constraint of one call (SGLang's Qwen 2.5 shape):
    triggered by `<tool_call>`, `begin` is `<tool_call>\\n{"name": "NAME", "arguments": `, the
    schema the tool's parameters (any object when None), `end` `}\\n</tool_call>`. None
    without tools. (The name is written with `json.dumps`, so any name is well quoted.)"""
    return legacy_structural_tag(
        tools,
        lambda name: OPEN + '\n{"name": ' + json.dumps(name) + ', "arguments": ',
        "}\n" + CLOSE,
        OPEN,
    )
