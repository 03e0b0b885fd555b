"""The KV-event hub in memory: numbering, proto shape, load records, slow subscribers."""

from __future__ import annotations

import asyncio

import pytest
from smg_grpc_proto.generated import common_pb2

from homing.clock import ManualClock
from homing.sim.kv_events import EngineMemoryInfo, KvEventHub, SubscriberOverflow
from homing.sim.radix_cache import AllBlocksCleared, BlockRemoved, BlockStored
from homing.sim.scheduler import LoadStats


def stats(running: int = 0, waiting: int = 0) -> LoadStats:
    return LoadStats(
        num_running=running,
        num_waiting=waiting,
        waiting_uncached_tokens=0,
        prefill_pending_tokens=0,
        num_used_tokens=0,
        evictable_tokens=0,
        max_total_num_tokens=1024,
        token_usage=0.0,
        gen_throughput=0.0,
        cache_hit_rate=0.0,
        max_running_requests=8,
        num_retracted=0,
    )


class Engine:
    """A settable load figure standing in for the scheduler."""

    def __init__(self) -> None:
        self.load = stats()


def make_hub(engine: Engine, **kw: object) -> KvEventHub:
    return KvEventHub(
        lambda: engine.load,
        EngineMemoryInfo(weight_gb=16.0, kv_cache_gb=59.0, token_capacity=1024),
        wall_time=lambda: 1234.5,
        clock=ManualClock(),
        **kw,  # type: ignore[arg-type]
    )


STORED = BlockStored(
    block_hashes=(-5, 9), parent_block_hash=7, token_ids=tuple(range(32)), block_size=16
)


async def take(iterator, n: int) -> list[common_pb2.KvEventBatch]:  # type: ignore[no-untyped-def]
    return [await asyncio.wait_for(anext(iterator), 1.0) for _ in range(n)]


async def test_batches_are_numbered_consecutively_and_shaped_as_the_proto_says() -> None:
    """Each publish is the next sequence number; events become stored/removed/cleared with
    increasing event ids; a stored run becomes one event with a block per page (its own 16
    token ids) and the parent link; stored and removed say tier DEVICE, medium "GPU" and
    locality LOCAL, as smg-grpc-servicer 0.14.1 relays SGLang's events."""
    hub = make_hub(Engine())
    stream = hub.subscribe(load_records_before_first_batch=False).batches()
    hub.publish([STORED, BlockRemoved(block_hashes=(-5, 9))])
    hub.publish([AllBlocksCleared()])
    first, second = await take(stream, 2)
    assert (first.sequence_number, second.sequence_number) == (1, 2)
    assert first.timestamp == 1234.5 and first.dp_rank == 0
    stored, removed = first.events
    assert stored.stored.parent_block_hash == 7
    blocks = stored.stored.blocks
    assert [b.block_hash for b in blocks] == [-5, 9]
    assert [list(b.token_ids) for b in blocks] == [list(range(16)), list(range(16, 32))]
    assert {b.block_size for b in blocks} == {16}
    assert list(removed.removed.block_hashes) == [-5, 9]
    for data in (stored.stored, removed.removed):
        assert data.tier == common_pb2.KV_CACHE_TIER_DEVICE and data.medium == "GPU"
        assert data.locality == common_pb2.KV_CACHE_LOCALITY_LOCAL
    assert second.events[0].HasField("cleared")
    assert [e.event_id for e in (*first.events, *second.events)] == [1, 2, 3]
    assert hub.publish([]) is None
    await stream.aclose()


async def test_load_changes_send_one_coalesced_load_only_record() -> None:
    """Several admissions between two reads give one load_only record with the latest figures;
    a change of nothing but usage sends none."""
    engine = Engine()
    hub = make_hub(engine)
    stream = hub.subscribe(load_records_before_first_batch=True).batches()
    (initial,) = await take(stream, 1)
    assert initial.load.load_only and initial.sequence_number == 0
    hub.load_changed()  # same core figures: nothing to send
    engine.load = stats(running=1)
    hub.load_changed()
    engine.load = stats(running=2, waiting=1)
    hub.load_changed()
    (record,) = await take(stream, 1)
    assert record.load.load_only and record.sequence_number == 0
    assert (record.load.running_requests, record.load.waiting_requests) == (2, 1)
    assert record.load.max_total_num_tokens == 1024  # telemetry rides on load_only records
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(stream), 0.05)
    await stream.aclose()


async def test_a_subscriber_that_falls_behind_is_cut_off() -> None:
    """Past max_pending unread batches the stream ends with SubscriberOverflow."""
    hub = make_hub(Engine(), max_pending=2)
    stream = hub.subscribe(load_records_before_first_batch=False).batches()
    for _ in range(3):
        hub.publish([STORED])
    with pytest.raises(SubscriberOverflow):
        await take(stream, 3)
    assert hub.num_subscribers == 0


async def test_closing_the_hub_ends_every_stream() -> None:
    """Worker shutdown ends subscriptions without error."""
    hub = make_hub(Engine())
    stream = hub.subscribe(load_records_before_first_batch=False).batches()
    hub.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(stream), 1.0)


async def test_heartbeats_come_at_the_busy_period_while_busy_and_the_idle_one_when_idle() -> None:
    """load_only heartbeats follow heartbeat_busy_s while requests run and heartbeat_idle_s
    when idle (the defaults are SGLang's 1 s and 5 s)."""
    from homing.clock import SystemClock
    from homing.sim.config import SimConfig

    assert (SimConfig().heartbeat_busy_s, SimConfig().heartbeat_idle_s) == (1.0, 5.0)
    engine = Engine()
    hub = KvEventHub(
        lambda: engine.load,
        EngineMemoryInfo(weight_gb=16.0, kv_cache_gb=59.0, token_capacity=1024),
        heartbeat_busy_s=0.05,
        heartbeat_idle_s=10.0,
        clock=SystemClock(),
    )
    engine.load = stats(running=1)
    stream = hub.subscribe(load_records_before_first_batch=True).batches()
    await take(stream, 1)  # the record on subscribing
    loop = asyncio.get_running_loop()
    started = loop.time()
    await take(stream, 4)
    assert loop.time() - started < 0.5  # four busy heartbeats ~50 ms apart
    engine.load = stats()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(stream), 0.3)  # idle: next heartbeat only after 10 s
    hub.close()
