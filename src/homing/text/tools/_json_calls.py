"""Calls written as JSON objects, `{"name": "f", "arguments": {...}}` (private to the
package): their header reader and `JsonCallParser`, the base of the Hermes, Llama 3,
Mistral and constrained-array parsers.

- `CallHeader` reads a call object's header, `{"name": "f", "arguments": `, up to the `{`
  of the arguments, one character at a time (the header is short: at most
  `MAX_NAME_CHARS`).
- `scan_args` reads JSON arguments (or the rest of a call object) with a `JsonScanner`,
  pausing at a marker that ends the call early.
- `JsonCallParser` reads one call object after another; subclasses read the frame around.

Arguments are scanned once, so a stream costs O(n); the rule of every parser is in
`homing.text.tools.base`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from enum import Enum

from homing.text.jsonscan import JsonScanner, Scan
from homing.text.output import Event
from homing.text.tools._common import Markers, StepParser, declared, skip_space
from homing.text.tools.base import MAX_NAME_CHARS, ToolSpec


class Header(Enum):
    """How a `CallHeader.feed` ended."""

    DONE = "done"
    """The header is whole; the index is the arguments' `{`, unread."""
    FAIL = "fail"
    """The text is not a call's header; the index is the first character not part of it."""
    MORE = "more"
    """All of the text was read; the header goes on in the next text."""
    BARE = "bare"
    """The object closed after its name, with no arguments key (a call of no arguments);
    the index is just past its `}`."""


# CallHeader states.
_H_OPEN, _H_KEY_WS, _H_KEY, _H_COLON, _H_ARGS_WS, _H_VAL_WS, _H_VAL, _H_COMMA = range(8)


class CallHeader:
    """Reads `{"name": "f", "arguments": ` up to the arguments' `{`, character by character.

    The object must open with `{`; keys before the arguments key (one of `arg_keys`) are
    `"name"`, whose string value must be a declared function, or any other key with a string
    value (`"type": "function"`, an `"id"`), which is skipped. The arguments key must come
    after the name and its value must be an object; an object that closes after the name
    without one is a call of no arguments (BARE). A header longer than `MAX_NAME_CHARS`
    fails.
    """

    __slots__ = ("_arg_keys", "_esc", "_key", "_length", "_names", "_raw", "_state", "name")

    def __init__(self, names: frozenset[str], arg_keys: tuple[str, ...]) -> None:
        self._names = names
        self._arg_keys = arg_keys
        self._state = _H_OPEN
        self._length = 0
        self._raw: list[str] = []
        self._esc = False
        self._key = ""
        self.name: str | None = None

    @staticmethod
    def _decode(raw: list[str]) -> str | None:
        try:
            value = json.loads('"' + "".join(raw) + '"')
        except ValueError:
            return None
        return value if isinstance(value, str) else None

    def feed(self, text: str, pos: int) -> tuple[Header, int]:
        """Read on from `pos`: DONE at the arguments' `{`, FAIL where the text stops being a
        header, or MORE at the end of the text."""
        n = len(text)
        i = pos
        while i < n:
            if self._length >= MAX_NAME_CHARS:
                return Header.FAIL, i
            c = text[i]
            state = self._state
            if state == _H_KEY or state == _H_VAL:
                if self._esc:
                    self._esc = False
                    self._raw.append(c)
                elif c == "\\":
                    self._esc = True
                    self._raw.append(c)
                elif c == '"':
                    value = self._decode(self._raw)
                    if value is None:
                        return Header.FAIL, i
                    if state == _H_KEY:
                        self._key = value
                        self._state = _H_COLON
                    else:
                        if self._key == "name":
                            if value not in self._names:
                                return Header.FAIL, i
                            self.name = value
                        self._state = _H_COMMA
                else:
                    self._raw.append(c)
            elif c in " \t\r\n" and state != _H_OPEN:
                pass
            elif state == _H_OPEN:
                if c != "{":
                    return Header.FAIL, i
                self._state = _H_KEY_WS
            elif state == _H_KEY_WS:
                if c != '"':
                    return Header.FAIL, i
                self._raw = []
                self._state = _H_KEY
            elif state == _H_COLON:
                if c != ":":
                    return Header.FAIL, i
                if self._key in self._arg_keys:
                    if self.name is None:
                        return Header.FAIL, i
                    self._state = _H_ARGS_WS
                else:
                    self._state = _H_VAL_WS
            elif state == _H_ARGS_WS:
                return (Header.DONE, i) if c == "{" else (Header.FAIL, i)
            elif state == _H_VAL_WS:
                if c != '"':
                    return Header.FAIL, i
                self._raw = []
                self._state = _H_VAL
            else:  # _H_COMMA
                if c == "}" and self.name is not None:
                    return Header.BARE, i + 1
                if c != ",":
                    return Header.FAIL, i
                self._state = _H_KEY_WS
            self._length += 1
            i += 1
        return Header.MORE, n


