"""The paged radix cache: SGLang's block-hash chain, radix nodes and their events, LRU eviction of
whole nodes, reference counts."""

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


def removed(events: list) -> list[BlockRemoved]:
    return [e for e in events if isinstance(e, BlockRemoved)]


class TestBlockHashChain:
    def test_stored_block_hashes_match_an_independent_sha256_chain(self) -> None:
        """An insert's new pages are one stored event carrying SGLang's SHA-256 chain hashes in
        order, unlinked under the root."""
        tokens = [7, 129279, 0, 2**20, *range(100, 160)]  # 64 tokens = 4 pages
        cache = RadixCache(total_pages=64, page_size=PAGE)
        insert(cache, tokens, now=1.0)
        (event,) = stored(cache.take_events())
        expected = sglang_hashes(tokens, PAGE)
        assert list(event.block_hashes) == expected
        assert event.parent_block_hash is None
        assert block_hash_chain(tokens, PAGE) == expected

    def test_blocks_hold_exactly_page_size_tokens_and_partial_pages_are_not_cached(self) -> None:
        """A 40-token sequence stores 2 blocks of 16 token ids each (one event); the 8-token
        tail is not cached."""
        tokens = list(range(500, 540))
        cache = RadixCache(total_pages=8, page_size=PAGE)
        insert(cache, tokens, now=1.0)
        (event,) = stored(cache.take_events())
        assert (event.token_ids, event.block_size) == (tuple(tokens[:32]), PAGE)
        assert len(event.block_hashes) == 2
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
        assert events[0].block_hashes == (sglang_hashes(b, PAGE)[1],)

    def test_chained_inserts_between_two_takes_are_one_event_unrelated_ones_two(self) -> None:
        """As SGLang's event recorder: a store whose parent is the last block of the store just
        before it joins that event (a chunked prefill's two inserts); an unrelated one does not."""
        tokens = list(range(64))
        cache = RadixCache(total_pages=16, page_size=PAGE)
        handle = cache.acquire(tokens, now=1.0, max_tokens=64)
        assert cache.grow(handle, 64, now=1.0)
        cache.checkpoint(handle, tokens[:32], now=1.0)
        cache.checkpoint(handle, tokens, now=2.0)
        cache.release(handle, tokens, now=2.0)
        insert(cache, list(range(900, 932)), now=3.0)
        first, second = stored(cache.take_events())
        assert first.block_hashes == tuple(sglang_hashes(tokens, PAGE))
        assert (first.parent_block_hash, second.parent_block_hash) == (None, None)
        assert second.block_hashes == tuple(sglang_hashes(list(range(900, 932)), PAGE))


class TestEviction:
    def test_least_recently_used_nodes_go_first_in_one_joined_event(self) -> None:
        """With A used after B, evicting takes B's node, then A's; consecutive removals are one
        removed event (SGLang's recorder joins them), each node's hashes from its first page."""
        a = list(range(0, 32))
        b = list(range(1000, 1032))
        cache = RadixCache(total_pages=4, page_size=PAGE)
        insert(cache, a, now=1.0)
        insert(cache, b, now=2.0)
        cache.match_prefix(a, now=3.0)  # A is now the most recently used
        cache.take_events()
        assert cache.evict(4, now=4.0) == 4
        hb, ha = sglang_hashes(b, PAGE), sglang_hashes(a, PAGE)
        assert removed(cache.take_events()) == [BlockRemoved((hb[0], hb[1], ha[0], ha[1]))]

    def test_allocation_evicts_whole_nodes_until_it_has_room(self) -> None:
        """A full pool of two chained nodes (a 2-page prompt, then a 2-page extension) gives
        up the leaf node, both pages, for a one-page allocation, and both nodes for three."""
        prompt, extension = list(range(32)), list(range(64))
        cache = RadixCache(total_pages=4, page_size=PAGE)
        insert(cache, prompt, now=1.0)
        insert(cache, extension, now=2.0)
        cache.take_events()
        handle = cache.acquire(list(range(2000, 2016)), now=3.0, max_tokens=16)
        assert cache.grow(handle, 16, now=3.0)
        hashes = sglang_hashes(extension, PAGE)
        assert removed(cache.take_events()) == [BlockRemoved((hashes[2], hashes[3]))]
        assert (cache.tree_pages, cache.free_pages) == (2, 1)
        cache.release(handle, (), now=3.0, insert=False)
        other = cache.acquire(list(range(3000, 3048)), now=4.0, max_tokens=48)
        assert cache.grow(other, 48, now=4.0)
        assert removed(cache.take_events()) == [BlockRemoved((hashes[0], hashes[1]))]
        assert (cache.tree_pages, cache.free_pages) == (0, 1)

    def test_an_insert_branching_inside_a_node_splits_it_for_good(self) -> None:
        """A request branching after the first 2 pages of a 4-page node splits it there (its
        store's parent is page 2): once the branch is gone, eviction still takes the old tail
        (2 pages) and the shared head (2 pages) as two nodes, not the 4 pages at once."""
        tokens = list(range(64))
        branch = [*range(32), *range(5000, 5032)]
        hashes, branch_hashes = sglang_hashes(tokens, PAGE), sglang_hashes(branch, PAGE)
        cache = RadixCache(total_pages=8, page_size=PAGE)
        insert(cache, tokens, now=1.0)
        cache.take_events()
        insert(cache, branch, now=2.0)
        (event,) = stored(cache.take_events())
        assert (event.parent_block_hash, event.block_hashes) == (
            hashes[1],
            tuple(branch_hashes[2:]),
        )
        cache.match_prefix(tokens, now=3.0)  # the branch is now the least recently used
        evicted = [cache.evict(1, now=4.0) for _ in range(3)]
        assert evicted == [2, 2, 2]
        assert removed(cache.take_events()) == [
            BlockRemoved((*branch_hashes[2:], *hashes[2:], *hashes[:2]))
        ]
        assert cache.tree_pages == 0

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
