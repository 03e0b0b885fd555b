"""gpt-oss tool calls and reasoning: OpenAI's Harmony response format, read as text.

Format (OpenAI's "Harmony response format" guide; SGLang's `gpt_oss` detector and Harmony
parser; vLLM's `openai` tool parser). The gateway detokenizes with special tokens kept, so
an answer reads as messages (the call's header and body are one line, cut here):

    <|channel|>analysis<|message|>THINKING<|end|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>
    ARGS<|call|>
    <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>

A message is a header, `<|message|>`, a body, and an end token (`<|end|>`, `<|call|>` or
`<|return|>`; the last two are stop tokens, which the gateway does not show). The prompt
ends with `<|start|>assistant`, so the first header is the rest of that one: it starts with
`<|channel|>` (or ` to=RECIPIENT`, the recipient may come in the role part:
`<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>`). A header
is read whole, up to `<|message|>` (at most `MAX_NAME_CHARS`), and decides the body:

- a recipient `functions.NAME` of a declared function: a call; `CallStart` at
  `<|message|>`, and the body, verbatim, is its arguments (JSON text; the `<|constrain|>`
  type is not checked); a text cut short leaves them partial;
- another recipient (an undeclared function, a built-in tool such as `browser.search`):
  the message is content, verbatim, its tokens included;
- no recipient: the `analysis` channel is reasoning (`ReasoningDelta`); any other channel
  (`final`, `commentary` preambles) is content.

A body also ends where a new message begins (`<|start|>` or `<|channel|>`) without its end
token. Text outside messages is content (an answer that is not Harmony at all is content),
less stray end tokens. A header that fails (too long, an end token or `<|start|>` inside
it, or a first header that starts with neither `<|channel|>` nor `to=`) is content,
verbatim.

Why not the `openai-harmony` package (its `StreamableParser` over token ids):
`load_harmony_encoding` downloads the `o200k_base.tiktoken` vocabulary on first use and
fails without network access (openai/harmony#46 and #95; the same failure stops smg's router,
sglang#18074), so a gateway in a closed network could not start it without extra files; it
parses token ids, while every parser here reads the detokenized text (with stop strings and
held-back characters already applied); and it would add a native dependency for one family.
The format is a handful of special tokens, so this parser reads it from the text.

Rule of the file: malformed output follows `homing.text.tools.base`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from homing.text.output import Event
from homing.text.tools._common import Markers, StepParser, declared
from homing.text.tools.base import MAX_NAME_CHARS, ToolSpec

START = "<|start|>"
CHANNEL = "<|channel|>"
CONSTRAIN = "<|constrain|>"
MESSAGE = "<|message|>"
END = "<|end|>"
CALL = "<|call|>"
RETURN = "<|return|>"

_ENDS = (END, CALL, RETURN)
_TEXT_MARKERS = Markers(START, CHANNEL, *_ENDS)
_HEADER_MARKERS = Markers(MESSAGE, START, *_ENDS)
_BODY_MARKERS = Markers(START, CHANNEL, *_ENDS)
_FIRST_HEADERS = (CHANNEL, "to=", MESSAGE)
_RECIPIENT = re.compile(r"to=([^\s<]+)")

_TEXT, _HEADER, _BODY = range(3)
_REASONING, _CONTENT, _CALL, _VERBATIM = range(4)


def _first_header_ok(text: str) -> bool:
    """Whether `text` may begin the first header (the rest of `<|start|>assistant`)."""
    text = text.lstrip()
    return any(text.startswith(p) or p.startswith(text) for p in _FIRST_HEADERS)


class GptOssParser(StepParser):
    """Incremental parser of gpt-oss Harmony answers: reasoning, content and calls."""

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        super().__init__()
        self._names = declared(tools)
        self._state = _HEADER
        self._first = True
        self._pending: list[str] = []
        """The message's raw text so far (its `<|start|>` included): content if it fails."""
        self._header: list[str] = []
        self._length = 0
        self._kind = _CONTENT
        self._calls = 0

    def finish(self) -> list[Event]:
        """Events for the text still held back; the model wrote its last text."""
        held, self._held = self._held, ""
        if self._state == _BODY:
            self._body(held)
        else:
            self._out.content(*self._pending, held)
        self._pending = []
        self._header = []
        self._state = _TEXT
        return self._out.take()

    def _body(self, text: str) -> None:
        if not text:
            return
        kind = self._kind
        if kind == _CALL:
            self._out.args(self._calls - 1, text)
        elif kind == _REASONING:
            self._out.reasoning(text)
        else:
            self._out.content(text)

    def _begin(self, marker: str) -> None:
        """A message's header starts with `marker` (`<|start|>` or `<|channel|>`)."""
        self._pending = [marker]
        self._header = [] if marker == START else [marker]
        self._length = 0 if marker == START else len(marker)
        self._first = False
        self._state = _HEADER

    def _give_back(self) -> None:
        self._out.content(*self._pending)
        self._pending = []
        self._header = []
        self._first = False
        self._state = _TEXT

    def _decide(self) -> None:
        """The header is whole: what its body is."""
        header = "".join(self._header)
        role, _, channel_part = header.partition(CHANNEL)
        channel_part = channel_part.replace(CONSTRAIN, " ")
        m = _RECIPIENT.search(role) or _RECIPIENT.search(channel_part)
        words = [w for w in channel_part.split() if not w.startswith("to=")]
        channel = words[0] if words else ""
        if m is not None:
            recipient = m.group(1)
            name = recipient.removeprefix("functions.")
            if recipient.startswith("functions.") and name in self._names:
                self._pending = []
                self._out.start(self._calls, name)
                self._calls += 1
                self._kind = _CALL
            else:
                self._out.content(*self._pending)
                self._pending = []
                self._kind = _VERBATIM
        else:
            self._pending = []
            self._kind = _REASONING if channel == "analysis" else _CONTENT
        self._header = []
        self._state = _BODY

    def _step(self, buf: str, pos: int) -> int:
        n = len(buf)
        state = self._state
        if state == _TEXT:
            found = self._until(_TEXT_MARKERS, buf, pos)
            if found is None:
                return n
            i, marker = found
            if marker in _ENDS:
                return i + len(marker)
            self._begin(marker)
            return i + len(marker)
        if state == _HEADER:
            i, marker = _HEADER_MARKERS.find(buf, pos)
            end = n if marker is None else i
            room = MAX_NAME_CHARS - self._length
            if end - pos > room:
                self._pending.append(buf[pos : pos + room])
                self._give_back()
                return pos + room
            piece = buf[pos:end]
            self._pending.append(piece)
            self._header.append(piece)
            self._length += len(piece)
            if self._first and not _first_header_ok("".join(self._header)):
                self._give_back()
                return end
            if marker is None:
                return n
            if not marker:
                self._held = buf[i:]
                return n
            if marker != MESSAGE:
                self._give_back()
                return i
            self._pending.append(marker)
            self._decide()
            return i + len(marker)
        # _BODY
        found = self._until(_BODY_MARKERS, buf, pos, self._body)
        if found is None:
            return n
        i, marker = found
        if marker in _ENDS:
            if self._kind == _VERBATIM:
                self._out.content(marker)
            self._state = _TEXT
            return i + len(marker)
        self._state = _TEXT
        return i


def structural_tag(tools: Sequence[ToolSpec]) -> dict | None:
    """None: no `structural_tag` constraint is built for Harmony's format, so a strict
    function of a gpt-oss model is refused (400, `unsupported_parameter`)."""
    return None