class Args(Enum):
    """How `scan_args` ended."""

    CLOSED = "closed"
    """The JSON value closed; the index is just past it."""
    MORE = "more"
    """All of the text was read."""
    HOLD = "hold"
    """The text ends inside what may be the stop marker, from the index on."""
    STOP = "stop"
    """The stop marker starts at the index."""


def scan_args(scanner: JsonScanner, text: str, pos: int, stop: str) -> tuple[Args, int]:
    """Read JSON text from `pos` with `scanner` (built with `stop[0]` as its stop character
    when `stop` is not empty) until the value closes, the text ends, or the `stop` marker
    starts (inside a string too: a marker is a special token, never JSON text)."""
    n = len(text)
    i = pos
    while True:
        result, k = scanner.scan(text, i)
        if result is Scan.CLOSED:
            return Args.CLOSED, k
        if result is Scan.MORE:
            return Args.MORE, k
        if text.startswith(stop, k):
            return Args.STOP, k
        if n - k < len(stop) and stop.startswith(text[k:]):
            return Args.HOLD, k
        result, _ = scanner.scan(text, k, k + 1, stop=False)
        if result is Scan.CLOSED:
            return Args.CLOSED, k + 1
        i = k + 1


# JsonCallParser states; subclasses number theirs from 10.
J_HEADER, J_ARGS, J_AFTER, J_EXTRA = range(4)


