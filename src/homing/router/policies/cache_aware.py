"""`cache_aware` (default): prefix affinity from the affinity index within a bound on each
worker's load, with bounded-load consistent hashing for cold prefixes.

Rule of this file: affinity first. Only the veto (an overloaded worker) moves a request off
the worker holding its longest useful prefix; load and queue only choose among holders of
near-equal prefixes; a request with no useful cached prefix anywhere goes where its session
or first block hashes. In order:

1. No candidates -> `NoWorkerAvailable`. Draining workers are dropped (unless all drain).
2. Veto (never an idle worker: nothing running or waiting, nothing of ours in flight):
   `filters.overloaded` (waiting queue >= 32 requests, or non-evictable KV usage >= 0.95
   while the engine queues or its admission window is full, or load >= the affinity
   capacity `load_bound(L, n, c_hit = 2, hit_min_bound = 8)`, `ring`; L counts the
   engine's running and waiting requests or ours in flight, whichever is more; both this
   bound and the ring's are capped at `OverloadThresholds.max_in_flight`, admission's
   per-replica cap, when it is set). If every candidate is vetoed, the near-best of all
   ("overload").
3. Matches (`PrefixIndex.lookup`): E_w = D_w + h * (T_w - D_w) effective cached tokens (T_w
   any tier, D_w device, h the lower-tier worth). The advantage is `max E_w - min E_w` over
   eligible workers (0 for a worker holding nothing); it is useful when >= u = max(
   block_size, min_match_ratio * P) with min_match_ratio 0.05 (a prefix every worker holds,
   such as a system prompt cached everywhere, tells them apart by nothing).
4. No useful advantage: bounded-load consistent hashing (c = 1.25, min_bound 4; vetoed
   workers count as full) keyed by the session key, else by the first prompt block past
   the prefix every eligible worker already holds (`policies.consistent_hash.routing_key`;
   the first block when they hold nothing in common). Of the key's first `ring_choices` (8)
   workers clockwise under the bound, the one of least queue and decode cost
   (`b * Q + d * L`) takes it (the power of d choices, Mitzenmacher 2001, on the ring: a key
   still maps to a fixed short list of workers). "ring" when no full or vetoed worker was
   passed before it, "overflow" when some was; "veto" instead when a vetoed worker held a
   useful prefix. Both refinements are ours: keying past the common prefix stops every new
   conversation from starting at one ring point when a system prompt is cached everywhere;
   the choices cut TTFT for cold prompts of very different lengths (Mooncake: 1k-120k).
5. Useful advantage: among eligible workers whose E_w is within `min(u, best - floor - u)`
   of the best (so each has a useful advantage of its own), the lowest

       cost_w = a * (P - E_w) + b * Q_w + d * L_w          (`homing.router.cost`)

   wins; ties by lower load, then worker id. Branch "exact_hit" / "approx_hit" (credited by
   KV events / approximate records), or "veto" when a vetoed worker held more.

Why no spill (a holder traded for a shorter queue by the cost rule alone): such a spill
recomputes the hit, duplicates the prefix in a second cache and moves the conversation; on
the Mooncake replay of `make bench-routers` spills gave up 54k cached tokens of 2.9M held
(4 points of the hit-rate bound), and a veto on queued prefill tokens (1.5-2x the mean plus
the prompt) gave up more (docs/benchmarks.md). The count bound caps a holder's queue.

Defaults (`CacheAwareConfig`): weights a = 3, b = 1, d = 128 tokens per request, h = 0.8
(`CostWeights`, derivation there), ring c = 1.25 with min_bound 4, affinity c_hit = 2
with hit_min_bound 8, 8 ring choices, 160 virtual nodes,
thresholds of `OverloadThresholds`. The pass (`_cheapest_python`) inlines
`cost.estimated_cost` for speed (tested equal), and runs in C (`homing.router._cost`, the
same steps in double precision; tested equal on random scenarios) where that extension is
built.
"""

from __future__ import annotations

import math
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter

from homing.router.cost import CostWeights
from homing.router.filters import OverloadThresholds, not_draining
from homing.router.index import Matches, PrefixIndex
from homing.router.ledger import DispatchLedger
from homing.router.policies.base import BasePolicy, PolicyContext, require_candidates
from homing.router.policies.consistent_hash import DEFAULT_MIN_BOUND, routing_key
from homing.router.ring import DEFAULT_LOAD_FACTOR, DEFAULT_VNODES, HashRing, load_bound
from homing.router.types import RouteDecision, RouteRequest, WorkerSnapshot

