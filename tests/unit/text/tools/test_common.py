"""The shared pieces of the tool-call parsers: `Emitter` joining, `StepParser`'s feed loop
and its marker helpers (hold-back of a cut marker, the name-region cap)."""

from __future__ import annotations

from homing.text.output import CallArguments, CallStart, ContentDelta, Event, ReasoningDelta
from homing.text.tools._common import Emitter, Markers, StepParser
from homing.text.tools.base import MAX_NAME_CHARS

_MARKS = Markers("<a>", "<b>")


def test_emitter_joins_neighbouring_pieces_of_one_kind() -> None:
    out = Emitter()
    out.reasoning("th")
    out.reasoning("")
    out.reasoning("ink")
    out.content("an", "", "swer")
    out.start(0, "f")
    out.args(0, "{")
    out.args(0, "}")
    out.args(1, "{}")
    out.reasoning("more")
    assert out.take() == [
        ReasoningDelta("think"),
        ContentDelta("answer"),
        CallStart(0, "f"),
        CallArguments(0, "{}"),
        CallArguments(1, "{}"),
        ReasoningDelta("more"),
    ]
    assert out.take() == []


class _Until(StepParser):
    """Content up to each marker; a marker is written back as content, in brackets."""

    def _fast(self, text: str) -> bool:
        return not _MARKS.may_occur(text)

    def _step(self, buf: str, pos: int) -> int:
        found = self._until(_MARKS, buf, pos)
        if found is None:
            return len(buf)
        i, marker = found
        self._out.content("[" + marker + "]")
        return i + len(marker)

    def finish(self) -> list[Event]:
        held, self._held = self._held, ""
        self._out.content(held)
        return self._out.take()


def test_until_holds_a_cut_marker_back_to_the_next_feed() -> None:
    parser = _Until()
    assert parser.feed("") == []
    assert parser.feed("plain") == [ContentDelta("plain")]
    assert parser.feed("x <") == [ContentDelta("x ")]
    assert parser.feed("a> y <b") == [ContentDelta("[<a>] y ")]
    assert parser.feed("c") == [ContentDelta("<bc")]
    assert parser.feed("<") == []
    assert parser.finish() == [ContentDelta("<")]


def test_region_until_caps_the_region() -> None:
    parser = _Until()
    body = "n" * MAX_NAME_CHARS
    assert parser._region_until(_MARKS, body + "<a>", 0, 0) == (MAX_NAME_CHARS, "<a>")
    assert parser._region_until(_MARKS, body + "x<a>", 0, 0) == (MAX_NAME_CHARS + 1, None)
    assert parser._region_until(_MARKS, "nn<a>", 0, MAX_NAME_CHARS - 1) == (2, None)
    assert parser._region_until(_MARKS, "nn", 0, 0) == (2, "")
    assert parser._held == ""
    assert parser._region_until(_MARKS, "nn<", 0, 0) == (2, "")
    assert parser._held == "<"


def test_marker_at_reads_one_position() -> None:
    parser = _Until()
    assert parser._marker_at(_MARKS, " <b>", 1) == "<b>"
    assert parser._marker_at(_MARKS, " x<b>", 1) is None
    assert parser._held == ""
    assert parser._marker_at(_MARKS, " <b", 1) == ""
    assert parser._held == "<b"
