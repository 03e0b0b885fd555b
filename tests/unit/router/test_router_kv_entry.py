"""The Router's KV-event entry points agree: the wire bytes (`apply_kv_bytes`, or
`decode_kv_batch` + `apply_kv_decoded`), a parsed batch (`apply_kv_batch`) and plain
events (`apply_events`) build the same index and tell the observer the same."""

from __future__ import annotations

from typing import Any

import pytest
from smg_grpc_proto.generated import common_pb2

from homing.bench.router_micro import BLOCK, SYSTEM_TOKENS, _tokens, stored_batches
from homing.clock import ManualClock
from homing.router import Router, RouteRequest, WorkerSnapshot
from homing.router.events import (
    BatchCounts,
    BlocksRemoved,
    BlocksStored,
    CacheCleared,
    StoredBlock,
    events_from_batch,
)
from homing.router.testing import RecordingObserver


def feeds() -> list[tuple[str, common_pb2.KvEventBatch]]:
    """SGLang-shaped batches (one block per stored event, parent hashes set) for 4 workers:
    a shared system prompt, then each conversation's own blocks; then removals, a store
    Python reads (two blocks in one event) and a cleared cache."""
    system = _tokens(0, SYSTEM_TOKENS)
    shared = SYSTEM_TOKENS // BLOCK
    out: list[tuple[str, common_pb2.KvEventBatch]] = []
    for w in range(4):
        out += [(f"w{w}", b) for b in stored_batches([(0, system, 0)])]
    for prefix_id in range(1, 9):
        tokens = system + _tokens(prefix_id, 40 * BLOCK)
        out += [(f"w{prefix_id % 4}", b) for b in stored_batches([(prefix_id, tokens, shared)])]
    mixed = common_pb2.KvEventBatch(sequence_number=99)
    mixed.events.add().removed.block_hashes.extend(
        ev.stored.blocks[0].block_hash for ev in out[-1][1].events[-5:]
    )
    two = mixed.events.add().stored
    two.blocks.add(block_hash=1, token_ids=list(range(7000, 7016)))
    two.blocks.add(block_hash=2, token_ids=list(range(7016, 7032)))
    out.append((out[-1][0], mixed))
    cleared = common_pb2.KvEventBatch(sequence_number=100)
    cleared.events.add().cleared.SetInParent()
    out.append(("w2", cleared))
    return out


def probes() -> list[list[int]]:
    system = _tokens(0, SYSTEM_TOKENS)
    return [system + _tokens(p, 40 * BLOCK) + [5, 6, 7] for p in range(1, 9)] + [
        list(range(7000, 7040)),
        system[:100],
    ]


def state(router: Router) -> dict[str, Any]:
    """What the router knows, as a caller sees it."""
    workers = [WorkerSnapshot(f"w{i}") for i in range(4)]
    return {
        "match": [router.index.match(p) for p in probes()],
        "modes": [router.worker_mode(f"w{i}") for i in range(4)],
        "last": [router.last_event_at(f"w{i}") for i in range(4)],
        "select": [router.select(RouteRequest(p), workers).worker_id for p in probes()],
        "blocks": router.index.num_blocks,
    }


def test_bytes_parsed_and_plain_events_build_the_same_router() -> None:
    """Every batch fed as its wire bytes, as a parsed message and as `events_from_batch`
    events: the same matches, modes, decisions and observed counts; the bytes and the
    parsed batch leave identical index internals too."""
    routers = {name: Router(clock=ManualClock(3.0)) for name in ("bytes", "parsed", "plain")}
    recorders = {name: RecordingObserver() for name in routers}
    for name, router in routers.items():
        router.observer = recorders[name]
    for worker, batch in feeds():
        raw = batch.SerializeToString()
        routers["bytes"].apply_kv_bytes(worker, raw, lag_s=0.01)
        routers["parsed"].apply_kv_batch(worker, batch, lag_s=0.01)
        routers["plain"].apply_events(worker, events_from_batch(batch), lag_s=0.01)
    a, b = routers["bytes"].index, routers["parsed"].index
    assert list(a._holders.items()) == list(b._holders.items())
    assert a._eng == b._eng and a.stats == b.stats
    assert recorders["bytes"].batches == recorders["parsed"].batches == recorders["plain"].batches
    assert recorders["bytes"].flushes == recorders["parsed"].flushes == recorders["plain"].flushes
    assert ("w2", "cleared") in recorders["bytes"].flushes
    views = [state(r) for r in routers.values()]
    assert views[0] == views[1] == views[2]
    assert views[0]["blocks"] > 300


