"""The router evaluation's pure parts: the offline LRU bound, the offered-load estimate and
the SGLang /generate stream reader used for smg."""

from __future__ import annotations

from homing.bench.routers import GenerateStream, lru_hits, offered_load
from homing.bench.traces import PromptBuilder, TraceRequest
from homing.sim.timing import TimingModel


def conversation(index: int, at: float, hash_ids: tuple[int, ...], tokens: int) -> TraceRequest:
    """A Mooncake-style request of `tokens` prompt tokens over `hash_ids` 512-token blocks."""
    return TraceRequest(index, at, tokens, 10, hash_ids)


TRACE = [
    conversation(0, 0.0, (0, 1), 1024),
    conversation(1, 1.0, (0, 1, 2), 1500),  # shares 1024 tokens with request 0
    conversation(2, 2.0, (0, 3), 1024),  # shares the first 512
]


class TestLruBound:
    def test_unbounded_cache_hits_every_shared_prefix(self) -> None:
        """With room for everything, each request hits exactly its shared prefix."""
        assert lru_hits(TRACE, PromptBuilder(), capacity_blocks=10_000) == [0, 1024, 512]

    def test_tiny_cache_keeps_the_root_side_of_each_prefix(self) -> None:
        """A 16-block cache evicts leaves first: every later request still hits 256 tokens."""
        assert lru_hits(TRACE, PromptBuilder(), capacity_blocks=16) == [0, 256, 256]

    def test_round_robin_caches_split_the_sharing(self) -> None:
        """With 3 caches and request i on cache i mod 3, nothing is shared."""
        assert lru_hits(TRACE, PromptBuilder(), capacity_blocks=10_000, caches=3) == [0, 0, 0]


def test_offered_load_is_proportional_to_speed() -> None:
    """Replaying twice as fast doubles the load; hits reduce it."""
    timing = TimingModel.from_names("llama-3.1-70b", "H100", 8)
    cold = offered_load(TRACE, [0, 0, 0], timing, 2, 1.0)
    assert abs(offered_load(TRACE, [0, 0, 0], timing, 2, 2.0) - 2 * cold) < 1e-9
    assert offered_load(TRACE, [0, 1024, 512], timing, 2, 1.0) < cold


class TestGenerateStream:
    def test_complete_stream_has_usage_and_token_times(self) -> None:
        """Chunks with output_ids set token times; meta_info gives the counts."""
        stream = GenerateStream()
        meta = {"prompt_tokens": 20, "completion_tokens": 1, "cached_tokens": 16}
        stream.on_event('{"text":"a","output_ids":[5],"meta_info":' + _j(meta) + "}", 1.0)
        done = {**meta, "completion_tokens": 2, "finish_reason": "length"}
        stream.on_event('{"text":"ab","output_ids":[6],"meta_info":' + _j(done) + "}", 1.5)
        stream.on_event("[DONE]", 1.6)
        assert stream.verdict() is None
        assert (stream.first_token_s, stream.last_token_s) == (1.0, 1.5)
        assert (stream.cached_tokens, stream.completion_tokens) == (16, 2)

    def test_missing_done_or_error_is_a_failure(self) -> None:
        """No [DONE], or an error event, is not a success."""
        cut = GenerateStream()
        cut.on_event('{"output_ids":[1],"meta_info":{"finish_reason":"length"}}', 0.1)
        assert cut.verdict() is not None
        failed = GenerateStream()
        failed.on_event('{"error":{"message":"boom"}}', 0.1)
        assert failed.verdict() is not None and "boom" in failed.verdict()


def _j(doc: dict[str, object]) -> str:
    import json

    return json.dumps(doc)
