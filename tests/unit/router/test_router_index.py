"""The prefix index credits exactly what each worker's KV events say it holds."""

from __future__ import annotations

from smg_grpc_proto.generated import common_pb2

from homing.router.events import (
    TIER_DEVICE,
    TIER_HOST,
    BlocksRemoved,
    BlocksStored,
    CacheCleared,
    StoredBlock,
    events_from_batch,
)
from homing.router.hashing import DEFAULT_HASH_SEED, block_hashes, chain_hash, root_hash
from homing.router.index import PrefixIndex

BS = 4


def prompt(n_tokens: int, offset: int = 0) -> list[int]:
    """A prompt of distinct token ids starting at `offset`."""
    return list(range(offset, offset + n_tokens))


def stored_chain(
    tokens: list[int],
    engine_base: int,
    parent: int | None = None,
    start_block: int = 0,
    tier: int = TIER_DEVICE,
) -> BlocksStored:
    """Blocks `start_block..` of `tokens`, engine hashes engine_base + block index."""
    n = len(tokens) // BS
    blocks = tuple(
        StoredBlock(engine_hash=engine_base + i, token_ids=tuple(tokens[i * BS : (i + 1) * BS]))
        for i in range(start_block, n)
    )
    return BlocksStored(blocks=blocks, parent_engine_hash=parent, tier=tier)


class TestHashing:
    def test_chain_depends_on_every_earlier_block(self) -> None:
        """Changing the first block changes every later block's key."""
        a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], BS, DEFAULT_HASH_SEED)
        b = block_hashes([9, 2, 3, 4, 5, 6, 7, 8], BS, DEFAULT_HASH_SEED)
        assert a[0] != b[0] and a[1] != b[1]

    def test_lazy_and_per_block_hashing_agree(self) -> None:
        """The prompt-wide hasher and the per-block chain give the same keys."""
        tokens = prompt(13)
        keys = block_hashes(tokens, BS, DEFAULT_HASH_SEED)
        assert len(keys) == 3
        h = DEFAULT_HASH_SEED
        for i, key in enumerate(keys):
            h = chain_hash(h, tokens[i * BS : (i + 1) * BS])
            assert h == key

    def test_namespace_changes_the_root(self) -> None:
        """A namespace gives a different chain root than the plain seed."""
        assert root_hash(DEFAULT_HASH_SEED, "lora=a") != root_hash(DEFAULT_HASH_SEED)


class TestStored:
    def test_stored_chain_matches_its_prefix_length(self) -> None:
        """A worker that stored 3 blocks matches 12 tokens of a longer prompt with that prefix."""
        index = PrefixIndex(BS)
        tokens = prompt(12)
        index.apply("w0", stored_chain(tokens, 100))
        assert index.match([*tokens, 50, 51, 52, 53, 54]) == {"w0": 12}
        assert index.match(tokens[:9]) == {"w0": 8}
        assert index.match([999, *tokens]) == {}

    def test_child_event_links_to_parent_by_engine_hash(self) -> None:
        """Blocks stored later with a parent engine hash extend the chain they hang from."""
        index = PrefixIndex(BS)
        tokens = prompt(16)
        first = stored_chain(tokens[:8], 100)
        second = stored_chain(tokens, 100, parent=101, start_block=2)
        index.apply_all("w0", [first, second])
        assert index.match(tokens) == {"w0": 16}
        assert index.worker_blocks("w0") == 4

    def test_unknown_parent_drops_the_chain(self) -> None:
        """A store whose parent was never seen is not credited (its prefix is unknown)."""
        index = PrefixIndex(BS)
        tokens = prompt(16)
        index.apply("w0", stored_chain(tokens, 100, parent=555, start_block=2))
        assert index.match(tokens) == {}
        assert index.worker_blocks("w0") == 0
        assert index.stats.dropped_unlinked == 2

    def test_partial_block_stops_the_chain(self) -> None:
        """A block whose length differs from block_size ends the stored chain there."""
        index = PrefixIndex(BS)
        event = BlocksStored(
            blocks=(
                StoredBlock(1, (1, 2, 3, 4)),
                StoredBlock(2, (5, 6)),
                StoredBlock(3, (7, 8, 9, 10)),
            )
        )
        index.apply("w0", event)
        assert index.match([1, 2, 3, 4, 5, 6, 7, 8]) == {"w0": 4}
        assert index.stats.dropped_size_mismatch == 2

    def test_longest_prefix_per_worker(self) -> None:
        """Each worker is credited with its own longest contiguous prefix."""
        index = PrefixIndex(BS)
        tokens = prompt(16)
        index.apply("w0", stored_chain(tokens[:4], 100))
        index.apply("w1", stored_chain(tokens, 200))
        index.apply("w2", stored_chain(prompt(16, offset=1000), 300))
        assert index.match(tokens) == {"w0": 4, "w1": 16}

    def test_match_restricted_to_candidates(self) -> None:
        """`workers=` limits the answer to the candidates given."""
        index = PrefixIndex(BS)
        tokens = prompt(8)
        index.apply("w0", stored_chain(tokens, 100))
        index.apply("w1", stored_chain(tokens, 200))
        assert index.match(tokens, ["w1", "w9"]) == {"w1": 8}

    def test_namespaced_blocks_never_match_plain_prompts(self) -> None:
        """Blocks stored under a LoRA/salt namespace are not a plain prompt's prefix."""
        index = PrefixIndex(BS)
        event = BlocksStored(blocks=(StoredBlock(1, (1, 2, 3, 4)),), namespace="lora=x")
        index.apply("w0", event)
        assert index.match([1, 2, 3, 4]) == {}

    def test_budget_evicts_least_recently_used_blocks(self) -> None:
        """Past max_blocks the oldest unused blocks go, never the index's size limit."""
        index = PrefixIndex(BS, max_blocks=8)
        hot = prompt(8)
        index.apply("w0", stored_chain(hot, 100))
        for i in range(6):
            index.match(hot)  # keeps the hot prefix recently used
            index.apply("w0", stored_chain(prompt(8, offset=1000 + 100 * i), 1000 + 10 * i))
            assert index.num_blocks <= 8
        assert index.match(hot) == {"w0": 8}
        assert index.stats.evicted > 0


