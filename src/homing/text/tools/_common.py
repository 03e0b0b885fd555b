"""Pieces the tool-call parsers of this package share (private to it).

- `Emitter` collects one feed's events, joining neighbouring content or argument pieces.
- `Markers` finds the next marker, or a marker's beginning cut by the end of the text (the
  caller holds that back until the next feed decides it).
- `CallHeader` reads a JSON call object's header, `{"name": "f", "arguments": `, up to the
  `{` of the arguments, one character at a time (the header is short: at most
  `MAX_NAME_CHARS`).
- `scan_args` reads JSON arguments (or the rest of a call object) with a `JsonScanner`,
  pausing at a marker that ends the call early.
- `SpecialTokenParser` is the whole parser of the formats built of special tokens only
  (DeepSeek V3 and V3.1, Kimi K2): a section of calls, each a header and arguments that run
  to the call's end token.

The rule of every parser is in `homing.text.tools.base`. Each state below consumes text left
to right and decides only from the text itself, never from where a feed was cut: that is
what makes the parsers chunk-invariant. Held text is at most a marker's length (or a capped
header), and arguments are scanned once, so a stream costs O(n).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Sequence
from enum import Enum

from homing.text.jsonscan import JsonScanner, Scan
from homing.text.output import CallArguments, CallStart, ContentDelta, Event
from homing.text.tools.base import MAX_NAME_CHARS, ToolSpec

_NON_SPACE = re.compile(r"\S")


def skip_space(text: str, pos: int) -> int:
    """Index of the first non-whitespace character at or after `pos` (len(text) if none)."""
    m = _NON_SPACE.search(text, pos)
    return len(text) if m is None else m.start()


def declared(tools: Sequence[ToolSpec]) -> frozenset[str]:
    """The declared function names."""
    return frozenset(tool.name for tool in tools)


class Emitter:
    """One feed's events; neighbouring content (or same-call argument) pieces are joined."""

    __slots__ = ("_events", "_index", "_kind", "_parts")

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._parts: list[str] = []
        self._kind = ""
        self._index = -1

    def _flush(self) -> None:
        if self._parts:
            text = "".join(self._parts)
            if self._kind == "content":
                self._events.append(ContentDelta(text))
            else:
                self._events.append(CallArguments(self._index, text))
            self._parts = []
        self._kind = ""

    def content(self, *texts: str) -> None:
        """Append content text (empty pieces are ignored)."""
        for text in texts:
            if text:
                if self._kind != "content":
                    self._flush()
                    self._kind = "content"
                self._parts.append(text)

    def start(self, index: int, name: str) -> None:
        """Append a call's header."""
        self._flush()
        self._events.append(CallStart(index, name))

    def args(self, index: int, text: str) -> None:
        """Append a fragment of call `index`'s arguments (empty ones are ignored)."""
        if text:
            if self._kind != "args" or self._index != index:
                self._flush()
                self._kind = "args"
                self._index = index
            self._parts.append(text)

    def take(self) -> list[Event]:
        """The events so far; the emitter starts empty again."""
        self._flush()
        events, self._events = self._events, []
        return events


class Markers:
    """A set of marker strings, searched for in text."""

    __slots__ = ("_first", "markers")

    def __init__(self, *markers: str) -> None:
        self.markers = tuple(sorted(set(markers), key=len, reverse=True))
        firsts = sorted({m[0] for m in self.markers})
        self._first = re.compile("[" + "".join(re.escape(c) for c in firsts) + "]")

    def may_occur(self, text: str) -> bool:
        """Whether `text` holds a character that can begin a marker."""
        return self._first.search(text) is not None

    def find(self, text: str, pos: int, limit: int | None = None) -> tuple[int, str | None]:
        """The first marker starting at an index in [pos, limit): `(i, marker)` when it is
        whole at i, `(i, "")` when the text ends inside it (the rest of the text from i is a
        marker's beginning), `(-1, None)` when there is none."""
        n = len(text)
        end = n if limit is None else min(limit, n)
        i = pos
        while True:
            m = self._first.search(text, i, end)
            if m is None:
                return -1, None
            j = m.start()
            for marker in self.markers:
                if text.startswith(marker, j):
                    return j, marker
            rest = n - j
            for marker in self.markers:
                if rest < len(marker) and marker.startswith(text[j:]):
                    return j, ""
            i = j + 1


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


# SpecialTokenParser states.
_TEXT, _SECTION, _HEADER, _OPEN, _ARGS = range(5)


