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
A request's seed is the `seed` its caller gives (SGLang's `custom_params` {"seed": N}, see
`homing.sim.servicer`), else its request id.

Chat prompts of the served template (`homing.sim.chat` reads them; a plain prompt costs a
few index checks) and constraints change what is written, in the template's own format:
- a constraint (`homing.sim.grammar`): exactly one instance of it, then EOS; after reasoning
  (below) only when the request sets `require_reasoning` (as SGLang with a reasoning parser
  starts the grammar after the thought), else from the first token. An instance longer than
  the request's `max_new_tokens` leaves room for is cut: the answer is a prefix of it, without
  EOS and at least as many tokens long as the request may still write, so the scheduler ends
  it at "length", as `max_new_tokens` cuts a real engine's constrained answer. Its text is
  drawn with a budget of `CHARS_PER_TOKEN` characters per token (plus `BUDGET_SLACK`), and
  drawn again from the same rng state with a larger one while it encodes to too few tokens,
  up to `MAX_BUDGET` characters; so its cost follows the tokens asked for, never the
  constraint's numbers;
- a prompt ending with `<think>`: reasoning sentences (`homing.sim.chat.REASONING_CORPUS`),
  then `</think>`, then the answer below;
- a prompt ending right after a tool result: "The tool returned: <the result, cut>", EOS;
- a prompt whose tools block declares tools, its last turn the user's: with odds
  `tool_call_share`, one call of a declared tool (drawn), its arguments an instance of the
  tool's parameters schema whose strings are words of the user's message (`{}` when that
  schema is refused or its instance is longer than the same budget), then EOS; else a plain
  answer.
These texts draw from their own generator (the draw seed salted), so plain answers never
change, and ignore `logit_bias`; under ignore_eos the corpus answer follows them (a
constrained answer repeats EOS). Every answer exposes its `draw_seed` (the log probabilities
of `homing.sim.logprobs` are keyed by it).
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
from collections.abc import Mapping, Sequence
from typing import Protocol

from homing.sim.chat import (
    REASONING_CORPUS,
    ChatTokens,
    PromptFacts,
    argument_words,
    last_user_text,
    object_schema,
    quote_tool_output,
    read_prompt,
)
from homing.sim.grammar import Constraint
from homing.sim.instances import DEFAULT_BUDGET, ConstraintError, InstanceCut, schema_instance

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


FEATURE_SALT = 0x5EED_F00D_CAFE
"""Mixed into the draw seed for the texts of tools, reasoning and constraints."""

CHARS_PER_TOKEN = 8
"""First character budget of a constrained answer (and of a tool call's arguments), per token
the answer may still write. The served tokenizer takes about 2 to 4 characters per token of
the simulator's JSON and words, so a text cut at 8 per token holds enough tokens at the first
draw; runs of one character take more (8 for `a`s, 128 for spaces) and are drawn again."""

BUDGET_SLACK = 64
"""Characters added to every such budget, so an answer allowed few tokens (or none) still
writes a short instance whole."""

MAX_BUDGET = 1 << 21
"""The largest character budget (2 Mi characters: about a second of drawing and encoding).
A cut text that still encodes to too few tokens at it (more than 16 characters per token at
131,072 tokens: long runs of one character) keeps what it has, and the EOS follows."""


class Encoder(Protocol):
    """What the planner needs from a tokenizer (`homing.text.tokenizer.TextTokenizer`)."""

    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def encode_plain(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def token_to_id(self, token: str | None) -> int | None: ...


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
        draw_seed: int = 0,
    ) -> None:
        self.draw_seed = draw_seed
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


class FixedOutput:
    """An answer that starts with fixed tokens: `prefix`, then `then`'s tokens (indexed from
    0 after the prefix), or `eos_token_id` repeated when `then` is None."""

    def __init__(
        self,
        prefix: Sequence[int],
        then: PlannedOutput | None,
        eos_token_id: int | None,
        draw_seed: int = 0,
    ) -> None:
        self.prefix = tuple(prefix)
        self.then = then
        self.eos_token_id = eos_token_id
        self.draw_seed = draw_seed

    def token_at(self, index: int) -> int:
        if index < len(self.prefix):
            return self.prefix[index]
        if self.then is not None:
            return self.then.token_at(index - len(self.prefix))
        assert self.eos_token_id is not None
        return self.eos_token_id


Answer = PlannedOutput | FixedOutput
"""What `OutputPlanner.plan` returns: a `token_at(index)` source with its `draw_seed`."""