class TestRemovedAndCleared:
    def test_removed_leaf_shortens_the_match(self) -> None:
        """Removing the last block of a chain shortens the worker's match by one block."""
        index = PrefixIndex(BS)
        tokens = prompt(12)
        index.apply("w0", stored_chain(tokens, 100))
        index.apply("w0", BlocksRemoved(engine_hashes=(102,)))
        assert index.match(tokens) == {"w0": 8}

    def test_removed_middle_block_cuts_the_prefix(self) -> None:
        """A prefix must be contiguous: removing block 1 leaves only block 0 credited."""
        index = PrefixIndex(BS)
        tokens = prompt(12)
        index.apply("w0", stored_chain(tokens, 100))
        index.apply("w0", BlocksRemoved(engine_hashes=(101,)))
        assert index.match(tokens) == {"w0": 4}

    def test_removal_is_per_worker(self) -> None:
        """One worker's removal leaves another worker's copy of the same prefix."""
        index = PrefixIndex(BS)
        tokens = prompt(8)
        index.apply("w0", stored_chain(tokens, 100))
        index.apply("w1", stored_chain(tokens, 100))
        index.apply("w0", BlocksRemoved(engine_hashes=(100, 101)))
        assert index.match(tokens) == {"w1": 8}
        assert index.num_blocks == 2

    def test_tiered_removal_keeps_block_until_last_tier_goes(self) -> None:
        """A block on device and host stays credited until both tiers are removed."""
        index = PrefixIndex(BS)
        tokens = prompt(4)
        index.apply("w0", stored_chain(tokens, 100, tier=TIER_DEVICE))
        index.apply("w0", stored_chain(tokens, 100, tier=TIER_HOST))
        index.apply("w0", BlocksRemoved(engine_hashes=(100,), tier=TIER_DEVICE))
        assert index.match(tokens) == {"w0": 4}
        index.apply("w0", BlocksRemoved(engine_hashes=(100,), tier=TIER_HOST))
        assert index.match(tokens) == {}

    def test_cleared_flushes_only_that_worker(self) -> None:
        """A cleared event drops the worker's entries and nobody else's."""
        index = PrefixIndex(BS)
        tokens = prompt(8)
        index.apply("w0", stored_chain(tokens, 100))
        index.apply("w1", stored_chain(tokens, 200))
        index.apply("w0", CacheCleared())
        assert index.match(tokens) == {"w1": 8}
        assert index.worker_blocks("w0") == 0

    def test_flush_worker_then_children_of_old_parents_are_dropped(self) -> None:
        """After a flush, a store linking to a pre-flush parent is not credited."""
        index = PrefixIndex(BS)
        tokens = prompt(12)
        index.apply("w0", stored_chain(tokens[:4], 100))
        assert index.flush_worker("w0") == 1
        index.apply("w0", stored_chain(tokens, 100, parent=100, start_block=1))
        assert index.match(tokens) == {}
        assert index.stats.dropped_unlinked == 2
        while index.maintain():
            pass
        assert index.num_blocks == 0 and index.num_entries == 0


class TestWireConversion:
    def test_batch_from_the_wire_feeds_the_index(self) -> None:
        """A protobuf KvEventBatch (stored, removed, remote store) converts as documented."""
        batch = common_pb2.KvEventBatch(sequence_number=1)
        ev = batch.events.add(event_id=1)
        ev.stored.blocks.add(block_hash=-7, token_ids=[1, 2, 3, 4], block_size=BS)
        ev.stored.blocks.add(block_hash=8, token_ids=[5, 6, 7, 8], block_size=BS)
        remote = batch.events.add(event_id=2)
        remote.stored.blocks.add(block_hash=9, token_ids=[9, 9, 9, 9], block_size=BS)
        remote.stored.locality = common_pb2.KV_CACHE_LOCALITY_REMOTE
        gone = batch.events.add(event_id=3)
        gone.removed.block_hashes.append(8)
        events = events_from_batch(batch)
        assert len(events) == 3
        stored, shared = events[0], events[1]
        assert isinstance(stored, BlocksStored) and isinstance(shared, BlocksStored)
        assert stored.parent_engine_hash is None
        assert stored.tier == TIER_DEVICE and not stored.shared and shared.shared
        index = PrefixIndex(BS)
        index.apply_all("w0", events)
        assert index.match([1, 2, 3, 4, 5, 6, 7, 8]) == {"w0": 4}

    def test_host_cache_level_becomes_host_tier(self) -> None:
        """The legacy cache_level 1 on a block maps to the host tier."""
        batch = common_pb2.KvEventBatch(sequence_number=1)
        ev = batch.events.add()
        ev.stored.blocks.add(block_hash=1, token_ids=[1, 2, 3, 4], cache_level=1)
        (stored,) = events_from_batch(batch)
        assert isinstance(stored, BlocksStored) and stored.tier == TIER_HOST
