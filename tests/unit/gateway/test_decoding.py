"""The sans-I/O choice decoder: engine messages in, text and finish out, with the engine's
token counting rule, hidden stop ids and stop strings held back until they cannot match."""

from __future__ import annotations

import pytest

from homing.engines.client import GenerateDone, TokenChunk
from homing.gateway.decoding import ChoiceDecoder
from homing.text.served import load_served_tokenizer
from homing.text.stops import StopSet
from homing.text.tokenizer import TextTokenizer


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return load_served_tokenizer()


def chunk(ids: list[int]) -> TokenChunk:
    return TokenChunk(tuple(ids), prompt_tokens=4, completion_tokens=0, cached_tokens=2)


def done(ids: list[int], completion: int, reason: str = "length") -> GenerateDone:
    return GenerateDone(
        token_ids=tuple(ids),
        prompt_tokens=4,
        completion_tokens=completion,
        finish_reason=reason,
        cached_tokens=2,
        matched_stop=None,
    )


def decode(decoder: ChoiceDecoder, items: list[TokenChunk | GenerateDone]) -> tuple[str, str]:
    texts, finish = [], None
    for item in items:
        step = decoder.push(item)
        texts.extend(step.texts)
        finish = step.finish or finish
    assert finish is not None
    return "".join(texts), finish


def test_streamed_tokens_repeated_in_complete_are_counted_and_shown_once(
    tok: TextTokenizer,
) -> None:
    ids = tok.encode_plain(" one two three four")
    decoder = ChoiceDecoder(tok, stop_set=StopSet([]))
    text, finish = decode(decoder, [chunk(ids[:2]), chunk(ids[2:]), done(ids[2:], len(ids))])
    assert (text, finish) == (tok.decode(ids), "length")
    assert decoder.received == decoder.completion_tokens == len(ids)
    assert decoder.cached_tokens == 2


def test_final_tokens_only_in_complete_are_taken_from_it(tok: TextTokenizer) -> None:
    ids = tok.encode_plain(" alpha beta gamma")
    decoder = ChoiceDecoder(tok, stop_set=StopSet([]))
    text, _ = decode(decoder, [chunk(ids[:1]), done(ids[1:], len(ids))])
    assert text == tok.decode(ids)
    assert decoder.completion_tokens == len(ids)


def test_stop_string_split_across_chunks_ends_the_choice_before_it(tok: TextTokenizer) -> None:
    ids = tok.encode_plain(" red green END blue")
    decoder = ChoiceDecoder(tok, stop_set=StopSet(["END"]))
    steps = [decoder.push(chunk([i])) for i in ids]
    finished = [s.finish for s in steps if s.finish]
    assert finished == ["stop"]
    text = "".join(
        t for s in steps[: next(i for i, s in enumerate(steps) if s.finish) + 1] for t in s.texts
    )
    assert text == " red green "


def test_hidden_stop_id_is_counted_but_not_shown(tok: TextTokenizer) -> None:
    ids = tok.encode_plain(" hello there")
    eos = 1
    decoder = ChoiceDecoder(tok, stop_set=StopSet([]), hidden_stop_ids=frozenset({eos}))
    text, finish = decode(decoder, [chunk([*ids, eos]), done([eos], len(ids) + 1, "stop")])
    assert (text, finish) == (tok.decode(ids), "stop")
    assert decoder.completion_tokens == len(ids) + 1
