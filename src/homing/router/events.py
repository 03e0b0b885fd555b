"""KV-cache events as plain data, and their conversion from the wire (`KvEventBatch`).

Rule of this file: the edge. `decode_batch`, `events_from_batch` and `ingest_batch` (the
fast path for stored events: one block each, as SGLang's event queue sends them, or a run of
pages, as its radix tree stores them) are the only places that read the protobuf;
the index consumes the frozen dataclasses below, or plain bytes and ints, and never sees a
message.

The KV stream arrives as the bytes gRPC delivered (`decode_batch`, then `ingest_decoded`):
the C extension `homing.router._kvwire` (`_native/kvwire.c`, built by `make` / `pip
install`) reads them once, the fast-shape stored runs and the removed events into plain
tuples, and hands back the bytes of the batch's other fields (sequence number, timestamp,
dp rank, load record) and of every other event, which upb parses. Where the extension is
not built, upb parses the whole batch and `ingest_batch_python` reads it: the same header,
the same calls on the sink, and ValueError for the same bytes. `ingest_batch` does the same
for a batch already parsed (it serializes it once). Conversion decisions (documented per
field in `common.proto`, smg-grpc-proto 0.4.28):

- tier: `KvBlocksStored.tier` when set, else the first block's legacy `cache_level`
  (0 device, 1 host, 2 disk, 3 external -> tier value + 1), else device.
- locality REMOTE events describe a shared pool (LMCache, Mooncake store) that every worker
  can load from: kept with `shared=True`, and the index credits those blocks to every worker
  (in a lower tier than device).
- blocks of a non-full-attention KV group (a sliding window, a mamba state) cannot serve a
  prefix: dropped.
- LoRA adapter / cache salt / per-block lora_id or extra keys put the blocks in their own
  namespace (the engine hashed them under it too), so plain prompts never match them.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from google.protobuf.message import DecodeError
from smg_grpc_proto.generated import common_pb2

from homing.router.hashing import token_bytes

try:  # the C extension (setup.py): same sink calls as the pure-Python path, faster
    from homing.router import _kvwire
except ImportError:  # pragma: no cover - built by `make`; pure Python elsewhere
    _kvwire = None

TIER_DEVICE = common_pb2.KV_CACHE_TIER_DEVICE
TIER_HOST = common_pb2.KV_CACHE_TIER_HOST
TIER_DISK = common_pb2.KV_CACHE_TIER_DISK
TIER_EXTERNAL = common_pb2.KV_CACHE_TIER_EXTERNAL


_LITTLE = sys.byteorder == "little"


@dataclass(frozen=True, slots=True)
class StoredBlock:
    """One stored page: the engine's block hash (signed int64) and its token ids."""

    engine_hash: int
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BlocksStored:
    """Consecutive blocks of one chain; block 0's parent is `parent_engine_hash` (None: root).

    `shared`: the blocks sit in a pool every worker reads (locality REMOTE).
    """

    blocks: tuple[StoredBlock, ...]
    parent_engine_hash: int | None = None
    tier: int = TIER_DEVICE
    namespace: str = ""
    shared: bool = False


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    """Blocks the engine dropped, by engine hash; `tier` None means every tier.

    `shared`: the blocks left the shared pool (locality REMOTE).
    """

    engine_hashes: tuple[int, ...]
    tier: int | None = None
    shared: bool = False


@dataclass(frozen=True, slots=True)
class CacheCleared:
    """The engine dropped its whole cache: everything known about the worker is void."""


KvEvent = BlocksStored | BlocksRemoved | CacheCleared


def _stored_tier(stored: common_pb2.KvBlocksStored) -> int:
    if stored.HasField("tier") and stored.tier != common_pb2.KV_CACHE_TIER_UNSPECIFIED:
        return int(stored.tier)
    if stored.blocks and stored.blocks[0].HasField("cache_level"):
        return int(stored.blocks[0].cache_level) + 1
    return TIER_DEVICE


def _removed_tier(removed: common_pb2.KvBlocksRemoved) -> int | None:
    if removed.HasField("tier") and removed.tier != common_pb2.KV_CACHE_TIER_UNSPECIFIED:
        return int(removed.tier)
    if removed.HasField("cache_level"):
        return int(removed.cache_level) + 1
    return None


