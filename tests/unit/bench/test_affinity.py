"""The affinity judge rebuilds each worker's cache from its KV events and finds, per request,
the longest prefix any worker held at the decision: equal to the simulated radix cache's own
match, and every lost token classified by what the router's index said."""

from __future__ import annotations

import random

from homing.bench.affinity import CLEARED, REMOVED, STORED, CacheChange, Routed, judge
from homing.sim.radix_cache import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    RadixCache,
    block_hash_chain,
)

BS = 16


def changes_of(cache: RadixCache, worker: str, at: float) -> list[CacheChange]:
    """The cache's pending events as `CacheChange`s published at `at`."""
    out = []
    for event in cache.take_events():
        if isinstance(event, BlockStored):
            out.append(CacheChange(at, worker, STORED, event.block_hashes))
        elif isinstance(event, BlockRemoved):
            out.append(CacheChange(at, worker, REMOVED, event.block_hashes))
        else:
            assert isinstance(event, AllBlocksCleared)
            out.append(CacheChange(at, worker, CLEARED))
    return out


def serve(cache: RadixCache, tokens: list[int], now: float) -> None:
    """A request over `tokens` runs to its end and leaves them in the tree."""
    handle = cache.acquire(tokens, now, max_tokens=len(tokens) - 1)
    assert cache.grow(handle, len(tokens), now)
    cache.release(handle, tokens, now)


def routed(tokens: list[int], at: float, worker: str, served: int = 0, **index: object) -> Routed:
    chain = tuple(block_hash_chain(tokens, BS))
    return Routed(f"r{at}", at, len(tokens), chain, worker, served, **index)  # type: ignore[arg-type]


def test_the_prefix_rebuilt_from_events_equals_the_radix_caches_own_match() -> None:
    """Random conversations over two small caches that evict: at every decision the judge's
    longest prefix per worker is what `RadixCache.match_prefix` finds there."""
    rng = random.Random(7)
    caches = {"w0": RadixCache(total_pages=40, page_size=BS), "w1": RadixCache(40, BS)}
    stems = [[rng.randrange(50_000) for _ in range(BS * rng.randint(1, 6))] for _ in range(6)]
    changes: list[CacheChange] = []
    requests: list[Routed] = []
    expected: list[tuple[int, int]] = []
    for step in range(120):
        now = float(step)
        prompt = list(rng.choice(stems)) + [
            rng.randrange(50_000) for _ in range(rng.randint(1, 40))
        ]
        chosen = rng.choice(["w0", "w1"])
        limit = len(prompt) - 1
        held = {
            w: c.match_prefix(prompt, now, max_tokens=limit // BS * BS, touch=False).num_tokens
            for w, c in caches.items()
        }
        requests.append(routed(prompt, now + 0.5, chosen, served=held[chosen]))
        expected.append((max(held.values()), held[chosen]))
        serve(caches[chosen], prompt, now + 0.6)
        changes += changes_of(caches[chosen], chosen, now + 0.7)
    verdicts, summary = judge(requests, changes, BS)
    assert [(v.best, v.held) for v in verdicts] == expected
    assert any(v.lost > 0 for v in verdicts) and any(v.best > 0 for v in verdicts)
    assert any(c.kind == REMOVED for c in changes)  # the caches did evict
    assert summary.evicted == 0 and summary.held == sum(h for _, h in expected)


def test_each_lost_prefix_is_classified_by_what_the_index_said() -> None:
    """Held by w0 (4 blocks) and w1 (2 blocks); the request goes to w1 each time."""
    prompt = list(range(100, 100 + 5 * BS + 3))
    w0, w1 = RadixCache(100, BS), RadixCache(100, BS)
    serve(w0, prompt[: 4 * BS + 1], 0.0)
    serve(w1, prompt[: 2 * BS + 1], 0.0)
    changes = changes_of(w0, "w0", 1.0) + changes_of(w1, "w1", 1.0)

    def one(**index: object) -> str:
        (verdict,), _ = judge([routed(prompt, 2.0, "w1", **index)], changes, BS)
        assert (verdict.best, verdict.held, verdict.lost) == (64, 32, 32)
        return verdict.category

    assert one() == "missed"  # the router said nothing of its index
    assert one(index_branch="veto", index_matched=32, index_best=64) == "traded_veto"
    assert one(index_branch="ring", index_matched=32, index_best=32) == "stale_missing"
    assert one(index_branch="exact_hit", index_matched=64, index_best=64) == "stale_phantom"
    # it credited w1 (not the true holder w0) with all 64: a phantom hid the holder
    phantom = one(index_branch="veto", index_matched=32, index_best=64, index_best_worker="w1")
    assert phantom == "stale_phantom"
    assert one(index_branch="veto", index_matched=32, index_best=64, index_best_worker="w0") == (
        "traded_veto"
    )


def test_changes_after_the_decision_do_not_count_and_a_clear_empties_the_worker() -> None:
    prompt = list(range(7, 7 + 3 * BS + 1))
    cache = RadixCache(100, BS)
    serve(cache, prompt, 0.0)
    stored = changes_of(cache, "w0", 5.0)
    cleared = [CacheChange(9.0, "w0", CLEARED)]
    requests = [
        routed(prompt, 4.0, "w0"),  # before the store was published
        routed(prompt, 5.0, "w0", served=16),  # at it: the store counts; 32 evicted in flight
        routed(prompt, 9.5, "w0"),  # after the clear
    ]
    verdicts, summary = judge(requests, stored + cleared, BS)
    assert [(v.category, v.best) for v in verdicts] == [
        ("nothing_cached", 0),
        ("taken", 48),
        ("nothing_cached", 0),
    ]
    assert verdicts[1].evicted == 32 and summary.evicted == 32
    assert summary.requests == {"nothing_cached": 2, "taken": 1}
