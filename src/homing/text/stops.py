"""Stop strings matched on decoded text, across chunk boundaries.

Rule of the file: text is released as soon as it can no longer be part of a stop string.
After each push the matcher holds back only the longest suffix of the unreleased text that
is a proper prefix of some stop string; everything before it is safe to emit. The stream
stops at the first point where some stop string is complete (the earliest end; on a tie, the
longest stop, i.e. the earliest start). The stop string and everything after it are never
emitted, and the answer does not depend on how the text was cut into chunks.

Cost: a request's stop strings are compiled once into a `StopSet`, an Aho-Corasick automaton
(Aho and Corasick, "Efficient string matching", CACM 1975) with at most one state per stop
character, shared by the request's choices. Set-up only lays the states out with C-speed list
operations; the transitions and failure links of a depth are built the first time some
choice's text reaches that depth, at most 2 look-ups per stop character in all. Each choice
runs its own `StopMatcher`, which holds only an automaton state (the held text is the text the
state spells, never copied): at most 2 look-ups per character pushed, none for text with no
character that begins a stop. Libraries such as pyahocorasick report matches but not the
state's depth, which is the hold-back, hence this small automaton of our own.

Pure code: plain strings in, plain results out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Transitions live in one dict keyed by `state << _CHAR_BITS | ord(char)`: code points fit in
# 21 bits (the last is U+10FFFF), and one flat dict is far smaller than a dict per state.
_CHAR_BITS = 21
_UNBUILT = -2  # match[] of a state whose depth is not built yet


@dataclass(frozen=True)
class StopResult:
    """Outcome of one push.

    text: text safe to emit now (may be "").
    matched: the stop string that ended the stream on this push, else None.
    """

    text: str
    matched: str | None = None


class StopSet:
    """A request's stop strings compiled once; logically immutable, shared by all its choices.

    Empty strings and duplicates are dropped (an empty stop would match before any text); order
    does not matter. States: the root plus one per distinct non-empty stop prefix, so at most
    1 + the total stop length. Set-up only lays out the states (C-speed list operations); the
    transitions and failure links of each depth are filled in the first time some matcher's
    text reaches that depth, once for all matchers of the set.
    """

    __slots__ = (
        "_build_steps",
        "_chains",
        "_depth",
        "_fail",
        "_first",
        "_goto",
        "_label",
        "_match",
        "_open",
        "_ready",
        "_starts",
        "_terminal",
        "stops",
    )

    def __init__(self, stops: Iterable[str] = ()) -> None:
        """Compile `stops`; O(total length) C-speed list work, no per-character Python loop."""
        self.stops: tuple[str, ...] = tuple(dict.fromkeys(s for s in stops if s))
        # Each stop adds a chain of states for its characters past the longest prefix it
        # shares with an earlier stop: (first state, shared length, that earlier stop or -1).
        self._chains: list[tuple[int, int, int]] = []
        self._depth = [0]  # length of the text a state spells
        self._label = [0]  # index of a stop whose first depth[state] characters spell the state
        for index, stop in enumerate(self.stops):
            shared, base = 0, -1
            for earlier in range(index):
                length = _common_prefix_length(stop, self.stops[earlier])
                if length > shared:
                    shared, base = length, earlier
            self._chains.append((len(self._depth), shared, base))
            self._depth.extend(range(shared + 1, len(stop) + 1))
            self._label.extend([index] * (len(stop) - shared))
        size = len(self._depth)
        # fail[s]: the state of the longest proper suffix of s's text that is a stop prefix.
        self._fail = [0] * size
        # match[s]: index of the longest stop that ends s's text, -1 if none, _UNBUILT until
        # the depth of s is built.
        self._match = [_UNBUILT] * size
        self._match[0] = -1
        self._terminal = {self._state(i, len(stop)): i for i, stop in enumerate(self.stops)}
        self._goto: dict[int, int] = {}  # state << _CHAR_BITS | ord(char) -> state
        self._first = frozenset(stop[0] for stop in self.stops)
        self._ready = 0  # depths <= this have links; transitions exist up to this + 1
        self._build_steps = 0
        # Chains by the depth of their first state, and those that reach the depth of the
        # latest transitions: each depth touches only its own states.
        self._starts: dict[int, list[int]] = {}
        for index, (_, shared, _) in enumerate(self._chains):
            if shared < len(self.stops[index]):
                self._starts.setdefault(shared + 1, []).append(index)
        self._open: list[int] = []
        self._add_transitions(1)

    @property
    def states(self) -> int:
        """Automaton states: 1 + the number of distinct non-empty stop prefixes."""
        return len(self._depth)

    @property
    def built_depth(self) -> int:
        """Depth up to which links are built (the deepest any matcher's text has reached)."""
        return self._ready

    @property
    def build_steps(self) -> int:
        """Transition look-ups spent on failure links so far; at most 2 x the total stop length."""
        return self._build_steps

    def matcher(self) -> StopMatcher:
        """A fresh matcher for one choice's text."""
        return StopMatcher(self)

    def __bool__(self) -> bool:
        return bool(self.stops)

    def __repr__(self) -> str:
        return f"StopSet({list(self.stops)!r})"

    def _state(self, index: int, length: int) -> int:
        """The state that spells the first `length` characters of stop `index`."""
        while length:
            first, shared, base = self._chains[index]
            if length > shared:
                return first + length - shared - 1
            index = base
        return 0

    def _add_transitions(self, depth: int) -> None:
        """Add the transitions into the states of `depth` (one per chain reaching it); called
        for depths 1, 2, ... in turn."""
        self._open = [i for i in self._open if len(self.stops[i]) >= depth]
        self._open += self._starts.pop(depth, ())
        for index in self._open:
            first, shared, _ = self._chains[index]
            state = first + depth - shared - 1
            parent = state - 1 if depth - 1 > shared else self._state(index, depth - 1)
            self._goto[parent << _CHAR_BITS | ord(self.stops[index][depth - 1])] = state

    def _build_next_depth(self) -> None:
        """Link the states one deeper than built (their links are shallower, so known), then
        add the transitions out of them. Each depth is built once."""
        depth = self._ready + 1
        goto, fail, match = self._goto, self._fail, self._match
        for index in self._open:  # the chains with a state at `depth`
            first, shared, _ = self._chains[index]
            stop = self.stops[index]
            state = first + depth - shared - 1
            nxt = 0
            if depth > 1:
                code = ord(stop[depth - 1])
                link = fail[state - 1 if depth - 1 > shared else self._state(index, depth - 1)]
                while True:
                    self._build_steps += 1
                    found = goto.get(link << _CHAR_BITS | code)
                    if found is not None:
                        nxt = found
                        break
                    if not link:
                        break
                    link = fail[link]
            fail[state] = nxt
            match[state] = self._terminal.get(state, match[nxt])
        self._add_transitions(depth + 1)
        self._ready = depth


def _common_prefix_length(a: str, b: str) -> int:
    """Length of the longest common prefix of `a` and `b` (binary search on C-speed compares)."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a.startswith(b[:mid]):
            low = mid
        else:
            high = mid - 1
    return low


NO_STOPS = StopSet()


class StopMatcher:
    """Streams one choice's text through, holding back what could still become a stop string.

    With no stop strings every push returns its text unchanged, with no per-character work.
    """

    __slots__ = ("_matched", "_set", "_state", "_steps")

    def __init__(self, stops: StopSet | Iterable[str]) -> None:
        """Match a compiled `StopSet`, or compile the given strings for this matcher alone."""
        self._set = stops if isinstance(stops, StopSet) else StopSet(stops)
        self._state = 0  # the automaton state: the held text is the text it spells
        self._matched: str | None = None
        self._steps = 0

    @property
    def stops(self) -> tuple[str, ...]:
        """The stop strings matched."""
        return self._set.stops

    @property
    def matched(self) -> str | None:
        """The stop string that ended the stream, or None while none has matched."""
        return self._matched

    @property
    def held(self) -> str:
        """Text held back because it could still become a stop string."""
        return self._held(self._set._depth[self._state])

    @property
    def steps(self) -> int:
        """Automaton transitions looked up so far; at most 2 x the characters pushed."""
        return self._steps

    def push(self, text: str) -> StopResult:
        """Add decoded text; return what is safe to emit and the stop matched, if any.

        On a match the result carries the text before the stop (held text included) and
        `matched`; every later push returns StopResult("", None).
        """
        compiled = self._set
        if not compiled.stops:  # nothing to match or hold back (the common request)
            return StopResult(text)
        if self._matched is not None:
            return StopResult("")
        state = self._state
        if state == 0 and compiled._first.isdisjoint(text):
            return StopResult(text)  # no character of it can begin a stop
        goto, fail, match = compiled._goto, compiled._fail, compiled._match
        held = compiled._depth[state]
        steps = 0
        for position, ch in enumerate(text):
            code = ord(ch)
            while True:
                steps += 1
                nxt = goto.get(state << _CHAR_BITS | code)
                if nxt is not None:
                    state = nxt
                    break
                if state == 0:
                    break
                state = fail[state]
            found = match[state]
            if found == _UNBUILT:  # the first text to reach this depth: build it
                compiled._build_next_depth()
                found = match[state]
            if found >= 0:
                stop = compiled.stops[found]
                before = self._release(held, text, held + position + 1 - len(stop))
                self._steps += steps
                self._state = 0
                self._matched = stop
                return StopResult(before, stop)
        safe = self._release(held, text, held + len(text) - compiled._depth[state])
        self._steps += steps
        self._state = state
        return StopResult(safe)

    def flush(self) -> str:
        """End of the text with no match: return the held-back text ("" after a match)."""
        held = "" if self._matched is not None else self.held
        self._state = 0
        return held

    def _held(self, length: int) -> str:
        """The first `length` characters of the text the current state spells."""
        if length == 0:
            return ""
        return self._set.stops[self._set._label[self._state]][:length]

    def _release(self, held: int, text: str, length: int) -> str:
        """The first `length` characters of (held text + `text`), `held` being the held length.

        Called before `_state` moves on, as the held text is read from it; O(length).
        """
        if length <= held:
            return self._held(length)
        return self._held(held) + text[: length - held]
