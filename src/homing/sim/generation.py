"""What a simulated request "samples": real token ids of the served tokenizer, deterministically.

Rule of this file: the output of a request is a pure function of its inputs.
- temperature <= 0 (greedy): a function of the prompt ids only, so the same prompt gives the
  same answer streamed or not, on any worker;
- temperature > 0: a function of the request's seed (the request id unless a caller gives
  one) and the worker's configured seed;
- a logit bias of -100 bans a token and one of +100 forces it, as OpenAI describes these
  values: a banned id never appears (sentences lose it; a banned EOS moves the end to the next
  EOS id, or removes it), and with forced ids every token is one of them, drawn from the same
  seed, until the scheduler's limits end the answer. Biases strictly between have no
  observable effect (the simulated worker has no logits).

An answer is whole sentences drawn from a small corpus of readable English, Chinese and emoji
text (so multi-byte characters split across tokens reach the detokenizer), about
`min_tokens`..`max_tokens` tokens long (the length is drawn first, then sentences are added
until it is reached), then the tokenizer's first EOS id. Under ignore_eos the sentences go on
for as long as the scheduler asks. Seeds are derived with SHA-256 (never Python's salted
`hash`), and `random.Random(seed)` gives the draws, so outputs are stable across processes.
"""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Mapping, Sequence
from typing import Protocol

CORPUS: tuple[str, ...] = (
    "Hello! This answer comes from a simulated worker, not from a real model.",
    "Routing a conversation back to the replica that holds its prefix keeps the cache warm.",
    "The scheduler batches requests together and produces one token per step for each.",
    "Long prompts are split into chunks, so decoding never waits too long behind them.",
    "When the KV pool is full, new requests wait in the queue until pages are freed.",
    "A cached prefix turns most of the prefill into a lookup, and the first token comes sooner.",
    "Here is a short summary: the request was received, scheduled, and answered.",
    "Numbers for the record: 3 replicas, 42 requests, 0 errors, 99.9% uptime.",
    "你好！这是一个模拟的推理服务返回的回答。",
    "前缀缓存命中的时候，首个词元的延迟会明显降低。",
    "路由器会把同一段对话发送到保存着它的缓存的副本。",
    "今天天气很好，我们一起去公园散步吧。",
    "调度器把多个请求合成一批，每一步为每个请求生成一个词元。",
    "Deployment finished 🚀 and every replica reports healthy ✅.",
    "Coffee first ☕, then the benchmark numbers 📈.",
    "🌏 你好，世界！👋 Nice to meet you.",
    "Tokens arrive one by one ⏳ and then the stream is done 🎉.",
    "緑茶と抹茶、どちらが好きですか？🍵",
    "Ça marche très bien, merci beaucoup ! 😊",
    "The answer is 42 — and the question is still being computed 🤔.",
)
"""The sentences answers are made of (our own text)."""

BAN_BIAS = -100.0
"""A logit bias at or below this bans its token (OpenAI's range ends at -100)."""

FORCE_BIAS = 100.0
"""A logit bias at or above this forces its token (OpenAI's range ends at +100)."""


class Encoder(Protocol):
    """What the planner needs from a tokenizer (`homing.text.tokenizer.TextTokenizer`)."""

    eos_token_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...


def _seed_from_bytes(*parts: bytes) -> int:
    digest = hashlib.sha256(b"\x00".join(parts)).digest()
    return int.from_bytes(digest[:8], "big")


def greedy_seed(input_ids: Sequence[int]) -> int:
    """The draw seed of a temperature-0 request: SHA-256 of its prompt ids (uint32 LE)."""
    return _seed_from_bytes(b"greedy", struct.pack(f"<{len(input_ids)}I", *input_ids))


def sampled_seed(request_seed: int | str, worker_seed: int = 0) -> int:
    """The draw seed of a temperature > 0 request from its seed (or request id)."""
    return _seed_from_bytes(b"sampled", str(request_seed).encode(), str(worker_seed).encode())


