"""A chat answer's text split into content, reasoning and tool calls, in OpenAI's shapes.

Rule of the file: one `ChoiceParser` per choice runs the model's reasoning parser first and
its tool-call parser on the content that comes out of it, so reasoning text never reaches
the tool-call parser (`homing.text.reasoning`, `homing.text.tools`). The non-streamed body
and the streamed deltas are built from the same events, so they agree for any chunking.
An `OutputPlan` (per request, built by `homing.gateway.prepare`) says which parsers run;
a request without tools or reasoning has none, and its text takes the plain path.

Shapes (OpenAI's chat completions API): a message has `content` (null when the answer is
only calls), `tool_calls` [{id, type: "function", function: {name, arguments}}] and, from a
reasoning model, `reasoning_content` (vLLM's and SGLang's name). A streamed call is a first
delta {index, id, type, function: {name, arguments: ""}}, then deltas {index, function:
{arguments}}, which the official SDK's stream helpers accumulate. The legacy `functions`
API answers one call as `function_call` {name, arguments} and finish reason
"function_call". An answer that made a call and stopped has finish reason "tool_calls".
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from homing.text.output import (
    CallArguments,
    CallStart,
    ContentDelta,
    Event,
    OutputParser,
    Parsed,
    ReasoningDelta,
    merge,
)

ParserFactory = Callable[[], OutputParser]


def call_id() -> str:
    """A new tool call id: "call_" and 24 random hex digits (OpenAI's ids are "call_" and
    24 characters)."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class OutputPlan:
    """How a request's answers are parsed.

    `tools`: a factory of the tool-call parser (None: calls are not parsed, the text is
    content). `reasoning`: a factory of the reasoning parser (None: no reasoning is split
    off). `combined`: one parser does both jobs (gpt-oss's Harmony). `legacy`: answer in the
    `functions` API's shape. `max_calls`: calls past this many are dropped
    (`parallel_tool_calls: false`), None for no bound. `parses_calls`: the answers may call
    declared functions (their content is null when they say none).
    """

    tools: ParserFactory | None = None
    reasoning: ParserFactory | None = None
    combined: bool = False
    legacy: bool = False
    max_calls: int | None = None
    parses_calls: bool = False

    def parser(self) -> ChoiceParser:
        """A fresh parser for one choice."""
        return ChoiceParser(self)


class ChoiceParser:
    """One choice's parsing: `feed(text)` and `finish()` give `homing.text.output` events;
    `ids` holds the id given to each call, `calls` counts them, `reasoning_text` is the
    reasoning so far. Where a tool-call parser runs, content that is only whitespace since
    the start or the last call is held back: dropped when a call follows or the answer ends
    after a call (a message of calls has null content, as SGLang gives it), else sent with
    the next other content, or at the end of an answer without calls. The rule depends on
    the text only, so a streamed answer still equals the whole one."""

    def __init__(self, plan: OutputPlan) -> None:
        self.plan = plan
        self._reasoning = plan.reasoning() if plan.reasoning is not None else None
        self._tools = plan.tools() if plan.tools is not None else None
        self.ids: list[str] = []
        self._reasoning_parts: list[str] = []
        # Whitespace content held back while it may only surround calls (class docstring);
        # `_holding` until other content is said since the start or the last call.
        self._space: list[str] = []
        self._holding = self._tools is not None

    @property
    def calls(self) -> int:
        """Calls started so far."""
        return len(self.ids)

    def feed(self, text: str) -> list[Event]:
        """Events for the next piece of the answer's text."""
        if self._reasoning is not None:
            return self._note(self._route(self._reasoning.feed(text)))
        if self._tools is not None:
            return self._note(self._tools.feed(text))
        return [ContentDelta(text)] if text else []

    def finish(self) -> list[Event]:
        """Events for what the parsers still hold; the answer ended."""
        events: list[Event] = []
        if self._reasoning is not None:
            events.extend(self._route(self._reasoning.finish()))
        if self._tools is not None:
            events.extend(self._tools.finish())
        events = self._note(events)
        if self._space and not self.ids:  # only whitespace was said, no call: the content
            events.append(ContentDelta("".join(self._space)))
        self._space = []
        self._holding = False
        return events

    def _route(self, events: list[Event]) -> list[Event]:
        if self._tools is None:
            return events
        out: list[Event] = []
        for event in events:
            if isinstance(event, ContentDelta):
                out.extend(self._tools.feed(event.text))
            else:
                out.append(event)
        return out

    def _note(self, events: list[Event]) -> list[Event]:
        bound = self.plan.max_calls
        if bound is not None and any(
            isinstance(e, (CallStart, CallArguments)) and e.index >= bound for e in events
        ):
            events = [
                e
                for e in events
                if not (isinstance(e, (CallStart, CallArguments)) and e.index >= bound)
            ]
        if self._tools is not None:
            events = self._hold_space(events)
        for event in events:
            if isinstance(event, CallStart):
                self.ids.append(call_id())
            elif isinstance(event, ReasoningDelta):
                self._reasoning_parts.append(event.text)
        return events

    def _hold_space(self, events: list[Event]) -> list[Event]:
        """`events` with whitespace content around calls held back (class docstring)."""
        out: list[Event] = []
        for event in events:
            if isinstance(event, ContentDelta):
                if not self._holding:
                    out.append(event)
                elif not event.text or event.text.isspace():
                    self._space.append(event.text)
                else:
                    out.append(ContentDelta("".join(self._space) + event.text))
                    self._space = []
                    self._holding = False
            else:
                if isinstance(event, CallStart):
                    self._space = []  # it only separated calls
                    self._holding = True
                out.append(event)
        return out

    @property
    def reasoning_text(self) -> str:
        """The reasoning text so far."""
        return "".join(self._reasoning_parts)