def test_decoded_batch_carries_the_header_the_pool_reads() -> None:
    """`decode_kv_batch` gives the sequence number, dp rank, timestamp, load record and event
    count; `apply_kv_decoded` then applies it like `apply_kv_bytes`."""
    batch = common_pb2.KvEventBatch(sequence_number=7, timestamp=12.5, dp_rank=1)
    batch.load.running_requests = 3
    batch.load.waiting_uncached_tokens = 0
    ev = batch.events.add().stored
    ev.blocks.add(block_hash=5, token_ids=list(range(16)))
    router = Router()
    decoded = router.decode_kv_batch(batch.SerializeToString())
    h = decoded.header
    assert (h.sequence_number, h.timestamp, h.dp_rank, decoded.num_events) == (7, 12.5, 1, 1)
    assert h.HasField("load") and h.load.running_requests == 3
    assert h.load.HasField("waiting_uncached_tokens")
    router.apply_kv_decoded("w0", decoded)
    assert router.index.match(list(range(16))) == {"w0": 16}


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"\x1a\x05ab", id="length past the end"),
        # a good stored event, then a cleared event cut short: nothing may be applied
        pytest.param(
            common_pb2.KvEventBatch(
                events=[
                    common_pb2.KvCacheEvent(
                        stored=common_pb2.KvBlocksStored(
                            blocks=[common_pb2.KvBlock(block_hash=1, token_ids=list(range(16)))]
                        )
                    )
                ]
            ).SerializeToString()
            + b"\x1a\x03\x22\x01\x0a",
            id="bad event after a good one",
        ),
    ],
)
def test_malformed_bytes_raise_and_apply_nothing(raw: bytes) -> None:
    """Bytes that are not a KvEventBatch raise ValueError, and the index, the worker's
    last-event time and the observer are as before."""
    recorder = RecordingObserver()
    router = Router(observer=recorder)
    with pytest.raises(ValueError, match=r"^malformed KvEventBatch: "):
        router.apply_kv_bytes("w0", raw)
    assert router.index.num_blocks == 0
    assert router.last_event_at("w0") is None
    assert recorder.batches == [] and recorder.flushes == []


def test_apply_events_takes_a_simulators_plain_events() -> None:
    """Plain events, no protobuf: stored blocks are matched, the worker turns exact (an
    exact_mode resync is reported), removals and a cleared cache apply in order."""
    recorder = RecordingObserver()
    router = Router(clock=ManualClock(1.0), observer=recorder)
    tokens = list(range(300, 348))
    blocks = tuple(
        StoredBlock(engine_hash=10 + i, token_ids=tuple(tokens[16 * i : 16 * (i + 1)]))
        for i in range(3)
    )
    router.apply_events("w0", [BlocksStored(blocks=blocks)], lag_s=0.5)
    assert router.index.match(tokens) == {"w0": 48}
    assert router.worker_mode("w0") == "exact"
    assert router.last_event_at("w0") == 1.0
    router.apply_events("w0", [BlocksRemoved(engine_hashes=(12,))])
    assert router.index.match(tokens) == {"w0": 32}
    router.apply_events("w0", (CacheCleared(),))
    assert router.index.match(tokens) == {}
    assert recorder.batches == [
        ("w0", BatchCounts(stored=3), 0.5),
        ("w0", BatchCounts(removed=1), None),
        ("w0", BatchCounts(cleared=1), None),
    ]
    assert recorder.flushes == [("w0", "exact_mode"), ("w0", "cleared")]


def test_bench_routers_run_shaped_events_store_and_remove_whole_runs() -> None:
    """`make bench-router`'s run-shaped ingestion: one stored event per conversation run
    (64 chained blocks under the shared system prompt) and one removed event per run; the
    bench itself checks the index held every block and kept only the system prompt."""
    from homing.bench import router_micro

    chains = [(1, list(range(2048)), 64), (2, list(range(5000, 7048)), 64)]
    stored = router_micro.run_shaped_batches(chains)
    assert [len(e.stored.blocks) for b in stored for e in b.events] == [64, 64]
    assert stored[0].events[0].stored.parent_block_hash == router_micro._engine_hash(0, 63)
    removed = router_micro.run_shaped_batches(chains, removed=True)
    assert [len(e.removed.block_hashes) for b in removed for e in b.events] == [64, 64]
    figures = router_micro.run_ingest(blocks=640, workers=4)
    assert figures["blocks"] == 640
    assert figures["stored_blocks_per_s"] > 0 and figures["removed_blocks_per_s"] > 0