def _is_full_attention(stored: common_pb2.KvBlocksStored) -> bool:
    if stored.HasField("kv_cache_spec_sliding_window") and stored.kv_cache_spec_sliding_window:
        return False
    if stored.HasField("kv_cache_spec_kind") and stored.kv_cache_spec_kind:
        return "full" in stored.kv_cache_spec_kind.lower()
    return True


def _namespace(stored: common_pb2.KvBlocksStored) -> str:
    parts: list[str] = []
    if stored.HasField("lora_name") and stored.lora_name:
        parts.append(f"lora={stored.lora_name}")
    if stored.HasField("cache_salt") and stored.cache_salt:
        parts.append(f"salt={stored.cache_salt}")
    for block in stored.blocks[:1]:
        if block.HasField("lora_id"):
            parts.append(f"lora_id={block.lora_id}")
        if len(block.extra_keys):
            parts.append(f"extra={block.extra_keys[0].SerializeToString().hex()}")
    return ";".join(parts)


def event_from_proto(event: common_pb2.KvCacheEvent) -> KvEvent | None:
    """One wire event as plain data, or None when it must not feed a per-worker index."""
    kind = event.WhichOneof("data")
    if kind == "stored":
        stored = event.stored
        shared = (
            stored.HasField("locality") and stored.locality == common_pb2.KV_CACHE_LOCALITY_REMOTE
        )
        if not _is_full_attention(stored):
            return None
        return BlocksStored(
            blocks=tuple(
                StoredBlock(engine_hash=b.block_hash, token_ids=tuple(b.token_ids))
                for b in stored.blocks
            ),
            parent_engine_hash=(
                stored.parent_block_hash if stored.HasField("parent_block_hash") else None
            ),
            tier=_stored_tier(stored),
            namespace=_namespace(stored),
            shared=shared,
        )
    if kind == "removed":
        removed = event.removed
        shared = (
            removed.HasField("locality") and removed.locality == common_pb2.KV_CACHE_LOCALITY_REMOTE
        )
        return BlocksRemoved(
            engine_hashes=tuple(removed.block_hashes), tier=_removed_tier(removed), shared=shared
        )
    if kind == "cleared":
        return CacheCleared()
    return None


class WireSink(Protocol):
    """What `ingest_batch` feeds (`homing.router.index.PrefixIndex` is one)."""

    def store_blocks(
        self, worker_id: str, items: Sequence[tuple[int, int | None, bytes, int]]
    ) -> int: ...

    def remove_blocks(
        self,
        worker_id: str,
        engine_hashes: Iterable[int],
        tier: int | None = None,
        shared: bool = False,
    ) -> None: ...

    def apply(self, worker_id: str, event: KvEvent) -> None: ...


@dataclass
class BatchCounts:
    """Events of one batch by kind (for metrics): stored blocks, removed blocks, cleared."""

    stored: int = 0
    removed: int = 0
    cleared: int = 0


_REMOTE = common_pb2.KV_CACHE_LOCALITY_REMOTE
_UNSPECIFIED = common_pb2.KV_CACHE_TIER_UNSPECIFIED


