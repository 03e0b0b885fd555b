"""Sans-I/O verdict on one streamed chat completion of the chaos suite: bytes in, outcome out.

Rule of this file: no sockets, no clock. `ChatStream` folds the bytes of an OpenAI
`chat.completion.chunk` SSE stream (each read stamped with the receive time the caller
passes in) into what the verdict needs; `classify` turns the HTTP status, that fold and how
the body ended into one `Outcome` and a short reason. The load generator feeds them from
the network; the unit tests feed them recorded bytes.

Outcomes, in the order `classify` decides them:
- HUNG: the client's per-request deadline passed, whatever had arrived;
- FAILED_BEFORE_FIRST_BYTE: no response head, an HTTP status other than 200, or a 200
  stream that ended or errored before any content (a delta with non-empty `content`);
- FAILED_MID_STREAM: content arrived, then an explicit error event (`data: {"error": ...}`,
  what the gateway sends when a stream fails after it began);
- CUT: content arrived, then the stream ended without an error event and without a whole
  ending (`[DONE]` after a finish_reason of "stop" or "length"): a connection cut, a
  malformed chunk, or a finish_reason "abort". The gateway promises this never happens;
- COMPLETED: `[DONE]` with every choice finished by "stop" or "length" and no error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from homing.bench.sse import SseDecoder, choices, read_chunk

GOOD_FINISH_REASONS = frozenset({"stop", "length"})
"""finish_reason values of an answer that ended as asked (OpenAI's, without "abort")."""


class Outcome(StrEnum):
    """What became of one request (see the module docstring)."""

    COMPLETED = "completed"
    FAILED_BEFORE_FIRST_BYTE = "failed_before_first_byte"
    FAILED_MID_STREAM = "failed_mid_stream"
    CUT = "cut"
    HUNG = "hung"


class End(StrEnum):
    """How the response body ended on the client's side."""

    EOF = "eof"
    """The server ended the body (or sent no body at all)."""
    TRANSPORT = "transport"
    """The connection failed: refused, reset, or closed inside a chunked body."""
    DEADLINE = "deadline"
    """The client's per-request deadline passed and it gave up."""


class ChatStream:
    """Accumulates a `/v1/chat/completions` stream (`stream: true`).

    `first_content_s`: receive time (caller's clock, s) of the first delta with non-empty
    `content`; `content_chunks`: how many such deltas. `finish_reasons`: choice index ->
    its finish_reason. `error`: the message of the first error event and `error_after_content`
    whether content had come before it. `malformed`: the first chunk that was not a JSON
    object. `done`: `data: [DONE]` arrived. Events after `[DONE]` or an error are ignored.
    """

    def __init__(self) -> None:
        self._decoder = SseDecoder()
        self.first_content_s: float | None = None
        self.content_chunks = 0
        self.finish_reasons: dict[int, str] = {}
        self.error: str | None = None
        self.error_after_content = False
        self.malformed: str | None = None
        self.done = False
        self.completion_tokens: int | None = None

    def feed(self, data: bytes, now: float) -> None:
        """Fold the bytes of one read received at `now` (s)."""
        for event in self._decoder.feed(data):
            self._event(event, now)

    def _event(self, data: str, now: float) -> None:
        if self.done or self.error is not None or self.malformed is not None:
            return
        chunk = read_chunk(data)
        if chunk.done:
            self.done = True
        elif chunk.malformed is not None:
            self.malformed = data[:200]
        elif chunk.error is not None:
            self.error = str(chunk.error)[:300]
            self.error_after_content = self.first_content_s is not None
        elif chunk.body is not None:
            self._fold(chunk.body, now)

    def _fold(self, chunk: dict[str, Any], now: float) -> None:
        for choice in choices(chunk):
            delta = choice.get("delta")
            content = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(content, str) and content:
                if self.first_content_s is None:
                    self.first_content_s = now
                self.content_chunks += 1
            reason = choice.get("finish_reason")
            if reason:
                index = choice.get("index")
                self.finish_reasons[index if isinstance(index, int) else 0] = str(reason)
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.completion_tokens = usage["completion_tokens"]


@dataclass(frozen=True)
class Verdict:
    """An outcome and why, in a few words (the error message when there was one)."""

    outcome: Outcome
    reason: str


def classify(
    status: int | None,
    stream: ChatStream,
    end: End,
    *,
    error_body: bytes = b"",
    transport_error: str = "",
) -> Verdict:
    """The outcome of one request (rules in the module docstring).

    `status`: the HTTP status, None when no response head arrived. `stream`: the fold of the
    body (empty unless the status was 200). `error_body`: the start of a non-200 body (its
    OpenAI error message is quoted). `transport_error`: what failed, for End.TRANSPORT.
    """
    if end is End.DEADLINE:
        got = "after content" if stream.first_content_s is not None else "before any content"
        return Verdict(Outcome.HUNG, f"client deadline passed {got}")
    if status is None:
        return Verdict(Outcome.FAILED_BEFORE_FIRST_BYTE, f"no response: {transport_error}")
    if status != 200:
        return Verdict(Outcome.FAILED_BEFORE_FIRST_BYTE, f"HTTP {status}: {_message(error_body)}")
    if stream.error is not None:
        if stream.error_after_content:
            return Verdict(Outcome.FAILED_MID_STREAM, f"error event: {stream.error}")
        return Verdict(
            Outcome.FAILED_BEFORE_FIRST_BYTE, f"error event before content: {stream.error}"
        )
    ending = _ending_problem(stream, end, transport_error)
    if ending is None:
        return Verdict(Outcome.COMPLETED, "ok")
    if stream.first_content_s is None:
        return Verdict(Outcome.FAILED_BEFORE_FIRST_BYTE, f"before any content: {ending}")
    return Verdict(Outcome.CUT, ending)


def _ending_problem(stream: ChatStream, end: End, transport_error: str) -> str | None:
    """None for a whole ending, else what was wrong with it."""
    if stream.malformed is not None:
        return f"malformed chunk {stream.malformed!r}"
    if not stream.done:
        if end is End.TRANSPORT:
            return f"connection failed without an error event: {transport_error}"
        return "stream ended without an error event or data: [DONE]"
    if not stream.finish_reasons:
        return "data: [DONE] without a finish_reason"
    bad = sorted({r for r in stream.finish_reasons.values() if r not in GOOD_FINISH_REASONS})
    if bad:
        return f"finish_reason {', '.join(bad)} without an error event"
    return None


def _message(body: bytes) -> str:
    """The `error.message` of an OpenAI error body, else the body's start."""
    text = body.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return text[:200] or "(empty body)"
    err = parsed.get("error") if isinstance(parsed, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    return str(message)[:200] if message else text[:200]