class JsonCallParser(StepParser):
    """Base of the parsers whose calls are JSON objects, `{"name": ..., "arguments": {...}}`.

    It reads one call object: the header (`CallHeader`), the arguments (streamed verbatim
    from their `{` to the `}` that closes them, found by a `JsonScanner`), then the rest of
    the object: `}` ends it; `,` starts keys after the arguments (an `"id"`...), skipped to
    the object's close; anything else ends the call there (the object is left unclosed).
    `STOP`, a special token that cannot be JSON text, ends a call wherever it comes.

    Subclasses read the frame around the objects in their own states (numbered from 10,
    `_frame_step`) and say where a call leads: `_give_back` (header failed), `_call_done`
    (object read), `_stopped` (STOP came inside the call).
    """

    STOP = ""
    ARG_KEYS: tuple[str, ...] = ("arguments", "parameters")
    TEXT_STATE = 10
    """The state of free text, where a failed call's text goes."""
    CUT_HEADER_IS_CONTENT = True
    """Whether a call cut before its name is whole is given back as content (False: output
    that can only be calls, under a constraint, drops it)."""

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        super().__init__()
        self._names = declared(tools)
        self._pending: list[str] = []
        """Text read but not decided: given back as content if the call fails."""
        self._state = self.TEXT_STATE
        self._calls = 0
        self._header = CallHeader(self._names, self.ARG_KEYS)
        self._scanner = JsonScanner()

    def finish(self) -> list[Event]:
        """Events for the text still held back; the model wrote its last text. A call cut
        after its declared name is a call (arguments as far as written, maybe none); one cut
        before is content (see `CUT_HEADER_IS_CONTENT`)."""
        held, self._held = self._held, ""
        state = self._state
        if state == J_HEADER and self._header.name is not None:
            self._out.start(self._calls, self._header.name)  # cut after its name: a call
            self._calls += 1
        elif state == J_HEADER:
            if self.CUT_HEADER_IS_CONTENT:
                self._out.content(*self._pending, held)
        elif state == J_ARGS:
            self._out.args(self._calls - 1, held)
        elif state in (J_AFTER, J_EXTRA):
            pass
        else:
            self._finish_frame(held)
        self._pending = []
        self._state = self.TEXT_STATE
        return self._out.take()

    def _text_step(self, markers: Markers, buf: str, pos: int, opened: int) -> int:
        """`_step` in free text: content up to the first of `markers`, a frame's opening
        marker, which becomes the pending text; state `opened` reads on after it."""
        found = self._until(markers, buf, pos)
        if found is None:
            return len(buf)
        i, marker = found
        self._pending = [marker]
        self._state = opened
        return i + len(marker)

    def _begin_call(self, i: int) -> int:
        """Read a call object from its `{` at `i` (the pending text stays pending)."""
        self._header = CallHeader(self._names, self.ARG_KEYS)
        self._state = J_HEADER
        return i

    def _give_back(self, i: int) -> int:
        """The call failed before its header was whole: the pending text is content, and
        text is read on from `i`."""
        self._out.content(*self._pending)
        self._pending = []
        self._state = self.TEXT_STATE
        return i

    def _args_closed(self, i: int) -> int:
        """The arguments' `}` was read, just before `i`: the rest of the call object
        follows (a format whose arguments stand alone ends the call here instead)."""
        self._state = J_AFTER
        return i

    def _call_done(self, i: int) -> int:
        """The call object was read; read on from `i`."""
        raise NotImplementedError

    def _stopped(self, i: int) -> int:
        """STOP starts at `i`, inside a call."""
        raise NotImplementedError

    def _frame_step(self, buf: str, pos: int) -> int:
        """`_step` in a frame state (numbered from 10)."""
        raise NotImplementedError

    def _finish_frame(self, held: str) -> None:
        """`finish` in a frame state, `held` the text held back."""
        raise NotImplementedError

    def _step(self, buf: str, pos: int) -> int:
        n = len(buf)
        state = self._state
        if state == J_HEADER:
            result, i = self._header.feed(buf, pos)
            self._pending.append(buf[pos:i])
            if result is Header.MORE:
                return n
            if result is Header.FAIL:
                return self._give_back(i)
            self._pending = []
            assert self._header.name is not None
            self._out.start(self._calls, self._header.name)
            self._calls += 1
            if result is Header.BARE:  # `{"name": "f"}`: a call of no arguments
                self._out.args(self._calls - 1, "{}")
                return self._call_done(i)
            self._scanner = JsonScanner(stops=self.STOP[:1])
            self._state = J_ARGS
            return i
        if state == J_ARGS or state == J_EXTRA:
            result, k = scan_args(self._scanner, buf, pos, self.STOP)
            if state == J_ARGS:
                self._out.args(self._calls - 1, buf[pos:k])
            if result is Args.CLOSED:
                if state == J_ARGS:
                    return self._args_closed(k)
                return self._call_done(k)
            if result is Args.MORE:
                return n
            if result is Args.HOLD:
                self._held = buf[k:]
                return n
            return self._stopped(k)
        if state == J_AFTER:
            j = skip_space(buf, pos)
            if j == n:
                return n
            c = buf[j]
            if c == "}":
                return self._call_done(j + 1)
            if c == ",":
                self._scanner = JsonScanner(depth=1, stops=self.STOP[:1])
                self._state = J_EXTRA
                return j + 1
            return self._call_done(j)
        return self._frame_step(buf, pos)
