"""`make bench-router`: microbenchmarks of the router's decision path and affinity index.

Rule of this file: measure the real code (`homing.router.Router`) on synthetic but
protocol-shaped input, in this process, with `time.perf_counter_ns`; print a table and
write one JSON file. Figures (targets from issue 4):

- decision latency p50 / p99 (us) of `Router.select` with the default `cache_aware` policy,
  block hashing included, tokenization excluded, for 2k- and 16k-token prompts at the
  `--workers` counts (default 8, 64 and 256; `make bench-router` adds the fleet scale of
  500, 2,000 and 4,000) with `blocks` distinct blocks indexed. Each request is an indexed
  conversation (a 1,024-token system prompt every worker holds, then its own blocks held by
  one worker) extended by new tokens, so the lookup walks its whole cached prefix: the
  worst case for the index. Targets: p99 <= 100 us at 2k tokens and 64 workers; p99 <= 1
  ms at 2k tokens and 4,000 workers (smg reported a p99 of 850 ms at 4,000 workers before
  its fix, smg-project/smg#1692). At 2k tokens and 64 workers also cold prompts (the
  system prompt, then new tokens: no useful prefix anywhere, so the bounded-load ring
  decides), the path of most decisions on the Mooncake replay.
- event ingestion (blocks/s): `Router.apply_kv_bytes` on serialized `KvEventBatch`es (the
  bytes the pool's subscription delivers) of one stored block per event (with its parent
  hash; 512 events per batch, one scheduler step of 8k tokens), reading the wire bytes
  included. Target: >= 300,000.
- run-shaped ingestion (blocks/s): the same conversations stored as SGLang's radix tree
  records them, one stored event per run of pages (a conversation's own 64 blocks after
  the shared system prompt, 16 events per batch), then evicted as one removed event per run;
  stored and removed rates apart, `--run-blocks` blocks over 64 workers. Target: stored
  >= 300,000 (as one-block events).
- bytes per indexed block: `tracemalloc` growth of the index while `blocks` distinct blocks
  are ingested, divided by `num_blocks`. Target: <= 150.
- native vs pure Python (`--compare-python`, on by default): the router's C extensions
  (`homing.router._walk`, `_kvwire`, `_cost`) are switched off and on in this process
  to measure the pure-Python fallback in the same run, for the decision at 2k tokens x 64
  workers (same index, interleaved rounds) and for ingestion (two fresh routers fed the
  same batches, interleaved); reported as ratios.
- growth under churn (`--churn N`): N unique 4-block prompts stored against a budget of
  `--churn-budget` blocks with no removals (a worker that never reports evictions, the worst
  case); index blocks, engine-map entries and process RSS sampled every N/10 prompts must
  level off.

Output: `bench-out/router-micro.json` with `decision_p50_us` and `decision_p99_us` keyed
"<prompt tokens>x<workers>" (e.g. "2048x64"), `ingest_blocks_per_s`, `bytes_per_block`,
`targets` (met or not), `churn` and the parameters.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import platform
import sys
import time
import tracemalloc
from array import array
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import xxhash
from smg_grpc_proto.generated import common_pb2

from homing.router import Router, RouteRequest, WorkerSnapshot, events, hashing, index
from homing.router.policies import cache_aware

#: The cell whose p99 has a target, and which `--compare-python` repeats in pure Python.
TARGET_CELL = (2048, 64)

BLOCK = 16
SYSTEM_TOKENS = 1024
EVENTS_PER_BATCH = 512
TARGET_P99_US = 100.0
TARGET_INGEST = 300_000.0
TARGET_BYTES = 150.0


def _tokens(seed: int, n: int) -> list[int]:
    """`n` deterministic pseudo-random token ids in [1000, 100000) from `seed`."""
    out: list[int] = []
    counter = 0
    while len(out) < n:
        digest = xxhash.xxh3_128_intdigest(counter.to_bytes(8, "little"), seed)
        for _ in range(4):
            out.append(1000 + (digest & 0xFFFFFFFF) % 99_000)
            digest >>= 32
        counter += 1
    return out[:n]


def _engine_hash(prefix_id: int, block: int) -> int:
    """A signed int64 engine block hash, unique per (conversation, block)."""
    return xxhash.xxh3_64_intdigest(f"{prefix_id}/{block}".encode()) - (1 << 63)


def stored_batches(
    chains: Sequence[tuple[int, list[int], int]], start_seq: int = 1
) -> list[common_pb2.KvEventBatch]:
    """Wire batches storing each chain `(prefix_id, tokens, first_block)` block by block,
    one block per stored event, parent hash set (SGLang's shape)."""
    batches: list[common_pb2.KvEventBatch] = []
    batch = common_pb2.KvEventBatch(sequence_number=start_seq)
    for prefix_id, tokens, first in chains:
        n = len(tokens) // BLOCK
        for b in range(first, n):
            if len(batch.events) >= EVENTS_PER_BATCH:
                batches.append(batch)
                batch = common_pb2.KvEventBatch(sequence_number=start_seq + len(batches))
            ev = batch.events.add(event_id=b)
            stored = ev.stored
            block = stored.blocks.add(block_hash=_engine_hash(prefix_id, b), block_size=BLOCK)
            block.token_ids.extend(tokens[b * BLOCK : (b + 1) * BLOCK])
            stored.tier = common_pb2.KV_CACHE_TIER_DEVICE
            if b > 0:
                parent = 0 if b * BLOCK <= SYSTEM_TOKENS else prefix_id
                stored.parent_block_hash = _engine_hash(parent, b - 1)
    if len(batch.events):
        batches.append(batch)
    return batches


class Population:
    """An index filled with `blocks` distinct blocks over `workers` workers."""

    def __init__(self, workers: int, blocks: int, prompt_tokens: int) -> None:
        self.workers = [f"w{i}" for i in range(workers)]
        self.router = Router("cache_aware", max_blocks=max(blocks * 2, 1024))
        self.system = _tokens(0, SYSTEM_TOKENS)
        self.prompt_tokens = prompt_tokens
        self.conversations: list[tuple[str, list[int]]] = []
        self.ingest_s = 0.0
        self.ingested_blocks = 0
        own_blocks = prompt_tokens // BLOCK - SYSTEM_TOKENS // BLOCK
        shared = SYSTEM_TOKENS // BLOCK
        system_chain = [(0, self.system, 0)]
        for w in self.workers:
            self._ingest(w, stored_batches(system_chain))
        prefix_id = 1
        while self.router.index.num_blocks < blocks:
            worker = self.workers[prefix_id % workers]
            tokens = self.system + _tokens(prefix_id, own_blocks * BLOCK)
            self._ingest(worker, stored_batches([(prefix_id, tokens, shared)]))
            if len(self.conversations) < 64:
                self.conversations.append((worker, tokens))
            prefix_id += 1

    def _ingest(self, worker: str, batches: Sequence[common_pb2.KvEventBatch]) -> None:
        apply = self.router.apply_kv_bytes
        wire = [batch.SerializeToString() for batch in batches]
        t0 = time.perf_counter()
        for data in wire:
            apply(worker, data)
        self.ingest_s += time.perf_counter() - t0
        self.ingested_blocks += sum(len(b.events) for b in batches)


def _snapshots(workers: Sequence[str], turn: int) -> list[WorkerSnapshot]:
    """Live-looking snapshots: loads 2..9 in flight, KV usage 0.3..0.6, varying per turn."""
    out = []
    for i, w in enumerate(workers):
        x = (i * 7 + turn * 3) % 8
        out.append(
            WorkerSnapshot(
                worker_id=w,
                in_flight=2 + x,
                running=2 + x,
                waiting=x // 3,
                token_usage=0.3 + 0.04 * x,
                max_running_requests=256,
                queued_prefill_tokens=1000 * (x // 2),
                load_at=0.0,
            )
        )
    return out


def decision_latency(
    population: Population,
    prompt_tokens: int,
    samples: int,
    cold: bool = False,
) -> tuple[float, float, dict[str, int]]:
    """p50 and p99 (us) of `Router.select` for prompts of `prompt_tokens` that extend an
    indexed conversation by 64 new tokens (`cold`: the system prompt every worker holds,
    then new tokens: no useful prefix, the ring's path); also the decision branches seen."""
    router = population.router
    if cold:
        own = prompt_tokens - SYSTEM_TOKENS
        requests = [
            RouteRequest([*population.system, *_tokens(2 * 10**9 + i, own)]) for i in range(64)
        ]
    else:
        requests = [
            RouteRequest([*tokens[: prompt_tokens - 64], *_tokens(10**9 + i, 64)])
            for i, (_, tokens) in enumerate(population.conversations)
        ]
    snaps = [_snapshots(population.workers, t) for t in range(16)]
    times: list[int] = []
    select = router.select
    perf = time.perf_counter_ns
    before = dict(router.decisions)
    for i in range(samples + samples // 10):
        request = requests[i % len(requests)]
        workers = snaps[i % len(snaps)]
        t0 = perf()
        select(request, workers)
        t1 = perf()
        if i >= samples // 10:  # warm-up excluded
            times.append(t1 - t0)
    times.sort()
    branches = {k: v - before.get(k, 0) for k, v in router.decisions.items()}
    return times[len(times) // 2] / 1e3, times[int(len(times) * 0.99)] / 1e3, branches


class _PurePython:
    """Within this block the router runs without its C extensions (the fallback path)."""

    def __enter__(self) -> None:
        self._saved = (
            index.native_walk,
            events._kvwire,
            hashing._native_block_keys,
            cache_aware.native_cost,
        )
        index.native_walk = None
        events._kvwire = None
        hashing._native_block_keys = None
        cache_aware.native_cost = None

    def __exit__(self, *exc: object) -> None:
        (
            index.native_walk,
            events._kvwire,
            hashing._native_block_keys,
            cache_aware.native_cost,
        ) = self._saved


def native_built() -> dict[str, bool]:
    """Which C extensions this process uses."""
    return {
        "walk": index.native_walk is not None,
        "kvwire": events._kvwire is not None,
        "cost": cache_aware.native_cost is not None,
    }


def compare_decisions(
    population: Population, prompt_tokens: int, samples: int, rounds: int = 4
) -> dict[str, float]:
    """Decision p50/p99 (us) with and without the C extensions on the same index, in
    `rounds` interleaved rounds of `samples / rounds` decisions each (machine noise hits
    both alike); medians of the rounds' figures."""
    per = max(100, samples // rounds)
    native: list[tuple[float, float]] = []
    python: list[tuple[float, float]] = []
    for _ in range(rounds):
        p50, p99, _ = decision_latency(population, prompt_tokens, per)
        native.append((p50, p99))
        with _PurePython():
            p50, p99, _ = decision_latency(population, prompt_tokens, per)
        python.append((p50, p99))

    def med(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    out = {
        "native_p50_us": med([a for a, _ in native]),
        "native_p99_us": med([b for _, b in native]),
        "python_p50_us": med([a for a, _ in python]),
        "python_p99_us": med([b for _, b in python]),
    }
    out["p50_ratio"] = round(out["python_p50_us"] / out["native_p50_us"], 2)
    out["p99_ratio"] = round(out["python_p99_us"] / out["native_p99_us"], 2)
    return out


RUN_EVENTS_PER_BATCH = 16


def run_shaped_batches(
    chains: Sequence[tuple[int, list[int], int]], removed: bool = False
) -> list[common_pb2.KvEventBatch]:
    """Wire batches with one event per chain `(prefix_id, tokens, first_block)`: a stored
    run of its blocks from `first_block` (parent: the block before it), or with `removed`
    the removal of that run; `RUN_EVENTS_PER_BATCH` events per batch."""
    batches: list[common_pb2.KvEventBatch] = []
    batch = common_pb2.KvEventBatch(sequence_number=1)
    for prefix_id, tokens, first in chains:
        if len(batch.events) >= RUN_EVENTS_PER_BATCH:
            batches.append(batch)
            batch = common_pb2.KvEventBatch(sequence_number=1 + len(batches))
        ev = batch.events.add(event_id=prefix_id)
        n = len(tokens) // BLOCK
        if removed:
            ev.removed.block_hashes.extend(_engine_hash(prefix_id, b) for b in range(first, n))
            continue
        stored = ev.stored
        for b in range(first, n):
            block = stored.blocks.add(block_hash=_engine_hash(prefix_id, b), block_size=BLOCK)
            block.token_ids.extend(tokens[b * BLOCK : (b + 1) * BLOCK])
        stored.tier = common_pb2.KV_CACHE_TIER_DEVICE
        if first > 0:
            stored.parent_block_hash = _engine_hash(0, first - 1)
    if len(batch.events):
        batches.append(batch)
    return batches


def run_ingest(blocks: int, workers: int = 64) -> dict[str, float]:
    """Blocks/s of `Router.apply_kv_bytes` on run-shaped events (module docstring): about
    `blocks` blocks of 2,048-token conversations stored as runs, then removed as runs."""
    system = _tokens(0, SYSTEM_TOKENS)
    shared = SYSTEM_TOKENS // BLOCK
    own = 2048 // BLOCK - shared
    router = Router("cache_aware", max_blocks=2 * blocks + workers * shared)
    for w in range(workers):
        for batch in stored_batches([(0, system, 0)]):
            router.apply_kv_bytes(f"w{w}", batch.SerializeToString())
    chains: dict[str, list[tuple[int, list[int], int]]] = {f"w{w}": [] for w in range(workers)}
    total = 0
    prefix_id = 1
    while total < blocks:
        chains[f"w{prefix_id % workers}"].append(
            (prefix_id, system + _tokens(prefix_id, own * BLOCK), shared)
        )
        total += own
        prefix_id += 1
    stored = {w: [b.SerializeToString() for b in run_shaped_batches(c)] for w, c in chains.items()}
    removed = {
        w: [b.SerializeToString() for b in run_shaped_batches(c, removed=True)]
        for w, c in chains.items()
    }
    apply = router.apply_kv_bytes
    perf = time.perf_counter
    t0 = perf()
    for worker, data in stored.items():
        for raw in data:
            apply(worker, raw)
    stored_s = perf() - t0
    held = router.index.num_blocks
    t0 = perf()
    for worker, data in removed.items():
        for raw in data:
            apply(worker, raw)
    removed_s = perf() - t0
    assert held == total + shared and router.index.num_blocks == shared, (
        "run-shaped events were not applied whole"
    )
    return {
        "blocks": total,
        "stored_blocks_per_s": round(total / stored_s),
        "removed_blocks_per_s": round(total / removed_s),
    }


def compare_ingest(blocks: int, workers: int = 64) -> dict[str, float]:
    """Blocks/s of `Router.apply_kv_bytes` with and without the C extensions: two fresh
    routers fed the same `blocks` blocks (conversation shape of `Population`), batch by
    batch in turn, each going first every other time."""
    system = _tokens(0, SYSTEM_TOKENS)
    shared = SYSTEM_TOKENS // BLOCK
    own = 2048 // BLOCK - shared
    feeds: list[tuple[str, list[bytes]]] = []

    def wire(batches: list[common_pb2.KvEventBatch]) -> list[bytes]:
        return [batch.SerializeToString() for batch in batches]

    for w in range(workers):
        feeds.append((f"w{w}", wire(stored_batches([(0, system, 0)]))))
    prefix_id = 1
    total = workers * shared
    while total < blocks:
        tokens = system + _tokens(prefix_id, own * BLOCK)
        chain = [(prefix_id, tokens, shared)]
        feeds.append((f"w{prefix_id % workers}", wire(stored_batches(chain))))
        total += own
        prefix_id += 1
    routers = {name: Router("cache_aware", max_blocks=2 * blocks) for name in ("native", "python")}
    spent = {"native": 0.0, "python": 0.0}
    perf = time.perf_counter
    for turn, (worker, batches) in enumerate(feeds):
        order = list(routers.items())
        for name, router in order if turn % 2 else reversed(order):
            with _PurePython() if name == "python" else contextlib.nullcontext():
                t0 = perf()
                for data in batches:
                    router.apply_kv_bytes(worker, data)
                spent[name] += perf() - t0
    assert routers["native"].index._holders == routers["python"].index._holders, (
        "native and Python ingestion disagree"
    )
    native = total / spent["native"]
    python = total / spent["python"]
    return {
        "blocks": total,
        "native_blocks_per_s": round(native),
        "python_blocks_per_s": round(python),
        "ratio": round(native / python, 2),
    }


def bytes_per_block(blocks: int) -> tuple[float, int]:
    """tracemalloc growth of a Router's index per distinct block after ingesting `blocks`
    blocks (64 workers; conversation shape of `Population`)."""
    gc.collect()
    tracemalloc.start()
    router = Router("cache_aware", max_blocks=blocks * 2)
    base = tracemalloc.get_traced_memory()[0]
    workers = [f"w{i}" for i in range(64)]
    system = _tokens(0, SYSTEM_TOKENS)
    shared = SYSTEM_TOKENS // BLOCK
    for w in workers:
        for batch in stored_batches([(0, system, 0)]):
            router.apply_kv_batch(w, batch)
    prefix_id = 1
    own = 2048 // BLOCK - shared
    while router.index.num_blocks < blocks:
        tokens = system + _tokens(prefix_id, own * BLOCK)
        for batch in stored_batches([(prefix_id, tokens, shared)]):
            router.apply_kv_batch(workers[prefix_id % 64], batch)
        prefix_id += 1
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return used / router.index.num_blocks, router.index.num_blocks


def _rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except OSError:
        return 0
    import resource

    return pages * resource.getpagesize()


def churn(prompts: int, budget: int, blocks_per_prompt: int = 4) -> dict[str, Any]:
    """Store `prompts` unique prompts of `blocks_per_prompt` blocks (no removals) against a
    `budget`-block index through the wire fast path (`PrefixIndex.store_blocks`, one block
    per event as SGLang sends them); sample index blocks, engine-map entries and RSS ten
    times."""
    router = Router("cache_aware", max_blocks=budget)
    index = router.index
    samples: list[dict[str, int]] = []
    step = max(1, prompts // 10)
    per = blocks_per_prompt * BLOCK
    t0 = time.perf_counter()
    for p in range(prompts):
        base = 1000 + p * per
        data = array("I", range(base, base + per)).tobytes()
        items = [
            (
                p * blocks_per_prompt + b + 1,
                p * blocks_per_prompt + b if b else None,
                data[4 * BLOCK * b : 4 * BLOCK * (b + 1)],
                1,
            )
            for b in range(blocks_per_prompt)
        ]
        index.store_blocks(f"w{p % 8}", items)
        if (p + 1) % step == 0:
            samples.append(
                {
                    "prompts": p + 1,
                    "index_blocks": index.num_blocks,
                    "engine_map": len(index._eng),
                    "rss_bytes": _rss_bytes(),
                }
            )
    return {
        "prompts": prompts,
        "blocks_per_prompt": blocks_per_prompt,
        "budget_blocks": budget,
        "seconds": round(time.perf_counter() - t0, 1),
        "evicted_blocks": index.stats.evicted,
        "samples": samples,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """All measurements; returns the JSON-ready result."""
    p50: dict[str, float] = {}
    p99: dict[str, float] = {}
    branches: dict[str, dict[str, int]] = {}
    compare: dict[str, float] | None = None
    cold_p50 = cold_p99 = None
    cold_branches: dict[str, int] = {}
    ingest: list[float] = []
    for workers in args.workers:
        for prompt_tokens in args.prompt_tokens:
            population = Population(workers, args.blocks, prompt_tokens)
            ingest.append(population.ingested_blocks / population.ingest_s)
            key = f"{prompt_tokens}x{workers}"
            p50[key], p99[key], branches[key] = decision_latency(
                population, prompt_tokens, args.samples
            )
            print(
                f"decision {key:>10}: p50 {p50[key]:7.1f} us  p99 {p99[key]:7.1f} us  "
                f"(index {population.router.index.num_blocks:,} blocks, "
                f"ingest {ingest[-1]:,.0f} blocks/s)",
                flush=True,
            )
            if (prompt_tokens, workers) == TARGET_CELL:
                cold_p50, cold_p99, cold_branches = decision_latency(
                    population, prompt_tokens, args.samples, cold=True
                )
                print(
                    f"decision {key:>10} cold (the ring's path, {dict(cold_branches)}): p50 "
                    f"{cold_p50:7.1f} us  p99 {cold_p99:7.1f} us",
                    flush=True,
                )
            if args.compare_python and (prompt_tokens, workers) == TARGET_CELL:
                compare = compare_decisions(population, prompt_tokens, args.samples)
                print(
                    f"decision {key:>10} native vs pure Python (interleaved): p50 "
                    f"{compare['native_p50_us']:.1f} vs {compare['python_p50_us']:.1f} us, "
                    f"p99 {compare['native_p99_us']:.1f} vs {compare['python_p99_us']:.1f} us",
                    flush=True,
                )
            del population
            gc.collect()
    ingest_compare = None
    if args.compare_python:
        ingest_compare = compare_ingest(args.compare_ingest_blocks)
        print(
            f"ingest native vs pure Python (interleaved, {ingest_compare['blocks']:,} blocks): "
            f"{ingest_compare['native_blocks_per_s']:,} vs "
            f"{ingest_compare['python_blocks_per_s']:,} blocks/s",
            flush=True,
        )
    runs = run_ingest(args.run_blocks)
    print(
        f"run-shaped ingest ({runs['blocks']:,} blocks, runs of "
        f"{(2048 - SYSTEM_TOKENS) // BLOCK} blocks): "
        f"stored {runs['stored_blocks_per_s']:,} blocks/s, removed "
        f"{runs['removed_blocks_per_s']:,} blocks/s",
        flush=True,
    )
    per_block, measured_blocks = bytes_per_block(args.bytes_blocks)
    print(f"bytes per block: {per_block:.1f} ({measured_blocks:,} blocks)", flush=True)
    ingest_rate = sorted(ingest)[len(ingest) // 2]
    result: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": sys.version.split()[0],
        "native": native_built(),
        "blocks_indexed": args.blocks,
        "samples": args.samples,
        "decision_p50_us": p50,
        "decision_p99_us": p99,
        "decision_branches": branches,
        "decision_cold_2048x64": {
            "p50_us": cold_p50,
            "p99_us": cold_p99,
            "branches": cold_branches,
        },
        "ingest_blocks_per_s": round(ingest_rate),
        "ingest_blocks_per_s_runs": [round(x) for x in ingest],
        "run_ingest": runs,
        "bytes_per_block": round(per_block, 1),
        "bytes_per_block_blocks": measured_blocks,
        "compare_python": {"decision_2048x64": compare, "ingest": ingest_compare},
    }
    key = "2048x64"
    result["targets"] = {
        "decision_p99_us_2048x64": {
            "target": TARGET_P99_US,
            "value": p99.get(key),
            "met": p99.get(key) is not None and p99[key] <= TARGET_P99_US,
        },
        "ingest_blocks_per_s": {
            "target": TARGET_INGEST,
            "value": round(ingest_rate),
            "met": ingest_rate >= TARGET_INGEST,
        },
        "run_ingest_stored_blocks_per_s": {
            "target": TARGET_INGEST,
            "value": runs["stored_blocks_per_s"],
            "met": runs["stored_blocks_per_s"] >= TARGET_INGEST,
        },
        "bytes_per_block": {
            "target": TARGET_BYTES,
            "value": round(per_block, 1),
            "met": per_block <= TARGET_BYTES,
        },
    }
    if args.churn:
        result["churn"] = churn(args.churn, args.churn_budget)
        last = result["churn"]["samples"][-1]
        print(
            f"churn: {args.churn:,} unique prompts, budget {args.churn_budget:,} blocks -> "
            f"{last['index_blocks']:,} blocks, RSS {last['rss_bytes'] / 2**20:.0f} MiB",
            flush=True,
        )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m homing.bench.router_micro [options]`; writes `--json`."""
    parser = argparse.ArgumentParser(prog="homing.bench.router_micro", description=__doc__)
    parser.add_argument("--blocks", type=int, default=1_000_000, help="blocks indexed")
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[2048, 16384])
    parser.add_argument("--samples", type=int, default=5000, help="decisions per cell")
    parser.add_argument("--bytes-blocks", type=int, default=1_000_000)
    parser.add_argument(
        "--compare-python",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure the pure-Python fallback in this run (see module docstring)",
    )
    parser.add_argument("--compare-ingest-blocks", type=int, default=200_000)
    parser.add_argument(
        "--run-blocks", type=int, default=500_000, help="blocks of the run-shaped ingestion"
    )
    parser.add_argument("--churn", type=int, default=0, help="unique prompts (0: skip)")
    parser.add_argument("--churn-budget", type=int, default=200_000)
    parser.add_argument("--json", default="bench-out/router-micro.json")
    args = parser.parse_args(argv)
    result = run(args)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