def parse_whole(plan: OutputPlan, text: str) -> tuple[Parsed, list[str]]:
    """`text` (a whole answer) parsed as `plan` says, with the ids of its calls."""
    parser = plan.parser()
    events = parser.feed(text)
    events.extend(parser.finish())
    return merge(events), parser.ids


def finish_reason(reason: str | None, calls: int, legacy: bool) -> str | None:
    """The finish reason to report: "tool_calls" (legacy: "function_call") for an answer
    that made calls and stopped; else `reason` ("length" stays "length": the last call may
    be cut)."""
    if calls and reason == "stop":
        return "function_call" if legacy else "tool_calls"
    return reason


def message_body(parsed: Parsed, ids: Sequence[str], plan: OutputPlan) -> dict[str, Any]:
    """The non-streamed `message` of one choice: `content` null when the answer, parsed for
    calls, says nothing as content (as OpenAI gives a message of calls)."""
    message: dict[str, Any] = {"role": "assistant"}
    message["content"] = parsed.content or (None if plan.parses_calls else "")
    if parsed.reasoning:
        message["reasoning_content"] = parsed.reasoning
    if parsed.calls and plan.legacy:
        first = parsed.calls[0]
        message["function_call"] = {"name": first.name, "arguments": first.arguments}
    elif parsed.calls:
        message["tool_calls"] = [
            {
                "id": ids[i],
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for i, call in enumerate(parsed.calls)
        ]
    return message


@dataclass
class DeltaBuilder:
    """Streamed deltas of one choice's events; merges consecutive events of one kind. A
    call's first delta carries its index, id, type and name with `arguments: ""`, as OpenAI
    streams it; its argument fragments follow in deltas of their own."""

    legacy: bool

    def deltas(self, events: Sequence[Event], ids: Sequence[str]) -> list[dict[str, Any]]:
        """The `delta` objects for `events` (in order); `ids` as `ChoiceParser.ids`."""
        out: list[dict[str, Any]] = []
        for event in events:
            last = out[-1] if out else None
            if isinstance(event, ContentDelta):
                if not event.text:
                    continue
                if last is not None and set(last) == {"content"}:
                    last["content"] += event.text
                else:
                    out.append({"content": event.text})
            elif isinstance(event, ReasoningDelta):
                if not event.text:
                    continue
                if last is not None and set(last) == {"reasoning_content"}:
                    last["reasoning_content"] += event.text
                else:
                    out.append({"reasoning_content": event.text})
            elif isinstance(event, CallStart):
                if self.legacy:
                    if event.index == 0:
                        out.append({"function_call": {"name": event.name, "arguments": ""}})
                    continue
                out.append(
                    {
                        "tool_calls": [
                            {
                                "index": event.index,
                                "id": ids[event.index],
                                "type": "function",
                                "function": {"name": event.name, "arguments": ""},
                            }
                        ]
                    }
                )
            elif isinstance(event, CallArguments):
                if not event.fragment:
                    continue
                if self.legacy:
                    if event.index != 0:
                        continue
                    open_call = last.get("function_call") if last is not None else None
                    if open_call is not None and "name" not in open_call:
                        open_call["arguments"] += event.fragment
                    else:
                        out.append({"function_call": {"arguments": event.fragment}})
                    continue
                calls = last.get("tool_calls") if last is not None else None
                if calls and calls[-1]["index"] == event.index and "id" not in calls[-1]:
                    calls[-1]["function"]["arguments"] += event.fragment
                else:
                    out.append(
                        {
                            "tool_calls": [
                                {"index": event.index, "function": {"arguments": event.fragment}}
                            ]
                        }
                    )
        return out


class _Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


class _Prepared(Protocol):
    """What `reasoning_tokens` reads of a prepared request."""

    @property
    def output(self) -> OutputPlan | None: ...

    @property
    def model(self) -> Any: ...


HEAVY_OUTPUT_CHARS = 8192
"""Parsed answers (or reasoning texts) longer than this, in characters all together, are
parsed and counted off the event loop (`heavy_output`): re-encoding takes ~0.3-0.6 us a
character on one core, so this is a few milliseconds."""


def heavy_output(prepared: _Prepared, texts: Sequence[str]) -> bool:
    """Whether parsing `texts` and counting their reasoning is work for a thread: the
    request's answers are parsed, and the texts are long (`HEAVY_OUTPUT_CHARS`)."""
    return prepared.output is not None and sum(map(len, texts)) > HEAVY_OUTPUT_CHARS


def reasoning_tokens(prepared: _Prepared, texts: Sequence[str]) -> int | None:
    """Tokens of the reasoning texts, counted by encoding them again (an approximation: the
    engine's own split may fall inside a token); None when no reasoning parser ran."""
    plan = prepared.output
    if plan is None or (plan.reasoning is None and not plan.combined):
        return None
    tokenizer: _Encoder = prepared.model.tokenizer
    return sum(len(tokenizer.encode(text)) for text in texts if text)
