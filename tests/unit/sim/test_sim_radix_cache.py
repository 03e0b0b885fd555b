"""The paged radix cache: SGLang's block-hash chain and events, LRU eviction, reference counts."""

from __future__ import annotations

import hashlib

import pytest

from homing.sim.radix_cache import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    RadixCache,
    block_hash_chain,
)

PAGE = 16


def sglang_hashes(token_ids: list[int], page_size: int) -> list[int]:
    """Independent re-derivation of SGLang's chain: hex digests chained through bytes.fromhex,
    tokens as 4-byte little-endian unsigned, first 16 hex chars as a signed int64."""
    out: list[int] = []
    prior_hex: str | None = None
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        hasher = hashlib.sha256()
        if prior_hex:
            hasher.update(bytes.fromhex(prior_hex))
        for t in token_ids[start : start + page_size]:
            hasher.update(t.to_bytes(4, byteorder="little", signed=False))
        prior_hex = hasher.hexdigest()
        value = int(prior_hex[:16], 16)
        out.append(value - 2**64 if value >= 2**63 else value)
    return out


def insert(cache: RadixCache, tokens: list[int], now: float) -> None:
    """Run one request through the cache: acquire, allocate, finish."""
    handle = cache.acquire(tokens, now, max_tokens=len(tokens))
    assert cache.grow(handle, len(tokens), now)
    cache.release(handle, tokens, now)


def stored(events: list) -> list[BlockStored]:
    return [e for e in events if isinstance(e, BlockStored)]


class TestBlockHashChain:
    def test_stored_block_hashes_match_an_independent_sha256_chain(self) -> None:
        """Stored events carry SGLang's SHA-256 chain hashes, parent-linked, root page unlinked."""
        tokens = [7, 129279, 0, 2**20, *range(100, 160)]  # 64 tokens = 4 pages
        cache = RadixCache(total_pages=64, page_size=PAGE)
        insert(cache, tokens, now=1.0)
        events = stored(cache.take_events())
        expected = sglang_hashes(tokens, PAGE)
        assert [e.block_hash for e in events] == expected
        assert [e.parent_block_hash for e in events] == [None, *expected[:-1]]
        assert block_hash_chain(tokens, PAGE) == expected

    def test_blocks_hold_exactly_page_size_tokens_and_partial_pages_are_not_cached(self) -> None:
        """A 40-token sequence stores 2 blocks of 16 token ids each; the 8-token tail is not
        cached."""
        tokens = list(range(500, 540))
        cache = RadixCache(total_pages=8, page_size=PAGE)
        insert(cache, tokens, now=1.0)
        events = stored(cache.take_events())
        assert [e.token_ids for e in events] == [tuple(tokens[:16]), tuple(tokens[16:32])]
        assert all(e.block_size == PAGE for e in events)
        assert cache.tree_pages == 2
        assert cache.private_pages == 0

    def test_a_shared_prefix_is_stored_once_and_the_branch_links_to_it(self) -> None:
        """A second sequence sharing one page stores only its new pages, parented on the shared
        page's hash."""
        a = list(range(32))
        b = list(range(16)) + list(range(900, 916))
        cache = RadixCache(total_pages=8, page_size=PAGE)
        insert(cache, a, now=1.0)
        cache.take_events()
        insert(cache, b, now=2.0)
        events = stored(cache.take_events())
        assert len(events) == 1
        assert events[0].parent_block_hash == sglang_hashes(a, PAGE)[0]
        assert events[0].block_hash == sglang_hashes(b, PAGE)[1]


class TestEviction:
    def test_least_recently_used_leaves_go_first(self) -> None:
        """With A used after B, evicting takes B's pages (leaf first), then A's."""
        a = list(range(0, 32))
        b = list(range(1000, 1032))
        cache = RadixCache(total_pages=4, page_size=PAGE)
        insert(cache, a, now=1.0)
        insert(cache, b, now=2.0)
        cache.match_prefix(a, now=3.0)  # A is now the most recently used
        cache.take_events()
        assert cache.evict(4, now=4.0) == 4
        removed = [e.block_hash for e in cache.take_events() if isinstance(e, BlockRemoved)]
        hb, ha = sglang_hashes(b, PAGE), sglang_hashes(a, PAGE)
        assert removed == [hb[1], hb[0], ha[1], ha[0]]

    def test_allocation_evicts_only_what_it_needs(self) -> None:
        """A full pool of unreferenced pages gives up exactly the pages a new request needs."""
        cache = RadixCache(total_pages=4, page_size=PAGE)
        insert(cache, list(range(64)), now=1.0)
        cache.take_events()
        handle = cache.acquire(list(range(2000, 2032)), now=2.0, max_tokens=32)
        assert cache.grow(handle, 32, now=2.0)
        removed = [e for e in cache.take_events() if isinstance(e, BlockRemoved)]
        assert len(removed) == 2
        assert cache.tree_pages == 2
        assert cache.free_pages == 0

    def test_referenced_pages_are_never_evicted(self) -> None:
        """Pages locked by a running request survive any eviction; allocation beyond the rest
        of the pool fails instead."""
        held = list(range(64))
        cache = RadixCache(total_pages=6, page_size=PAGE)
        insert(cache, held, now=1.0)
        handle = cache.acquire(held, now=2.0, max_tokens=64)
        assert handle.shared_pages == 4
        other = cache.acquire(list(range(5000, 5100)), now=3.0, max_tokens=100)
        assert not cache.grow(other, 48, now=3.0)  # needs 3 pages, only 2 are free
        assert cache.evict(10, now=3.0) == 0
        assert cache.tree_pages == 4
        assert cache.grow(other, 32, now=3.0)
        cache.release(handle, held, now=4.0)
        assert cache.evictable_pages == 4

    def test_releasing_a_request_makes_its_pages_evictable(self) -> None:
        """After release a request holds no pages: its full pages are evictable, the rest free."""
        tokens = list(range(40))
        cache = RadixCache(total_pages=4, page_size=PAGE)
        handle = cache.acquire(tokens, now=1.0, max_tokens=39)
        assert cache.grow(handle, 40, now=1.0)
        assert cache.used_pages == 3
        cache.release(handle, tokens, now=2.0)
        assert cache.used_pages == 0
        assert cache.evictable_pages == 2
        assert cache.free_pages == 2


class TestReset:
    def test_reset_emits_all_blocks_cleared(self) -> None:
        """FlushCache drops every page and records one AllBlocksCleared."""
        cache = RadixCache(total_pages=4, page_size=PAGE)
        insert(cache, list(range(32)), now=1.0)
        cache.take_events()
        cache.reset()
        assert cache.take_events() == [AllBlocksCleared()]
        assert cache.tree_pages == 0
        assert cache.match_prefix(list(range(32)), now=2.0).num_tokens == 0

    def test_reset_is_refused_while_a_request_holds_pages(self) -> None:
        """The cache cannot be flushed under a running request."""
        cache = RadixCache(total_pages=4, page_size=PAGE)
        handle = cache.acquire(list(range(20)), now=1.0, max_tokens=19)
        assert cache.grow(handle, 20, now=1.0)
        with pytest.raises(RuntimeError):
            cache.reset()
