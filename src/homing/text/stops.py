"""Stop strings matched on decoded text, across chunk boundaries.

Rule of the file: text is released as soon as it can no longer be part of a stop string.
After each push the matcher holds back only the longest suffix of the unreleased text that
is a proper prefix of some stop string; everything before it is safe to emit. The stream
stops at the first point where some stop string is complete (the earliest end; on a tie, the
longest stop, i.e. the earliest start). The stop string and everything after it are never
emitted, and the answer does not depend on how the text was cut into chunks.

Pure code: plain strings in, plain results out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopResult:
    """Outcome of one push.

    text: text safe to emit now (may be "").
    matched: the stop string that ended the stream on this push, else None.
    """

    text: str
    matched: str | None = None


class StopMatcher:
    """Streams text through, holding back what could still become a stop string.

    Empty stop strings are ignored (they would match before any text). With no stop
    strings every push returns its text unchanged.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        """Match `stops` (duplicates and empty strings dropped; order does not matter)."""
        self._stops: tuple[str, ...] = tuple(dict.fromkeys(s for s in stops if s))
        # Every proper, non-empty prefix of a stop: a suffix of the pending text equal to one
        # of these may still grow into that stop, so it is held back.
        self._prefixes: frozenset[str] = frozenset(
            stop[:i] for stop in self._stops for i in range(1, len(stop))
        )
        self._max_hold = max((len(s) - 1 for s in self._stops), default=0)
        self._pending = ""
        self._matched: str | None = None

    @property
    def stops(self) -> tuple[str, ...]:
        """The stop strings matched."""
        return self._stops

    @property
    def matched(self) -> str | None:
        """The stop string that ended the stream, or None while none has matched."""
        return self._matched

    @property
    def held(self) -> str:
        """Text held back because it could still become a stop string."""
        return self._pending

    def push(self, text: str) -> StopResult:
        """Add decoded text; return what is safe to emit and the stop matched, if any.

        On a match the result carries the text before the stop (held text included) and
        `matched`; every later push returns StopResult("", None).
        """
        if not self._stops:  # nothing to match or hold back (the common request)
            return StopResult(text)
        if self._matched is not None:
            return StopResult("")
        pending = self._pending + text
        match = self._first_match(pending)
        if match is not None:
            start, stop = match
            self._pending = ""
            self._matched = stop
            return StopResult(pending[:start], stop)
        hold = self._hold_length(pending)
        self._pending = pending[len(pending) - hold :] if hold else ""
        return StopResult(pending[: len(pending) - hold])

    def flush(self) -> str:
        """End of the text with no match: return the held-back text ("" after a match)."""
        held, self._pending = self._pending, ""
        return "" if self._matched is not None else held

    def _first_match(self, text: str) -> tuple[int, str] | None:
        """(start, stop) of the stop occurrence that ends first in `text`, longest on a tie."""
        best: tuple[int, int, str] | None = None  # (end, -len, stop)
        for stop in self._stops:
            start = text.find(stop)
            if start < 0:
                continue
            key = (start + len(stop), -len(stop), stop)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        end, neg_len, stop = best
        return end + neg_len, stop

    def _hold_length(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop."""
        for length in range(min(len(text), self._max_hold), 0, -1):
            if text[len(text) - length :] in self._prefixes:
                return length
        return 0
