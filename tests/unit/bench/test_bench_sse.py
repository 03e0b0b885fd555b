"""Sans-I/O SSE decoding and the completion-stream verdict."""

from __future__ import annotations

import json

from homing.bench.sse import CompletionStream, SseDecoder


def _chunk(text: str) -> str:
    return json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": None}]})


USAGE = json.dumps(
    {
        "choices": [],
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 64},
        },
    }
)


class TestSseDecoder:
    def test_events_split_across_reads_and_line_endings(self) -> None:
        """Events come out whole however the bytes are cut, with LF, CRLF or CR endings."""
        wire = b'data: {"a":1}\r\n\r\n: comment\n\ndata: x\rdata: y\r\rdata: [DONE]\n\n'
        for size in (1, 2, 3, 7, len(wire)):
            decoder = SseDecoder()
            events = []
            for i in range(0, len(wire), size):
                events.extend(decoder.feed(wire[i : i + size]))
            assert events == ['{"a":1}', "x\ny", "[DONE]"], size

    def test_multibyte_characters_split_across_reads(self) -> None:
        """A UTF-8 character cut between reads is decoded intact."""
        wire = 'data: {"t":"你好"}\n\n'.encode()
        decoder = SseDecoder()
        events = [e for b in wire for e in decoder.feed(bytes([b]))]
        assert events == ['{"t":"你好"}']

    def test_unterminated_event_is_not_dispatched(self) -> None:
        """Data without the closing blank line is not an event."""
        assert SseDecoder().feed(b"data: [DONE]\n") == []


class TestCompletionStream:
    def test_complete_stream_gives_times_and_usage(self) -> None:
        """First/last token times come from chunks with text; usage from the usage chunk."""
        s = CompletionStream()
        s.on_event(_chunk(""), 1.0)  # empty text is not a token
        s.on_event(_chunk("a"), 2.0)
        s.on_event(_chunk("b"), 3.0)
        s.on_event(_chunk("c"), 4.5)
        s.on_event(USAGE, 4.6)
        s.on_event("[DONE]", 4.7)
        assert (s.first_token_s, s.last_token_s) == (2.0, 4.5)
        assert (s.prompt_tokens, s.completion_tokens, s.cached_tokens) == (100, 3, 64)
        assert s.verdict() is None

    def test_missing_done_is_an_error(self) -> None:
        """A stream that ends without [DONE] is not complete."""
        s = CompletionStream()
        s.on_event(_chunk("a"), 1.0)
        s.on_event(USAGE, 1.1)
        verdict = s.verdict()
        assert verdict is not None and verdict.kind == "no_done"

    def test_missing_usage_is_an_error(self) -> None:
        """A stream without a usage chunk is not complete."""
        s = CompletionStream()
        s.on_event(_chunk("a"), 1.0)
        s.on_event("[DONE]", 1.1)
        verdict = s.verdict()
        assert verdict is not None and verdict.kind == "no_usage"

    def test_error_event_wins(self) -> None:
        """An in-stream error object makes the request an error even if [DONE] follows."""
        s = CompletionStream()
        s.on_event(json.dumps({"error": {"message": "worker died"}}), 1.0)
        s.on_event(USAGE, 1.1)
        s.on_event("[DONE]", 1.2)
        verdict = s.verdict()
        assert verdict is not None and verdict.kind == "stream_error"
        assert "worker died" in verdict.message

    def test_missing_cached_details_count_as_zero(self) -> None:
        """Usage without prompt_tokens_details reports 0 cached tokens."""
        s = CompletionStream()
        s.on_event(json.dumps({"usage": {"prompt_tokens": 5, "completion_tokens": 1}}), 1.0)
        s.on_event("[DONE]", 1.0)
        assert s.cached_tokens == 0 and s.verdict() is None
