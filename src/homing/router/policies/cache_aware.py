"""`cache_aware` (default): prefix affinity from the KV-event index, weighed against load.

Rule of this file: affinity never overrides an overloaded worker. Decision, in order:

1. No candidates -> `NoWorkerAvailable`.
2. Veto (`homing.router.filters.overloaded`): KV usage >= 0.95, or load more than 8
   requests AND 1.5x above the least loaded candidate. If every candidate is vetoed, the
   least loaded of all is chosen (branch "overload").
3. `m_w` = prompt tokens worker w holds as a cached prefix (`PrefixIndex.match`); P = prompt
   tokens. A match is useful when `m_w >= max(block_size, min_match_ratio * P)`. If no
   eligible worker has a useful match, the least loaded eligible worker is chosen (branch
   "load", or "veto" when a vetoed worker was the one holding a useful prefix).
4. Otherwise the eligible worker with the highest

       score_w = prefix_weight * m_w / P
               + load_weight   * (1 - L_w / max(L_max, load_floor))
               + kv_weight     * (1 - token_usage_w)

   wins (branch "cache_hit"), L_w = max(in_flight, running + waiting) in requests and L_max
   the largest L among eligible workers. Ties: lower load, then worker id.

Defaults (`CacheAwareConfig`): prefix_weight 1.0, load_weight 1.0, kv_weight 0.25,
load_floor 8, min_match_ratio 0.05. With these, a worker holding a share s of the prompt
beats an idle worker while its extra load is below s * max(L_max, 8) requests: a full hit
is worth up to 8 queued requests at low load, a 25% hit about 2. The constants are ours
(chosen so that one queued request at low load weighs like ~12% of a prompt's prefill);
the bench of issue 4 is where they get tuned.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from homing.router.filters import OverloadThresholds, overloaded
from homing.router.index import PrefixIndex
from homing.router.policies.base import PolicyContext, require_candidates
from homing.router.policies.least_load import pick_least_loaded
from homing.router.scorers import kv_score, load_score, prefix_score
from homing.router.types import RouteDecision, RouteRequest, WorkerSnapshot


@dataclass(frozen=True)
class CacheAwareConfig:
    """Weights and thresholds of `CacheAwarePolicy` (formula in the module docstring)."""

    prefix_weight: float = 1.0
    load_weight: float = 1.0
    kv_weight: float = 0.25
    load_floor: int = 8
    min_match_ratio: float = 0.05
    overload: OverloadThresholds = field(default_factory=OverloadThresholds)


class CacheAwarePolicy:
    """Prefix affinity against load, with an overload veto (see module docstring)."""

    name = "cache_aware"

    def __init__(self, index: PrefixIndex, config: CacheAwareConfig | None = None) -> None:
        self.index = index
        self.config = config or CacheAwareConfig()
        self._turn = 0

    def select(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> RouteDecision:
        """Pick per the module docstring; raises `NoWorkerAvailable` on an empty candidate set."""
        require_candidates(workers)
        turn = self._turn
        self._turn += 1
        cfg = self.config
        matches = self.index.match(request.prompt_ids, [w.worker_id for w in workers])

        vetoed = overloaded(workers, cfg.overload)
        eligible = [w for w in workers if w.worker_id not in vetoed]
        if not eligible:
            chosen = pick_least_loaded(workers, turn)
            return RouteDecision(chosen.worker_id, "overload", matches.get(chosen.worker_id, 0))

        prompt_tokens = len(request.prompt_ids)
        useful = max(self.index.block_size, math.ceil(cfg.min_match_ratio * prompt_tokens))
        best_eligible = max(matches.get(w.worker_id, 0) for w in eligible)
        if best_eligible < useful:
            chosen = pick_least_loaded(eligible, turn)
            vetoed_holder = any(matches.get(w, 0) >= useful for w in vetoed)
            branch = "veto" if vetoed_holder else "load"
            return RouteDecision(chosen.worker_id, branch, matches.get(chosen.worker_id, 0))

        max_load = max(w.load for w in eligible)

        def score(w: WorkerSnapshot) -> float:
            return (
                cfg.prefix_weight * prefix_score(matches.get(w.worker_id, 0), prompt_tokens)
                + cfg.load_weight * load_score(w.load, max_load, cfg.load_floor)
                + cfg.kv_weight * kv_score(w)
            )

        chosen = min(eligible, key=lambda w: (-score(w), w.load, w.worker_id))
        return RouteDecision(chosen.worker_id, "cache_hit", matches.get(chosen.worker_id, 0))


def build_cache_aware(context: PolicyContext) -> CacheAwarePolicy:
    """Factory for the registry (default config)."""
    return CacheAwarePolicy(context.index)
