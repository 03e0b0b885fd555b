"""The contract of a tool-call parser: model text in, content and call events out.

A parser turns the text a model writes (already detokenized, special tokens kept as text)
into events, incrementally. Rule of every parser in this package: **chunk invariance**. The
events of one text, merged (`merge`), are the same however the text was cut into `feed`
calls, one character at a time included; so a streamed answer equals the non-streamed one.

Text that might still become part of a call marker is held back until the next feed decides
it; `finish` releases whatever is held when the model stops.

Malformed output never raises. The rule, in OpenAI's non-strict spirit:
- a call that goes wrong before its header is complete (no separator, an undeclared
  function name, arguments that do not start a JSON object, a name region over
  `MAX_NAME_CHARS`) is given back as content text, verbatim;
- once a header (`CallStart`) is emitted, the call's arguments are the model's own text up
  to the call's end marker, even if that text is not valid JSON (the client sees what the
  model wrote); a text cut short (finish reason `length`) leaves the arguments partial.

Events and their merge are in `homing.text.output`. Pure code: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from homing.text.output import OutputParser

MAX_NAME_CHARS = 256
"""Longest function-name region a parser waits for before it gives the text back as content
(OpenAI's names are at most 64 characters; the slack covers a format's own prefixes)."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function the request declares: its name and JSON-Schema `parameters` (or None)."""

    name: str
    parameters: dict | None = None


ToolCallParser = OutputParser
"""A tool-call parser is an `OutputParser` built with the request's declared `ToolSpec`s;
it emits ContentDelta, CallStart and CallArguments."""
