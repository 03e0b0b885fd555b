"""Per-model affinity index: which worker holds which prefix, mirrored from KV events (pure).

Rule of this file: a worker is credited with a block only while its own event stream (exact
mode) or the router's own recent dispatches (approximate mode, with a TTL) say it holds it,
and never after that worker's entries were flushed.

Keys are the router's chained 60-bit xxh3 block keys (`homing.router.hashing`); the engine's
block hashes only link a stored block to its parent and find it again on removal. A stored
event whose parent this worker is not credited with (stored before we subscribed, lost in a
gap, evicted here) is dropped with its chain: its prefix cannot be matched anyway.

Data layout (chosen for ~150 bytes per block in CPython; measured by `make bench-router`):

- `_holders: dict[key, mask]`: one entry per distinct block. `mask` is an int bitset of
  *slots*; a slot is one worker epoch (below). Single-slot masks are shared int objects.
  The dict's insertion order is the LRU order (see eviction).
- `_eng: dict[engine_hash & 2**60-1, key]`: engine hash -> our key. Engine hashes are
  content hashes (SGLang: SHA-256 chain), so one global map serves every worker; entries
  of evicted blocks go stale (harmless: they still name the right content) and the map is
  rebuilt when stale entries outnumber live ones.
- `_host: dict[key, mask]`: holders in a lower tier (host, disk, external); sparse.
  `_shared: set[key]`: blocks in a remote/shared pool (locality REMOTE), credited to every
  worker. Both are empty on a device-only pool and then cost nothing on lookups.

Lookups: `lookup`'s device-tier walk runs in C (`homing.router._walk.walk`, the same steps
as `_walk_python`, which runs where the extension is not built; tests compare them); the
tiered walk (host/shared blocks present) is Python only.

Slots and epochs: each worker's exact credit lives in one slot; `flush_worker` (cleared,
sequence gap, stream error, restart, removal) retires the slot in O(1) — its bit leaves the
`live` mask, so no lookup credits it again — and an incremental sweep (`maintain`, a bounded
number of keys per call) clears retired bits and frees the slot for reuse. Approximate mode
uses one slot per TTL generation (`approx_ttl_s / 4` long); a generation's slot retires when
its TTL has passed, so a record is credited for between `ttl` and `1.25 * ttl` seconds.

Mode per worker: "approximate" from the first sight or the last flush until the worker's
stream delivers its first stored event; then "exact" (approximate records are dropped).
Bookings (opt-in, `booking_ttl_s`): in exact mode each dispatch is also credited for that
TTL (own slots, same mechanism) until the worker's stored events take over. A hit credited
only by an approximate record or a booking is reported as approximate.

Memory budget (global, not per worker): at most `max_blocks` distinct blocks. Beyond it the
least recently used blocks are evicted, in batches of `max_blocks / 64`, by the CLOCK
approximation of LRU: lookups mark their matched path recently used (and a re-store of a
block another worker holds marks it); eviction walks the dict from its oldest end, gives
marked blocks a second chance (moved to the young end) and drops the others. Leaf first: a
chain stored in one event is inserted deepest block first, and a lookup marks the whole
matched path, so a used parent is never older than its children (SGLang publishes a
radix run of pages as one event). Blocks stored one per event enter parent first; unused
ones then leave oldest first, a batch taking whole chains, and a descendant orphaned at a
batch boundary (unreachable, since lookups walk from the root) is among the oldest left
and goes with the next batch.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Literal

from homing.router.events import (
    TIER_DEVICE,
    BlocksRemoved,
    BlocksStored,
    CacheCleared,
    KvEvent,
)
from homing.router.hashing import (
    DEFAULT_HASH_SEED,
    KEY_MASK,
    _xxh3,
    block_hashes,
    native_walk,
    root_hash,
    token_bytes,
)

#: Default cap on distinct blocks: 1M blocks is ~150 MB and far above 8 workers x ~80k
#: pages (an 8x H100 llama-70B pool at page 16 holds 1.26M tokens = 79k pages per worker).
DEFAULT_MAX_BLOCKS = 1_000_000

#: Default approximate-mode TTL in seconds: a block the router sent to a worker that
#: publishes no events is credited this long (SGLang's cache-aware router evicts its
#: approximate tree every 120 s by default).
DEFAULT_APPROX_TTL_S = 120.0

#: Default booking TTL in seconds; None: bookings off. With a TTL, a dispatch to a worker in
#: exact mode is credited to it that long (to 1.5x) before its own stored events confirm it,
#: so a follow-up arriving while the first request still waits for its prefill goes to the
#: same worker (smg books dispatches the same way). Off by default: on the Mooncake replay
#: of `make bench-routers` no decision ever needed one (follow-ups arrive tens of seconds
#: after their prefix was stored) and booking re-hashes every prompt (~40 us at 2k tokens).
DEFAULT_BOOKING_TTL_S: float | None = None

#: Keys the incremental sweep visits per `maintain` call (~0.3 ms of CPU).
DEFAULT_SWEEP_CHUNK = 4096

#: Distinct slot masks whose owner tuples `lookup` keeps (cleared when full).
OWNERS_MEMO_SIZE = 1024

#: Measured bytes per distinct block of this layout (`make bench-router`), used for the
#: index-bytes metric and to turn a byte budget into `max_blocks`.
BYTES_PER_BLOCK_ESTIMATE = 160

WorkerMode = Literal["exact", "approximate"]

_NO_EXPIRY = math.inf


class Matches:
    """What the workers hold of one prompt, in tokens (multiples of `block_size`).

    `tokens[w]`: the longest prefix `w` holds in any tier (contiguous from block 0).
    `device[w]`: the part of it on the device (None: all of it, the common case).
    `approximate`: workers credited by approximate-mode records.
    """

    __slots__ = ("approximate", "device", "tokens")

    def __init__(
        self,
        tokens: dict[str, int],
        device: dict[str, int] | None = None,
        approximate: frozenset[str] = frozenset(),
    ) -> None:
        self.tokens = tokens
        self.device = device
        self.approximate = approximate

    def get(self, worker_id: str) -> PrefixMatch | None:
        """`worker_id`'s match as a `PrefixMatch` (None when it holds nothing)."""
        tokens = self.tokens.get(worker_id)
        if tokens is None:
            return None
        device = tokens if self.device is None else self.device.get(worker_id, 0)
        return PrefixMatch(tokens, device, worker_id in self.approximate)

    def effective(self, worker_id: str, lower_tier_worth: float) -> float:
        """`D + worth * (T - D)` cached tokens of `worker_id` (0 when it holds nothing)."""
        tokens = self.tokens.get(worker_id, 0)
        if self.device is None or not tokens:
            return float(tokens)
        device = self.device.get(worker_id, 0)
        return device + lower_tier_worth * (tokens - device)


