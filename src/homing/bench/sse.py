"""Sans-I/O reading of an OpenAI completions SSE stream: bytes in, events out, verdict at the end.

Rule of this file: no sockets, no clock. `SseDecoder` turns received bytes into the `data`
payloads of complete server-sent events (WHATWG HTML "Server-sent events" parsing: lines end in
CRLF, LF or CR; `data:` fields of one event are joined with "\\n"; a blank line dispatches;
comments and other fields are ignored; an unterminated event at end of stream is dropped).
`read_chunk` reads one payload as an OpenAI stream chunk (`[DONE]`, an error event, a
malformed payload, or a chunk body); `CompletionStream` folds those payloads, each stamped with
the receive time the caller passes in, into what the benchmark records: first/last token time,
usage, `[DONE]`, and an error verdict. The load generator feeds both from the network; tests
feed them from strings.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


class SseDecoder:
    """Incremental SSE parser: `feed(bytes)` returns the data payloads of completed events."""

    def __init__(self) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._data: list[str] = []
        self._first_line = True

    def feed(self, chunk: bytes) -> list[str]:
        """Consume `chunk`; return the `data` of every event completed by it, in order."""
        self._buffer += self._text.decode(chunk)
        events: list[str] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                break
            line, width = cut
            text = self._buffer[:line]
            self._buffer = self._buffer[line + width :]
            self._line(text, events)
        return events

    def _line(self, line: str, events: list[str]) -> None:
        if self._first_line:
            self._first_line = False
            line = line.removeprefix("\ufeff")
        if line == "":
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(":"):
            return
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)


def _line_end(buffer: str) -> tuple[int, int] | None:
    """(index, width) of the first complete line terminator, or None while undecided.

    A lone CR at the very end is undecided: the next chunk may begin with its LF.
    """
    cr = buffer.find("\r")
    lf = buffer.find("\n")
    if cr == -1 and lf == -1:
        return None
    if cr == -1 or (lf != -1 and lf < cr):
        return lf, 1
    if cr + 1 == len(buffer):
        return None
    return cr, 2 if buffer[cr + 1] == "\n" else 1


@dataclass(frozen=True, slots=True)
class Chunk:
    """One SSE data payload read as an OpenAI stream chunk; exactly one field is set.

    `done`: the payload was `[DONE]`. `malformed`: "not JSON" or "not an object". `error`: an
    error event (`{"error": ...}`, not null): its `error.message`, or the whole `error` value
    when that has no message. `body`: the object of any other chunk.
    """

    done: bool = False
    malformed: str | None = None
    error: object = None
    body: dict[str, Any] | None = None


def read_chunk(data: str) -> Chunk:
    """Read one event payload (leading and trailing white space around `[DONE]` is allowed)."""
    if data.strip() == "[DONE]":
        return Chunk(done=True)
    try:
        parsed = json.loads(data)
    except json.JSONDecodeError:
        return Chunk(malformed="not JSON")
    if not isinstance(parsed, dict):
        return Chunk(malformed="not an object")
    err = parsed.get("error")
    if err is not None:
        message = err.get("message") if isinstance(err, dict) else None
        return Chunk(error=message or err)
    return Chunk(body=parsed)


def choices(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The `choices[]` of a chunk body that are objects (others are skipped)."""
    for choice in body.get("choices") or ():
        if isinstance(choice, dict):
            yield choice


@dataclass(frozen=True, slots=True)
class StreamError:
    """Why a stream does not count as a completed request: a short `kind` and a message."""

    kind: str
    message: str


class CompletionStream:
    """Accumulates `/v1/completions` stream chunks (`stream_options.include_usage: true`).

    `first_token_s` / `last_token_s`: receive times (caller's clock, s) of the first and last
    chunk carrying non-empty `choices[].text`. `prompt_tokens`, `completion_tokens` and
    `cached_tokens` come from the usage chunk (`usage.prompt_tokens_details.cached_tokens`;
    0 when the details are absent). `verdict()` is None for a complete stream, else the first
    problem: an `error` event, a malformed chunk, no usage chunk, or no `data: [DONE]`.
    """

    def __init__(self) -> None:
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.finish_reason: str | None = None
        self.done = False
        self._error: StreamError | None = None

    def on_event(self, data: str, now: float) -> None:
        """Fold one event payload received at `now` (s). Payloads after `[DONE]` are ignored."""
        if self.done or self._error is not None:
            return
        chunk = read_chunk(data)
        if chunk.done:
            self.done = True
        elif chunk.malformed == "not JSON":
            self._error = StreamError("bad_chunk", f"malformed stream chunk: {data[:200]!r}")
        elif chunk.malformed is not None:
            self._error = StreamError("bad_chunk", f"stream chunk is not an object: {data[:200]!r}")
        elif chunk.error is not None:
            self._error = StreamError("stream_error", f"error event: {chunk.error!r}")
        elif chunk.body is not None:
            self._fold(chunk.body, now)

    def _fold(self, chunk: dict[str, Any], now: float) -> None:
        """Fold one well-formed, non-error chunk (OpenAI completion chunk shape)."""
        for choice in choices(chunk):
            text = choice.get("text")
            if isinstance(text, str) and text:
                if self.first_token_s is None:
                    self.first_token_s = now
                self.last_token_s = now
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self._usage(usage)

    def _usage(self, usage: dict[str, object]) -> None:
        prompt = usage.get("prompt_tokens")
        completion = usage.get("completion_tokens")
        if not isinstance(prompt, int) or not isinstance(completion, int):
            self._error = StreamError("bad_chunk", f"usage without token counts: {usage!r}")
            return
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        self.prompt_tokens = prompt
        self.completion_tokens = completion
        self.cached_tokens = cached if isinstance(cached, int) else 0

    def verdict(self) -> StreamError | None:
        """None when the stream was complete; else what was wrong (call at end of stream)."""
        if self._error is not None:
            return self._error
        if not self.done:
            return StreamError("no_done", "stream ended without data: [DONE]")
        if self.completion_tokens is None:
            return StreamError("no_usage", "stream ended without a usage chunk")
        return None


def copy_stream_fields(rec: Any, stream: CompletionStream) -> None:
    """Copy token times and counts from a finished (or cut) stream onto a request record."""
    rec.first_token_s = stream.first_token_s
    rec.last_token_s = stream.last_token_s
    rec.prompt_tokens = stream.prompt_tokens
    rec.completion_tokens = stream.completion_tokens
    rec.cached_tokens = stream.cached_tokens
    rec.finish_reason = stream.finish_reason
