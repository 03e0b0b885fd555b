"""KV-cache events as plain data, and their conversion from the wire (`KvEventBatch`).

Rule of this file: the edge. `events_from_batch` is the only place that reads the protobuf;
the index consumes the frozen dataclasses below and never sees a message. Conversion
decisions (documented per field in `common.proto`, smg-grpc-proto 0.4.28):

- tier: `KvBlocksStored.tier` when set, else the first block's legacy `cache_level`
  (0 device, 1 host, 2 disk, 3 external -> tier value + 1), else device.
- locality REMOTE events describe a shared pool, not this worker: dropped.
- blocks of a non-full-attention KV group (a sliding window, a mamba state) cannot serve a
  prefix: dropped.
- LoRA adapter / cache salt / per-block lora_id or extra keys put the blocks in their own
  namespace (the engine hashed them under it too), so plain prompts never match them.
"""

from __future__ import annotations

from dataclasses import dataclass

from smg_grpc_proto.generated import common_pb2

TIER_DEVICE = common_pb2.KV_CACHE_TIER_DEVICE
TIER_HOST = common_pb2.KV_CACHE_TIER_HOST
TIER_DISK = common_pb2.KV_CACHE_TIER_DISK
TIER_EXTERNAL = common_pb2.KV_CACHE_TIER_EXTERNAL


@dataclass(frozen=True, slots=True)
class StoredBlock:
    """One stored page: the engine's block hash (signed int64) and its token ids."""

    engine_hash: int
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BlocksStored:
    """Consecutive blocks of one chain; block 0's parent is `parent_engine_hash` (None: root)."""

    blocks: tuple[StoredBlock, ...]
    parent_engine_hash: int | None = None
    tier: int = TIER_DEVICE
    namespace: str = ""


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    """Blocks the engine dropped, by engine hash; `tier` None means every tier."""

    engine_hashes: tuple[int, ...]
    tier: int | None = None


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
        if stored.HasField("locality") and stored.locality == common_pb2.KV_CACHE_LOCALITY_REMOTE:
            return None
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
        )
    if kind == "removed":
        removed = event.removed
        if removed.HasField("locality") and removed.locality == common_pb2.KV_CACHE_LOCALITY_REMOTE:
            return None
        return BlocksRemoved(engine_hashes=tuple(removed.block_hashes), tier=_removed_tier(removed))
    if kind == "cleared":
        return CacheCleared()
    return None


def events_from_batch(batch: common_pb2.KvEventBatch) -> list[KvEvent]:
    """The batch's events in order, converted; events that do not apply are left out."""
    out: list[KvEvent] = []
    for event in batch.events:
        converted = event_from_proto(event)
        if converted is not None:
            out.append(converted)
    return out