_NO_MATCHES = Matches({})


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """What one worker holds of a prompt, in tokens (multiples of `block_size`).

    `tokens`: the longest prefix held in any tier (contiguous from the first block).
    `device_tokens`: the part of it on the device (<= tokens; the rest is host/remote).
    `approximate`: True when the credit comes from approximate-mode records.
    """

    tokens: int
    device_tokens: int
    approximate: bool = False


@dataclass(frozen=True, slots=True)
class CacheValue:
    """What removing one worker would lose of the index's blocks (`PrefixIndex.cache_value`).

    `unique_blocks`: distinct blocks credited to the worker's live slots in any tier (device,
    host/disk) that no other worker's live slot holds in any tier and that are not in the
    shared pool; a block it holds on device and on host counts once.
    `unique_recent_blocks`: those of them a lookup matched (or a re-store touched) since the
    last eviction pass (the CLOCK reference set). `blocks`: every credit of the worker,
    `worker_blocks` (a block on device and host counts twice there).
    """

    unique_blocks: int = 0
    unique_recent_blocks: int = 0
    blocks: int = 0


@dataclass
class IndexStats:
    """Monotonic counters for logs and metrics (in blocks unless stated)."""

    stored: int = 0
    removed: int = 0
    recorded: int = 0
    evicted: int = 0
    flushes: int = 0
    dropped_unlinked: int = 0
    dropped_size_mismatch: int = 0
    expired_generations: int = 0
    sweeps: int = 0
    eng_rebuilds: int = 0


@dataclass(slots=True)
class _Worker:
    mode: WorkerMode = "approximate"
    exact: int | None = None  # slot of the exact credit
    approx: list[tuple[int, int]] = field(default_factory=list)  # (slot, generation)
    bookings: list[tuple[int, int]] = field(default_factory=list)  # (slot, generation)
    epoch: int = 0


