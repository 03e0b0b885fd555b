"""The chaos suite's verdict on one streamed chat completion, from bytes the gateway sent.

The byte strings below were recorded from `homing serve` over a simulated worker: a whole
answer, one whose worker was SIGKILLed after the first token (the gateway's error event),
and the 503 of a request to a dead worker. The others are cut from them.
"""

from __future__ import annotations

import pytest

from homing.bench.chaos.outcome import ChatStream, End, Outcome, classify

HEAD = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1796183864,'
ROLE = (
    HEAD + b'"model":"llama-3.1-8b","choices":[{"index":0,"delta":{"role":"assistant",'
    b'"content":""},"logprobs":null,"finish_reason":null}],"usage":null}\n\n'
)


def _content(text: str) -> bytes:
    return (
        HEAD + b'"model":"llama-3.1-8b","choices":[{"index":0,"delta":{"content":"'
        + text.encode() + b'"},"logprobs":null,"finish_reason":null}],"usage":null}\n\n'
    )  # fmt: skip


def _finish(reason: str) -> bytes:
    return (
        HEAD + b'"model":"llama-3.1-8b","choices":[{"index":0,"delta":{},"logprobs":null,'
        b'"finish_reason":"' + reason.encode() + b'"}],"usage":null}\n\n'
    )


USAGE = (
    HEAD + b'"model":"llama-3.1-8b","choices":[],"usage":{"prompt_tokens":4,'
    b'"completion_tokens":3,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":0}}}\n\n'
)
DONE = b"data: [DONE]\n\n"
WHOLE = ROLE + _content("今天") + _content("天气") + _content("很好") + _finish("length") + USAGE
WHOLE += DONE
ERROR_EVENT = (
    b'data: {"error":{"message":"The worker failed: Stream removed (Socket closed)",'
    b'"type":"service_unavailable_error","param":null,"code":"no_capacity"}}\n\n'
)
KILLED_MID_STREAM = ROLE + _content("The") + ERROR_EVENT + DONE
DEAD_WORKER_503 = (
    b'{"error":{"message":"The worker failed: failed to connect to all addresses",'
    b'"type":"service_unavailable_error","param":null,"code":"no_capacity"}}'
)


def _fold(wire: bytes, size: int | None = None) -> ChatStream:
    """`wire` fed in reads of `size` bytes (all at once: None), the i-th read at time i."""
    stream = ChatStream()
    step = size or len(wire) or 1
    for i, at in enumerate(range(0, len(wire), step)):
        stream.feed(wire[at : at + step], float(i))
    return stream


@pytest.mark.parametrize("size", [1, 7, 64, None])
def test_a_whole_answer_is_completed_however_the_reads_cut_it(size: int | None) -> None:
    """The recorded whole answer: completed, three content deltas, finish "length"."""
    stream = _fold(WHOLE, size)
    assert classify(200, stream, End.EOF).outcome is Outcome.COMPLETED
    assert (stream.content_chunks, stream.finish_reasons, stream.completion_tokens) == (
        3,
        {0: "length"},
        3,
    )


def test_first_content_time_is_the_read_that_brought_the_first_text() -> None:
    """The role chunk (empty content) does not count as content; the next read does."""
    stream = ChatStream()
    stream.feed(ROLE, 1.0)
    assert stream.first_content_s is None
    stream.feed(_content("Hi"), 2.5)
    stream.feed(_content("!"), 3.0)
    assert stream.first_content_s == 2.5


def test_an_error_event_after_content_is_a_failure_mid_stream() -> None:
    """The recorded SIGKILL after the first token: failed mid-stream, with the message."""
    verdict = classify(200, _fold(KILLED_MID_STREAM), End.EOF)
    assert verdict.outcome is Outcome.FAILED_MID_STREAM
    assert "Stream removed (Socket closed)" in verdict.reason


def test_an_error_event_before_any_content_fails_before_the_first_byte() -> None:
    """A 200 whose only chunk before the error is the role delta never gave content."""
    verdict = classify(200, _fold(ROLE + ERROR_EVENT + DONE), End.EOF)
    assert verdict.outcome is Outcome.FAILED_BEFORE_FIRST_BYTE
    assert "error event before content" in verdict.reason


def test_a_non_200_status_fails_before_the_first_byte_and_quotes_its_message() -> None:
    """The recorded 503 for a dead worker: its OpenAI error message is the reason."""
    verdict = classify(503, ChatStream(), End.EOF, error_body=DEAD_WORKER_503)
    assert verdict.outcome is Outcome.FAILED_BEFORE_FIRST_BYTE
    assert verdict.reason == "HTTP 503: The worker failed: failed to connect to all addresses"


def test_no_response_at_all_fails_before_the_first_byte() -> None:
    """A refused connection (no status) is a failure before the first byte."""
    verdict = classify(None, ChatStream(), End.TRANSPORT, transport_error="connection refused")
    assert verdict.outcome is Outcome.FAILED_BEFORE_FIRST_BYTE
    assert "connection refused" in verdict.reason


def test_a_connection_cut_after_content_without_an_error_event_is_cut() -> None:
    """Content, then the connection fails with no error event: cut silently."""
    wire = ROLE + _content("The")
    verdict = classify(200, _fold(wire), End.TRANSPORT, transport_error="ClientPayloadError")
    assert verdict.outcome is Outcome.CUT
    assert "without an error event" in verdict.reason


def test_a_body_that_ends_after_content_without_done_is_cut() -> None:
    """Content, then a clean end of body but no [DONE]: cut silently."""
    assert classify(200, _fold(ROLE + _content("The")), End.EOF).outcome is Outcome.CUT


def test_a_200_that_ends_before_any_content_fails_before_the_first_byte() -> None:
    """Only the role chunk, then the end: an error before any content."""
    verdict = classify(200, _fold(ROLE), End.TRANSPORT, transport_error="reset")
    assert verdict.outcome is Outcome.FAILED_BEFORE_FIRST_BYTE


def test_finish_reason_abort_without_an_error_event_is_cut() -> None:
    """[DONE] after finish_reason "abort" is not a whole answer, and no error said so."""
    wire = ROLE + _content("The") + _finish("abort") + USAGE + DONE
    verdict = classify(200, _fold(wire), End.EOF)
    assert verdict.outcome is Outcome.CUT
    assert "abort" in verdict.reason


def test_a_malformed_chunk_after_content_is_cut() -> None:
    """A chunk that is not JSON ends the fold; what came after does not rescue it."""
    wire = ROLE + _content("The") + b"data: {not json\n\n" + _finish("length") + DONE
    assert classify(200, _fold(wire), End.EOF).outcome is Outcome.CUT


def test_done_without_a_finish_reason_is_cut() -> None:
    """[DONE] right after content, with no finish_reason, is not a whole answer."""
    assert classify(200, _fold(ROLE + _content("a") + DONE), End.EOF).outcome is Outcome.CUT


def test_the_deadline_makes_any_request_hung() -> None:
    """Whatever arrived, a request past its client deadline is hung."""
    assert classify(200, _fold(WHOLE), End.DEADLINE).outcome is Outcome.HUNG
    assert classify(None, ChatStream(), End.DEADLINE).outcome is Outcome.HUNG
    assert "after content" in classify(200, _fold(ROLE + _content("a")), End.DEADLINE).reason


def test_events_after_done_are_ignored() -> None:
    """An error event after [DONE] does not change a completed answer."""
    assert classify(200, _fold(WHOLE + ERROR_EVENT), End.EOF).outcome is Outcome.COMPLETED
