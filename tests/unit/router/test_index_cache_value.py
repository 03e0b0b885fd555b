"""`PrefixIndex.cache_value` counts what removing a worker loses: blocks no other live worker
holds, the recently matched ones among them, and all its credits."""

from __future__ import annotations

from homing.clock import ManualClock
from homing.router.events import TIER_HOST, BlocksStored
from homing.router.index import CacheValue, PrefixIndex
from homing.router.router import Router
from tests.unit.router.test_router_index import BS, prompt, stored_chain
from tests.unit.router.test_router_index_lifecycle import drain

# A 2-block system prompt both workers hold; w0 continues it by 3 blocks, w1 by 1.
SYSTEM = prompt(8)
W0_TOKENS = SYSTEM + prompt(12, offset=100)
W1_TOKENS = SYSTEM + prompt(4, offset=200)


def two_workers() -> PrefixIndex:
    """w0 and w1 in exact mode sharing SYSTEM (engine hashes 10, 11; content hashes are the
    same on every worker), each with its own continuation."""
    index = PrefixIndex(BS)
    index.apply("w0", stored_chain(W0_TOKENS, 10))  # engine hashes 10..14
    index.apply("w1", stored_chain(SYSTEM, 10))
    index.apply("w1", stored_chain(W1_TOKENS, 20, parent=11, start_block=2))
    return index


class TestUnique:
    def test_only_blocks_no_other_worker_holds_are_unique(self) -> None:
        """The shared system prompt is in every worker's `blocks` but unique to none."""
        index = two_workers()
        assert index.cache_value("w0") == CacheValue(3, 0, 5)
        assert index.cache_value("w1") == CacheValue(1, 0, 3)
        assert index.cache_value("w0").blocks == index.worker_blocks("w0")

    def test_unknown_worker_is_all_zeros(self) -> None:
        """A worker the index never saw loses nothing."""
        assert two_workers().cache_value("nobody") == CacheValue(0, 0, 0)
        assert PrefixIndex(BS).cache_value("w0") == CacheValue(0, 0, 0)

    def test_a_block_removed_from_the_other_worker_becomes_unique(self) -> None:
        """Once w1's removed event drops a system block, w0 is its only holder."""
        index = two_workers()
        index.remove_blocks("w1", [11])
        assert index.cache_value("w0").unique_blocks == 4
        assert index.cache_value("w1") == CacheValue(1, 0, 2)


class TestRecent:
    def test_a_lookup_makes_the_blocks_it_matched_recent(self) -> None:
        """Matching w0's first own block marks it (and only it, of w0's unique ones)."""
        index = two_workers()
        assert index.cache_value("w0").unique_recent_blocks == 0
        assert index.match(W0_TOKENS[:12]) == {"w0": 12, "w1": 8}
        assert index.cache_value("w0") == CacheValue(3, 1, 5)
        assert index.cache_value("w1").unique_recent_blocks == 0

    def test_cache_value_itself_marks_nothing_recent(self) -> None:
        """Asking twice gives the same answer: the count is a read, not a use."""
        index = two_workers()
        first = index.cache_value("w0")
        assert index.cache_value("w0") == first
        assert first.unique_recent_blocks == 0

    def test_an_eviction_pass_clears_recent_marks(self) -> None:
        """A block given its second chance by CLOCK is no longer counted recent."""
        index = PrefixIndex(BS, max_blocks=6)
        index.apply("w0", stored_chain(prompt(12), 10))
        index.match(prompt(12))
        assert index.cache_value("w0") == CacheValue(3, 3, 3)
        index.apply("w1", stored_chain(prompt(16, offset=500), 40))  # 7 blocks > 6: evicts
        assert index.cache_value("w0").unique_recent_blocks == 0
        assert index.cache_value("w0").unique_blocks == 3


class TestFlushed:
    def test_a_flushed_worker_counts_nothing_and_its_shared_blocks_become_unique(
        self,
    ) -> None:
        """Retired slots are not holders, before and after the sweep clears their bits."""
        index = two_workers()
        index.flush_worker("w1")
        assert index.cache_value("w1") == CacheValue(0, 0, 0)
        # w1's re-store of the system prompt marked it recent (CLOCK), so 2 of 5 are recent.
        assert index.cache_value("w0") == CacheValue(5, 2, 5)
        drain(index)
        assert index.cache_value("w0") == CacheValue(5, 2, 5)

    def test_a_restarted_worker_counts_only_its_new_blocks(self) -> None:
        """After a flush and a new stored chain, only the new epoch's blocks are its own."""
        index = two_workers()
        index.flush_worker("w1")
        index.apply("w1", stored_chain(prompt(8, offset=700), 60))
        assert index.cache_value("w1") == CacheValue(2, 0, 2)
        assert index.cache_value("w0").unique_blocks == 5


