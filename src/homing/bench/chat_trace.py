"""A synthetic multi-tenant chat trace in Mooncake form: shared system prompts, many tenants,
conversations that grow turn by turn.

Rule of this file: pure and deterministic, like `homing.bench.traces`. The same `ChatConfig`
gives the same rows on every machine: every draw is xxHash3-64 of (stream, key) seeded with
`seed`, in counter mode, turned into a uniform in (0, 1) and then into an exponential,
lognormal or geometric variate with `math.log` / `math.exp` / `NormalDist.inv_cdf` (IEEE
doubles; a libm that differs in the last bit could in rare cases round a length differently).
No clock, no stdlib `random`, no numpy. Each draw is keyed by what it is for (conversation,
turn), so changing one knob does not reshuffle unrelated draws.

The workload (all lengths in tokens, times in seconds of trace time):

- `tenants` tenants; a new conversation's tenant is drawn Zipf(`tenant_skew`) (tenant 0 the
  most popular). Tenant t's system prompt is `1 + floor(u * (2 * system_blocks - 1))` whole
  512-token blocks (mean `system_blocks`), shared by all its users. `preamble_tenants()`
  (`round(preamble_share * tenants)` tenants, evenly spaced from tenant 0) put a platform
  preamble of `preamble_blocks` blocks, common to all of them, before it.
- `users_per_tenant` users per tenant, drawn uniformly; each has `user_blocks` blocks of its
  own (custom instructions, memory) after the system prompt, shared by its conversations.
- Conversations start as a Poisson process of `rate` per second over
  `[-warmup_s, duration_s)`; only requests in `[0, duration_s)` are emitted, so the trace
  opens on a service in steady state (the first requests of conversations begun before 0
  carry histories nobody has cached, as at any cache's start). A conversation has
  `min(max_turns, Geometric(mean_turns))` turns. Turn k's prompt is the prefix (preamble,
  system prompt, user blocks), every earlier user message and answer, and the new user
  message; so turn k's prompt extends turn k-1's, token for token. User messages are
  lognormal (median `user_median`, log-sd `user_sigma`), answers lognormal (median
  `answer_median`, log-sd `answer_sigma`), both clipped to [`MIN_TOKENS`, `MAX_MESSAGE`]. The
  next turn arrives `answer_tokens * answer_s_per_token` (the answer streaming) plus an
  exponential think time (mean `think_s`) after this one.

Hash ids (one per 512-token block, the last one possibly partial; `traces.PromptBuilder`
makes block id b's tokens a function of b and cuts the last block). The prefix parts are
whole blocks, so a conversation's first message starts a fresh block. A prompt that ends in a
partial block has that block's content extended by the next turn; `partial` says how:

- "extend" (default): the block keeps its id while it fills. `PromptBuilder` then gives turn
  k-1's prompt as an exact token prefix of turn k's, as a real chat template does (the
  engines and the bench's bound work at 16-token pages, so those pages are reusable in
  reality). Equal ids mean the same 512-token block; a prompt uses a prefix of its last one.
- "fresh": Mooncake's own convention (an id hashes one block's exact content): a partial
  block gets a new id when its content grows, so only full blocks are shared between turns
  (up to 511 reusable tokens a turn are lost).

Defaults (assumptions unless a source is named): 32 tenants, 16 users each, system prompts of
1-7 blocks (mean 4: 2,048 tokens, an assistant's instructions plus examples), a preamble of 2
blocks on a quarter of the tenants, 1 user block; user messages median 64 tokens (log-sd 1.0:
mean ~105, a few long pastes), answers median 200 (log-sd 0.5: mean ~227); LMSYS-Chat-1M
reports about 70 and 215 tokens a turn and 2.0 turns a conversation on average (Zheng et al.,
ICLR 2024, Table 1); more turns here (mean 4, at most 16), for a product whose conversations
grow; 30 s of think time; answers stream at 30 ms a token (a 70B TP8 decode step under load,
inside the bench's 50 ms TPOT SLO); 600 s of warm-up. `rate` 4 conversations/s (~16
requests/s) puts 8 simulated llama-3.1-70b TP8 H100 workers at 73-77% load under round robin
at trace speed 1 (`homing.bench.routers`' estimate), so the bench replays it at about real
time and think times stay real; `duration_s` 125 gives 1,973 requests, prompts p5/p50/p95
2.1k/3.8k/6.4k tokens, answers 94/201/438.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import math
import struct
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Literal, TextIO

import xxhash

from homing.bench.traces import MOONCAKE_BLOCK_TOKENS, TraceRequest

BLOCK = MOONCAKE_BLOCK_TOKENS
MIN_TOKENS = 4
"""Shortest user message or answer, tokens (a one-word message plus template tokens)."""
MAX_MESSAGE = 8192
"""Longest user message or answer, tokens (clips the lognormals' tails)."""
SPEC_PREFIX = "chat"
"""`--trace chat` or `--trace chat:key=value,...` selects this trace in the benches."""

PartialRule = Literal["extend", "fresh"]

# Draw streams: the first word of every hashed key, so the draws of different purposes are
# independent. Values are arbitrary and fixed.
_S_GAP, _S_TENANT, _S_USER, _S_TURNS = 1, 2, 3, 4
_S_USER_TOKENS, _S_ANSWER_TOKENS, _S_THINK, _S_SYSTEM_LEN = 5, 6, 7, 8
_NORMAL = NormalDist()


@dataclass(frozen=True, slots=True)
class ChatConfig:
    """Knobs of the chat workload (module docstring); lengths in tokens or 512-token blocks,
    times in seconds of trace time. Raises ValueError for out-of-range values."""

    tenants: int = 32
    users_per_tenant: int = 16
    system_blocks: int = 4
    preamble_blocks: int = 2
    preamble_share: float = 0.25
    user_blocks: int = 1
    tenant_skew: float = 1.0
    mean_turns: float = 4.0
    max_turns: int = 16
    rate: float = 4.0
    duration_s: float = 125.0
    warmup_s: float = 600.0
    think_s: float = 30.0
    answer_s_per_token: float = 0.03
    user_median: float = 64.0
    user_sigma: float = 1.0
    answer_median: float = 200.0
    answer_sigma: float = 0.5
    partial: PartialRule = "extend"
    seed: int = 0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name} must be finite, got {value}")
        positive = ("tenants", "users_per_tenant", "system_blocks", "max_turns")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("preamble_blocks", "user_blocks", "tenant_skew"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("rate", "duration_s", "user_median", "answer_median"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("warmup_s", "think_s", "answer_s_per_token", "user_sigma", "answer_sigma"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.preamble_share <= 1:
            raise ValueError(f"preamble_share must be in [0, 1], got {self.preamble_share}")
        if self.mean_turns < 1:
            raise ValueError(f"mean_turns must be >= 1, got {self.mean_turns}")
        if self.partial not in ("extend", "fresh"):
            raise ValueError(f"partial must be 'extend' or 'fresh', got {self.partial!r}")
        if not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")


@dataclass(frozen=True, slots=True)
class ChatTurn:
    """One request of the chat trace with where it came from.

    `timestamp_ms`: arrival, integer ms after the first emitted request (Mooncake's
    `timestamp`). `prefix_blocks`: how many leading `hash_ids` are the tenant's preamble and
    system prompt; the user's own `user_blocks` follow them. `turn`: 0-based turn of
    `conversation` (0-based in start order, counting the warm-up's).
    """

    timestamp_ms: int
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    tenant: int
    user: int
    conversation: int
    turn: int
    prefix_blocks: int


# ============================================================================ draws


def _uniform(seed: int, stream: int, *key: int) -> float:
    """A uniform in (0, 1): the top 53 bits of xxh3_64(stream, *key; seed), centred."""
    digest = xxhash.xxh3_64_intdigest(struct.pack(f"<{1 + len(key)}q", stream, *key), seed=seed)
    return ((digest >> 11) + 0.5) * 2.0**-53


def _exponential(u: float, mean: float) -> float:
    return -mean * math.log(u)


def _lognormal_tokens(u: float, median: float, sigma: float) -> int:
    value = median * math.exp(sigma * _NORMAL.inv_cdf(u))
    return min(MAX_MESSAGE, max(MIN_TOKENS, round(value)))


def _geometric(u: float, mean: float, cap: int) -> int:
    """1 + floor(log u / log p) with continuation p = 1 - 1/mean (mean `mean`), at most `cap`."""
    if mean <= 1:
        return 1
    return min(cap, 1 + int(math.log(u) / math.log(1.0 - 1.0 / mean)))


# ============================================================================ the trace


def preamble_tenants(config: ChatConfig) -> set[int]:
    """The tenants whose prompts start with the platform preamble: `round(preamble_share *
    tenants)` of them, tenant `floor(i * tenants / n)` for i < n."""
    n = round(config.preamble_share * config.tenants)
    return {i * config.tenants // n for i in range(n)}


def chat_turns(config: ChatConfig) -> list[ChatTurn]:
    """Every request of the workload in arrival order (ties by conversation, then turn).

    Hash ids are small integers allocated in a fixed order: preamble, system prompts by
    tenant, user blocks by (tenant, user), then conversation blocks as they are written, so
    distinct content never shares an id.
    """
    c = config
    s = c.seed
    next_id = 0

    def allocate(n: int) -> list[int]:
        nonlocal next_id
        ids = list(range(next_id, next_id + n))
        next_id += n
        return ids

    preamble = allocate(c.preamble_blocks)
    with_preamble = preamble_tenants(c)
    prefixes: list[list[int]] = []
    for tenant in range(c.tenants):
        blocks = 1 + int(_uniform(s, _S_SYSTEM_LEN, tenant) * (2 * c.system_blocks - 1))
        prefixes.append((preamble if tenant in with_preamble else []) + allocate(blocks))
    user_ids = [allocate(c.user_blocks) for _ in range(c.tenants * c.users_per_tenant)]
    weights = [1.0 / (t + 1) ** c.tenant_skew for t in range(c.tenants)]
    cumulative = [sum(weights[: t + 1]) for t in range(c.tenants)]

    turns_out: list[ChatTurn] = []  # timestamps in ms after t = 0 until the end
    t = -c.warmup_s
    conversation = 0
    while True:
        t += _exponential(_uniform(s, _S_GAP, conversation), 1.0 / c.rate)
        if t >= c.duration_s:
            break
        pick = _uniform(s, _S_TENANT, conversation) * cumulative[-1]
        tenant = min(bisect.bisect_right(cumulative, pick), c.tenants - 1)
        user = int(_uniform(s, _S_USER, conversation) * c.users_per_tenant)
        turns = _geometric(_uniform(s, _S_TURNS, conversation), c.mean_turns, c.max_turns)
        ids = prefixes[tenant] + user_ids[tenant * c.users_per_tenant + user]
        context = len(ids) * BLOCK  # tokens before this turn's user message
        prompt = context  # the previous prompt's length; `ids` are its blocks
        at = t
        for turn in range(turns):
            if at >= c.duration_s:
                break
            u_message = _uniform(s, _S_USER_TOKENS, conversation, turn)
            u_answer = _uniform(s, _S_ANSWER_TOKENS, conversation, turn)
            message = _lognormal_tokens(u_message, c.user_median, c.user_sigma)
            answer = _lognormal_tokens(u_answer, c.answer_median, c.answer_sigma)
            if c.partial == "fresh" and prompt % BLOCK:
                ids[-1] = allocate(1)[0]  # the partial last block's content grows
            prompt = context + message
            ids += allocate(math.ceil(prompt / BLOCK) - len(ids))
            if at >= 0:
                turns_out.append(
                    ChatTurn(
                        timestamp_ms=round(at * 1000),
                        prompt_tokens=prompt,
                        output_tokens=answer,
                        hash_ids=tuple(ids),
                        tenant=tenant,
                        user=user,
                        conversation=conversation,
                        turn=turn,
                        prefix_blocks=len(prefixes[tenant]),
                    )
                )
            context = prompt + answer
            think = _exponential(_uniform(s, _S_THINK, conversation, turn), c.think_s)
            at += answer * c.answer_s_per_token + think
        conversation += 1

    turns_out.sort(key=lambda r: (r.timestamp_ms, r.conversation, r.turn))
    origin = turns_out[0].timestamp_ms if turns_out else 0
    return [dataclasses.replace(r, timestamp_ms=r.timestamp_ms - origin) for r in turns_out]


def to_requests(turns: Sequence[ChatTurn], limit: int | None = None) -> list[TraceRequest]:
    """The first `limit` turns (all when None) as `TraceRequest`s, exactly as
    `traces.parse_mooncake` reads them back from `write_mooncake`'s file."""
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    kept = turns[:limit] if limit is not None else turns
    return [
        TraceRequest(
            index=i,
            arrival_s=r.timestamp_ms / 1000.0,
            prompt_tokens=r.prompt_tokens,
            output_tokens=r.output_tokens,
            hash_ids=r.hash_ids,
        )
        for i, r in enumerate(kept)
    ]


def mooncake_rows(turns: Iterable[ChatTurn]) -> list[dict[str, object]]:
    """Mooncake jsonl objects: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`."""
    return [
        {
            "timestamp": r.timestamp_ms,
            "input_length": r.prompt_tokens,
            "output_length": r.output_tokens,
            "hash_ids": list(r.hash_ids),
        }
        for r in turns
    ]


def write_mooncake(turns: Iterable[ChatTurn], out: TextIO) -> None:
    """Write `turns` as Mooncake jsonl, one compact object a line."""
    for row in mooncake_rows(turns):
        out.write(json.dumps(row, separators=(",", ":")) + "\n")


# ============================================================================ specs


def is_chat_spec(trace: str) -> bool:
    """Whether a `--trace` value names this generator ("chat" or "chat:key=value,...")."""
    return trace == SPEC_PREFIX or trace.startswith(SPEC_PREFIX + ":")


def parse_spec(spec: str) -> ChatConfig:
    """`ChatConfig` from "chat" or "chat:key=value,..." (keys are its field names).

    Raises ValueError naming the bad key or value.
    """
    if not is_chat_spec(spec):
        raise ValueError(f"not a chat trace spec: {spec!r} (expected 'chat[:key=value,...]')")
    fields = {f.name: f for f in dataclasses.fields(ChatConfig)}
    values: dict[str, object] = {}
    body = spec[len(SPEC_PREFIX) + 1 :]
    for item in filter(None, (part.strip() for part in body.split(","))):
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            raise ValueError(
                f"bad chat trace knob {item!r}; expected key=value with key in {', '.join(fields)}"
            )
        kind = type(fields[key].default)
        try:
            values[key] = kind(text.strip())
        except ValueError as e:
            raise ValueError(f"chat trace knob {key}: {e}") from e
    return ChatConfig(**values)  # type: ignore[arg-type]


def chat_requests(spec: str, limit: int | None = None) -> list[TraceRequest]:
    """The first `limit` requests of the chat trace `spec` ("chat[:key=value,...]")."""
    return to_requests(chat_turns(parse_spec(spec)), limit)


# ============================================================================ CLI


def describe(turns: Sequence[ChatTurn]) -> str:
    """One paragraph of counts and length percentiles (tokens) for the CLI."""
    if not turns:
        return "no requests"

    def pct(values: list[int], q: float) -> int:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    prompts = [r.prompt_tokens for r in turns]
    outputs = [r.output_tokens for r in turns]
    span = turns[-1].timestamp_ms / 1000.0
    mean_turn = sum(r.turn for r in turns) / len(turns)
    return (
        f"{len(turns):,} requests over {span:.0f} s ({len(turns) / max(span, 1e-9):.2f}/s), "
        f"{len({r.conversation for r in turns}):,} conversations, "
        f"{len({r.tenant for r in turns})} tenants, mean turn number {1 + mean_turn:.2f}; "
        f"prompt p5/p50/p95 {pct(prompts, 0.05):,}/{pct(prompts, 0.5):,}/{pct(prompts, 0.95):,} "
        f"(mean {sum(prompts) / len(prompts):,.0f}), output p5/p50/p95 "
        f"{pct(outputs, 0.05)}/{pct(outputs, 0.5)}/{pct(outputs, 0.95)}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m homing.bench.chat_trace [SPEC] [--out FILE.jsonl]`: describe the trace and
    write it as Mooncake jsonl."""
    p = argparse.ArgumentParser(prog="homing.bench.chat_trace", description=__doc__.splitlines()[0])
    p.add_argument("spec", nargs="?", default=SPEC_PREFIX, help="chat[:key=value,...]")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--out", default=None, help="write Mooncake jsonl here")
    args = p.parse_args(argv)
    turns = chat_turns(parse_spec(args.spec))
    if args.limit is not None:
        turns = turns[: args.limit]
    print(describe(turns), file=sys.stderr)
    if args.out:
        with Path(args.out).open("w", encoding="utf-8") as f:
            write_mooncake(turns, f)
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