class SpecialTokenParser:
    """A parser of calls framed by special tokens only; subclasses set the tokens.

    Shape: `SECTION_BEGIN (CALL_BEGIN header HEADER_END args CALL_END)* SECTION_END`, with
    whitespace allowed between the tokens of the section. A bare `CALL_BEGIN` in text opens
    a section too. The header (text between CALL_BEGIN and HEADER_END, at most
    `MAX_NAME_CHARS`) is read by `name_of`; the call's `CallStart` comes at the `{` that
    opens the arguments (only whitespace may come before it). Arguments run to the next
    special token of the format (normally CALL_END), verbatim, less `ARGS_SUFFIX` when they
    end with it. A section's tokens are dropped; a section that holds no good call, and
    every call that fails before its header is whole, are given back as content verbatim.
    """

    SECTION_BEGINS: tuple[str, ...] = ()
    SECTION_ENDS: tuple[str, ...] = ()
    CALL_BEGIN = ""
    HEADER_END = ""
    CALL_END = ""
    TOKENS: tuple[str, ...] = ()
    """All special tokens of the format: each ends a call's arguments."""
    HEADER_TOKENS: tuple[str, ...] = ()
    """The tokens a header may hold (besides its HEADER_END)."""
    ARGS_SUFFIX = ""
    """Text the format writes after the arguments, before CALL_END (dropped)."""

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        self._names = declared(tools)
        self._text_markers = Markers(*self.SECTION_BEGINS, self.CALL_BEGIN, *self.SECTION_ENDS)
        self._header_markers = Markers(
            self.HEADER_END, *(t for t in self.TOKENS if t not in self.HEADER_TOKENS)
        )
        self._token_markers = Markers(*self.TOKENS)
        self._out = Emitter()
        self._state = _TEXT
        self._held = ""
        self._pending: list[str] = []
        """Text read but not decided: given back as content if the call fails."""
        self._frame_only = True
        """Whether `_pending` is whitespace between calls (dropped at the end)."""
        self._in_section = False
        self._region = ""
        self._name = ""
        self._calls = 0

    def name_of(self, header: str) -> str | None:
        """The function name a header (text between CALL_BEGIN and HEADER_END) gives, or
        None when it is malformed."""
        raise NotImplementedError

    def feed(self, text: str) -> list[Event]:
        """Events for the next piece of model output."""
        if not text:
            return []
        if self._state == _TEXT and not self._held and not self._text_markers.may_occur(text):
            return [ContentDelta(text)]
        buf = self._held + text
        self._held = ""
        pos = 0
        n = len(buf)
        while pos < n:
            pos = self._step(buf, pos)
        return self._out.take()

    def finish(self) -> list[Event]:
        """Events for the text still held back; the model wrote its last text. A call cut
        after its declared name is a call (arguments as far as written, maybe none); one cut
        before is content (see `CUT_HEADER_IS_CONTENT`)."""
        held, self._held = self._held, ""
        out = self._out
        state = self._state
        if state == _ARGS:
            if self.ARGS_SUFFIX and held.endswith(self.ARGS_SUFFIX):
                held = held[: -len(self.ARGS_SUFFIX)]
            out.args(self._calls - 1, held)
        elif state == _OPEN:  # cut after a whole header: the call, no arguments written
            out.start(self._calls, self._name)
            self._calls += 1
        elif state == _SECTION and self._frame_only and not held:
            pass
        else:
            out.content(*self._pending, self._region, held)
        self._pending = []
        self._region = ""
        self._state = _TEXT
        return out.take()

    def _give_back(self, *texts: str) -> None:
        """The call being read failed: its text (and the pending text) is content."""
        self._out.content(*self._pending, *texts)
        self._pending = []
        self._frame_only = True
        self._region = ""
        self._state = _TEXT

    def _step(self, buf: str, pos: int) -> int:
        n = len(buf)
        state = self._state
        out = self._out
        if state == _TEXT:
            i, marker = self._text_markers.find(buf, pos)
            if marker is None:
                out.content(buf[pos:])
                return n
            out.content(buf[pos:i])
            if not marker:
                self._held = buf[i:]
                return n
            return self._at_marker(marker, i)
        if state == _SECTION:
            j = skip_space(buf, pos)
            self._pending.append(buf[pos:j])
            if j == n:
                return n
            i, marker = self._text_markers.find(buf, j, j + 1)
            if marker == "":
                self._held = buf[j:]
                return n
            if marker is None:
                self._give_back()
                return j
            return self._at_marker(marker, j)
        if state == _HEADER:
            limit = pos + MAX_NAME_CHARS + 1 - len(self._region)
            i, marker = self._header_markers.find(buf, pos, limit)
            if marker is None:
                if n < limit:
                    self._region += buf[pos:]
                    return n
                self._give_back(self._region, buf[pos:limit])
                return limit
            self._region += buf[pos:i]
            if not marker:
                self._held = buf[i:]
                return n
            if marker != self.HEADER_END:
                self._give_back(self._region)
                return i
            end = i + len(marker)
            name = self.name_of(self._region)
            if name is None or name not in self._names:
                self._give_back(self._region, marker)
                return end
            self._pending.append(self._region + marker)
            self._region = ""
            self._name = name
            self._state = _OPEN
            return end
        if state == _OPEN:
            j = skip_space(buf, pos)
            self._pending.append(buf[pos:j])
            if j == n:
                return n
            if buf[j] != "{":
                self._give_back()
                return j
            self._pending = []
            self._frame_only = True
            self._in_section = True
            out.start(self._calls, self._name)
            self._calls += 1
            self._state = _ARGS
            return j
        # _ARGS
        index = self._calls - 1
        i, marker = self._token_markers.find(buf, pos)
        end = n if i < 0 else i
        suffix = self.ARGS_SUFFIX
        if marker:
            if suffix and buf.endswith(suffix, pos, end):
                out.args(index, buf[pos : end - len(suffix)])
            else:
                out.args(index, buf[pos:end])
            self._state = _SECTION
            self._frame_only = True
            if marker == self.CALL_END:
                return end + len(marker)
            return end
        keep = 0
        for k in range(min(len(suffix), end - pos), 0, -1):
            if buf.startswith(suffix[:k], end - k):
                keep = k
                break
        out.args(index, buf[pos : end - keep])
        if end - keep < n:
            self._held = buf[end - keep :]
        return n

    def _at_marker(self, marker: str, i: int) -> int:
        """Act on a whole text-level marker at `i` (in text or between calls)."""
        end = i + len(marker)
        if marker == self.CALL_BEGIN:
            if self._state == _TEXT:
                self._pending = []
            self._pending.append(marker)
            self._region = ""
            self._state = _HEADER
            return end
        if marker in self.SECTION_BEGINS:
            if self._frame_only:
                self._pending = []
            else:
                self._give_back()
            self._pending.append(marker)
            self._frame_only = False
            self._state = _SECTION
            return end
        # a section end
        if self._in_section and self._frame_only:
            self._pending = []
            self._in_section = False
        else:
            self._out.content(*self._pending, marker)
            self._pending = []
        self._frame_only = True
        self._state = _TEXT
        return end


