"""Pieces every tool-call parser of this package shares (private to it).

- `Emitter` collects one feed's events, joining neighbouring content, reasoning or argument
  pieces.
- `Markers` finds the next marker, or a marker's beginning cut by the end of the text.
- `StepParser` is the parsers' base: `feed` runs the subclass's `_step` over the held text
  and the new text; `_until`, `_region_until` and `_marker_at` read up to a marker, holding
  back a marker's beginning cut by the end of the text until the next feed decides it.

The rule of every parser is in `homing.text.tools.base`. Each state of a parser consumes
text left to right and decides only from the text itself, never from where a feed was
cut: that is what makes the parsers chunk-invariant. Held text is at most a marker's length
(or a capped header), so a stream costs O(n).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from homing.text.output import CallArguments, CallStart, ContentDelta, Event, ReasoningDelta
from homing.text.tools.base import MAX_NAME_CHARS, ToolSpec

_NON_SPACE = re.compile(r"\S")


def skip_space(text: str, pos: int) -> int:
    """Index of the first non-whitespace character at or after `pos` (len(text) if none)."""
    m = _NON_SPACE.search(text, pos)
    return len(text) if m is None else m.start()


def declared(tools: Sequence[ToolSpec]) -> frozenset[str]:
    """The declared function names."""
    return frozenset(tool.name for tool in tools)


def drop(text: str) -> None:
    """A text sink that keeps nothing (for `StepParser._until` in text that is dropped)."""


class Emitter:
    """One feed's events; neighbouring content, reasoning (or same-call argument) pieces are
    joined."""

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
            elif self._kind == "reasoning":
                self._events.append(ReasoningDelta(text))
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

    def reasoning(self, text: str) -> None:
        """Append reasoning text (an empty one is ignored)."""
        if text:
            if self._kind != "reasoning":
                self._flush()
                self._kind = "reasoning"
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


class StepParser:
    """Base of the incremental parsers: `feed` reads the text held back from the last feed
    and the new text in steps. `_step(buf, pos)` reads on from `pos` in the current state
    and returns the index to go on from (the same index only with a new state); the end of
    `buf` that may still begin a marker goes to `_held`, read again by the next feed.

    Subclasses write `_step` and `finish`, and may write `_fast(text)`: True lets a feed's
    text (nothing held) pass through as content without a step.
    """

    def __init__(self) -> None:
        self._out = Emitter()
        self._held = ""

    def _fast(self, text: str) -> bool:
        """Whether `text` can pass through as content at once (asked when nothing is held)."""
        return False

    def _step(self, buf: str, pos: int) -> int:
        """Read `buf` from `pos` in the current state; the index to read on from."""
        raise NotImplementedError

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

    def _until(
        self, markers: Markers, buf: str, pos: int, emit: Callable[[str], object] | None = None
    ) -> tuple[int, str] | None:
        """Pass the text from `pos` up to the first of `markers` to `emit` (content when
        None): `(i, marker)` for a whole marker at i, or None when the text ran out (a
        marker's beginning at its end is held back)."""
        i, marker = markers.find(buf, pos)
        if emit is None:
            emit = self._out.content
        if marker is None:
            emit(buf[pos:])
            return None
        emit(buf[pos:i])
        if not marker:
            self._held = buf[i:]
            return None
        return i, marker

    def _region_until(
        self, markers: Markers, buf: str, pos: int, got: int
    ) -> tuple[int, str | None]:
        """Read a capped region (a header of at most `MAX_NAME_CHARS`, `got` characters of it
        read already) from `pos` up to the first of `markers`: `(i, marker)` where buf[pos:i]
        is more of the region and a whole marker starts at i; `(i, "")` when the text ran
        out (from i on a marker's beginning is held back); `(i, None)` when the region, with
        buf[pos:i], is over the cap."""
        limit = pos + MAX_NAME_CHARS + 1 - got
        i, marker = markers.find(buf, pos, limit)
        if marker is None:
            n = len(buf)
            return (n, "") if n < limit else (limit, None)
        if not marker:
            self._held = buf[i:]
        return i, marker

    def _marker_at(self, markers: Markers, buf: str, j: int) -> str | None:
        """The whole marker of `markers` at `j`, None when none starts there, or "" when the
        text ends inside one (held back from j)."""
        _, marker = markers.find(buf, j, j + 1)
        if marker == "":
            self._held = buf[j:]
        return marker