def _ingest_event(
    ev: common_pb2.KvCacheEvent,
    sink: WireSink,
    worker_id: str,
    counts: BatchCounts,
    run: list[tuple[int, int | None, bytes, int]],
) -> list[tuple[int, int | None, bytes, int]]:
    """One event of `ingest_batch_python`: a fast-shape stored event joins `run` (the
    pending `store_blocks` items); any other event first sends `run` to the sink. Returns
    the run to continue with (a new list once the old one went to the sink)."""
    kind = ev.WhichOneof("data")
    if kind == "stored":
        stored = ev.stored
        blocks = stored.blocks
        if (
            len(blocks)
            and not stored.lora_name
            and not stored.cache_salt
            and not stored.kv_cache_spec_kind
            and not stored.kv_cache_spec_sliding_window
            and stored.locality != _REMOTE
        ):
            # A run of pages (SGLang's radix node): one item per block, each block's parent
            # the one before it, so it applies as that many one-block events would. A block
            # with a lora_id or extra keys sends the whole event the slow way
            # (`event_from_proto`, which keys the event by its first block's namespace).
            tier = stored.tier
            if tier == _UNSPECIFIED:
                tier = _stored_tier(stored)
            parent = stored.parent_block_hash if stored.HasField("parent_block_hash") else None
            start = len(run)
            append = run.append
            for block in blocks:
                if block.HasField("lora_id") or block.extra_keys:
                    del run[start:]
                    break
                engine_hash = block.block_hash
                ids = block.token_ids[:]
                append(
                    (
                        engine_hash,
                        parent,
                        array("I", ids).tobytes() if _LITTLE else token_bytes(ids),
                        tier,
                    )
                )
                parent = engine_hash
            else:
                return run
        if run:
            counts.stored += sink.store_blocks(worker_id, run)
            run = []
        converted = event_from_proto(ev)
        if converted is not None:
            sink.apply(worker_id, converted)
            counts.stored += len(blocks)
        return run
    if run:
        counts.stored += sink.store_blocks(worker_id, run)
        run = []
    if kind == "removed":
        removed = ev.removed
        sink.remove_blocks(
            worker_id,
            removed.block_hashes,
            _removed_tier(removed),
            removed.HasField("locality") and removed.locality == _REMOTE,
        )
        counts.removed += len(removed.block_hashes)
    elif kind == "cleared":
        sink.apply(worker_id, CacheCleared())
        counts.cleared += 1
    return run


def ingest_batch_python(
    batch: common_pb2.KvEventBatch, sink: WireSink, worker_id: str
) -> BatchCounts:
    """`ingest_batch` in pure Python, reading every event from the message: the fallback
    where `homing.router._kvwire` is not built, and the reference the native path matches.

    Runs of stored events (each of one block or of a run of pages, every block's parent the
    one before it) with no namespace, sliding window, spec kind or remote locality go to
    `sink.store_blocks` as `(engine_hash, parent or None, uint32-LE token bytes, tier)`; a
    removed event goes to `sink.remove_blocks(worker_id, hashes, tier or None, shared)`;
    anything else takes `event_from_proto` and `sink.apply`, in stream order. Returns the
    counts of the events fed.
    """
    counts = BatchCounts()
    run: list[tuple[int, int | None, bytes, int]] = []
    for ev in batch.events:
        run = _ingest_event(ev, sink, worker_id, counts, run)
    if run:
        counts.stored += sink.store_blocks(worker_id, run)
    return counts


def ingest_batch(batch: common_pb2.KvEventBatch, sink: WireSink, worker_id: str) -> BatchCounts:
    """Feed one parsed batch's events to `sink` in order, converted as `event_from_proto`
    does (for a batch as the wire delivers it, see `decode_batch`).

    Same calls to `sink` and same counts as `ingest_batch_python` (see there for the
    shapes). With `homing.router._kvwire` built, the batch is serialized once and the
    common events (fast-shape stored runs, removed events) are read from the wire bytes in
    C; each event the reader leaves to Python (cleared, any other stored shape, an event
    without data, a field it does not read as the schema says) goes through the same
    per-event code as the pure-Python path, so runs of `store_blocks` items are the same
    too. Without the extension this is `ingest_batch_python`.
    """
    if _kvwire is None:
        return ingest_batch_python(batch, sink, worker_id)
    # upb serialized the batch, so the reader's ValueError for malformed bytes would be a
    # reader bug: it propagates (the pool's stream task then resubscribes) rather than
    # being hidden by a fallback.
    items: list[Any] = _kvwire.parse_events(batch.SerializeToString())
    for i, item in enumerate(items):
        if type(item) is int:
            items[i] = batch.events[item]
    return _ingest_items(items, sink, worker_id)


#: An item of `_ingest_items`: a run of fast-shape stored events (`store_blocks` items), a
#: removed event (hashes, tier or None, shared) or an event Python reads.
_Item = (
    list[tuple[int, int | None, bytes, int]]
    | tuple[list[int], int | None, bool]
    | common_pb2.KvCacheEvent
)