def arguments_schema(tool: ToolSpec) -> dict:
    """The JSON Schema of a tool's arguments: its `parameters` (a copy), or any object."""
    return copy.deepcopy(tool.parameters) if tool.parameters is not None else {"type": "object"}


def legacy_structural_tag(
    tools: Sequence[ToolSpec], begin: Callable[[str], str], end: str, trigger: str
) -> dict | None:
    """SGLang's legacy `structural_tag` constraint (xgrammar's triggered tags): once the
    model writes `trigger`, it must write `begin(name)` for a declared function, arguments
    that match its schema, then `end`; text outside is free. None without tools."""
    if not tools:
        return None
    return {
        "type": "structural_tag",
        "structures": [
            {"begin": begin(tool.name), "schema": arguments_schema(tool), "end": end}
            for tool in tools
        ],
        "triggers": [trigger],
    }


# JsonCallParser states; subclasses number theirs from 10.
J_HEADER, J_ARGS, J_AFTER, J_EXTRA = range(4)


class JsonCallParser:
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
        self._names = declared(tools)
        self._out = Emitter()
        self._held = ""
        self._pending: list[str] = []
        """Text read but not decided: given back as content if the call fails."""
        self._state = self.TEXT_STATE
        self._calls = 0
        self._header = CallHeader(self._names, self.ARG_KEYS)
        self._scanner = JsonScanner()

    def _fast(self, text: str) -> bool:
        """Whether `text` can pass through as content at once (nothing held)."""
        return False

    def feed(self, text: str) -> list[Event]:
        """Events for the next piece of model output."""
        if not text:
            return []
        if not self._held and self._fast(text):
            return [ContentDelta(text)]
        buf = self._held + text
        self._held = ""
        pos = 0
        n = len(buf)
        while pos < n:
            pos = self._step(buf, pos)
        return self._out.take()

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
        raise NotImplementedError

    def _finish_frame(self, held: str) -> None:
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
