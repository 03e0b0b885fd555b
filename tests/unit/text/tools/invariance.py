"""Shared checks of the tool-call parser tests: chunk invariance, streaming, fuzzed texts.

`assert_invariant(factory, text)` parses `text` whole, one character per feed, cut in two at
every position (short texts), and cut at random (seeded), and asserts that every way gives
the same `Parsed`; it returns that `Parsed`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence

from homing.text.output import CallArguments, Event, OutputParser, Parsed, merge, parse_chunks
from homing.text.tools.base import ToolSpec

Factory = Callable[[], OutputParser]

WEATHER = ToolSpec(
    "get_weather",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"],
    },
)
TIME = ToolSpec("get_time", {"type": "object", "properties": {"tz": {"type": "string"}}})
SEARCH = ToolSpec("web.search-v2", None)
TOOLS = (WEATHER, TIME, SEARCH)


def random_cuts(text: str, rng: random.Random, most: int) -> list[str]:
    """`text` cut into pieces of 1 to `most` characters."""
    pieces: list[str] = []
    i = 0
    while i < len(text):
        k = rng.randint(1, most)
        pieces.append(text[i : i + k])
        i += k
    return pieces


def chunkings(text: str, seed: int = 0, rounds: int = 40) -> Iterator[list[str]]:
    """Ways to cut `text`: whole, per character, in two at every position (texts up to 400
    characters), and `rounds` seeded random cuts of growing piece sizes."""
    yield [text]
    yield list(text)
    if len(text) <= 400:
        for i in range(1, len(text)):
            yield [text[:i], text[i:]]
    rng = random.Random(seed)
    for r in range(rounds):
        yield random_cuts(text, rng, 2 + r % 16)


def assert_invariant(factory: Factory, text: str, seed: int = 0, rounds: int = 40) -> Parsed:
    """The `Parsed` of `text`, asserted equal for every way of cutting it (`chunkings`)."""
    whole = parse_chunks(factory(), [text])
    for chunks in chunkings(text, seed, rounds):
        got = parse_chunks(factory(), chunks)
        assert got == whole, f"chunks {chunks!r}: {got!r} != {whole!r}"
    return whole


def feeds(factory: Factory, chunks: Sequence[str]) -> list[list[Event]]:
    """The events of each feed, then of finish (the last entry)."""
    parser = factory()
    out = [parser.feed(chunk) for chunk in chunks]
    out.append(parser.finish())
    merge(e for events in out for e in events)
    return out


def argument_feeds(factory: Factory, chunks: Sequence[str]) -> int:
    """How many feeds (finish excluded) gave a CallArguments event."""
    return sum(
        any(isinstance(e, CallArguments) for e in events) for events in feeds(factory, chunks)[:-1]
    )


def fuzz_texts(fragments: Sequence[str], seed: int, count: int, longest: int = 12) -> list[str]:
    """`count` seeded texts, each 1 to `longest` fragments drawn from `fragments`, plus
    cuts of each: a fragment may stop short (a marker or string cut in the middle)."""
    rng = random.Random(seed)
    texts: list[str] = []
    for _ in range(count):
        parts = [rng.choice(fragments) for _ in range(rng.randint(1, longest))]
        text = "".join(parts)
        texts.append(text)
        if text:
            texts.append(text[: rng.randint(0, len(text))])
    return texts