def _ingest_items(items: Sequence[_Item], sink: WireSink, worker_id: str) -> BatchCounts:
    """The native half of `ingest_batch` and `ingest_decoded`: `items` (the reader's, with
    the events it left to Python as messages) fed to `sink` in order; a message goes
    through `_ingest_event`. `items` is not modified."""
    counts = BatchCounts()
    run: list[tuple[int, int | None, bytes, int]] = []
    for item in items:
        if type(item) is list:
            if run:
                run += item
            else:
                run = item.copy()  # a run may grow: the items stay as read
        elif type(item) is tuple:
            if run:
                counts.stored += sink.store_blocks(worker_id, run)
                run = []
            hashes, tier, shared = item
            sink.remove_blocks(worker_id, hashes, tier, shared)
            counts.removed += len(hashes)
        else:
            run = _ingest_event(item, sink, worker_id, counts, run)
    if run:
        counts.stored += sink.store_blocks(worker_id, run)
    return counts


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """One serialized `KvEventBatch`, read once by `decode_batch`.

    `header`: a `KvEventBatch` with the batch's fields (sequence_number, timestamp,
    dp_rank, snapshot, load) as upb parses them; its `events` are not to be read (empty
    when the C reader split them off). `num_events`: events in the batch. The events
    themselves go to a sink with `ingest_decoded`, as many times as wanted.
    """

    header: common_pb2.KvEventBatch
    num_events: int
    _items: list[_Item] | None  # the C reader's items; None: `_message` holds everything
    _message: common_pb2.KvEventBatch | None


def _malformed(err: DecodeError) -> ValueError:
    return ValueError(f"malformed KvEventBatch: {err}")


def decode_batch(data: bytes | bytearray | memoryview) -> DecodedBatch:
    """Read a serialized `KvEventBatch` (as the gRPC stream delivers it) once.

    With `homing.router._kvwire` built, C reads the events (`_kvwire.parse_batch`) and upb
    parses only the bytes it hands back: the batch's other fields and the events C leaves
    to Python (each as a batch of that one event, so at its own nesting depth). Without it
    upb parses the whole batch. Either way the result feeds the same sink calls
    (`ingest_decoded`) and the header reads the same. Raises ValueError ("malformed
    KvEventBatch: ...") for exactly the bytes upb rejects, before anything is applied.
    """
    if _kvwire is None:
        try:
            batch = common_pb2.KvEventBatch.FromString(data)
        except DecodeError as err:
            raise _malformed(err) from err
        return DecodedBatch(batch, len(batch.events), None, batch)
    header_bytes, num_events, items = _kvwire.parse_batch(data)
    from_string = common_pb2.KvEventBatch.FromString
    try:
        header = from_string(header_bytes)
        for i, item in enumerate(items):
            if type(item) is bytes:
                items[i] = from_string(item).events[0]
    except DecodeError as err:
        raise _malformed(err) from err
    return DecodedBatch(header, num_events, items, None)


def ingest_decoded(batch: DecodedBatch, sink: WireSink, worker_id: str) -> BatchCounts:
    """Feed a `decode_batch` result's events to `sink` in order: the calls and counts of
    `ingest_batch_python` on the parsed batch (see there for the shapes)."""
    if batch._items is None:
        assert batch._message is not None
        return ingest_batch_python(batch._message, sink, worker_id)
    return _ingest_items(batch._items, sink, worker_id)


def ingest_events(events: Iterable[KvEvent], sink: WireSink, worker_id: str) -> BatchCounts:
    """Feed plain events (a simulator's, or `events_from_batch`'s) to `sink.apply` in order.
    Counts as the batch paths count an event applied whole: a stored event's blocks, a
    removed event's hashes, one per cleared."""
    counts = BatchCounts()
    apply = sink.apply
    for event in events:
        apply(worker_id, event)
        if type(event) is BlocksStored:
            counts.stored += len(event.blocks)
        elif type(event) is BlocksRemoved:
            counts.removed += len(event.engine_hashes)
        elif type(event) is CacheCleared:
            counts.cleared += 1
    return counts


def events_from_batch(batch: common_pb2.KvEventBatch) -> list[KvEvent]:
    """The batch's events in order, converted; events that do not apply are left out."""
    out: list[KvEvent] = []
    for event in batch.events:
        converted = event_from_proto(event)
        if converted is not None:
            out.append(converted)
    return out
