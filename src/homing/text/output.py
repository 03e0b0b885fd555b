"""What parsers of model output give: answer, reasoning and tool-call events, and their merge.

Tool-call parsers (`homing.text.tools`) and reasoning parsers (`homing.text.reasoning`) both
emit these events. Rule of every such parser: **chunk invariance**. The events of one text,
merged (`merge`), are the same however the text was cut into `feed` calls, one character at
a time included; so a streamed answer equals the non-streamed one.

Pure code: strings in, dataclasses out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """Plain answer text (what OpenAI calls `content`)."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Thinking text, apart from the answer (`reasoning_content`)."""

    text: str


@dataclass(frozen=True, slots=True)
class CallStart:
    """A tool call's header: its 0-based index among this answer's calls and the function."""

    index: int
    name: str


@dataclass(frozen=True, slots=True)
class CallArguments:
    """A fragment of call `index`'s arguments (JSON text; fragments concatenate)."""

    index: int
    fragment: str


Event = ContentDelta | ReasoningDelta | CallStart | CallArguments


class OutputParser(Protocol):
    """One answer's incremental parser (one per choice)."""

    def feed(self, text: str) -> list[Event]:
        """Events for `text`, the next piece of the model's output."""
        ...

    def finish(self) -> list[Event]:
        """Events for what is still held back; the model wrote its last text."""
        ...


@dataclass(slots=True)
class ParsedCall:
    """One merged call: function name and the concatenated arguments text."""

    name: str
    arguments: str = ""


@dataclass(slots=True)
class Parsed:
    """The merge of an answer's events: content, reasoning and calls in index order."""

    content: str = ""
    reasoning: str = ""
    calls: list[ParsedCall] = field(default_factory=list)


def merge(events: Iterable[Event]) -> Parsed:
    """Merge events into one `Parsed`. Raises ValueError on an event out of order (a call
    index that is not the next one, arguments for a call not started)."""
    out = Parsed()
    content: list[str] = []
    reasoning: list[str] = []
    args: list[list[str]] = []
    for ev in events:
        if isinstance(ev, ContentDelta):
            content.append(ev.text)
        elif isinstance(ev, ReasoningDelta):
            reasoning.append(ev.text)
        elif isinstance(ev, CallStart):
            if ev.index != len(out.calls):
                raise ValueError(f"call {ev.index} started after {len(out.calls)} calls")
            out.calls.append(ParsedCall(ev.name))
            args.append([])
        else:
            if not 0 <= ev.index < len(out.calls):
                raise ValueError(f"arguments for call {ev.index}, which never started")
            args[ev.index].append(ev.fragment)
    out.content = "".join(content)
    out.reasoning = "".join(reasoning)
    for call, parts in zip(out.calls, args, strict=True):
        call.arguments = "".join(parts)
    return out


def parse_chunks(parser: OutputParser, chunks: Sequence[str]) -> Parsed:
    """Feed `chunks` in order, then finish, and merge all events (a test and non-streamed
    helper)."""
    events: list[Event] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.finish())
    return merge(events)
