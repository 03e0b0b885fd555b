"""The affinity index mirrors SGLang's radix cache exactly on run-shaped KV events: for random
workloads on the simulated workers' radix caches (runs of pages stored per insert, whole runs
evicted LRU, nodes split by later matches, flushes), after every event batch, as the wire
carries it, the index credits each worker with exactly the prefix its cache would match.

The reference model is `homing.sim.radix_cache.RadixCache`, SGLang 0.5.23's paged radix cache
with its event recorder; the batches go through the gateway's own path (`fill_proto_event`,
serialization, `decode_batch`, `ingest_decoded`)."""

from __future__ import annotations

import random

import pytest
from smg_grpc_proto.generated import common_pb2

from homing.router.events import decode_batch, ingest_decoded
from homing.router.index import PrefixIndex
from homing.sim.kv_events import fill_proto_event
from homing.sim.radix_cache import KvHandle, RadixCache

BS = 16


class Workload:
    """Random conversations over `workers` radix caches of `pages` pages each."""

    def __init__(self, seed: int, workers: int, pages: int) -> None:
        self.rng = random.Random(seed)
        self.caches = {f"w{i}": RadixCache(pages, BS) for i in range(workers)}
        vocab = 40
        # Few distinct tokens make prompts share pages at many depths (splits, branches).
        self.stems = [
            [self.rng.randrange(vocab) for _ in range(BS * self.rng.randint(1, 8))]
            for _ in range(8)
        ]
        self.vocab = vocab
        self.running: dict[str, list[tuple[KvHandle, list[int]]]] = {w: [] for w in self.caches}
        self.now = 0.0
        self.event_id = 0

    def prompt(self) -> list[int]:
        rng = self.rng
        stem = rng.choice(self.stems)
        cut = rng.randint(0, len(stem))
        tail = [rng.randrange(self.vocab) for _ in range(rng.randint(1, 5 * BS))]
        return stem[:cut] + tail

    def step(self) -> dict[str, bytes]:
        """Start, finish or flush on random workers; each changed worker's batch bytes."""
        rng = self.rng
        self.now += 1.0
        for _ in range(rng.randint(1, 4)):
            worker = rng.choice(list(self.caches))
            cache = self.caches[worker]
            running = self.running[worker]
            roll = rng.random()
            if roll < 0.5:
                tokens = self.prompt()
                handle = cache.acquire(tokens, self.now, max_tokens=len(tokens) - 1)
                if cache.grow(handle, len(tokens), self.now):
                    running.append((handle, tokens))
                else:
                    cache.release(handle, tokens, self.now, insert=False)
            elif roll < 0.95 and running:
                handle, tokens = running.pop(rng.randrange(len(running)))
                output = [rng.randrange(self.vocab) for _ in range(rng.randint(0, 2 * BS))]
                if cache.grow(handle, len(tokens) + len(output), self.now):
                    tokens = tokens + output
                cache.release(handle, tokens, self.now)
            elif roll >= 0.99 and not running:
                cache.reset()
        out = {}
        for worker, cache in self.caches.items():
            events = cache.take_events()
            if not events:
                continue
            batch = common_pb2.KvEventBatch(sequence_number=int(self.now), timestamp=self.now)
            for event in events:
                self.event_id += 1
                fill_proto_event(batch.events.add(), event, self.event_id)
            out[worker] = batch.SerializeToString()
        return out


@pytest.mark.parametrize("seed", range(12))
def test_after_every_batch_the_index_credits_what_each_radix_cache_matches(seed: int) -> None:
    load = Workload(seed, workers=3, pages=24)
    index = PrefixIndex(block_size=BS, max_blocks=1 << 20)
    probes = [load.prompt() for _ in range(40)]
    evicted = stored = runs = 0
    for _ in range(150):
        for worker, data in load.step().items():
            parsed = common_pb2.KvEventBatch.FromString(data)
            runs += sum(len(e.stored.blocks) > 1 for e in parsed.events)
            counts = ingest_decoded(decode_batch(data), index, worker)
            evicted += counts.removed
            stored += counts.stored
        for prompt in [*probes, load.prompt()]:
            held = index.match(prompt)
            for worker, cache in load.caches.items():
                want = cache.match_prefix(prompt, load.now, touch=False).num_tokens
                assert held.get(worker, 0) == want, (worker, prompt)
    assert runs > 0 and evicted > 0  # it stored multi-page runs and evicted some
    assert stored > 0
    assert index.stats.dropped_unlinked == 0
