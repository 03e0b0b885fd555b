"""Llama 3.1 / 3.2 / 3.3 JSON tool calls.

Format (Meta's Llama-3.1/3.2/3.3-Instruct model cards, "JSON based tool calling"; the
`<|python_tag|>` prefix is what the 3.1 template's `ipython` environment and many
fine-tunes write):

    <|python_tag|>{"name": "NAME", "parameters": {ARGS}}; {"name": "NAME", "parameters": {ARGS}}

Only a JSON object that starts the output (after leading whitespace), or that follows
`<|python_tag|>`, is a call; more calls follow, each after a `;` (or just whitespace). The
object is read by `JsonCallParser` (see `homing.text.tools._json_calls`): the name first
(a `"type": "function"` key before it is skipped), then `"parameters"` (`"arguments"` is
accepted too); the arguments are the model's text from their `{` to the `}` that closes
them (found by the JSON scanner), verbatim; keys after them are skipped. A JSON object in
the middle of text is content; so is `<|python_tag|>` followed by something other than an
object (a built-in tool's `brave_search.call(...)`, code). `<|python_tag|>` ends a call
wherever it comes. Whitespace between and after calls is dropped.

Rule of the file: malformed output follows `homing.text.tools.base` (an object whose
header fails, such as an answer that happens to be JSON, is content, verbatim).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from homing.text.tools._common import Markers, skip_space
from homing.text.tools._json_calls import JsonCallParser
from homing.text.tools._schemas import legacy_structural_tag
from homing.text.tools.base import ToolSpec

PYTHON_TAG = "<|python_tag|>"

_START, _TEXT, _TAG, _AFTER_CALL, _SEP = 10, 11, 12, 13, 14

_TAG_MARKERS = Markers(PYTHON_TAG)


class Llama3JsonParser(JsonCallParser):
    """Incremental parser of Llama 3 JSON tool calls."""

    STOP = PYTHON_TAG
    ARG_KEYS = ("parameters", "arguments")
    TEXT_STATE = _TEXT

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        super().__init__(tools)
        self._state = _START

    def _fast(self, text: str) -> bool:
        return self._state == _TEXT and not _TAG_MARKERS.may_occur(text)

    def _call_done(self, i: int) -> int:
        self._state = _AFTER_CALL
        return i

    def _stopped(self, i: int) -> int:
        self._state = _TEXT
        return i

    def _finish_frame(self, held: str) -> None:
        if self._state == _AFTER_CALL and not held:
            return
        self._out.content(*self._pending, held)

    def _frame_step(self, buf: str, pos: int) -> int:
        n = len(buf)
        state = self._state
        if state == _TEXT:
            return self._text_step(_TAG_MARKERS, buf, pos, _TAG)
        j = skip_space(buf, pos)
        self._pending.append(buf[pos:j])
        if j == n:
            return n
        c = buf[j]
        if c == "{":
            return self._begin_call(j)
        if state == _TAG or state == _SEP:
            return self._give_back(j)
        if state == _AFTER_CALL and c == ";":
            self._pending.append(c)
            self._state = _SEP
            return j + 1
        # _START or _AFTER_CALL: `<|python_tag|>` may come
        marker = self._marker_at(_TAG_MARKERS, buf, j)
        if marker == "":
            return n
        if marker:
            if state == _START:
                self._pending.append(marker)
            else:
                self._pending = [marker]
            self._state = _TAG
            return j + len(marker)
        return self._give_back(j)


def structural_tag(tools: Sequence[ToolSpec]) -> dict | None:
    """The legacy `structural_tag` constraint of one call (SGLang's Llama 3.2 shape, with
    Llama's own `"parameters"` key): triggered by `<|python_tag|>`, `begin` is
    `<|python_tag|>{"name": "NAME", "parameters": `, the schema the tool's parameters (any
    object when None), `end` `}`. A call the model writes without `<|python_tag|>` (at the
    start of the output) is not constrained: a trigger cannot be "the start of the text".
    None without tools."""
    return legacy_structural_tag(
        tools,
        lambda name: PYTHON_TAG + '{"name": ' + json.dumps(name) + ', "parameters": ',
        "}",
        PYTHON_TAG,
    )