class PlannedOutput:
    """A request's answer, produced lazily: `token_at(i)` is output token i (0-based).

    Sentences are appended until at least `target_tokens` tokens, then `eos_token_id`
    (unless `ignore_eos`, where sentences continue without end). With `forced` ids every
    token is drawn from them instead; with no sentence left (`sentences` empty) the answer is
    the EOS at once, or `filler` repeated when there is no EOS to give.
    """

    def __init__(
        self,
        sentences: Sequence[Sequence[int]],
        spaced_sentences: Sequence[Sequence[int]],
        rng: random.Random,
        target_tokens: int,
        eos_token_id: int | None,
        ignore_eos: bool,
        *,
        forced: Sequence[int] = (),
        filler: int = 0,
    ) -> None:
        self._sentences = sentences
        self._spaced = spaced_sentences
        self._rng = rng
        self._target = target_tokens
        self._eos = eos_token_id
        self._ignore_eos = ignore_eos or eos_token_id is None
        self._forced = tuple(forced)
        self._filler = filler
        self._tokens: list[int] = []
        self._ended = False
        self._last = -1

    def token_at(self, index: int) -> int:
        """Token `index` of the answer. After the EOS (never under ignore_eos) the EOS repeats,
        which only a scheduler that ignores EOS would ask for."""
        while index >= len(self._tokens) and not self._ended:
            self._extend()
        if index < len(self._tokens):
            return self._tokens[index]
        assert self._eos is not None
        return self._eos

    def _extend(self) -> None:
        if self._forced:
            self._tokens.append(self._forced[self._rng.randrange(len(self._forced))])
            return
        if not self._sentences:
            if self._ignore_eos:
                self._tokens.append(self._filler)
                return
            assert self._eos is not None
            self._tokens.append(self._eos)
            self._ended = True
            return
        if not self._ignore_eos and len(self._tokens) >= self._target:
            assert self._eos is not None
            self._tokens.append(self._eos)
            self._ended = True
            return
        choice = self._rng.randrange(len(self._sentences))
        if choice == self._last and len(self._sentences) > 1:
            choice = (choice + 1) % len(self._sentences)
        self._last = choice
        source = self._spaced if self._tokens else self._sentences
        self._tokens.extend(source[choice])


class OutputPlanner:
    """Makes each request's `PlannedOutput` (see the module docstring).

    tokenizer: the served tokenizer (real ids; EOS = its first eos id).
    min_tokens / max_tokens: range of the drawn answer length before EOS.
    worker_seed: mixed into sampled (temperature > 0) answers only.
    Raises ValueError when min_tokens > max_tokens or the corpus is empty.
    """

    def __init__(
        self,
        tokenizer: Encoder,
        *,
        corpus: Sequence[str] = CORPUS,
        min_tokens: int = 20,
        max_tokens: int = 120,
        worker_seed: int = 0,
    ) -> None:
        if not corpus:
            raise ValueError("the corpus is empty")
        if min_tokens > max_tokens:
            raise ValueError(f"min_tokens {min_tokens} > max_tokens {max_tokens}")
        self.min_tokens = min_tokens
        self.max_tokens = max_tokens
        self.worker_seed = worker_seed
        self.eos_token_ids = tuple(tokenizer.eos_token_ids)
        self.eos_token_id = self.eos_token_ids[0] if self.eos_token_ids else None
        self._sentences = tuple(tuple(tokenizer.encode(s)) for s in corpus)
        self._spaced = tuple(tuple(tokenizer.encode(" " + s)) for s in corpus)

    def plan(
        self,
        input_ids: Sequence[int],
        *,
        temperature: float = 0.0,
        seed: int | str | None = None,
        request_id: str = "",
        ignore_eos: bool = False,
        logit_bias: Mapping[int, float] | None = None,
    ) -> PlannedOutput:
        """The answer of one request: greedy (temperature <= 0) from the prompt alone, sampled
        from `seed` (or `request_id` when None) otherwise; `logit_bias` (token id -> bias)
        bans and forces tokens as the module docstring says."""
        if temperature <= 0.0:
            draw_seed = greedy_seed(input_ids)
        else:
            draw_seed = sampled_seed(seed if seed is not None else request_id, self.worker_seed)
        rng = random.Random(draw_seed)
        target = rng.randint(self.min_tokens, self.max_tokens)
        bias = logit_bias or {}
        banned = frozenset(t for t, b in bias.items() if b <= BAN_BIAS)
        forced = sorted(t for t, b in bias.items() if b >= FORCE_BIAS)
        if not banned:
            return PlannedOutput(
                self._sentences,
                self._spaced,
                rng,
                target,
                self.eos_token_id,
                ignore_eos,
                forced=forced,
            )
        pairs = [
            (_without(plain, banned), _without(lead, banned))
            for plain, lead in zip(self._sentences, self._spaced, strict=True)
        ]
        kept = [(plain, lead) for plain, lead in pairs if plain and lead]
        sentences = tuple(plain for plain, _ in kept)
        spaced = tuple(lead for _, lead in kept)
        eos = next((e for e in self.eos_token_ids if e not in banned), None)
        filler = next(t for t in range(len(banned) + 1) if t not in banned)
        return PlannedOutput(
            sentences, spaced, rng, target, eos, ignore_eos, forced=forced, filler=filler
        )


def _without(tokens: Sequence[int], banned: frozenset[int]) -> tuple[int, ...]:
    return tuple(t for t in tokens if t not in banned)
