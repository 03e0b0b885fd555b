"""The synthetic multi-tenant chat trace: deterministic, growing conversations, shared system
prompts, Mooncake round trip, and a reusable share in a chat product's range."""

from __future__ import annotations

import hashlib
import io
import math
from collections import defaultdict
from collections.abc import Sequence
from itertools import pairwise

import pytest

from homing.bench.chat_trace import (
    BLOCK,
    ChatConfig,
    ChatTurn,
    chat_requests,
    chat_turns,
    parse_spec,
    preamble_tenants,
    to_requests,
    write_mooncake,
)
from homing.bench.routers import load_requests, lru_hits
from homing.bench.traces import PromptBuilder, TraceRequest, parse_mooncake

SMALL = ChatConfig(tenants=4, users_per_tenant=3, rate=1.0, duration_s=60.0, warmup_s=120.0)


@pytest.fixture(scope="module")
def default_turns() -> list[ChatTurn]:
    return chat_turns(ChatConfig())


def conversations(turns: Sequence[ChatTurn]) -> dict[int, list[ChatTurn]]:
    """Each conversation's emitted turns in turn order."""
    out: dict[int, list[ChatTurn]] = defaultdict(list)
    for r in turns:
        out[r.conversation].append(r)
    for convo in out.values():
        convo.sort(key=lambda r: r.turn)
    return out


def infinite_cache_reuse(requests: Sequence[TraceRequest]) -> float:
    """Share of prompt tokens one unbounded cache would serve, replayed in arrival order over
    the hash ids: a block is cached up to the most tokens of it any earlier prompt used (a
    prompt uses a prefix of its last block), and a prompt's hit stops at its first block not
    cached in full for it."""
    seen: dict[int, int] = {}
    hit = total = 0
    for r in requests:
        total += r.prompt_tokens
        for j, block in enumerate(r.hash_ids or ()):
            used = min(BLOCK, r.prompt_tokens - j * BLOCK)
            cached = min(seen.get(block, 0), used)
            hit += cached
            if cached < used:
                break
        for j, block in enumerate(r.hash_ids or ()):
            seen[block] = max(seen.get(block, 0), min(BLOCK, r.prompt_tokens - j * BLOCK))
    return hit / total


class TestDeterminism:
    def test_same_knobs_same_rows(self, default_turns: list[ChatTurn]) -> None:
        """Two generations with the same config are identical, row for row."""
        assert chat_turns(ChatConfig()) == default_turns

    def test_default_trace_is_pinned(self, default_turns: list[ChatTurn]) -> None:
        """The default trace's Mooncake file has a fixed digest: no machine, Python version or
        edit of the generator changes it unnoticed."""
        out = io.StringIO()
        write_mooncake(default_turns, out)
        assert len(default_turns) == 1973
        digest = hashlib.sha256(out.getvalue().encode()).hexdigest()[:16]
        assert digest == "db7a1ac86d1e2476"

    def test_seed_changes_the_rows(self, default_turns: list[ChatTurn]) -> None:
        """Another seed gives another trace."""
        assert chat_turns(ChatConfig(seed=1)) != default_turns

    def test_limit_takes_a_prefix(self) -> None:
        """`limit` keeps the first N requests of the full trace."""
        full = chat_requests("chat:tenants=4,duration_s=30")
        assert chat_requests("chat:tenants=4,duration_s=30", limit=50) == full[:50]


class TestMooncakeForm:
    def test_round_trip_through_the_jsonl_reader(self) -> None:
        """`write_mooncake`'s file reads back (`parse_mooncake`) as exactly `to_requests`."""
        turns = chat_turns(SMALL)
        out = io.StringIO()
        write_mooncake(turns, out)
        lines = out.getvalue().splitlines()
        assert parse_mooncake(lines) == to_requests(turns)
        assert parse_mooncake(lines, limit=7) == to_requests(turns, limit=7)

    def test_rows_are_in_arrival_order_from_zero(self, default_turns: list[ChatTurn]) -> None:
        """Timestamps start at 0 ms and never decrease; one id per started 512-token block."""
        stamps = [r.timestamp_ms for r in default_turns]
        assert stamps[0] == 0
        assert stamps == sorted(stamps)
        for r in default_turns:
            assert len(r.hash_ids) == math.ceil(r.prompt_tokens / BLOCK)


