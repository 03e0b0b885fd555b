"""An incremental scanner of JSON structure: where a streamed object or array ends.

The tool-call parsers stream a call's arguments verbatim and must find where the arguments'
JSON value ends when the format has no end marker of its own (Llama 3, Hermes, Mistral v3,
the constrained JSON array). `JsonScanner` reads the text once, in pieces, keeping only its
state between pieces: the nesting depth of `{`/`[`, whether it is inside a string, and
whether the last character was a string's backslash (so `\\"`, `\\\\` or `\\u00e9` split
between two pieces reads right). It jumps from one structural character to the next with a
character-class regex (no backtracking), so a whole stream costs O(n).

It checks structure, not grammar: any `}` or `]` closes the innermost container, and text
between structural characters (numbers, `true`, stray words) is not validated. A value
"ends" when the depth comes back to zero at a closing bracket.

Why not a partial-JSON parser (`partial-json-parser`, pydantic-core's `allow_partial`):
those turn a prefix into a value, so a stream would parse the whole prefix again at every
piece (quadratic) and send re-serialized arguments, not the model's own text. Streaming the
arguments verbatim only needs where the value ends, which this finds in one pass.

Pure code: strings in, positions out.
"""

from __future__ import annotations

import re
from enum import Enum


class Scan(Enum):
    """What `JsonScanner.scan` stopped at."""

    CLOSED = "closed"
    """The value closed; the position is just past its closing bracket."""
    MORE = "more"
    """The range was read to its end without the value closing."""
    STOP = "stop"
    """A stop character (see `JsonScanner`); the position is that character's, unread."""


def _char_class(chars: str) -> re.Pattern[str]:
    return re.compile("[" + "".join(re.escape(c) for c in chars) + "]")


class JsonScanner:
    """The structural state of one JSON value being read piece by piece.

    `depth` is the number of open containers (start it at 1 to read the rest of an object
    whose `{` was already read). `stops` are characters at which `scan` pauses, inside or
    outside strings, so the caller can look for a marker there; the character itself is left
    unread (read it with `scan(text, i, i + 1, stop=False)` when it is not a marker). A stop
    character just after a string's backslash pauses too (a marker is never escaped text);
    read on with `stop=False`, it is the escaped character.
    """

    __slots__ = (
        "_in",
        "_in_stop",
        "_out",
        "_out_stop",
        "_stops",
        "depth",
        "escape",
        "in_string",
    )

    def __init__(self, depth: int = 0, stops: str = "") -> None:
        self.depth = depth
        self.in_string = False
        self.escape = False
        self._stops = stops
        self._out = _char_class('"{}[]')
        self._in = _char_class('"\\')
        self._out_stop = _char_class('"{}[]' + stops) if stops else self._out
        self._in_stop = _char_class('"\\' + stops) if stops else self._in

    def scan(
        self, text: str, start: int = 0, end: int | None = None, *, stop: bool = True
    ) -> tuple[Scan, int]:
        """Read `text[start:end]` on from the current state: `(CLOSED, just past the close)`,
        `(STOP, index of a stop character)` or `(MORE, end)`."""
        n = len(text) if end is None else end
        i = start
        out_rx = self._out_stop if stop else self._out
        in_rx = self._in_stop if stop else self._in
        if self.escape and i < n:
            if stop and self._stops and text[i] in self._stops:
                return Scan.STOP, i
            self.escape = False
            i += 1
        while i < n:
            if self.in_string:
                m = in_rx.search(text, i, n)
                if m is None:
                    return Scan.MORE, n
                j = m.start()
                c = text[j]
                if c == '"':
                    self.in_string = False
                    i = j + 1
                elif c == "\\":
                    self.escape = True
                    if j + 1 >= n:
                        return Scan.MORE, n
                    if stop and self._stops and text[j + 1] in self._stops:
                        return Scan.STOP, j + 1
                    self.escape = False
                    i = j + 2
                else:
                    return Scan.STOP, j
            else:
                m = out_rx.search(text, i, n)
                if m is None:
                    return Scan.MORE, n
                j = m.start()
                c = text[j]
                if c == '"':
                    self.in_string = True
                elif c in "{[":
                    self.depth += 1
                elif c in "}]":
                    self.depth -= 1
                    if self.depth <= 0:
                        self.depth = 0
                        return Scan.CLOSED, j + 1
                else:
                    return Scan.STOP, j
                i = j + 1
        return Scan.MORE, n
