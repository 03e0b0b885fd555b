"""The affinity index's lifecycle: epochs and flushes, approximate mode with a TTL, tiers and
shared blocks, the wire fast path, and bounded growth under a global budget."""

from __future__ import annotations

from smg_grpc_proto.generated import common_pb2

from homing.engines.kv_stream import KvStreamCursor
from homing.router.events import (
    TIER_HOST,
    BlocksRemoved,
    BlocksStored,
    StoredBlock,
    events_from_batch,
    ingest_batch,
)
from homing.router.index import PrefixIndex

BS = 4


def prompt(n_tokens: int, offset: int = 0) -> list[int]:
    """A prompt of distinct token ids starting at `offset`."""
    return list(range(offset, offset + n_tokens))


def chain(tokens: list[int], base: int, tier: int | None = None, shared: bool = False):
    """Every full block of `tokens` as one stored chain, engine hashes base + i."""
    blocks = tuple(
        StoredBlock(base + i, tuple(tokens[i * BS : (i + 1) * BS]))
        for i in range(len(tokens) // BS)
    )
    if tier is None:
        return BlocksStored(blocks=blocks, shared=shared)
    return BlocksStored(blocks=blocks, tier=tier, shared=shared)


def wire_batch(tokens: list[int], base: int, seq: int = 1) -> common_pb2.KvEventBatch:
    """SGLang's wire shape: one stored event per block, each naming its parent."""
    batch = common_pb2.KvEventBatch(sequence_number=seq)
    for i in range(len(tokens) // BS):
        ev = batch.events.add(event_id=i)
        ev.stored.blocks.add(block_hash=base + i, token_ids=tokens[i * BS : (i + 1) * BS])
        ev.stored.tier = common_pb2.KV_CACHE_TIER_DEVICE
        if i:
            ev.stored.parent_block_hash = base + i - 1
    return batch


def drain(index: PrefixIndex) -> None:
    """Run the retired-slot sweep to completion."""
    while index.maintain():
        pass


class TestEpochs:
    def test_flush_stops_crediting_at_once_and_sweep_reclaims(self) -> None:
        """A flushed worker is not credited by the very next lookup; the sweep frees memory."""
        index = PrefixIndex(BS)
        tokens = prompt(16)
        index.apply("w0", chain(tokens, 100))
        index.apply("w1", chain(tokens, 100))
        index.flush_worker("w0")
        assert index.match(tokens) == {"w1": 16}
        assert index.worker_blocks("w0") == 0 and index.epoch("w0") == 1
        index.flush_worker("w1")
        assert index.match(tokens) == {}
        drain(index)
        assert index.num_blocks == 0

    def test_restarted_worker_is_credited_only_with_new_blocks(self) -> None:
        """After a flush (restart), blocks stored before it are never credited again."""
        index = PrefixIndex(BS)
        old, new = prompt(8), prompt(8, offset=500)
        index.apply("w0", chain(old, 100))
        index.flush_worker("w0")
        index.apply("w0", chain(new, 300))
        assert index.match(old) == {}
        assert index.match(new) == {"w0": 8}
        assert index.mode("w0") == "exact"

    def test_slots_are_reused_after_a_sweep(self) -> None:
        """Many restarts do not grow the slot space: retired slots are reused once swept."""
        index = PrefixIndex(BS)
        for i in range(50):
            index.apply("w0", chain(prompt(8, offset=10 * i), 1000 * i))
            index.flush_worker("w0")
            drain(index)
        assert len(index._one) <= 2

    def test_a_reused_slot_is_credited_to_its_new_owner(self) -> None:
        """The memoized spans of a lookup follow a slot's owner: after w0's slot is swept
        and taken by w2, the same prefix is w2's, and editing a returned match changes no
        later lookup."""
        index = PrefixIndex(BS)
        tokens = prompt(8)
        index.apply("w0", chain(tokens, 100))
        index.apply("w1", chain(tokens, 100))
        first = index.lookup(tokens).tokens
        assert first == {"w0": 8, "w1": 8}
        first["w0"] = 999  # a caller's edit stays its own
        assert index.lookup(tokens).tokens == {"w0": 8, "w1": 8}
        index.remove_worker("w0")
        drain(index)
        index.apply("w2", chain(tokens, 100))
        assert index.lookup(tokens).tokens == {"w1": 8, "w2": 8}

    def test_an_approximate_holder_in_the_first_span_is_credited(self) -> None:
        """A worker credited by an approximate record beside an exact holder of the same
        prefix is in the match, marked approximate (the first span's approximate slots are
        read as the later spans' are)."""
        index = PrefixIndex(BS)
        tokens = prompt(8)
        index.apply("w0", chain(tokens, 100))
        index.record_approximate("w1", tokens, now=0.0)
        found = index.lookup(tokens)
        assert found.tokens == {"w0": 8, "w1": 8}
        assert found.approximate == frozenset({"w1"})

    def test_removal_of_a_worker_forgets_it(self) -> None:
        """remove_worker drops the worker's credit and its mode entry."""
        index = PrefixIndex(BS)
        index.apply("w0", chain(prompt(8), 100))
        index.remove_worker("w0")
        assert index.match(prompt(8)) == {}
        assert "w0" not in index.modes()


class TestApproximateMode:
    def test_a_worker_is_approximate_until_its_first_stored_event(self) -> None:
        """Mode starts approximate and turns exact on the worker's first stored event."""
        index = PrefixIndex(BS)
        assert index.mode("w0") == "approximate"
        index.apply("w0", chain(prompt(4), 1))
        assert index.mode("w0") == "exact"
        index.flush_worker("w0")
        assert index.mode("w0") == "approximate"

    def test_records_are_credited_until_the_ttl_passes(self) -> None:
        """A dispatch recorded at t is credited at t + ttl - 1 and gone by t + 1.25 ttl."""
        index = PrefixIndex(BS, approx_ttl_s=100.0)
        tokens = prompt(12)
        assert index.record_approximate("w0", tokens, now=1000.0) == 3
        found = index.lookup(tokens)
        assert found.tokens == {"w0": 12} and found.approximate == {"w0"}
        index.expire(1099.0)
        assert index.match(tokens) == {"w0": 12}
        index.expire(1000.0 + 125.0)
        assert index.match(tokens) == {}
        assert index.stats.expired_generations == 1

    def test_first_stored_event_drops_approximate_records(self) -> None:
        """Switching to exact mode forgets what the router guessed."""
        index = PrefixIndex(BS)
        guessed, real = prompt(8), prompt(8, offset=900)
        index.record_approximate("w0", guessed, now=0.0)
        index.apply("w0", chain(real, 1))
        assert index.match(guessed) == {}
        assert index.match(real) == {"w0": 8}
        assert index.record_approximate("w0", guessed, now=1.0) == 0


class TestTiers:
    def test_host_tier_counts_in_tokens_not_device_tokens(self) -> None:
        """A prefix whose tail is on the host is matched whole, device part reported apart."""
        index = PrefixIndex(BS)
        tokens = prompt(12)
        index.apply("w0", chain(tokens[:4], 100))
        index.apply(
            "w0",
            BlocksStored(
                blocks=tuple(
                    StoredBlock(101 + i, tuple(tokens[4 + 4 * i : 8 + 4 * i])) for i in (0, 1)
                ),
                parent_engine_hash=100,
                tier=TIER_HOST,
            ),
        )
        match = index.match_detail(tokens)["w0"]
        assert (match.tokens, match.device_tokens) == (12, 4)
        assert index.lookup(tokens).effective("w0", 0.5) == 4 + 0.5 * 8

    def test_shared_blocks_count_for_every_worker(self) -> None:
        """Blocks in a remote/shared pool extend every worker's prefix (REMOTE locality)."""
        index = PrefixIndex(BS)
        tokens = prompt(8)
        index.apply("w0", chain(tokens[:4], 100))
        index.apply("w1", chain(tokens[:4], 100))
        index.apply(
            "w0",
            BlocksStored(
                blocks=(StoredBlock(101, tuple(tokens[4:8])),), parent_engine_hash=100, shared=True
            ),
        )
        found = index.lookup(tokens)
        assert found.tokens == {"w0": 8, "w1": 8}
        assert found.device == {"w0": 4, "w1": 4}
        index.apply("w0", BlocksRemoved(engine_hashes=(101,), shared=True))
        assert index.match(tokens) == {"w0": 4, "w1": 4}


class TestWireFastPath:
    def test_fast_path_and_dataclasses_agree(self) -> None:
        """ingest_batch credits exactly what events_from_batch + apply credit."""
        tokens = prompt(20)
        fast, slow = PrefixIndex(BS), PrefixIndex(BS)
        batch = wire_batch(tokens, 7000)
        counts = ingest_batch(batch, fast, "w0")
        slow.apply_all("w0", events_from_batch(batch))
        assert counts.stored == 5
        assert fast.match(tokens) == slow.match(tokens) == {"w0": 20}
        gone = common_pb2.KvEventBatch(sequence_number=2)
        gone.events.add().removed.block_hashes.append(7003)
        ingest_batch(gone, fast, "w0")
        assert fast.match(tokens) == {"w0": 12}

    def test_namespaced_wire_blocks_take_the_slow_path(self) -> None:
        """A LoRA-named store is kept apart from plain prompts, as the dataclass path does."""
        index = PrefixIndex(BS)
        batch = common_pb2.KvEventBatch(sequence_number=1)
        ev = batch.events.add()
        ev.stored.blocks.add(block_hash=1, token_ids=[1, 2, 3, 4])
        ev.stored.lora_name = "adapter"
        ingest_batch(batch, index, "w0")
        assert index.match([1, 2, 3, 4]) == {}
        assert index.mode("w0") == "exact"


class TestGrowth:
    def test_prefix_churn_never_exceeds_the_budget(self) -> None:
        """20k unique prompts and no removals: blocks stay within budget, the engine map too."""
        budget = 4000
        index = PrefixIndex(BS, max_blocks=budget)
        for p in range(20_000):
            index.apply(f"w{p % 4}", chain(prompt(16, offset=16 * p), 10 * p))
            assert index.num_blocks <= budget
        assert len(index._eng) <= 2 * budget + 1024
        assert index.stats.evicted >= 20_000 * 4 - budget


class TestSequenceCursor:
    def test_sequence_going_backwards_is_a_restart(self) -> None:
        """A batch numbered below the last one means the worker restarted: flush, apply."""
        cursor = KvStreamCursor()
        for seq in (5, 6):
            assert cursor.feed(common_pb2.KvEventBatch(sequence_number=seq)).apply
        step = cursor.feed(common_pb2.KvEventBatch(sequence_number=1))
        assert step.reset and step.flush and step.apply
        assert cursor.feed(common_pb2.KvEventBatch(sequence_number=2)).flush is False


class TestBookings:
    def test_bookings_are_off_by_default(self) -> None:
        """Without a booking TTL an exact worker is credited only by its events."""
        index = PrefixIndex(BS)
        index.apply("w0", chain(prompt(4, offset=900), 1))
        assert index.record_dispatch("w0", prompt(8), now=0.0) == 0
        assert index.match(prompt(8)) == {}

    def test_exact_worker_is_booked_with_what_it_was_sent(self) -> None:
        """In exact mode a dispatch is credited (approximately) until its TTL passes."""
        index = PrefixIndex(BS, booking_ttl_s=10.0)
        index.apply("w0", chain(prompt(4, offset=900), 1))
        sent = prompt(12)
        assert index.record_dispatch("w0", sent, now=100.0) == 3
        found = index.lookup(sent)
        assert found.tokens == {"w0": 12} and found.approximate == {"w0"}
        index.expire(100.0 + 15.0)
        assert index.match(sent) == {}
        assert index.mode("w0") == "exact"

    def test_confirmed_blocks_are_exact_not_approximate(self) -> None:
        """Once the worker's own events store the booked prefix, the credit is exact."""
        index = PrefixIndex(BS, booking_ttl_s=10.0)
        index.apply("w0", chain(prompt(4, offset=900), 1))
        sent = prompt(8)
        index.record_dispatch("w0", sent, now=0.0)
        index.apply("w0", chain(sent, 50))
        found = index.lookup(sent)
        assert found.tokens == {"w0": 8} and not found.approximate

    def test_flush_drops_bookings(self) -> None:
        """A restart forgets the bookings along with the exact credit."""
        index = PrefixIndex(BS, booking_ttl_s=10.0)
        index.apply("w0", chain(prompt(4, offset=900), 1))
        index.record_dispatch("w0", prompt(8), now=0.0)
        assert index.match(prompt(8)) == {"w0": 8}
        index.flush_worker("w0")
        assert index.match(prompt(8)) == {}
