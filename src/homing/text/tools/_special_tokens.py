"""`SpecialTokenParser`: the whole parser of the formats built of special tokens only
(DeepSeek V3 and V3.1, Kimi K2), private to the package: a section of calls, each a header
and arguments that run to the call's end token. The rule of every parser is in
`homing.text.tools.base`.
"""

from __future__ import annotations

from collections.abc import Sequence

from homing.text.output import Event
from homing.text.tools._common import Markers, StepParser, declared, skip_space
from homing.text.tools.base import ToolSpec

# SpecialTokenParser states.
_TEXT, _SECTION, _HEADER, _OPEN, _ARGS = range(5)


class SpecialTokenParser(StepParser):
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
        super().__init__()
        self._names = declared(tools)
        self._text_markers = Markers(*self.SECTION_BEGINS, self.CALL_BEGIN, *self.SECTION_ENDS)
        self._header_markers = Markers(
            self.HEADER_END, *(t for t in self.TOKENS if t not in self.HEADER_TOKENS)
        )
        self._token_markers = Markers(*self.TOKENS)
        self._state = _TEXT
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

    def _fast(self, text: str) -> bool:
        return self._state == _TEXT and not self._text_markers.may_occur(text)

    def finish(self) -> list[Event]:
        """Events for the text still held back; the model wrote its last text. A call cut
        after its whole header is a call (arguments as far as written, maybe none); one cut
        before is content."""
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
            found = self._until(self._text_markers, buf, pos)
            if found is None:
                return n
            i, marker = found
            return self._at_marker(marker, i)
        if state == _SECTION:
            j = skip_space(buf, pos)
            self._pending.append(buf[pos:j])
            if j == n:
                return n
            marker = self._marker_at(self._text_markers, buf, j)
            if marker == "":
                return n
            if marker is None:
                self._give_back()
                return j
            return self._at_marker(marker, j)
        if state == _HEADER:
            i, marker = self._region_until(self._header_markers, buf, pos, len(self._region))
            self._region += buf[pos:i]
            if marker == "":
                return n
            if marker != self.HEADER_END:  # another token, or a header over the cap
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