def _bits(mask: int) -> Iterator[int]:
    """Slot numbers set in `mask`, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


_BYTE_SLOTS: list[tuple[tuple[int, ...], ...]] = []  # [byte index][byte value] -> slots


def _slots(mask: int) -> Sequence[int]:
    """Slot numbers set in `mask`, lowest first (table lookup per byte; fast for the dense
    masks of a prefix every worker holds)."""
    if mask < 256:
        if not _BYTE_SLOTS:
            _grow_byte_table(1)
        return _BYTE_SLOTS[0][mask]
    raw = mask.to_bytes((mask.bit_length() + 7) // 8, "little")
    if len(raw) > len(_BYTE_SLOTS):
        _grow_byte_table(len(raw))
    out: list[int] = []
    for j, byte in enumerate(raw):
        if byte:
            out.extend(_BYTE_SLOTS[j][byte])
    return out


def _grow_byte_table(n_bytes: int) -> None:
    while len(_BYTE_SLOTS) < n_bytes:
        base = 8 * len(_BYTE_SLOTS)
        _BYTE_SLOTS.append(
            tuple(tuple(base + i for i in range(8) if value >> i & 1) for value in range(256))
        )


class PrefixIndex:
    """Which worker holds which prefix of full blocks, for one model (see module docstring).

    `block_size`: tokens per block; must equal the engines' page size (blocks of another
    length are dropped and counted in `stats.dropped_size_mismatch`).
    `seed`: root of the hash chain. `max_blocks`: the global budget in distinct blocks
    (>= 1). `approx_ttl_s`: approximate-mode TTL (> 0). `booking_ttl_s`: exact-mode
    booking TTL (> 0; None: no bookings). `sweep_chunk`: keys per `maintain` step.
    ValueError for out-of-range arguments.
    """

    def __init__(
        self,
        block_size: int = 16,
        *,
        seed: int = DEFAULT_HASH_SEED,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        approx_ttl_s: float = DEFAULT_APPROX_TTL_S,
        booking_ttl_s: float | None = DEFAULT_BOOKING_TTL_S,
        sweep_chunk: int = DEFAULT_SWEEP_CHUNK,
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
        if not approx_ttl_s > 0 or (booking_ttl_s is not None and not booking_ttl_s > 0):
            raise ValueError(f"TTLs must be > 0, got {approx_ttl_s} and {booking_ttl_s}")
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.approx_ttl_s = approx_ttl_s
        self._generation_s = approx_ttl_s / 4
        self.booking_ttl_s = booking_ttl_s
        self._booking_generation_s = (booking_ttl_s or 1.0) / 2
        self._seed = seed
        self._root = root_hash(seed)
        self._evict_batch = max(1, max_blocks // 64)
        self._sweep_chunk = max(1, sweep_chunk)
        self._holders: dict[int, int] = {}
        self._eng: dict[int, int] = {}
        self._host: dict[int, int] = {}
        self._shared: set[int] = set()
        self._recent: set[int] = set()
        self._workers: dict[str, _Worker] = {}
        # slots
        self._one: list[int] = []  # canonical 1 << slot objects
        self._owner: list[str | None] = []
        self._owners_memo: dict[int, tuple[str | None, ...]] = {}  # mask -> owners
        self._count: list[int] = []  # entries credited per live slot
        self._serial: list[int] = []  # allocation number per slot (stale expiry entries)
        self._free: list[int] = []  # heap of free slots
        self._live = 0
        self._approx_mask = 0
        self._expiry: list[tuple[float, int, int]] = []  # heap of (expires_at, slot, serial)
        self._dead = 0  # retired, waiting for a sweep
        self._sweeping = 0  # retired, being swept
        self._sweep_keys: list[int] | None = None
        self._sweep_pos = 0
        self.stats = IndexStats()

    # ================================================================== queries

    @property
    def num_blocks(self) -> int:
        """Distinct blocks (keys) in the index, the quantity `max_blocks` caps."""
        return len(self._holders)

    @property
    def num_entries(self) -> int:
        """Live (worker, block) credits over every tier."""
        return sum(self._count[s] for s in _bits(self._live))

    def worker_blocks(self, worker_id: str) -> int:
        """Blocks currently credited to `worker_id` in its live slots (0 if unknown)."""
        w = self._workers.get(worker_id)
        if w is None:
            return 0
        slots = [s for s, _ in w.approx] + [s for s, _ in w.bookings]
        if w.exact is not None:
            slots.append(w.exact)
        return sum(self._count[s] for s in slots if self._live >> s & 1)

    def cache_value(self, worker_id: str) -> CacheValue:
        """What removing `worker_id` would lose (see `CacheValue`); zeros for a worker the
        index does not know or credits with nothing (`cache_values` for one worker)."""
        return self.cache_values([worker_id])[worker_id]

    def cache_values(self, worker_ids: Iterable[str]) -> dict[str, CacheValue]:
        """`CacheValue` of each of `worker_ids`, in one pass over the index. A block is
        unique to a worker when every live slot holding it (device or lower tier) is that
        worker's and it is not in the shared pool; one held on device and host counts once.
        Bits of retired slots (flushed workers, expired generations) are not holders, so a
        block shared only with a flushed worker is unique. A pure read (marks nothing
        recent). O(blocks in the index + host-tier entries): for a scale-down decision, not
        per request."""
        wanted = list(dict.fromkeys(worker_ids))
        live = self._live
        slot_owner: dict[int, str] = {}  # live slot bit -> requested worker
        for worker_id in wanted:
            w = self._workers.get(worker_id)
            if w is None:
                continue
            slots = [s for s, _ in w.approx] + [s for s, _ in w.bookings]
            if w.exact is not None:
                slots.append(w.exact)
            for slot in slots:
                if live >> slot & 1:
                    slot_owner[self._one[slot]] = worker_id
        ours = 0
        for bit in slot_owner:
            ours |= bit
        unique = dict.fromkeys(wanted, 0)
        recent_unique = dict.fromkeys(wanted, 0)
        if ours:
            host, shared, recent, holders = self._host, self._shared, self._recent, self._holders
            keys = holders.keys() | host.keys() if host else holders.keys()
            for key in keys:
                m = (holders.get(key, 0) | host.get(key, 0) if host else holders[key]) & live
                if not m & ours or m & ~ours or key in shared:
                    continue  # nobody of ours, or someone else holds it too
                owner = slot_owner.get(m & -m)  # the lowest bit's worker
                if m & (m - 1):  # several slots: unique only if one worker has them all
                    rest = m & (m - 1)
                    same = True
                    while rest:
                        bit = rest & -rest
                        if slot_owner.get(bit) != owner:
                            same = False
                            break
                        rest &= rest - 1
                    if not same:
                        continue
                assert owner is not None
                unique[owner] += 1
                if key in recent:
                    recent_unique[owner] += 1
        return {w: CacheValue(unique[w], recent_unique[w], self.worker_blocks(w)) for w in wanted}

    def mode(self, worker_id: str) -> WorkerMode:
        """ "exact" once the worker's stream delivered a stored event since its last flush,
        else "approximate" (also for a worker never seen)."""
        w = self._workers.get(worker_id)
        return w.mode if w is not None else "approximate"

    def epoch(self, worker_id: str) -> int:
        """How many times `worker_id`'s entries were flushed (0 if never)."""
        w = self._workers.get(worker_id)
        return w.epoch if w is not None else 0

    def modes(self) -> dict[str, WorkerMode]:
        """Mode of every worker the index knows, by id."""
        return {wid: w.mode for wid, w in self._workers.items()}

    def memory_bytes(self) -> int:
        """Estimated bytes held by the index: `num_blocks * BYTES_PER_BLOCK_ESTIMATE` plus
        the sparse tier maps (an estimate, not a measurement; see `make bench-router`)."""
        extra = 100 * (len(self._host) + len(self._shared)) + 60 * len(self._recent)
        stale = max(0, len(self._eng) - len(self._holders)) * 80
        return len(self._holders) * BYTES_PER_BLOCK_ESTIMATE + extra + stale

    def hashes(self, prompt_ids: Sequence[int]) -> list[int]:
        """The router's keys of every full block of `prompt_ids`, in order."""
        return block_hashes(prompt_ids, self.block_size, self._root)

    def match(
        self, prompt_ids: Sequence[int], workers: Iterable[str] | None = None
    ) -> dict[str, int]:
        """Longest held prefix per worker in tokens, any tier (see `lookup`).

        `workers` restricts the answer to those candidates (None: every worker).
        """
        tokens = self.lookup(prompt_ids).tokens
        if workers is None:
            return dict(tokens)
        allowed = set(workers)
        return {w: t for w, t in tokens.items() if w in allowed}

    def match_detail(self, prompt_ids: Sequence[int]) -> dict[str, PrefixMatch]:
        """What every worker holds of `prompt_ids` as `PrefixMatch`es (see `lookup`)."""
        found = self.lookup(prompt_ids)
        return {w: found.get(w) for w in found.tokens}  # type: ignore[misc]

    def lookup(self, prompt_ids: Sequence[int]) -> Matches:
        """What every worker holds of `prompt_ids` (workers holding nothing are absent).

        Hashes block by block and stops at the first block no live slot holds, so the cost
        is O(matched blocks + 1); the matched path is marked recently used.
        """
        holders = self._holders
        live = self._live
        bs = self.block_size
        n = len(prompt_ids) // bs
        if not holders or not live or n == 0:
            return _NO_MATCHES
        if self._host or self._shared:
            data = token_bytes(prompt_ids if len(prompt_ids) == n * bs else prompt_ids[: n * bs])
            return self._lookup_tiered(memoryview(data), n, 4 * bs)
        clean = not (self._dead | self._sweeping)
        if native_walk is not None:
            drops = native_walk(prompt_ids, bs, self._root, holders, live, clean, self._recent)
        else:
            drops = self._walk_python(prompt_ids, n, clean)
        if not drops:
            return _NO_MATCHES
        tokens: dict[str, int] = {}
        memo = self._owners_memo
        approx_mask = self._approx_mask
        guessed: dict[str, int] = {}
        for mask, depth in drops:
            exact = mask & ~approx_mask
            if exact:
                owners = memo.get(exact)
                if owners is None:
                    owners = self._owners_of(exact)
                tokens.update(zip(owners, repeat(depth * bs)))
            if mask & approx_mask:
                guessed.update(zip(self._owners_of(mask & approx_mask), repeat(depth * bs)))
        approximate: frozenset[str] = frozenset()
        if guessed:
            approximate = frozenset(w for w, t in guessed.items() if t > tokens.get(w, 0))
            for w in approximate:
                tokens[w] = guessed[w]
        return Matches(tokens, None, approximate)

    def _owners_of(self, mask: int) -> tuple[str | None, ...]:
        """Owners of the slots in `mask`, lowest slot first, memoized until a slot changes
        owner (the masks of a lookup repeat: a system prompt every worker holds)."""
        owner = self._owner.__getitem__
        owners = tuple(map(owner, _slots(mask)))
        memo = self._owners_memo
        if len(memo) >= OWNERS_MEMO_SIZE:
            memo.clear()
        memo[mask] = owners
        return owners

    def _walk_python(self, prompt_ids: Sequence[int], n: int, clean: bool) -> list[tuple[int, int]]:
        """`lookup`'s device-tier walk in Python (what `homing.router._walk.walk` computes):
        `(slots that stopped matching, blocks matched)` pairs, the slots still matching at
        the end last; the matched path is added to `_recent`. Empty: nothing matched."""
        holders = self._holders
        live = self._live
        bs = self.block_size
        stride = 4 * bs
        view = memoryview(
            token_bytes(prompt_ids if len(prompt_ids) == n * bs else prompt_ids[: n * bs])
        )
        get = holders.get
        xx = _xxh3
        h = xx(view[:stride], self._root) & KEY_MASK
        m = get(h)
        if m is None:
            return []
        active = m if clean else m & live
        if not active:
            return []
        path = [h]
        append = path.append
        drops: list[tuple[int, int]] = []  # (slots that stopped matching, blocks matched)
        mask = KEY_MASK
        for pos in range(stride, n * stride, stride):
            h = xx(view[pos : pos + stride], h) & mask
            m = get(h)
            if m is None:
                break
            if m != active:
                kept = active & m  # within `live` already (the first mask was masked)
                if kept != active:
                    drops.append((active ^ kept, len(path)))
                    active = kept
                    if not kept:
                        break
            append(h)
        if active:
            drops.append((active, len(path)))
        self._recent.update(path)
        return drops

    def _lookup_tiered(self, view: memoryview, n: int, stride: int) -> Matches:
        """`lookup`'s walk when host-tier or shared blocks exist: tracks the any-tier and
        the device-only prefix per slot."""
        holders, host, shared, live = self._holders, self._host, self._shared, self._live
        bs = self.block_size
        h = self._root
        active = -1  # slots still matching in any tier
        dev = -1  # slots still matching on device only
        drops: list[tuple[int, int]] = []
        dev_drops: list[tuple[int, int]] = []
        path: list[int] = []
        for i in range(n):
            h = _xxh3(view[i * stride : (i + 1) * stride], h) & KEY_MASK
            m = holders.get(h)
            if m is None:
                break
            dm = m & live
            anym = live if h in shared else dm | (host.get(h, 0) & live)
            kept = active & anym
            kept_dev = dev & dm
            if kept_dev != dev:
                if i:
                    dev_drops.append((dev & ~kept_dev, i))
                dev = kept_dev
            if kept != active:
                if i:
                    drops.append((active & ~kept, i))
                active = kept
                if not kept:
                    break
            path.append(h)
        depth = len(path)
        if not depth:
            return _NO_MATCHES
        if active:
            drops.append((active, depth))
        if dev:
            dev_drops.append((dev, depth))
        self._recent.update(path)
        owner = self._owner
        tokens: dict[str, int] = {}
        device: dict[str, int] = {}
        matched = 0
        for mask, d in drops:
            matched |= mask
            for slot in _slots(mask):
                worker_id = owner[slot]
                if worker_id is not None:
                    tokens[worker_id] = max(tokens.get(worker_id, 0), d * bs)
        for mask, d in dev_drops:
            for slot in _slots(mask):
                worker_id = owner[slot]
                if worker_id is not None:
                    device[worker_id] = max(device.get(worker_id, 0), d * bs)
        approximate = frozenset(
            w for w in map(owner.__getitem__, _slots(matched & self._approx_mask)) if w
        )
        device_only = {w: min(device.get(w, 0), t) for w, t in tokens.items()}
        return Matches(tokens, device_only, approximate)

    # ================================================================== updates

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
        """Apply events in order (see `apply`), then run one `maintain` step."""
        for event in events:
            self.apply(worker_id, event)
        if self._sweeping or self._dead:
            self.maintain()

    def flush_worker(self, worker_id: str) -> int:
        """Forget everything credited to `worker_id` (a new epoch); returns the entries
        dropped. O(1): the worker's slots retire at once; `maintain` reclaims them later.
        The worker is in approximate mode afterwards until its next stored event."""
        w = self._workers.get(worker_id)
        if w is None:
            self._workers[worker_id] = _Worker(epoch=1)
            self.stats.flushes += 1
            return 0
        dropped = 0
        if w.exact is not None:
            dropped += self._retire(w.exact)
        for slot, _ in w.approx + w.bookings:
            dropped += self._retire(slot)
        w.exact = None
        w.approx = []
        w.bookings = []
        w.mode = "approximate"
        w.epoch += 1
        self.stats.flushes += 1
        return dropped

    def remove_worker(self, worker_id: str) -> int:
        """Flush `worker_id` and forget it entirely (it left the pool); entries dropped."""
        dropped = self.flush_worker(worker_id)
        self._workers.pop(worker_id, None)
        return dropped

    def record_approximate(self, worker_id: str, prompt_ids: Sequence[int], now: float) -> int:
        """Credit `worker_id` with every full block of `prompt_ids` for `approx_ttl_s`
        (approximate mode: the router sent it there). Ignored (returns 0) for a worker in
        exact mode; else returns the blocks recorded."""
        w = self._worker(worker_id)
        if w.mode == "exact":
            return 0
        return self._record(w, worker_id, w.approx, prompt_ids, now, self._generation_s,
                            self.approx_ttl_s)  # fmt: skip

    def record_dispatch(self, worker_id: str, prompt_ids: Sequence[int], now: float) -> int:
        """The router sent `prompt_ids` to `worker_id` at `now`: an approximate-mode record,
        or in exact mode a booking for `booking_ttl_s` (nothing when bookings are off).
        Returns the blocks credited."""
        w = self._worker(worker_id)
        if w.mode != "exact":
            return self._record(w, worker_id, w.approx, prompt_ids, now, self._generation_s,
                                self.approx_ttl_s)  # fmt: skip
        if self.booking_ttl_s is None:
            return 0
        return self._record(
            w, worker_id, w.bookings, prompt_ids, now, self._booking_generation_s,
            self.booking_ttl_s,
        )  # fmt: skip

    def _record(
        self,
        w: _Worker,
        worker_id: str,
        generations: list[tuple[int, int]],
        prompt_ids: Sequence[int],
        now: float,
        generation_s: float,
        ttl_s: float,
    ) -> int:
        self.expire(now)
        generation = int(now // generation_s)
        if generations and generations[-1][1] == generation:
            slot = generations[-1][0]
        else:
            expires = (generation + 1) * generation_s + ttl_s
            slot = self._allocate(worker_id, approximate=True, expires_at=expires)
            generations.append((slot, generation))
        keys = self.hashes(prompt_ids)
        self._credit(slot, keys, device=True)
        self.stats.recorded += len(keys)
        return len(keys)

    def expire(self, now: float) -> int:
        """Retire approximate generations whose TTL has passed at `now`; returns how many."""
        heap = self._expiry
        n = 0
        while heap and heap[0][0] <= now:
            _, slot, serial = heapq.heappop(heap)
            owner = self._owner[slot]
            if owner is None or self._serial[slot] != serial:
                continue
            w = self._workers.get(owner)
            if w is not None:
                w.approx = [(s, g) for s, g in w.approx if s != slot]
                w.bookings = [(s, g) for s, g in w.bookings if s != slot]
            self._retire(slot)
            n += 1
        self.stats.expired_generations += n
        return n

    def has_retired(self) -> bool:
        """True while retired slots wait for (or are in) a sweep."""
        return bool(self._dead or self._sweeping)

    def maintain(self, steps: int | None = None) -> bool:
        """Advance the sweep of retired slots by up to `steps` keys (default
        `sweep_chunk`); True while work remains."""
        if self._sweep_keys is None:
            if not self._dead:
                return False
            self._start_sweep()
        keys = self._sweep_keys
        assert keys is not None
        stop = min(len(keys), self._sweep_pos + (steps or self._sweep_chunk))
        holders, host, live = self._holders, self._host, self._live
        gone = self._sweeping
        for i in range(self._sweep_pos, stop):
            key = keys[i]
            m = holders.get(key)
            if m is None:
                continue
            hm = host.get(key, 0)
            if not (m | hm) & gone:
                continue
            m &= ~gone
            if hm & gone:
                hm &= ~gone
                if hm:
                    host[key] = hm
                else:
                    del host[key]
            if not (m & live) and not (hm & live) and key not in self._shared:
                del holders[key]
                self._recent.discard(key)
            else:
                holders[key] = self._canonical(m)
        self._sweep_pos = stop
        if stop < len(keys):
            return True
        self._finish_sweep()
        return bool(self._dead)

    # ================================================================== internals

    def _worker(self, worker_id: str) -> _Worker:
        w = self._workers.get(worker_id)
        if w is None:
            w = self._workers[worker_id] = _Worker()
        return w

    def _allocate(self, worker_id: str, *, approximate: bool, expires_at: float) -> int:
        if self._free:
            slot = heapq.heappop(self._free)
        else:
            slot = len(self._one)
            self._one.append(1 << slot)
            self._owner.append(None)
            self._count.append(0)
            self._serial.append(0)
        self._serial[slot] += 1
        self._owner[slot] = worker_id
        self._owners_memo.clear()
        self._count[slot] = 0
        bit = self._one[slot]
        self._live |= bit
        if approximate:
            self._approx_mask |= bit
            heapq.heappush(self._expiry, (expires_at, slot, self._serial[slot]))
        return slot

    def _retire(self, slot: int) -> int:
        bit = self._one[slot]
        if not self._live & bit:
            return 0
        self._live &= ~bit
        self._approx_mask &= ~bit
        self._dead |= bit
        self._owner[slot] = None
        self._owners_memo.clear()
        dropped = self._count[slot]
        self._count[slot] = 0
        return dropped

    def _start_sweep(self) -> None:
        self._sweeping, self._dead = self._dead, 0
        self._sweep_keys = list(self._holders)
        self._sweep_pos = 0
        self.stats.sweeps += 1

    def _finish_sweep(self) -> None:
        for slot in _bits(self._sweeping):
            heapq.heappush(self._free, slot)
        self._sweeping = 0
        self._sweep_keys = None
        self._sweep_pos = 0
        if len(self._eng) > 2 * len(self._holders) + 1024:
            self._rebuild_eng()

    def _canonical(self, mask: int) -> int:
        """The shared int object for a single-slot mask (saves one int per block)."""
        if mask and not mask & (mask - 1):
            return self._one[mask.bit_length() - 1]
        return mask

    def _enter_exact(self, w: _Worker, worker_id: str) -> int:
        for slot, _ in w.approx:
            self._retire(slot)
        w.approx = []
        w.mode = "exact"
        w.exact = self._allocate(worker_id, approximate=False, expires_at=_NO_EXPIRY)
        return w.exact

    def _credit(self, slot: int, keys: Sequence[int], *, device: bool) -> None:
        """Set `slot` on every key (deepest first, so new children are older than their
        parents in LRU order), then evict past the budget."""
        holders = self._holders
        recent = self._recent
        bit = self._one[slot]
        added = 0
        if device:
            for key in reversed(keys):
                m = holders.get(key)
                if m is None:
                    holders[key] = bit
                    added += 1
                elif not m & bit:
                    holders[key] = m | bit
                    added += 1
                    recent.add(key)
                else:
                    recent.add(key)
        else:
            host = self._host
            for key in reversed(keys):
                if key not in holders:
                    holders[key] = 0
                else:
                    recent.add(key)
                hm = host.get(key, 0)
                if not hm & bit:
                    host[key] = self._canonical(hm | bit)
                    added += 1
        self._count[slot] += added
        if len(holders) > self.max_blocks:
            self._evict()

    def _store(self, worker_id: str, event: BlocksStored) -> None:
        w = self._worker(worker_id)
        slot = w.exact if w.exact is not None else self._enter_exact(w, worker_id)
        blocks = event.blocks
        if not blocks:
            return
        if event.parent_engine_hash is None:
            parent = root_hash(self._seed, event.namespace) if event.namespace else self._root
        else:
            parent_key = self._eng.get(event.parent_engine_hash & KEY_MASK)
            if parent_key is None or not self._holds(slot, parent_key):
                self.stats.dropped_unlinked += len(blocks)
                return
            parent = parent_key
        bs = self.block_size
        usable = len(blocks)
        for i, block in enumerate(blocks):
            if len(block.token_ids) != bs:
                usable = i
                self.stats.dropped_size_mismatch += len(blocks) - i
                break
        if usable == 0:
            return
        tokens: list[int] = []
        for block in blocks[:usable]:
            tokens.extend(block.token_ids)
        keys = block_hashes(tokens, bs, parent)
        eng = self._eng
        for block, key in zip(blocks, keys, strict=False):
            eng[block.engine_hash & KEY_MASK] = key
        if event.shared:
            for key in keys:
                self._shared.add(key)
                if key not in self._holders:
                    self._holders[key] = 0
            self.stats.stored += usable
            if len(self._holders) > self.max_blocks:
                self._evict()
            return
        self._credit(slot, keys, device=event.tier == TIER_DEVICE)
        self.stats.stored += usable

    def store_blocks(
        self, worker_id: str, items: Sequence[tuple[int, int | None, bytes, int]]
    ) -> int:
        """Consecutive one-block stored events of `worker_id`, each `(engine_hash,
        parent_engine_hash or None, token bytes, tier)`, in stream order (the fast path
        of `ingest_batch`). Returns the blocks credited."""
        w = self._worker(worker_id)
        slot = w.exact if w.exact is not None else self._enter_exact(w, worker_id)
        holders = self._holders
        eng = self._eng
        recent = self._recent
        host = self._host
        shared = self._shared
        bit = self._one[slot]
        root = self._root
        size = 4 * self.block_size
        limit = self.max_blocks
        hget = holders.get
        eget = eng.get
        mask = KEY_MASK
        xx = _xxh3
        added = 0
        credited = 0
        stats = self.stats
        for engine_hash, parent_engine_hash, data, tier in items:
            if len(data) != size:
                stats.dropped_size_mismatch += 1
                continue
            if parent_engine_hash is None:
                parent = root
            else:
                parent_key = eget(parent_engine_hash & mask)
                if parent_key is None:
                    stats.dropped_unlinked += 1
                    continue
                pm = hget(parent_key)
                if pm is None or not (
                    pm & bit or (host and host.get(parent_key, 0) & bit) or parent_key in shared
                ):
                    stats.dropped_unlinked += 1
                    continue
                parent = parent_key
            key = xx(data, parent) & mask
            eng[engine_hash & mask] = key
            credited += 1
            if tier != TIER_DEVICE:
                self._count[slot] += added
                added = 0
                self._credit(slot, (key,), device=False)
                continue
            m = hget(key)
            if m is None:
                holders[key] = bit
                added += 1
                if len(holders) > limit:
                    self._count[slot] += added
                    added = 0
                    self._evict()
            elif not m & bit:
                holders[key] = m | bit
                added += 1
                recent.add(key)
            else:
                recent.add(key)
        self._count[slot] += added
        stats.stored += credited
        return credited

    def remove_blocks(
        self,
        worker_id: str,
        engine_hashes: Iterable[int],
        tier: int | None = None,
        shared: bool = False,
    ) -> None:
        """A removed event (see `apply`)."""
        self._remove(worker_id, BlocksRemoved(tuple(engine_hashes), tier, shared))

    def _holds(self, slot: int, key: int) -> bool:
        bit = self._one[slot]
        m = self._holders.get(key)
        if m is None:
            return False
        return bool(m & bit or self._host.get(key, 0) & bit or key in self._shared)

    def _remove(self, worker_id: str, event: BlocksRemoved) -> None:
        if event.shared:
            self._remove_shared(event)
            return
        w = self._workers.get(worker_id)
        if w is None or w.exact is None:
            return
        slot = w.exact
        bit = self._one[slot]
        holders, host, eng = self._holders, self._host, self._eng
        device_too = event.tier is None or event.tier == TIER_DEVICE
        lower_too = event.tier is None or event.tier != TIER_DEVICE
        for engine_hash in event.engine_hashes:
            e = engine_hash & KEY_MASK
            key = eng.get(e)
            if key is None:
                continue
            m = holders.get(key)
            if m is None:
                continue
            hit = False
            if device_too and m & bit:
                m = self._canonical(m & ~bit)
                holders[key] = m
                self._count[slot] -= 1
                hit = True
            hm = host.get(key, 0)
            if lower_too and hm & bit:
                hm &= ~bit
                if hm:
                    host[key] = self._canonical(hm)
                else:
                    del host[key]
                self._count[slot] -= 1
                hit = True
            if not hit:
                continue
            self.stats.removed += 1
            if not (m & self._live) and not (hm & self._live) and key not in self._shared:
                del holders[key]
                host.pop(key, None)
                self._recent.discard(key)
                del eng[e]

    def _remove_shared(self, event: BlocksRemoved) -> None:
        holders, eng, live = self._holders, self._eng, self._live
        for engine_hash in event.engine_hashes:
            e = engine_hash & KEY_MASK
            key = eng.get(e)
            if key is None or key not in self._shared:
                continue
            self._shared.discard(key)
            self.stats.removed += 1
            m = holders.get(key, 0)
            if not (m & live) and not (self._host.get(key, 0) & live):
                holders.pop(key, None)
                self._host.pop(key, None)
                self._recent.discard(key)
                del eng[e]

    def _evict(self) -> None:
        """Evict least recently used blocks down to `max_blocks - batch` (CLOCK)."""
        holders = self._holders
        recent = self._recent
        floor = self.max_blocks - self._evict_batch if self.max_blocks > self._evict_batch else 0
        need = len(holders) - max(floor, 0)
        evicted = 0
        for _ in range(2):
            victims: list[int] = []
            second: list[int] = []
            for key in holders:
                if key in recent:
                    second.append(key)
                else:
                    victims.append(key)
                    if len(victims) >= need - evicted:
                        break
            for key in second:
                recent.discard(key)
                holders[key] = holders.pop(key)
            for key in victims:
                self._drop_key(key)
            evicted += len(victims)
            if evicted >= need:
                break
        self.stats.evicted += evicted
        if len(self._eng) > 2 * len(holders) + 1024:
            self._rebuild_eng()

    def _drop_key(self, key: int) -> None:
        m = self._holders.pop(key, None)
        if m is None:
            return
        live = self._live
        count = self._count
        for slot in _bits(m & live):
            count[slot] -= 1
        hm = self._host.pop(key, 0)
        for slot in _bits(hm & live):
            count[slot] -= 1
        self._shared.discard(key)

    def _rebuild_eng(self) -> None:
        holders = self._holders
        self._eng = {e: k for e, k in self._eng.items() if k in holders}
        self.stats.eng_rebuilds += 1