try:  # the C extension (setup.py): the same pass, ~3x faster
    from homing.router import _cost as native_cost
except ImportError:  # pragma: no cover - built by `make`; pure Python elsewhere
    native_cost = None
if native_cost is not None:
    try:  # read snapshots through their slots; if the layout changed, by attribute name
        native_cost.bind(WorkerSnapshot)
    except (TypeError, AttributeError):  # pragma: no cover - WorkerSnapshot lost its slots
        pass

#: Balance factor of the affinity veto: a prefix holder may take a request while its load
#: is under `load_bound(L, n, 2, min_bound)`. Looser than the ring's c = 1.25 because a hit
#: saves real work, and looser than smg's `balance_rel_threshold` (1.5, which smg applies
#: only past an absolute gap of 64 requests): on the Mooncake replay of `make
#: bench-routers` 1.5 vetoed holders of long prefixes (2-5 requests of 1,000 losing 20-55k
#: cached tokens), while max/mean requests per worker read 1.05-1.18 at 2.
DEFAULT_HIT_LOAD_FACTOR = 2.0

#: Ring candidates compared by queue and decode cost for a cold prefix: the power of d
#: choices with d = 8 (all of an 8-worker pool): Mooncake's prompts run from 1k to 120k
#: tokens, so the queued prefill of a few candidates differs by seconds (against d = 3 in
#: one run each on the same replay: lower max/mean load and engine TTFT, client TTFT mixed).
DEFAULT_RING_CHOICES = 8

#: Floor of the affinity capacity (requests): below 8 in flight a prefix holder is never
#: vetoed for load (smg's spill gate never drops under an absolute margin either).
DEFAULT_HIT_MIN_BOUND = 8


_DRAINING = attrgetter("draining")


@dataclass(frozen=True)
class CacheAwareConfig:
    """Weights and thresholds of `CacheAwarePolicy` (formula in the module docstring)."""

    weights: CostWeights = field(default_factory=CostWeights)
    min_match_ratio: float = 0.05
    load_factor: float = DEFAULT_LOAD_FACTOR
    hit_load_factor: float = DEFAULT_HIT_LOAD_FACTOR
    min_bound: int = DEFAULT_MIN_BOUND
    hit_min_bound: int = DEFAULT_HIT_MIN_BOUND
    ring_choices: int = DEFAULT_RING_CHOICES
    vnodes: int = DEFAULT_VNODES
    overload: OverloadThresholds = field(default_factory=OverloadThresholds)


