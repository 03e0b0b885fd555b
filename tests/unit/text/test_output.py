"""merge and parse_chunks: events of an answer into one Parsed."""

from __future__ import annotations

import pytest

from homing.text.output import (
    CallArguments,
    CallStart,
    ContentDelta,
    Event,
    Parsed,
    ParsedCall,
    ReasoningDelta,
    merge,
    parse_chunks,
)


class Echo:
    """A parser that gives each piece back as content, and "!" at finish."""

    def feed(self, text: str) -> list[Event]:
        return [ContentDelta(text)]

    def finish(self) -> list[Event]:
        return [ContentDelta("!")]


def test_merge_joins_content_reasoning_and_call_arguments() -> None:
    events: list[Event] = [
        ReasoningDelta("think "),
        ContentDelta("a"),
        CallStart(0, "f"),
        ReasoningDelta("more"),
        CallArguments(0, '{"x": '),
        CallStart(1, "g"),
        CallArguments(0, "1}"),
        CallArguments(1, "{}"),
        ContentDelta("b"),
    ]
    assert merge(events) == Parsed(
        content="ab",
        reasoning="think more",
        calls=[ParsedCall("f", '{"x": 1}'), ParsedCall("g", "{}")],
    )


def test_merge_of_no_events_is_empty() -> None:
    assert merge([]) == Parsed()


def test_a_call_without_arguments_has_empty_arguments() -> None:
    assert merge([CallStart(0, "f")]).calls == [ParsedCall("f", "")]


def test_merge_raises_on_a_call_index_out_of_order() -> None:
    with pytest.raises(ValueError, match="started after"):
        merge([CallStart(1, "f")])
    with pytest.raises(ValueError, match="started after"):
        merge([CallStart(0, "f"), CallStart(0, "g")])


def test_merge_raises_on_arguments_for_a_call_not_started() -> None:
    with pytest.raises(ValueError, match="never started"):
        merge([CallArguments(0, "{}")])
    with pytest.raises(ValueError, match="never started"):
        merge([CallStart(0, "f"), CallArguments(1, "{}")])
    with pytest.raises(ValueError, match="never started"):
        merge([CallStart(0, "f"), CallArguments(-1, "{}")])


def test_parse_chunks_feeds_in_order_then_finishes() -> None:
    assert parse_chunks(Echo(), ["a", "b", "c"]) == Parsed(content="abc!")
    assert parse_chunks(Echo(), []) == Parsed(content="!")
