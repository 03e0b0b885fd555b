"""Sans-I/O decoding of one choice: engine token messages in, text deltas and the finish
reason out.

Rule of the file: no awaits, no clocks, no queues. A `ChoiceDecoder` takes each
`TokenChunk` / `GenerateDone` of one choice's engine stream in order and returns what the
client must see: the new text (detokenized incrementally, held back while it may still be
the start of a stop string) and, when the choice ends, why ("stop", "length", "abort").
It also counts the choice's tokens by the engine's rule (`GenerateDone.new_tokens`). The
HTTP and gRPC APIs both reach it through `homing.gateway.generation.Generation`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from homing.engines.client import GenerateDone, TokenChunk
from homing.text.detokenizer import IncrementalDetokenizer
from homing.text.stops import StopSet
from homing.text.tokenizer import TextTokenizer


@dataclass(frozen=True)
class DecodeStep:
    """What one engine message gave: `texts` to send in order (may be empty), `finish`
    (None while the choice runs) and `new_tokens` (tokens it added, for timing)."""

    texts: tuple[str, ...]
    finish: str | None
    new_tokens: int


class ChoiceDecoder:
    """One choice's decoding state.

    `hidden_stop_ids`: token ids that end the choice without being shown (the request's
    stop token ids, unless it sets ignore_eos; SGLang's and vLLM's rule). After the end:
    `received` (tokens taken from the stream), `completion_tokens` (the engine's count),
    `cached_tokens` (prompt tokens served from cache).
    """

    def __init__(
        self,
        tokenizer: TextTokenizer,
        *,
        stop_set: StopSet,
        hidden_stop_ids: frozenset[int] = frozenset(),
        skip_special_tokens: bool = True,
    ) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
        self._stops = stop_set.matcher()
        self._hidden = hidden_stop_ids
        self.received = 0
        self.completion_tokens = 0
        self.cached_tokens = 0

    def push(self, item: TokenChunk | GenerateDone) -> DecodeStep:
        """Feed the next engine message; the text to send and, at the end, the reason."""
        done = isinstance(item, GenerateDone)
        if isinstance(item, GenerateDone):
            token_ids: Sequence[int] = item.new_tokens(self.received)
            self.completion_tokens = max(self.received + len(token_ids), item.completion_tokens)
        else:
            token_ids = item.token_ids
            self.completion_tokens = self.received + len(token_ids)
        new = len(token_ids)
        self.received += new
        self.cached_tokens = item.cached_tokens
        if self._hidden:
            token_ids = _before_stop_id(token_ids, self._hidden)
        text = self._detok.push(token_ids)
        if done:
            text += self._detok.flush()
        result = self._stops.push(text)
        texts = [result.text] if result.text else []
        if result.matched is not None:
            return DecodeStep(tuple(texts), "stop", new)
        if isinstance(item, GenerateDone):
            tail = self._stops.flush()
            if tail:
                texts.append(tail)
            return DecodeStep(tuple(texts), item.finish_reason or "stop", new)
        return DecodeStep(tuple(texts), None, new)


def _before_stop_id(token_ids: Sequence[int], stop_ids: frozenset[int]) -> Sequence[int]:
    """`token_ids` up to (not including) the first of `stop_ids`."""
    for position, token in enumerate(token_ids):
        if token in stop_ids:
            return token_ids[:position]
    return token_ids