class OutputPlanner:
    """Makes each request's answer (see the module docstring).

    tokenizer: the served tokenizer (real ids; EOS = its first eos id).
    min_tokens / max_tokens: range of the drawn answer length before EOS.
    worker_seed: mixed into sampled (temperature > 0) answers only.
    tool_call_share: odds that a prompt offering tools, its last turn the user's, is
    answered with a tool call (0..1).
    Raises ValueError when min_tokens > max_tokens, the corpus is empty or tool_call_share
    is outside 0..1.
    """

    def __init__(
        self,
        tokenizer: Encoder,
        *,
        corpus: Sequence[str] = CORPUS,
        min_tokens: int = 20,
        max_tokens: int = 120,
        worker_seed: int = 0,
        tool_call_share: float = 1.0,
    ) -> None:
        if not corpus:
            raise ValueError("the corpus is empty")
        if min_tokens > max_tokens:
            raise ValueError(f"min_tokens {min_tokens} > max_tokens {max_tokens}")
        if not 0.0 <= tool_call_share <= 1.0:
            raise ValueError(f"tool_call_share must be in 0..1, got {tool_call_share}")
        self.min_tokens = min_tokens
        self.max_tokens = max_tokens
        self.worker_seed = worker_seed
        self.tool_call_share = tool_call_share
        self.eos_token_ids = tuple(tokenizer.eos_token_ids)
        self.eos_token_id = self.eos_token_ids[0] if self.eos_token_ids else None
        self._sentences = tuple(tuple(tokenizer.encode(s)) for s in corpus)
        self._spaced = tuple(tuple(tokenizer.encode(" " + s)) for s in corpus)
        self._tokenizer = tokenizer
        self.chat_tokens = ChatTokens.from_tokenizer(tokenizer, tokenizer.bos_token_id)
        self._reasoning = tuple(tuple(tokenizer.encode(s)) for s in REASONING_CORPUS)
        self._reasoning_spaced = tuple(tuple(tokenizer.encode(" " + s)) for s in REASONING_CORPUS)
        special = set(self.eos_token_ids)
        self.token_pool: tuple[int, ...] = tuple(
            sorted({t for sentence in self._sentences for t in sentence} - special)
        )
        """Ordinary ids of the corpus: the alternatives log probabilities list."""

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def read_prompt(self, input_ids: Sequence[int]) -> PromptFacts | None:
        """What a chat prompt asks for (`homing.sim.chat.read_prompt`); None for plain text."""
        if self.chat_tokens is None:
            return None
        return read_prompt(input_ids, self.chat_tokens, self._decode)

    def plan(
        self,
        input_ids: Sequence[int],
        *,
        temperature: float = 0.0,
        seed: int | str | None = None,
        request_id: str = "",
        ignore_eos: bool = False,
        logit_bias: Mapping[int, float] | None = None,
        constraint: Constraint | None = None,
        require_reasoning: bool = False,
        max_new_tokens: int | None = None,
    ) -> Answer:
        """The answer of one request: greedy (temperature <= 0) from the prompt alone, sampled
        from `seed` (or `request_id` when None) otherwise; `logit_bias` (token id -> bias)
        bans and forces tokens, and chat prompts and `constraint` shape the answer, as the
        module docstring says. `max_new_tokens`: the most tokens the scheduler lets the
        request write, which sizes a constrained answer and a tool call (None: not known;
        those texts get `homing.sim.instances.DEFAULT_BUDGET` characters)."""
        if temperature <= 0.0:
            draw_seed = greedy_seed(input_ids)
        else:
            draw_seed = sampled_seed(seed if seed is not None else request_id, self.worker_seed)
        corpus = self._corpus(draw_seed, ignore_eos, logit_bias)
        facts = self.read_prompt(input_ids)
        if constraint is None and facts is None:
            return corpus
        return self._shaped(
            input_ids, draw_seed, corpus, facts, constraint, require_reasoning, max_new_tokens
        )

    def _shaped(
        self,
        input_ids: Sequence[int],
        draw_seed: int,
        corpus: PlannedOutput,
        facts: PromptFacts | None,
        constraint: Constraint | None,
        require_reasoning: bool,
        max_new_tokens: int | None,
    ) -> Answer:
        """A chat or constrained answer (see the module docstring)."""
        rng = random.Random(draw_seed ^ FEATURE_SALT)
        eos = self.eos_token_id
        tail = [] if eos is None else [eos]
        tokens = self.chat_tokens
        prefix: list[int] = []
        thinking = facts is not None and facts.thinking and tokens is not None
        if constraint is not None:
            if thinking and require_reasoning:
                prefix += self._reasoning_tokens(rng)
            words = argument_words(last_user_text(input_ids, tokens, self._decode))
            left = None if max_new_tokens is None else max(0, max_new_tokens - len(prefix))
            ids, complete = self._constrained(rng, constraint, words, left)
            return FixedOutput([*prefix, *ids, *(tail if complete else [])], None, eos, draw_seed)
        assert facts is not None and tokens is not None
        if thinking:
            prefix += self._reasoning_tokens(rng)
        if facts.tool_output is not None:
            prefix += self._tokenizer.encode_plain(quote_tool_output(facts.tool_output))
            return FixedOutput([*prefix, *tail], corpus, eos, draw_seed)
        if facts.tools and rng.random() < self.tool_call_share:
            left = None if max_new_tokens is None else max(0, max_new_tokens - len(prefix))
            prefix += self._tool_call(rng, facts, tokens, _first_budget(left))
            return FixedOutput([*prefix, *tail], corpus, eos, draw_seed)
        return FixedOutput(prefix, corpus, eos, draw_seed) if prefix else corpus

    def _constrained(
        self,
        rng: random.Random,
        constraint: Constraint,
        words: Sequence[str],
        left: int | None,
    ) -> tuple[list[int], bool]:
        """The token ids of the constraint's text and whether it is a whole instance. A cut
        text holds at least `left` tokens (the answer's room; None: unknown, no such need)
        unless `MAX_BUDGET` or the writer's steps (`homing.sim.instances.STEPS_PER_CHAR`)
        stopped it; each redraw starts from the same rng state, so the answer is
        deterministic."""
        needed = 0 if left is None else left
        state = rng.getstate()
        budget = _first_budget(left)
        while True:
            written = constraint.text(rng, words, self._token_text, budget=budget)
            ids = self._tokenizer.encode(written.text)
            if (
                written.complete
                or len(ids) >= needed
                or len(written.text) < budget  # stopped by steps: more characters won't help
                or budget >= MAX_BUDGET
            ):
                # tokens past the room are never read: a cut answer keeps only those it needs
                return (ids if written.complete or left is None else ids[:needed]), written.complete
            # a larger budget, by the characters per token seen (at least twice as large)
            wanted = -(-budget * needed // max(len(ids), 1)) * 5 // 4
            budget = min(MAX_BUDGET, max(2 * budget, wanted))
            rng.setstate(state)

    def _token_text(self, token_id: int) -> str:
        return self._tokenizer.decode([token_id], skip_special_tokens=False)

    def _reasoning_tokens(self, rng: random.Random) -> list[int]:
        """One or two reasoning sentences, then `</think>`."""
        assert self.chat_tokens is not None
        first = rng.randrange(len(self._reasoning))
        out = list(self._reasoning[first])
        if rng.random() < 0.5:
            second = (first + 1 + rng.randrange(len(self._reasoning) - 1)) % len(self._reasoning)
            out += self._reasoning_spaced[second]
        out.append(self.chat_tokens.think_end)
        return out

    def _tool_call(
        self, rng: random.Random, facts: PromptFacts, tokens: ChatTokens, budget: int
    ) -> list[int]:
        """One call of a declared tool in the template's format (without the EOS); its
        arguments `{}` when their instance is refused or longer than `budget` characters."""
        tool = facts.tools[rng.randrange(len(facts.tools))]
        try:
            arguments = schema_instance(
                object_schema(tool.parameters), rng, argument_words(facts.user_text), budget
            )
        except (ConstraintError, InstanceCut):
            arguments = {}
        encode = self._tokenizer.encode_plain
        return [
            tokens.tool_calls_begin,
            tokens.tool_call_begin,
            *encode(tool.name),
            tokens.tool_sep,
            *encode(json.dumps(arguments, ensure_ascii=False)),
            tokens.tool_call_end,
            tokens.tool_calls_end,
        ]

    def _corpus(
        self, draw_seed: int, ignore_eos: bool, logit_bias: Mapping[int, float] | None
    ) -> PlannedOutput:
        """The plain corpus answer of `draw_seed` (see the module docstring)."""
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
                draw_seed=draw_seed,
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
            sentences,
            spaced,
            rng,
            target,
            eos,
            ignore_eos,
            forced=forced,
            filler=filler,
            draw_seed=draw_seed,
        )


def _first_budget(left: int | None) -> int:
    """The first character budget of a text the answer has room for `left` tokens of (None:
    unknown)."""
    if left is None:
        return DEFAULT_BUDGET
    return min(MAX_BUDGET, CHARS_PER_TOKEN * left + BUDGET_SLACK)


def _without(tokens: Sequence[int], banned: frozenset[int]) -> tuple[int, ...]:
    return tuple(t for t in tokens if t not in banned)
