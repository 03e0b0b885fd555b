"""Log probabilities on both engines, checked through the official SDK: chat `logprobs` /
`top_logprobs` report one entry per generated token whose bytes are the answer's text, with
sorted top entries that the greedy token heads; streamed, the same entries arrive in pieces;
completions `logprobs` with `echo` report the prompt's tokens first (the first with no
logprob), with text offsets that place each token in the text."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
from engine_fleet import Fleet
from openai import AsyncOpenAI

from homing.app import App

pytestmark = pytest.mark.asyncio(loop_scope="module")

MAX_TOKENS = 8
MESSAGES: list[Any] = [{"role": "user", "content": "Name three rivers of Europe."}]
PROMPT = "The longest river of Europe is"
TOLERANCE = 1e-4
_ESCAPE = re.compile(r"\\x([0-9a-f]{2})")


def _client(app: App) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=f"http://127.0.0.1:{app.http_port}/v1", api_key="unused", max_retries=0
    )


def _chat_fields(app: App) -> dict[str, Any]:
    return {
        "model": app.model.model_id,
        "messages": MESSAGES,
        "logprobs": True,
        "top_logprobs": 3,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }


def _raw(token: str) -> bytes:
    """A completions token string's bytes (a "bytes:\\xNN..." string is its escaped bytes)."""
    if token.startswith("bytes:"):
        return bytes(int(h, 16) for h in _ESCAPE.findall(token))
    return token.encode("utf-8")


def _whole(token: str) -> bool:
    return not token.startswith("bytes:")


async def test_chat_logprobs_cover_every_token_with_sorted_tops_headed_by_the_greedy_token(
    gateway: App, fleet: Fleet
) -> None:
    """Greedy chat with `top_logprobs=3`: one entry per completion token, whose bytes joined
    are the content; every logprob <= 0; three top entries in non-increasing order, the
    first of which is the sampled token with its logprob."""
    answer = await _client(gateway).chat.completions.create(**_chat_fields(gateway))
    choice = answer.choices[0]
    assert choice.finish_reason == "length", choice
    assert answer.usage is not None and answer.usage.completion_tokens == MAX_TOKENS
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert len(content) == answer.usage.completion_tokens
    joined = bytes(b for e in content for b in e.bytes or [])
    assert joined.decode(errors="replace") == choice.message.content  # a cut char: U+FFFD
    for entry in content:
        assert entry.logprob <= 0
        assert bytes(entry.bytes or []) == _raw(entry.token)
        tops = entry.top_logprobs
        assert len(tops) == 3
        assert all(t.logprob <= 0 for t in tops)
        assert all(a.logprob >= b.logprob for a, b in itertools.pairwise(tops))
        assert entry.token == tops[0].token and entry.bytes == tops[0].bytes
        assert abs(entry.logprob - tops[0].logprob) <= TOLERANCE


async def test_streamed_chat_logprobs_equal_the_whole_answers(gateway: App, fleet: Fleet) -> None:
    """The same greedy request streamed: the chunks' logprob entries, joined, are the
    non-streamed answer's (tokens, bytes and tops alike; logprobs within 1e-4)."""
    client = _client(gateway)
    fields = _chat_fields(gateway)
    whole = await client.chat.completions.create(**fields)
    assert whole.choices[0].logprobs is not None
    expected = whole.choices[0].logprobs.content or []
    stream = await client.chat.completions.create(**fields, stream=True)
    streamed: list[Any] = []
    async for chunk in stream:
        for choice in chunk.choices:
            if choice.logprobs is not None:
                streamed.extend(choice.logprobs.content or [])
    assert [(e.token, e.bytes) for e in streamed] == [(e.token, e.bytes) for e in expected]
    for got, want in zip(streamed, expected, strict=True):
        assert abs(got.logprob - want.logprob) <= TOLERANCE
        assert [t.token for t in got.top_logprobs] == [t.token for t in want.top_logprobs]
        for a, b in zip(got.top_logprobs, want.top_logprobs, strict=True):
            assert abs(a.logprob - b.logprob) <= TOLERANCE


async def test_echoed_completion_logprobs_place_prompt_and_answer_tokens_in_the_text(
    gateway: App, fleet: Fleet
) -> None:
    """`logprobs=2` with `echo`: the text starts with the prompt; there is one entry per
    prompt and completion token, the prompt's being exactly its text (neither engine adds a
    BOS token to a text prompt), the first with null logprob and top; offsets start at 0,
    never decrease, and put each whole-UTF-8 token at its place in the text; each top dict
    holds at most 3 tokens, the sampled one among them."""
    answer = await _client(gateway).completions.create(
        model=gateway.model.model_id,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        logprobs=2,
        echo=True,
        extra_body={"ignore_eos": True},
    )
    choice = answer.choices[0]
    text = choice.text
    assert text.startswith(PROMPT)
    assert answer.usage is not None and answer.usage.completion_tokens == MAX_TOKENS
    lp = choice.logprobs
    assert lp is not None
    tokens = lp.tokens or []
    values = lp.token_logprobs or []
    tops = lp.top_logprobs or []
    offsets = lp.text_offset or []
    assert len(tokens) == answer.usage.prompt_tokens + answer.usage.completion_tokens
    assert len(values) == len(tops) == len(offsets) == len(tokens)
    prompt_tokens = answer.usage.prompt_tokens
    assert b"".join(_raw(t) for t in tokens[:prompt_tokens]).decode() == PROMPT  # no BOS
    assert offsets[prompt_tokens] == len(PROMPT)
    assert values[0] is None and tops[0] is None
    assert offsets[0] == 0
    assert all(a <= b for a, b in itertools.pairwise(offsets))
    for token, offset in zip(tokens, offsets, strict=True):
        if _whole(token):
            assert text[offset : offset + len(token)] == token, (token, offset, text)
    for token, value, top in zip(tokens[1:], values[1:], tops[1:], strict=True):
        assert value is not None and value <= 0
        assert top is not None and 1 <= len(top) <= 3
        assert token in top and abs(top[token] - value) <= TOLERANCE


async def test_streamed_completion_logprobs_match_each_chunks_text(
    gateway: App, fleet: Fleet
) -> None:
    """Streamed `logprobs=1`: every chunk's logprob lists are equally long, and the chunks'
    token bytes, joined, decode to the chunks' text joined."""
    stream = await _client(gateway).completions.create(
        model=gateway.model.model_id,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        logprobs=1,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    pieces: list[str] = []
    raw = b""
    count = 0
    async for chunk in stream:
        for choice in chunk.choices:
            pieces.append(choice.text)
            if choice.logprobs is None:
                continue
            tokens = choice.logprobs.tokens or []
            assert len(tokens) == len(choice.logprobs.token_logprobs or [])
            assert len(tokens) == len(choice.logprobs.text_offset or [])
            raw += b"".join(_raw(t) for t in tokens)
            count += len(tokens)
    assert count == MAX_TOKENS
    assert raw.decode(errors="replace") == "".join(pieces)  # a cut char: U+FFFD
