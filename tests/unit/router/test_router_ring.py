"""Consistent hashing with bounded loads: the bound, the walk, and ~1/N key movement."""

from __future__ import annotations

import pytest

from homing.router.ring import HashRing, key_hash, load_bound

KEYS = [key_hash(f"key-{i}") for i in range(20_000)]


def ring_of(n: int) -> HashRing:
    """A ring with workers w0..w{n-1}."""
    ring = HashRing()
    ring.ensure(f"w{i}" for i in range(n))
    return ring


class TestBound:
    def test_bound_is_ceil_c_times_mean_with_the_new_request(self) -> None:
        """bound = max(ceil(c (L + 1) / n), min_bound) (Mirrokni et al. 2018)."""
        assert load_bound(79, 8, 1.25) == 13  # ceil(1.25 * 80 / 8) = 12.5 -> 13
        assert load_bound(15, 8, 1.25) == 3  # ceil(2.5)
        assert load_bound(0, 8, 1.25, min_bound=4) == 4
        assert load_bound(200, 4, 1.25) == 63  # ceil(62.8125)

    def test_bad_arguments_raise(self) -> None:
        """No workers or c < 1 is a ValueError."""
        with pytest.raises(ValueError):
            load_bound(1, 0, 1.25)
        with pytest.raises(ValueError):
            load_bound(1, 2, 0.9)


class TestRing:
    def test_same_key_same_worker(self) -> None:
        """Lookups are deterministic and independent of insertion order."""
        a = ring_of(8)
        b = HashRing()
        b.ensure(f"w{i}" for i in reversed(range(8)))
        assert [a.lookup(k) for k in KEYS[:500]] == [b.lookup(k) for k in KEYS[:500]]

    def test_walk_visits_each_worker_once(self) -> None:
        """A walk yields every worker exactly once, starting at the key's owner."""
        ring = ring_of(8)
        walk = list(ring.walk(KEYS[0]))
        assert sorted(walk) == ring.members() and walk[0] == ring.lookup(KEYS[0])

    def test_pick_walks_past_full_workers(self) -> None:
        """A worker at the bound is passed over; the next one clockwise takes the key."""
        ring = ring_of(4)
        walk = list(ring.walk(KEYS[1]))
        loads = {w: 0 for w in walk}
        loads[walk[0]] = 5
        assert ring.pick(KEYS[1], loads, bound=5) == (walk[1], 1)
        assert ring.pick(KEYS[1], dict.fromkeys(walk, 5), bound=5) == (None, 4)

    def test_virtual_nodes_balance_the_key_space(self) -> None:
        """With 160 points per worker no worker owns more than 1.3x its fair share."""
        ring = ring_of(8)
        counts: dict[str, int] = {}
        for k in KEYS:
            owner = ring.lookup(k)
            assert owner is not None
            counts[owner] = counts.get(owner, 0) + 1
        assert max(counts.values()) <= 1.3 * len(KEYS) / 8


class TestMembershipChange:
    def test_removing_a_worker_moves_only_its_keys(self) -> None:
        """Removing one of 8 workers moves exactly its keys (~1/8), nothing else."""
        ring = ring_of(8)
        before = {k: ring.lookup(k) for k in KEYS}
        ring.remove("w3")
        moved = [k for k in KEYS if ring.lookup(k) != before[k]]
        assert all(before[k] == "w3" for k in moved)
        assert 0.08 <= len(moved) / len(KEYS) <= 0.18

    def test_adding_a_worker_moves_about_one_nth_to_it(self) -> None:
        """A ninth worker takes ~1/9 of the keys, all moved keys go to it."""
        ring = ring_of(8)
        before = {k: ring.lookup(k) for k in KEYS}
        ring.add("w8")
        moved = [k for k in KEYS if ring.lookup(k) != before[k]]
        assert all(ring.lookup(k) == "w8" for k in moved)
        assert 0.07 <= len(moved) / len(KEYS) <= 0.16


def test_candidates_lists_the_first_workers_under_the_bound() -> None:
    """candidates() returns the key's first n workers under the bound, with passes counted."""
    ring = ring_of(5)
    walk = list(ring.walk(KEYS[2]))
    loads = {w: 0 for w in walk}
    loads[walk[1]] = 9
    assert ring.candidates(KEYS[2], loads, bound=9, count=3) == [
        (walk[0], 0),
        (walk[2], 1),
        (walk[3], 1),
    ]


def test_ensure_adds_a_pool_in_one_go_and_builds_the_same_ring() -> None:
    """A pool joining at once (a set, a list or a generator) gives the ring that adding its
    workers one by one gives, and a repeated ensure changes nothing."""
    one_by_one = HashRing()
    for i in range(12):
        one_by_one.add(f"w{i}")
    for workers in ({f"w{i}" for i in range(12)}, [f"w{i}" for i in range(12)]):
        for first, second in ((workers, iter(workers)), (iter(workers), workers)):
            ring = HashRing()
            ring.ensure(first)
            ring.ensure(second)
            assert (ring._points, ring._owners) == (one_by_one._points, one_by_one._owners)
            assert len(ring._points) == 12 * ring.vnodes
    assert ring_of(12).members() == one_by_one.members()