class TestConversations:
    def test_each_turn_extends_the_previous_prompt(self, default_turns: list[ChatTurn]) -> None:
        """Turn k's ids start with all of turn k-1's ("extend": a partial block keeps its id),
        and its prompt is turn k-1's plus its answer plus a new message."""
        multi = 0
        for convo in conversations(default_turns).values():
            for prev, cur in pairwise(convo):
                assert cur.turn == prev.turn + 1
                assert cur.hash_ids[: len(prev.hash_ids)] == prev.hash_ids
                assert cur.prompt_tokens > prev.prompt_tokens + prev.output_tokens
                multi += 1
        assert multi > len(default_turns) // 2

    def test_previous_prompt_is_a_token_prefix(self) -> None:
        """With `PromptBuilder` (the bench's token ids), turn k-1's prompt is an exact prefix
        of turn k's, the partial last block included."""
        builder = PromptBuilder()
        turns = chat_turns(SMALL)
        requests = dict(zip(turns, to_requests(turns), strict=True))
        checked = 0
        for convo in conversations(turns).values():
            for prev, cur in pairwise(convo):
                old = builder.prompt_ids(requests[prev])
                assert builder.prompt_ids(requests[cur])[: len(old)] == old
                checked += prev.prompt_tokens % BLOCK != 0
        assert checked > 10

    def test_fresh_rule_shares_full_blocks_only(self) -> None:
        """With `partial="fresh"` (Mooncake's hashing), turn k keeps turn k-1's full blocks and
        gives a partial last block a new id; no id is ever used at two lengths."""
        turns = chat_turns(ChatConfig(partial="fresh"))
        for convo in conversations(turns).values():
            for prev, cur in pairwise(convo):
                full = prev.prompt_tokens // BLOCK
                assert cur.hash_ids[:full] == prev.hash_ids[:full]
                if prev.prompt_tokens % BLOCK:
                    assert cur.hash_ids[full] != prev.hash_ids[full]
        used: dict[int, int] = {}
        for r in turns:
            for j, block in enumerate(r.hash_ids):
                length = min(BLOCK, r.prompt_tokens - j * BLOCK)
                assert used.setdefault(block, length) == length

    def test_new_conversations_arrive_at_the_rate(self) -> None:
        """Conversations begun inside the trace number rate x duration, within 4 sigma."""
        config = ChatConfig()
        started = {r.conversation for r in chat_turns(config) if r.turn == 0}
        expected = config.rate * config.duration_s
        assert abs(len(started) - expected) < 4 * math.sqrt(expected)


class TestSharing:
    def test_system_prompts_shared_within_a_tenant_distinct_across(
        self, default_turns: list[ChatTurn]
    ) -> None:
        """Every request of a tenant starts with the same preamble + system prompt blocks; the
        system prompts of two tenants share no block; exactly `preamble_tenants()` tenants carry
        the common preamble, whose blocks start their prompts."""
        config = ChatConfig()
        prefix: dict[int, tuple[int, ...]] = {}
        for r in default_turns:
            assert (
                prefix.setdefault(r.tenant, r.hash_ids[: r.prefix_blocks])
                == (r.hash_ids[: r.prefix_blocks])
            )
        assert len(prefix) == config.tenants
        holders: dict[int, set[int]] = defaultdict(set)
        for t, p in prefix.items():
            for block in p:
                holders[block].add(t)
        shared = [b for b, ts in holders.items() if len(ts) > 1]
        assert len(shared) == config.preamble_blocks
        with_preamble = holders[shared[0]]
        assert with_preamble == preamble_tenants(config)
        for t in with_preamble:
            assert sorted(prefix[t][: config.preamble_blocks]) == sorted(shared)
        for t, p in prefix.items():
            own = p[config.preamble_blocks :] if t in with_preamble else p
            assert own and all(holders[b] == {t} for b in own)

    def test_users_blocks_follow_the_system_prompt(self, default_turns: list[ChatTurn]) -> None:
        """A user's own block comes right after its tenant's prefix, the same in all its
        conversations and different from every other user's."""
        own: dict[tuple[int, int], int] = {}
        for r in default_turns:
            assert (
                own.setdefault((r.tenant, r.user), r.hash_ids[r.prefix_blocks])
                == (r.hash_ids[r.prefix_blocks])
            )
        assert len(set(own.values())) == len(own)

    def test_reusable_share_is_a_chat_products(self, default_turns: list[ChatTurn]) -> None:
        """One unbounded cache would serve 75-92% of the default trace's prompt tokens (the
        system prompts and each conversation's history; the new message, the last answer and
        the cold start are misses); "fresh" loses a partial block a turn, a few points."""
        extend = infinite_cache_reuse(to_requests(default_turns))
        fresh = infinite_cache_reuse(to_requests(chat_turns(ChatConfig(partial="fresh"))))
        assert 0.75 < extend < 0.92
        assert extend - 0.08 < fresh < extend

    def test_replay_agrees_with_the_bench_bound(self) -> None:
        """The hash-id replay matches the bench's own token-level LRU bound with room for
        everything, up to its 16-token pages (at most 15 tokens a request)."""
        requests = to_requests(chat_turns(SMALL))
        hits = lru_hits(requests, PromptBuilder(), capacity_blocks=10**9)
        total = sum(r.prompt_tokens for r in requests)
        share = infinite_cache_reuse(requests)
        assert 0 <= share * total - sum(hits) <= 15 * len(requests)


class TestSpec:
    def test_knobs_parse_with_their_types(self) -> None:
        """ "chat:key=value,..." sets ChatConfig fields; bare "chat" is the default."""
        assert parse_spec("chat") == ChatConfig()
        config = parse_spec("chat:tenants=8, rate=2.5,partial=fresh,seed=7")
        assert (config.tenants, config.rate, config.partial, config.seed) == (8, 2.5, "fresh", 7)

    @pytest.mark.parametrize(
        "spec",
        [
            "chat:tenant=8",
            "chat:tenants",
            "chat:tenants=x",
            "chat:partial=half",
            "chats",
            "chat:duration_s=inf",  # would never end
            "chat:warmup_s=nan",
        ],
    )
    def test_bad_specs_are_refused(self, spec: str) -> None:
        """Unknown keys, missing or mistyped values, and out-of-range knobs raise ValueError."""
        with pytest.raises(ValueError):
            parse_spec(spec)

    def test_the_bench_loads_a_chat_spec(self) -> None:
        """`homing.bench.routers` takes `--trace chat[:...]` as the generated trace."""
        assert load_requests("chat:duration_s=20", 40) == chat_requests("chat:duration_s=20", 40)
