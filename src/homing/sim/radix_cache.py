"""Paged radix prefix cache and KV pool of one simulated worker, with SGLang's KV events.

Rule of this file: the cache owns every KV page of the pool and is the only place that
creates KV events. Pure data structure: time comes in as `now` arguments, nothing here reads
a clock or does I/O.

Model (as SGLang 0.5.23's RadixCache with `page_size` > 1, mem_cache/radix_cache.py):
- The pool has `total_pages` pages of `page_size` tokens. A page is either free, held
  privately by a running request (computed KV not yet in the tree), or in the tree.
- Only full pages enter the tree, one tree entry per page, grouped into SGLang's radix nodes:
  a run of pages that one insert added (a page marked `run_start` begins a node; the pages
  below it down to the next mark belong to it). As SGLang splits a node where a match or an
  insert stops or branches inside it, a locking match, an insert and a branch mark the page
  after that point: every page of a node then has the same reference count, and each page
  of a node but its last has exactly one child, the node's next page.
- A request's `KvHandle` locks the tree path it uses (reference count per page); a page with a
  reference count > 0 is never evicted.
- Eviction takes whole unreferenced leaf nodes, least recently used first (by `now` of the
  last match/insert that touched the node's last page, ties by access order), until an
  allocation has room: it can free a few pages more than asked, as SGLang's does.
- Events, as SGLang's radix cache records them (mem_cache/events.py): one `BlockStored` per
  inserted node (all its pages: their hashes, their token ids, `parent_block_hash` = the hash
  of the page before the node, None under the root), one `BlockRemoved` per evicted node,
  `AllBlocksCleared` on reset; and, as SGLang's recorder queue, a `BlockStored` whose parent
  is the last block of the `BlockStored` recorded just before it joins that event, and
  consecutive `BlockRemoved` events join into one (until `take_events`).
- Block hash (SGLang `get_hash_str` / `hash_str_to_int64`): digest = SHA-256(parent digest ||
  token ids as uint32 little-endian), the root contributing nothing; block_hash = the first
  8 bytes of the digest read big-endian as a signed int64.

The scheduler meets the cache through a narrow interface: `acquire` (match + lock),
`grow` (allocate private pages; False means "no room": queue or retract), `checkpoint`
(move computed full pages into the tree), `release` (finish: checkpoint, free, unlock).
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

# --------------------------------------------------------------------------------------------
# Events and the block-hash chain
# --------------------------------------------------------------------------------------------


class BlockStored(NamedTuple):
    """A run of pages entered the cache: `block_hashes` one per page, in chain order;
    `token_ids` their ids, `block_size` per page; `parent_block_hash` the page before the
    first (None under the root)."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int


class BlockRemoved(NamedTuple):
    """Pages left the cache (evicted): their block hashes, each node's from its first page."""

    block_hashes: tuple[int, ...]