class TestApproximate:
    def test_approximate_records_count_for_the_approximate_worker(self) -> None:
        """A worker without events is credited its dispatched prompt's blocks, unique where
        no exact worker holds them."""
        index = PrefixIndex(BS, approx_ttl_s=100.0)
        index.apply("w0", stored_chain(SYSTEM, 10))
        index.record_approximate("w2", W0_TOKENS, now=0.0)
        assert index.mode("w2") == "approximate"
        assert index.cache_value("w2") == CacheValue(3, 0, 5)
        assert index.cache_value("w0") == CacheValue(0, 0, 2)

    def test_every_live_generation_counts_once(self) -> None:
        """Records in two TTL generations of one worker are its own; a block in both counts
        once as unique."""
        index = PrefixIndex(BS, approx_ttl_s=100.0)
        index.record_approximate("w2", SYSTEM, now=0.0)
        index.record_approximate("w2", W1_TOKENS, now=30.0)  # next generation (25 s each)
        assert index.cache_value("w2").unique_blocks == 3

    def test_expired_records_count_for_nobody(self) -> None:
        """Past its TTL an approximate generation retires and credits nothing."""
        index = PrefixIndex(BS, approx_ttl_s=100.0)
        index.record_approximate("w2", W0_TOKENS, now=0.0)
        index.expire(200.0)
        assert index.cache_value("w2") == CacheValue(0, 0, 0)


class TestTiers:
    def test_host_tier_blocks_count_and_a_device_copy_counts_once(self) -> None:
        """w0's host-tier backup of its device blocks adds nothing unique; a host-only block
        of w0 that w1 holds on device is not unique."""
        index = PrefixIndex(BS)
        index.apply("w0", stored_chain(W0_TOKENS, 10))
        index.apply("w0", stored_chain(W0_TOKENS, 10, tier=TIER_HOST))
        assert index.cache_value("w0").unique_blocks == 5
        assert index.cache_value("w0").blocks == 10
        index.apply("w1", stored_chain(SYSTEM, 10, tier=TIER_HOST))
        assert index.cache_value("w0").unique_blocks == 3
        assert index.cache_value("w1").unique_blocks == 0

    def test_a_block_only_on_host_is_unique_to_its_holder(self) -> None:
        """A host-only chain of w0 that no one else holds is lost with w0."""
        index = PrefixIndex(BS)
        index.apply("w1", stored_chain(prompt(4, offset=900), 90))  # w1 known, elsewhere
        index.apply("w0", stored_chain(SYSTEM, 10, tier=TIER_HOST))
        assert index.cache_value("w0") == CacheValue(2, 0, 2)
        index.match(SYSTEM)
        assert index.cache_value("w0") == CacheValue(2, 2, 2)

    def test_a_host_block_two_workers_hold_is_unique_to_neither(self) -> None:
        """Both workers backing up the system prompt on host: removing one loses nothing."""
        index = PrefixIndex(BS)
        index.apply("w0", stored_chain(SYSTEM, 10, tier=TIER_HOST))
        index.apply("w1", stored_chain(W1_TOKENS, 10, tier=TIER_HOST))
        assert index.cache_value("w0") == CacheValue(0, 0, 2)
        assert index.cache_value("w1") == CacheValue(1, 0, 3)

    def test_shared_pool_blocks_are_unique_to_nobody(self) -> None:
        """A block in the remote pool every worker reads survives any worker's removal."""
        index = PrefixIndex(BS)
        index.apply("w0", stored_chain(SYSTEM, 10))
        index.apply(
            "w1",
            BlocksStored(blocks=stored_chain(SYSTEM, 10).blocks, shared=True),
        )
        assert index.cache_value("w0").unique_blocks == 0


def test_router_cache_value_is_its_index_s() -> None:
    """`Router.cache_value` answers from the index fed by `apply_events`."""
    router = Router(block_size=BS, clock=ManualClock())
    router.apply_events("w0", [stored_chain(W0_TOKENS, 10)])
    router.apply_events("w1", [stored_chain(SYSTEM, 10)])
    assert router.cache_value("w0") == CacheValue(3, 0, 5)
    assert router.cache_value("w0") == router.index.cache_value("w0")


def test_cache_values_of_several_workers_in_one_pass_match_each_alone() -> None:
    """Asking for both workers at once gives each the value it has alone: a block both hold
    is unique to neither, even though both are asked for."""
    index = two_workers()
    index.match(W0_TOKENS[:12])
    together = index.cache_values(["w0", "w1", "nobody"])
    assert together == {
        "w0": index.cache_value("w0"),
        "w1": index.cache_value("w1"),
        "nobody": CacheValue(0, 0, 0),
    }
    assert together["w0"] == CacheValue(3, 1, 5)
