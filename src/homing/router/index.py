"""Per-model prefix index mirrored from the workers' KV-cache events (pure code).

Rule of this file: a worker is credited with a block only while its own event stream says
it holds it. Keys are the router's chained xxh3 hashes (`homing.router.hashing`); the
engine's block hashes are used only to link a stored block to its parent and to find the
block again when it is removed. A stored event whose parent the index does not know (it was
stored before we subscribed, or lost in a gap) is dropped with its whole chain: the router
cannot know its prefix tokens, and crediting a wrong prefix is worse than missing one.

Shapes: `match(prompt_ids) -> {worker_id: matched_tokens}` where matched_tokens is a
multiple of `block_size` (the longest prefix of full blocks the worker holds, contiguous
from the first block). Memory: one `_Held` per (worker, engine block) plus one holder set
per distinct block; `max_blocks` caps the (worker, block) entries (new stores beyond it
are dropped and counted; an engine's own evictions and `removed` events keep the index at
the size of the pool's KV caches in normal operation). Budgets and eviction come with the
affinity index of issue 4.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from homing.router.events import (
    BlocksRemoved,
    BlocksStored,
    CacheCleared,
    KvEvent,
    StoredBlock,
)
from homing.router.hashing import DEFAULT_HASH_SEED, chain_hash, iter_block_hashes, root_hash

#: Default cap on (worker, block) entries: 1M entries is a few hundred MB of Python objects
#: at most and far above 8 workers x ~30k pages (an H100 llama-8B pool at page 16).
DEFAULT_MAX_BLOCKS = 1_000_000


@dataclass(slots=True)
class _Held:
    """One engine block held by one worker: our key and the tiers (bitmask) it sits in."""

    key: int
    tiers: int


@dataclass(slots=True)
class _WorkerBlocks:
    by_engine: dict[int, _Held] = field(default_factory=dict)
    refs: dict[int, int] = field(default_factory=dict)  # our key -> engine blocks mapping to it


@dataclass
class IndexStats:
    """Counters for logs and metrics (monotonic, in blocks)."""

    stored: int = 0
    removed: int = 0
    flushed: int = 0
    dropped_unlinked: int = 0
    dropped_size_mismatch: int = 0
    dropped_over_budget: int = 0


class PrefixIndex:
    """Which worker holds which prefix of full blocks, for one model.

    `block_size`: tokens per block; must equal the engines' page size (blocks of another
    length are dropped and counted in `stats.dropped_size_mismatch`).
    `seed`: root of the hash chain. `max_blocks`: cap on (worker, block) entries.
    """

    def __init__(
        self,
        block_size: int = 16,
        *,
        seed: int = DEFAULT_HASH_SEED,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self._seed = seed
        self._root = root_hash(seed)
        self._max_blocks = max_blocks
        self._holders: dict[int, set[str]] = {}
        self._workers: dict[str, _WorkerBlocks] = {}
        self._entries = 0
        self.stats = IndexStats()

    # ----------------------------------------------------------------- queries

    @property
    def num_blocks(self) -> int:
        """Distinct blocks (prefix keys) held by at least one worker."""
        return len(self._holders)

    @property
    def num_entries(self) -> int:
        """(worker, engine block) entries, the quantity `max_blocks` caps."""
        return self._entries

    def worker_blocks(self, worker_id: str) -> int:
        """Blocks currently credited to `worker_id` (0 for an unknown worker)."""
        wb = self._workers.get(worker_id)
        return len(wb.by_engine) if wb else 0

    def workers(self) -> list[str]:
        """Workers with at least one block credited, sorted."""
        return sorted(w for w, wb in self._workers.items() if wb.by_engine)

    def hashes(self, prompt_ids: Sequence[int]) -> list[int]:
        """The router's keys of every full block of `prompt_ids`, in order."""
        return list(iter_block_hashes(prompt_ids, self.block_size, self._root))

    def match(
        self, prompt_ids: Sequence[int], workers: Iterable[str] | None = None
    ) -> dict[str, int]:
        """Longest held prefix per worker, in tokens (multiples of `block_size`).

        Workers holding nothing of the prompt's first block are absent from the result.
        `workers` restricts the answer to those candidates (None: every worker). Hashing
        stops at the first block no (remaining) candidate holds.
        """
        allowed = None if workers is None else set(workers)
        matched: dict[str, int] = {}
        active: set[str] | None = None
        depth = 0
        for key in iter_block_hashes(prompt_ids, self.block_size, self._root):
            holders = self._holders.get(key)
            if not holders:
                break
            if active is None:
                active = set(holders) if allowed is None else holders & allowed
            else:
                active &= holders
            if not active:
                break
            depth += self.block_size
            for worker_id in active:
                matched[worker_id] = depth
        return matched

    # ----------------------------------------------------------------- updates

    def apply(self, worker_id: str, event: KvEvent) -> None:
        """Apply one event from `worker_id`'s stream (in stream order)."""
        if isinstance(event, BlocksStored):
            self._store(worker_id, event)
        elif isinstance(event, BlocksRemoved):
            self._remove(worker_id, event)
        elif isinstance(event, CacheCleared):
            self.flush_worker(worker_id)
        else:  # pragma: no cover - exhaustive over KvEvent
            raise TypeError(f"not a KV event: {event!r}")

    def apply_all(self, worker_id: str, events: Iterable[KvEvent]) -> None:
        """Apply events in order (see `apply`)."""
        for event in events:
            self.apply(worker_id, event)

    def flush_worker(self, worker_id: str) -> int:
        """Forget everything credited to `worker_id`; returns the blocks dropped."""
        wb = self._workers.pop(worker_id, None)
        if wb is None:
            return 0
        for key in wb.refs:
            self._drop_holder(key, worker_id)
        dropped = len(wb.by_engine)
        self._entries -= dropped
        self.stats.flushed += dropped
        return dropped

    def _store(self, worker_id: str, event: BlocksStored) -> None:
        wb = self._workers.get(worker_id)
        if event.parent_engine_hash is None:
            parent = root_hash(self._seed, event.namespace) if event.namespace else self._root
        else:
            held = wb.by_engine.get(event.parent_engine_hash) if wb else None
            if held is None:
                self.stats.dropped_unlinked += len(event.blocks)
                return
            parent = held.key
        if wb is None:
            wb = self._workers[worker_id] = _WorkerBlocks()
        tier_bit = 1 << event.tier
        for i, block in enumerate(event.blocks):
            if len(block.token_ids) != self.block_size:
                self.stats.dropped_size_mismatch += len(event.blocks) - i
                return
            key = chain_hash(parent, block.token_ids)
            if not self._store_block(worker_id, wb, block, key, tier_bit):
                self.stats.dropped_over_budget += len(event.blocks) - i
                return
            parent = key

    def _store_block(
        self, worker_id: str, wb: _WorkerBlocks, block: StoredBlock, key: int, tier_bit: int
    ) -> bool:
        held = wb.by_engine.get(block.engine_hash)
        if held is not None:
            if held.key == key:
                held.tiers |= tier_bit
                return True
            # The engine reused a hash for other content: the old entry is gone.
            self._forget(worker_id, wb, block.engine_hash, held)
        if self._entries >= self._max_blocks:
            return False
        wb.by_engine[block.engine_hash] = _Held(key=key, tiers=tier_bit)
        self._entries += 1
        self.stats.stored += 1
        count = wb.refs.get(key, 0)
        wb.refs[key] = count + 1
        if count == 0:
            self._holders.setdefault(key, set()).add(worker_id)
        return True

    def _remove(self, worker_id: str, event: BlocksRemoved) -> None:
        wb = self._workers.get(worker_id)
        if wb is None:
            return
        for engine_hash in event.engine_hashes:
            held = wb.by_engine.get(engine_hash)
            if held is None:
                continue
            if event.tier is not None:
                held.tiers &= ~(1 << event.tier)
                if held.tiers:
                    continue
            self._forget(worker_id, wb, engine_hash, held)
            self.stats.removed += 1

    def _forget(self, worker_id: str, wb: _WorkerBlocks, engine_hash: int, held: _Held) -> None:
        del wb.by_engine[engine_hash]
        self._entries -= 1
        count = wb.refs[held.key] - 1
        if count:
            wb.refs[held.key] = count
        else:
            del wb.refs[held.key]
            self._drop_holder(held.key, worker_id)

    def _drop_holder(self, key: int, worker_id: str) -> None:
        holders = self._holders.get(key)
        if holders is None:
            return
        holders.discard(worker_id)
        if not holders:
            del self._holders[key]
