"""The sans-I/O choice decoder: engine messages in, text and finish out, with the engine's
token counting rule, hidden stop ids and stop strings held back until they cannot match;
the detailed decoder's reported tokens travel with the text they release."""

from __future__ import annotations

import pytest

from homing.engines.client import GenerateDone, PromptTokenLogprob, TokenChunk, TokenLogprob
from homing.gateway.decoding import ChoiceDecoder, DetailedDecoder, LoggedToken
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


def logged_chunk(ids: list[int], first: int = 0) -> TokenChunk:
    """A chunk whose tokens have logprobs -(position + 1) / 10 from position `first`."""
    entries = tuple(
        TokenLogprob(t, -(first + k + 1) / 10, ((t, -(first + k + 1) / 10),))
        for k, t in enumerate(ids)
    )
    return TokenChunk(tuple(ids), 4, first + len(ids), 2, logprobs=entries)


def logged_done(ids: list[int], first: int, completion: int) -> GenerateDone:
    entries = tuple(TokenLogprob(t, -(first + k + 1) / 10) for k, t in enumerate(ids))
    return GenerateDone(tuple(ids), "length", 4, completion, 2, None, logprobs=entries)


def detailed(
    decoder: DetailedDecoder, items: list[TokenChunk | GenerateDone]
) -> tuple[list[str], list[LoggedToken]]:
    """Each step's text and every reported token, in order; each step's tokens are those
    whose text that step released."""
    texts: list[str] = []
    logged: list[LoggedToken] = []
    for item in items:
        step = decoder.push(item)
        texts.append("".join(step.texts))
        logged.extend(step.logprobs)
    return texts, logged


def test_each_reported_token_comes_with_the_text_it_released_at_its_offset(
    tok: TextTokenizer,
) -> None:
    ids = tok.encode_plain(" one two three")
    decoder = DetailedDecoder(tok, stop_set=StopSet([]))
    items: list[TokenChunk | GenerateDone] = [logged_chunk([i], k) for k, i in enumerate(ids)]
    texts, logged = detailed(decoder, [*items, logged_done([ids[-1]], len(ids) - 1, len(ids))])
    text = "".join(texts)
    assert [e.token_id for e in logged] == ids  # the repeated last token is reported once
    assert [e.logprob for e in logged] == [-(k + 1) / 10 for k in range(len(ids))]
    assert [text[e.offset :].startswith(tok.decode([e.token_id])) for e in logged] == [True] * 3


def test_tokens_of_one_split_character_wait_for_it_and_share_its_offset(
    tok: TextTokenizer,
) -> None:
    ids = tok.encode_plain(" 𝔘 x")  # " 𝔘" is three byte tokens
    decoder = DetailedDecoder(tok, stop_set=StopSet([]))
    steps = [decoder.push(logged_chunk([i], k)) for k, i in enumerate(ids)]
    assert [len(s.logprobs) for s in steps[:3]] == [0, 0, 3]
    assert [e.offset for e in steps[2].logprobs] == [0, 0, 0]
    assert "".join(steps[2].texts) == " 𝔘"


def test_tokens_after_a_stop_string_are_not_reported(tok: TextTokenizer) -> None:
    ids = tok.encode_plain(" one two STOP three four")
    decoder = DetailedDecoder(tok, stop_set=StopSet(["STOP"]))
    texts, logged = detailed(decoder, [logged_chunk(ids)])
    # " STOP" is one token: its space was sent, so it is reported; " three" and on are not.
    assert "".join(texts) == " one two "
    assert "".join(tok.decode([e.token_id]) for e in logged) == " one two STOP"


def test_hidden_stop_id_is_not_reported(tok: TextTokenizer) -> None:
    ids = tok.encode_plain(" one two")
    eos = tok.eos_token_ids[0]
    decoder = DetailedDecoder(tok, stop_set=StopSet([]), hidden_stop_ids=frozenset({eos}))
    _, logged = detailed(decoder, [logged_chunk([*ids, eos]), logged_done([], 3, 3)])
    assert [e.token_id for e in logged] == ids


def test_silent_eos_is_not_shown_but_counted_and_reported(tok: TextTokenizer) -> None:
    """Special tokens kept as text: the EOS that ends the answer shows no text, yet it is
    counted and its log probability reported last, as without kept specials."""
    ids = tok.encode_plain(" one two")
    eos = tok.eos_token_ids[0]
    decoder = DetailedDecoder(
        tok, stop_set=StopSet([]), silent_ids=frozenset({eos}), skip_special_tokens=False
    )
    steps = [decoder.push(logged_chunk([*ids, eos])), decoder.push(done([], len(ids) + 1, "stop"))]
    text = "".join(t for step in steps for t in step.texts)
    reported = [entry.token_id for step in steps for entry in step.logprobs]
    assert text == tok.decode(ids) and reported == [*ids, eos]
    assert decoder.completion_tokens == len(ids) + 1
    plain = ChoiceDecoder(tok, stop_set=StopSet([]), silent_ids=frozenset({eos}),
                          skip_special_tokens=False)  # fmt: skip
    assert decode(plain, [chunk([*ids, eos]), done([], len(ids) + 1, "stop")]) == (
        tok.decode(ids),
        "stop",
    )


def test_echo_sends_the_prompt_first_and_its_tokens_before_the_answer(
    tok: TextTokenizer,
) -> None:
    prompt = tok.encode_plain("Hello there")
    answer = tok.encode_plain(" friend")
    entries = (
        PromptTokenLogprob(prompt[0], None),
        *(PromptTokenLogprob(t, -0.5, ((t, -0.5),)) for t in prompt[1:]),
    )
    first = logged_chunk(answer)
    first = TokenChunk(
        first.token_ids, 4, len(answer), 2, logprobs=first.logprobs, prompt_logprobs=entries
    )
    decoder = DetailedDecoder(tok, stop_set=StopSet([]), echo="Hello there")
    texts, logged = detailed(decoder, [first, logged_done([], len(answer), len(answer))])
    text = "".join(texts)
    assert text == "Hello there friend"
    assert [e.token_id for e in logged] == prompt + answer
    assert logged[0].logprob is None and logged[1].logprob == -0.5
    assert [text[e.offset :].startswith(tok.decode([e.token_id])) for e in logged] == [True] * (
        len(prompt) + len(answer)
    )


def test_echo_without_logprobs_reports_no_token(tok: TextTokenizer) -> None:
    ids = tok.encode_plain(" one")
    decoder = DetailedDecoder(tok, stop_set=StopSet([]), logprobs=False, echo="Say")
    texts, logged = detailed(decoder, [logged_chunk(ids), logged_done([], 1, 1)])
    assert "".join(texts) == "Say one" and logged == []