class AllBlocksCleared(NamedTuple):
    """The whole cache was dropped (FlushCache)."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class _PendingStored:
    """A `BlockStored` still open for the next chained store to join (lists, not tuples, so
    joining does not copy)."""

    __slots__ = ("block_hashes", "parent_block_hash", "token_ids")

    def __init__(self, parent_block_hash: int | None) -> None:
        self.parent_block_hash = parent_block_hash
        self.block_hashes: list[int] = []
        self.token_ids: list[int] = []


class _PendingRemoved:
    """A `BlockRemoved` still open for the next removal to join."""

    __slots__ = ("block_hashes",)

    def __init__(self) -> None:
        self.block_hashes: list[int] = []


def page_digest(token_ids: Sequence[int], parent_digest: bytes | None) -> bytes:
    """SHA-256(parent_digest || ids as uint32 little-endian); `None` parent for a root page."""
    hasher = hashlib.sha256()
    if parent_digest is not None:
        hasher.update(parent_digest)
    hasher.update(struct.pack(f"<{len(token_ids)}I", *token_ids))
    return hasher.digest()


def digest_to_block_hash(digest: bytes) -> int:
    """First 8 bytes of the digest, big-endian, as a signed int64 (SGLang hash_str_to_int64)."""
    return int.from_bytes(digest[:8], "big", signed=True)


def block_hash_chain(token_ids: Sequence[int], page_size: int) -> list[int]:
    """Block hashes of every full page of `token_ids` from the root (the partial tail is
    ignored), as a worker publishes them."""
    hashes: list[int] = []
    digest: bytes | None = None
    for start in range(0, len(token_ids) // page_size * page_size, page_size):
        digest = page_digest(token_ids[start : start + page_size], digest)
        hashes.append(digest_to_block_hash(digest))
    return hashes


# --------------------------------------------------------------------------------------------
# Tree
# --------------------------------------------------------------------------------------------


class _Page:
    """One tree entry = one full page of tokens; `run_start` marks the first page of a radix
    node."""

    __slots__ = (
        "access_seq",
        "alive",
        "block_hash",
        "children",
        "digest",
        "key",
        "last_access",
        "lock_ref",
        "node_id",
        "parent",
        "run_start",
    )

    def __init__(
        self,
        node_id: int,
        key: tuple[int, ...],
        parent: _Page | None,
        digest: bytes | None,
        run_start: bool = True,
    ) -> None:
        self.node_id = node_id
        self.key = key
        self.parent = parent
        self.children: dict[tuple[int, ...], _Page] = {}
        self.digest = digest
        self.block_hash = digest_to_block_hash(digest) if digest is not None else 0
        self.lock_ref = 0
        self.last_access = 0.0
        self.access_seq = 0
        self.alive = True
        self.run_start = run_start


@dataclass(eq=False)
class KvHandle:
    """A running request's hold on the pool.

    node: the last tree page of the request's locked path (the root when none).
    shared_pages: pages on that path (all locked by this handle), i.e. tokens
        `[0, shared_pages x page_size)` live in the tree.
    private_pages: pages allocated to the request beyond the shared prefix.
    """

    node: _Page
    shared_pages: int = 0
    private_pages: int = 0
    released: bool = field(default=False)

    def capacity_tokens(self, page_size: int) -> int:
        """Tokens of KV this handle can hold without another allocation."""
        return (self.shared_pages + self.private_pages) * page_size


@dataclass(frozen=True)
class PrefixMatch:
    """Longest cached page-aligned prefix: `num_tokens` tokens ending at tree page `node`."""

    num_tokens: int
    node: _Page


class RadixCache:
    """Paged radix prefix cache over a pool of `total_pages` pages (see the module docstring).

    Raises ValueError for page_size < 1 or total_pages < 1.
    """

    def __init__(self, total_pages: int, page_size: int = 16) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if total_pages < 1:
            raise ValueError(f"total_pages must be >= 1, got {total_pages}")
        self.page_size = page_size
        self.total_pages = total_pages
        self._pack = struct.Struct(f"<{page_size}I").pack  # page_digest's encoding, compiled
        self._ids = itertools.count(1)
        self._seq = itertools.count(1)
        self._events: list[_PendingStored | _PendingRemoved | AllBlocksCleared] = []
        self._init_tree()

    def _init_tree(self) -> None:
        self.root = _Page(0, (), None, None)
        self.root.lock_ref = 1  # the root is never evicted
        self.tree_pages = 0
        self.private_pages = 0
        self.locked_pages = 0
        self._heap: list[tuple[float, int, int, _Page]] = []

    # ---- pool figures ----

    @property
    def free_pages(self) -> int:
        """Pages neither in the tree nor held privately."""
        return self.total_pages - self.tree_pages - self.private_pages

    @property
    def evictable_pages(self) -> int:
        """Tree pages no request references (all of them can be evicted, leaves first)."""
        return self.tree_pages - self.locked_pages

    @property
    def available_pages(self) -> int:
        """Pages an allocation can get: free plus evictable."""
        return self.free_pages + self.evictable_pages

    @property
    def used_pages(self) -> int:
        """Pages that cannot be reclaimed: locked tree pages plus private pages."""
        return self.locked_pages + self.private_pages

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold `num_tokens` tokens (ceiling)."""
        return -(-num_tokens // self.page_size)

    # ---- lookups ----

    def match_prefix(
        self,
        token_ids: Sequence[int],
        now: float,
        *,
        max_tokens: int | None = None,
        touch: bool = True,
    ) -> PrefixMatch:
        """Longest page-aligned prefix of `token_ids` (at most `max_tokens`) in the tree.
        With `touch`, the matched pages count as used at `now` for LRU."""
        match = self._match(token_ids, now, max_tokens, touch)
        if touch and self._is_evictable_leaf(match.node):
            self._push(match.node)  # its LRU position moved (only the last page can be a leaf)
        return match

    def _match(
        self, token_ids: Sequence[int], now: float, max_tokens: int | None, touch: bool
    ) -> PrefixMatch:
        """`match_prefix` without re-queueing the last page for eviction (for callers that
        lock the path at once; unlocking queues it)."""
        limit = len(token_ids) if max_tokens is None else min(max_tokens, len(token_ids))
        page = self.page_size
        node = self.root
        matched = 0
        seq = next(self._seq) if touch else 0
        for start in range(0, limit // page * page, page):
            child = node.children.get(tuple(token_ids[start : start + page]))
            if child is None:
                break
            node = child
            matched += page
            if touch:
                node.last_access = now
                node.access_seq = seq
        return PrefixMatch(matched, node)

    # ---- the scheduler's interface ----

    def acquire(self, token_ids: Sequence[int], now: float, *, max_tokens: int) -> KvHandle:
        """Match the longest cached prefix (at most `max_tokens` tokens) and lock it for a
        request (a match ending inside a radix node splits it there, as SGLang's does). The
        handle's `shared_pages` x page_size is the request's cached tokens."""
        match = self._match(token_ids, now, max_tokens, True)
        self._split_below(match.node)
        handle = KvHandle(node=self.root)
        self._lock_path(match.node, stop=self.root)
        handle.node = match.node
        handle.shared_pages = match.num_tokens // self.page_size
        return handle

    def grow(self, handle: KvHandle, kv_tokens: int, now: float) -> bool:
        """Make `handle` hold at least `kv_tokens` tokens of KV, evicting unreferenced nodes
        (LRU) when the pool has too few free pages. Returns False, changing nothing, when even
        eviction cannot make room."""
        needed = self.pages_for(kv_tokens) - handle.shared_pages - handle.private_pages
        if needed <= 0:
            return True
        if needed > self.available_pages:
            return False
        if needed > self.free_pages:
            shortfall = needed - self.free_pages
            evicted = self.evict(shortfall, now)
            assert evicted >= shortfall, "every unreferenced page is evictable"
        handle.private_pages += needed
        self.private_pages += needed
        return True

    def checkpoint(self, handle: KvHandle, token_ids: Sequence[int], now: float) -> None:
        """Insert the full pages of `token_ids` (tokens whose KV the request has computed) into
        the tree and lock them for `handle`: pages new to the tree move from the handle's
        private pages into the tree as one new radix node (one `BlockStored` for all of them);
        pages another request already inserted free the handle's private copy. An insert
        that ends or branches inside an existing node splits it there.

        Raises ValueError if `token_ids` holds more full pages than the handle has.
        """
        num_pages = len(token_ids) // self.page_size
        if num_pages <= handle.shared_pages:
            return
        if num_pages > handle.shared_pages + handle.private_pages:
            raise ValueError(
                f"checkpoint of {num_pages} pages but the handle holds "
                f"{handle.shared_pages + handle.private_pages}"
            )
        seq = next(self._seq)
        node = handle.node
        old_last = node
        page = self.page_size
        pack = self._pack
        run: _PendingStored | None = None
        for start in range(handle.shared_pages * page, num_pages * page, page):
            key = tuple(token_ids[start : start + page])
            child = node.children.get(key)
            if child is None:
                first = run is None
                if run is None:  # the first new page: a new node under `node`
                    self._split_below(node)
                    run = self._stored_run(node.block_hash if node is not self.root else None)
                parent = node.digest
                digest = hashlib.sha256(parent + pack(*key) if parent else pack(*key)).digest()
                child = _Page(next(self._ids), key, node, digest, run_start=first)
                node.children[key] = child
                self.tree_pages += 1
                run.block_hashes.append(child.block_hash)
                run.token_ids.extend(key)
            child.last_access = now  # locked just below; unlocking queues it for eviction
            child.access_seq = seq
            node = child
        if run is None:
            self._split_below(node)  # the insert ended inside an existing node
        moved = num_pages - handle.shared_pages
        self.private_pages -= moved
        handle.private_pages -= moved
        self._lock_path(node, stop=old_last)
        handle.node = node
        handle.shared_pages = num_pages

    def release(
        self, handle: KvHandle, token_ids: Sequence[int], now: float, *, insert: bool = True
    ) -> None:
        """A request is done with its KV: insert the full pages of `token_ids` (when `insert`),
        free its private pages and drop its references (its pages become evictable).
        Releasing twice is a no-op."""
        if handle.released:
            return
        if insert:
            self.checkpoint(handle, token_ids, now)
        self.private_pages -= handle.private_pages
        handle.private_pages = 0
        self._unlock_path(handle.node)
        handle.node = self.root
        handle.shared_pages = 0
        handle.released = True

    def evict(self, num_pages: int, now: float) -> int:
        """Evict unreferenced leaf nodes, least recently used first, until at least `num_pages`
        pages are evicted or none is left; returns how many pages were evicted (a whole node
        goes at once, so it can be more than asked; one `BlockRemoved` per node, joined as
        the module docstring says). `now` is accepted for strategies that age entries; LRU
        only compares recorded access times."""
        del now
        evicted = 0
        while evicted < num_pages and self._heap:
            access, seq, _, page = heapq.heappop(self._heap)
            if not self._is_evictable_leaf(page) or (page.last_access, page.access_seq) != (
                access,
                seq,
            ):
                continue
            hashes: list[int] = []
            while True:  # the node's pages, from its last up to its first
                parent = page.parent
                assert parent is not None
                del parent.children[page.key]
                page.alive = False
                self.tree_pages -= 1
                evicted += 1
                hashes.append(page.block_hash)
                if page.run_start or not self._is_evictable_leaf(parent):
                    break
                page = parent
            hashes.reverse()
            self._removed_run().block_hashes.extend(hashes)
            if parent is not self.root and self._is_evictable_leaf(parent):
                self._push(parent)
        return evicted

    def reset(self) -> None:
        """Drop every page (FlushCache); emits `AllBlocksCleared`.

        Raises RuntimeError while any request holds pages.
        """
        if self.locked_pages or self.private_pages:
            raise RuntimeError("cannot flush the cache while requests hold KV pages")
        self._init_tree()
        self._events.append(AllBlocksCleared())

    def take_events(self) -> list[KvEvent]:
        """Events recorded since the last call, oldest first."""
        pending, self._events = self._events, []
        events: list[KvEvent] = []
        for item in pending:
            if isinstance(item, _PendingStored):
                events.append(
                    BlockStored(
                        block_hashes=tuple(item.block_hashes),
                        parent_block_hash=item.parent_block_hash,
                        token_ids=tuple(item.token_ids),
                        block_size=self.page_size,
                    )
                )
            elif isinstance(item, _PendingRemoved):
                events.append(BlockRemoved(tuple(item.block_hashes)))
            else:
                events.append(item)
        return events

    # ---- internals ----

    def _stored_run(self, parent_block_hash: int | None) -> _PendingStored:
        """The store a new node's pages go into: the last recorded event when it is a store
        ending at `parent_block_hash` (SGLang's recorder joins chained stores), else a new one."""
        tail = self._events[-1] if self._events else None
        if (
            isinstance(tail, _PendingStored)
            and parent_block_hash is not None
            and tail.block_hashes[-1] == parent_block_hash
        ):
            return tail
        run = _PendingStored(parent_block_hash)
        self._events.append(run)
        return run

    def _removed_run(self) -> _PendingRemoved:
        """The removal an evicted node's hashes go into: the last recorded event when it is a
        removal (SGLang's recorder joins consecutive ones), else a new one."""
        tail = self._events[-1] if self._events else None
        if isinstance(tail, _PendingRemoved):
            return tail
        run = _PendingRemoved()
        self._events.append(run)
        return run

    def _split_below(self, page: _Page) -> None:
        """Make `page` the last page of its radix node: its next page in the same node, if
        any (then its only child), starts a node of its own (SGLang's `_split_node`)."""
        if len(page.children) == 1:
            for child in page.children.values():
                child.run_start = True

    def _is_evictable_leaf(self, page: _Page) -> bool:
        return page.alive and page.lock_ref == 0 and not page.children and page is not self.root

    def _push(self, page: _Page) -> None:
        heapq.heappush(self._heap, (page.last_access, page.access_seq, page.node_id, page))
        if len(self._heap) > 2 * self.tree_pages + 64:
            live = {p.node_id: p for (_, _, _, p) in self._heap if self._is_evictable_leaf(p)}
            self._heap = [(p.last_access, p.access_seq, p.node_id, p) for p in live.values()]
            heapq.heapify(self._heap)

    def _lock_path(self, node: _Page, *, stop: _Page) -> None:
        """Add one reference to every page from `node` up to (not including) `stop`."""
        while node is not stop and node is not self.root:
            if node.lock_ref == 0:
                self.locked_pages += 1
            node.lock_ref += 1
            assert node.parent is not None
            node = node.parent

    def _unlock_path(self, node: _Page) -> None:
        """Drop one reference from every page from `node` up to the root."""
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.locked_pages -= 1
                if self._is_evictable_leaf(node):
                    self._push(node)
            assert node.parent is not None
            node = node.parent
