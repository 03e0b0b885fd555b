"""Consistent hashing with bounded loads (pure): a hash ring of virtual nodes, walked past full
workers.

Rule of this file: a key always starts at the same point of the ring, and a worker is taken
only while its load is under the bound. Source: V. Mirrokni, M. Thorup, M. Zadimoghaddam,
"Consistent Hashing with Bounded Loads", SODA 2018: with m balls (requests) on n bins
(workers) and balance parameter c > 1, every bin's capacity is `ceil(c * m / n)`; a ball
goes to the first bin clockwise from its hash whose load is under capacity. Counting the
request being placed, m = (requests in flight) + 1, so

    bound(L, n) = max(ceil(c * (L + 1) / n), min_bound)

where L is the candidates' total load (`WorkerSnapshot.load`, requests) and `min_bound` (ours,
default 1) keeps a tiny pool from spilling every second request. No worker ends up above
the bound, and a membership change moves only the keys of the worker that joined or left
(~1/n of them) when no worker is full.

Virtual nodes: each worker owns `vnodes` points `xxh3_64("<worker_id>#<i>", seed)`; 160 is
libketama's figure and keeps the largest worker's share of the ring within ~10% of 1/n at
8-64 workers. Points of workers that are not candidates for a request are skipped, which is
the same as removing them, so the ring only grows on first sight of a worker and shrinks on
`remove`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping

import xxhash

#: Virtual nodes per worker (libketama uses 160 points per server).
DEFAULT_VNODES = 160

#: Default balance parameter c of the bound (Mirrokni et al. use 1.25 in their experiments).
DEFAULT_LOAD_FACTOR = 1.25

#: Seed of the ring's point hashes (any fixed value: "ring").
RING_SEED = 0x72696E67

_MASK64 = (1 << 64) - 1


def load_bound(total_load: int, workers: int, load_factor: float, min_bound: int = 1) -> int:
    """Most requests a worker may hold after this placement: `max(ceil(c (L + 1) / n),
    min_bound)` (see the module docstring). ValueError when `workers` < 1 or c < 1."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if load_factor < 1:
        raise ValueError(f"load_factor must be >= 1, got {load_factor}")
    return max(math.ceil(load_factor * (total_load + 1) / workers - 1e-9), min_bound)


def key_hash(data: bytes | str, seed: int = RING_SEED) -> int:
    """A ring position (uint64) for a routing key."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return xxhash.xxh3_64_intdigest(raw, seed)


class HashRing:
    """Sorted ring of virtual nodes; see the module docstring.

    `vnodes`: points per worker (>= 1). `seed`: seed of the point hashes.
    """

    def __init__(self, vnodes: int = DEFAULT_VNODES, seed: int = RING_SEED) -> None:
        if vnodes < 1:
            raise ValueError(f"vnodes must be >= 1, got {vnodes}")
        self.vnodes = vnodes
        self._seed = seed
        self._points: list[int] = []
        self._owners: list[str] = []
        self._members: set[str] = set()

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self._members

    def __len__(self) -> int:
        return len(self._members)

    def members(self) -> list[str]:
        """Workers on the ring, sorted."""
        return sorted(self._members)

    def add(self, worker_id: str) -> None:
        """Put `worker_id`'s virtual nodes on the ring (no-op if present)."""
        self.add_many((worker_id,))

    def add_many(self, worker_ids: Iterable[str]) -> None:
        """Put the virtual nodes of every worker of `worker_ids` not yet on the ring, with
        one sort (a pool of 256 workers joins in ~50 ms, not 256 re-sorts)."""
        new = [w for w in dict.fromkeys(worker_ids) if w not in self._members]
        if not new:
            return
        self._members.update(new)
        pairs = list(zip(self._points, self._owners, strict=True))
        for worker_id in new:
            for i in range(self.vnodes):
                pairs.append((key_hash(f"{worker_id}#{i}", self._seed), worker_id))
        pairs.sort()
        self._points = [p for p, _ in pairs]
        self._owners = [o for _, o in pairs]

    def remove(self, worker_id: str) -> None:
        """Take `worker_id`'s virtual nodes off the ring (no-op if absent)."""
        if worker_id not in self._members:
            return
        self._members.discard(worker_id)
        kept = [(p, o) for p, o in zip(self._points, self._owners, strict=True) if o != worker_id]
        self._points = [p for p, _ in kept]
        self._owners = [o for _, o in kept]

    def ensure(self, worker_ids: Iterable[str]) -> None:
        """Add every worker of `worker_ids` not yet on the ring."""
        if not isinstance(worker_ids, Collection):
            worker_ids = list(worker_ids)  # an iterator is read twice below
        if not self._members.issuperset(worker_ids):
            self.add_many(worker_ids)

    def walk(self, key: int) -> Iterator[str]:
        """Distinct workers in ring order starting at the first point >= `key` (wrapping)."""
        points, owners = self._points, self._owners
        n = len(points)
        if n == 0:
            return
        start = bisect.bisect_left(points, key & _MASK64)
        seen: set[str] = set()
        for i in range(n):
            owner = owners[(start + i) % n]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == len(self._members):
                    return

    def lookup(self, key: int) -> str | None:
        """The owner of `key` ignoring load (None on an empty ring)."""
        return next(self.walk(key), None)

    def candidates(
        self, key: int, loads: Mapping[str, int], bound: int, count: int
    ) -> list[tuple[str, int]]:
        """The first `count` workers clockwise from `key` among `loads`' keys whose load is
        under `bound`, each with how many full workers were passed before it."""
        return self.candidates_by(key, loads.get, bound, count)

    def candidates_by(
        self, key: int, load_of: Callable[[str], int | None], bound: int, count: int
    ) -> list[tuple[str, int]]:
        """`candidates` with loads read on demand: `load_of(worker)` is the worker's load,
        None for a worker that is not a candidate (only walked workers are asked)."""
        out: list[tuple[str, int]] = []
        passed = 0
        for worker_id in self.walk(key):
            load = load_of(worker_id)
            if load is None:
                continue
            if load < bound:
                out.append((worker_id, passed))
                if len(out) == count:
                    break
            else:
                passed += 1
        return out

    def pick(
        self, key: int, loads: Mapping[str, int], bound: int
    ) -> tuple[str, int] | tuple[None, int]:
        """First worker clockwise from `key` among `loads`' keys whose load is under
        `bound`; returns (worker, workers passed over). (None, n) when every candidate is
        at or over the bound or none is on the ring."""
        passed = 0
        for worker_id in self.walk(key):
            load = loads.get(worker_id)
            if load is None:
                continue
            if load < bound:
                return worker_id, passed
            passed += 1
        return None, passed