class CacheAwarePolicy(BasePolicy):
    """Prefix affinity priced by the cost rule, ring for cold prefixes (module docstring)."""

    name = "cache_aware"

    def __init__(
        self,
        index: PrefixIndex,
        config: CacheAwareConfig | None = None,
        ledger: DispatchLedger | None = None,
    ) -> None:
        self.index = index
        self.config = config or CacheAwareConfig()
        self.ledger = ledger if ledger is not None else DispatchLedger()
        self.ring = HashRing(self.config.vnodes)

    def select(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> RouteDecision:
        """Pick per the module docstring; raises `NoWorkerAvailable` on an empty candidate set."""
        require_candidates(workers)
        cfg = self.config
        prompt_tokens = len(request.prompt_ids)
        found = self.index.lookup(request.prompt_ids)
        if native_cost is not None:
            total, draining = native_cost.load_total(workers)
        else:
            total = 0
            for w in workers:
                load = w.running + w.waiting
                total += w.in_flight if w.in_flight > load else load
            draining = any(map(_DRAINING, workers))
        candidates = workers
        if draining:
            candidates = not_draining(workers)
            total = sum(w.load for w in candidates)
        n = len(candidates)
        bound = load_bound(total, n, cfg.load_factor, cfg.min_bound)
        hit_bound = load_bound(total, n, cfg.hit_load_factor, cfg.hit_min_bound)
        cap = cfg.overload.max_in_flight  # admission's per-replica cap: a hard bound for both
        if cap is not None:
            bound, hit_bound = min(bound, cap), min(hit_bound, cap)
        useful = max(self.index.block_size, math.ceil(cfg.min_match_ratio * prompt_tokens))
        vetoed: list[str] = []
        scored = self._cheapest(candidates, found, prompt_tokens, hit_bound, vetoed, useful)
        if scored is None:  # every candidate is overloaded
            chosen = self._cheapest(candidates, found, prompt_tokens, None, [], useful)
            assert chosen is not None
            return self._decision(chosen[0], "overload", found, prompt_tokens)
        chosen, best_eff, floor, vetoed_eff = scored
        if not found.tokens:
            return self._ring(request, candidates, set(vetoed), bound, found, False, 0.0)
        vetoed_holder = vetoed_eff - floor >= useful
        if best_eff - floor < useful:
            return self._ring(request, candidates, set(vetoed), bound, found, vetoed_holder, floor)
        # the near-best rule gave the winner a useful advantage of its own
        if vetoed_holder and vetoed_eff > best_eff:  # the veto took a longer prefix away
            branch = "veto"
        else:
            branch = "approx_hit" if chosen.worker_id in found.approximate else "exact_hit"
        return self._decision(chosen, branch, found, prompt_tokens)

    def _cheapest(
        self,
        workers: Sequence[WorkerSnapshot],
        found: Matches,
        prompt_tokens: int,
        bound: int | None,
        vetoed: list[str],
        useful: float = math.inf,
    ) -> tuple[WorkerSnapshot, float, float, float] | None:
        """`_cheapest_python`, in C (`homing.router._cost`) when it is built."""
        if native_cost is None:
            return self._cheapest_python(workers, found, prompt_tokens, bound, vetoed, useful)
        cfg = self.config
        w = cfg.weights
        ledger = self.ledger
        return native_cost.cheapest(
            workers, found.tokens, found.device, prompt_tokens, w.prefill, w.queue, w.decode,
            w.lower_tier_worth, cfg.overload.max_token_usage, cfg.overload.max_waiting, bound,
            useful, ledger.oldest, ledger.sums, ledger.pending, vetoed,
        )  # fmt: skip

    def _cheapest_python(
        self,
        workers: Sequence[WorkerSnapshot],
        found: Matches,
        prompt_tokens: int,
        bound: int | None,
        vetoed: list[str],
        useful: float = math.inf,
    ) -> tuple[WorkerSnapshot, float, float, float] | None:
        """Three steps over `workers` (`bound` None: no veto at all):

        1. per worker: its effective match, load, the veto of
           `filters.overloaded(workers, thresholds, bound)` (inlined) and `cost_w` (inlined
           `cost.estimated_cost`, queued prefill with `DispatchLedger.pending`);
        2. vetoed ids go to `vetoed` in order;
        3. among the others, the largest effective match `best` and the smallest `floor`
           (0 when one of them holds nothing), and the winner: the worker of least cost
           (ties by load, then id) among those whose match is within `tol` of `best`, with
           `tol = min(useful, best - floor - useful)` when `best - floor >= useful` (so the
           winner's own advantage is useful too), else among all of them.

        Returns (winner, best, floor, largest effective match of a vetoed worker (0 when
        none)), or None when every worker is vetoed."""
        cfg = self.config
        weights = cfg.weights
        a, b, d, h = weights.prefill, weights.queue, weights.decode, weights.lower_tier_worth
        max_usage, max_waiting = cfg.overload.max_token_usage, cfg.overload.max_waiting
        check = bound is not None
        cap = bound if bound is not None else 0
        ledger = self.ledger
        pending = ledger.pending
        oldest = ledger.oldest.get
        sums = ledger.sums
        matched = found.tokens.get
        device = found.device
        rows: list[tuple[WorkerSnapshot, float, int, bool, float]] = []
        for w in workers:
            wid = w.worker_id
            if device is None:
                eff = matched(wid, 0)
            else:
                tokens = matched(wid, 0)
                dev = device.get(wid, 0) if tokens else 0
                eff = dev + h * (tokens - dev)
            waiting = w.waiting
            running = w.running
            load = running + waiting
            in_flight = w.in_flight
            if in_flight > load:
                load = in_flight
            over = False
            if check and (running or waiting or in_flight):  # an idle one is never vetoed
                over = load >= cap or waiting >= max_waiting
                if not over:
                    usage = w.active_token_usage
                    if usage is None:
                        usage = w.token_usage
                    window = w.max_running_requests
                    over = usage >= max_usage and (waiting > 0 or 0 < window <= load)
            queued = w.queued_prefill_tokens or 0
            first = oldest(wid)
            if first is not None:
                since = w.load_at
                queued += sums[wid] if since is None or first >= since else pending(wid, since)
            uncached = prompt_tokens - eff
            cost = (a * uncached if uncached > 0 else 0.0) + b * queued + d * load
            rows.append((w, eff, load, over, cost))
        best_eff = 0.0
        vetoed_eff = 0.0
        floor = math.inf
        eligible = []
        for row in rows:
            w, eff, _, over, _ = row
            if over:
                vetoed.append(w.worker_id)
                if eff > vetoed_eff:
                    vetoed_eff = eff
                continue
            if eff > best_eff:
                best_eff = eff
            if eff < floor:
                floor = eff
            eligible.append(row)
        if not eligible:
            return None
        near = -math.inf
        if best_eff - floor >= useful:
            near = best_eff - min(useful, best_eff - floor - useful)
        best: WorkerSnapshot | None = None
        best_cost = math.inf
        best_load = 0
        for w, eff, load, _, cost in eligible:
            if eff < near:
                continue
            if (
                best is None
                or cost < best_cost
                or (cost == best_cost and (load, w.worker_id) < (best_load, best.worker_id))
            ):
                best, best_cost, best_load = w, cost, load
        assert best is not None
        return best, best_eff, floor, vetoed_eff

    def _ring(
        self,
        request: RouteRequest,
        candidates: Sequence[WorkerSnapshot],
        vetoed: set[str],
        bound: int,
        found: Matches,
        vetoed_holder: bool,
        shared_tokens: float,
    ) -> RouteDecision:
        """Bounded-load ring choice keyed past the `shared_tokens` every eligible worker
        holds; vetoed workers count as full. Of the key's first `ring_choices` workers under
        the bound, the one of least queue and decode cost (`b * Q + d * L`) takes it."""
        weights = self.config.weights
        if native_cost is not None:
            ledger = self.ledger
            loads, costs = native_cost.ring_loads(
                candidates, weights.queue, weights.decode, ledger.oldest, ledger.sums,
                ledger.pending, vetoed, bound,
            )  # fmt: skip
        else:
            loads, costs = self._ring_loads_python(candidates, vetoed, bound)
        self.ring.ensure(loads)
        bs = self.index.block_size
        key = routing_key(request, bs, int(shared_tokens) // bs)
        options = self.ring.candidates_by(key, loads.get, bound, self.config.ring_choices)
        if not options:  # unreachable while some candidate is eligible
            chosen_id = min((w for w in loads if w not in vetoed), key=lambda w: (loads[w], w))
            passed = 1
        else:
            chosen_id, passed = min(options, key=lambda item: (costs[item[0]], item[1]))
        if vetoed_holder:
            branch = "veto"
        else:
            branch = "ring" if passed == 0 else "overflow"
        chosen = next(w for w in candidates if w.worker_id == chosen_id)
        return self._decision(chosen, branch, found, len(request.prompt_ids))

    def _ring_loads_python(
        self, workers: Sequence[WorkerSnapshot], vetoed: Container[str], full: int
    ) -> tuple[dict[str, int], dict[str, float]]:
        """Per worker id: its load `max(in_flight, running + waiting)` (`full` for an id in
        `vetoed`: it counts as full on the ring), and its queue and decode cost `b * Q + d *
        L` (Q its queued prefill tokens with the ledger's pending ones, as in `cost_w`)."""
        weights = self.config.weights
        pending = self.ledger.pending
        loads: dict[str, int] = {}
        costs: dict[str, float] = {}
        for w in workers:
            wid = w.worker_id
            load = w.running + w.waiting
            if w.in_flight > load:
                load = w.in_flight
            queued = (w.queued_prefill_tokens or 0) + pending(wid, w.load_at)
            loads[wid] = full if wid in vetoed else load
            costs[wid] = weights.queue * queued + weights.decode * load
        return loads, costs

    def _decision(
        self, chosen: WorkerSnapshot, branch: str, found: Matches, prompt_tokens: int
    ) -> RouteDecision:
        wid = chosen.worker_id
        held = found.tokens
        tokens = held.get(wid, 0)
        saved = found.effective(wid, self.config.weights.lower_tier_worth)
        # the first worker of the longest match (as `max(held, key=held.get)`, in C loops)
        best_id, best = "", 0
        if held:
            values = list(held.values())
            best = max(values)
            best_id = next(islice(held, values.index(best), None))
        return RouteDecision(
            wid, branch, tokens, max(0, round(prompt_tokens - saved)), best_id, best
        )

    def on_worker_removed(self, worker_id: str) -> None:
        """Take the worker's points off the ring."""
        self.ring.remove(worker_id)


def build_cache_aware(context: PolicyContext) -> CacheAwarePolicy:
    """Factory for the registry (default config)."""
    return CacheAwarePolicy(context.index, ledger=context.ledger)
