"""Filters: which candidates a policy may consider at all (pure).

Rule of this file: a filter removes workers, never reorders them, and never returns an
empty set when it was given a non-empty one unless its docstring says so; the caller decides
what to do when every worker is filtered out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from homing.router.types import WorkerSnapshot


@dataclass(frozen=True)
class OverloadThresholds:
    """When a worker counts as overloaded (see `overloaded`).

    `max_token_usage`: KV utilisation at or above which the worker is vetoed; 0.95 leaves
    ~5% of the pool for running requests' decode growth before SGLang starts retracting.
    `balance_abs` / `balance_rel`: a worker whose load exceeds the least loaded candidate's
    by more than `balance_abs` requests AND is more than `balance_rel` times it is vetoed
    (the same two-threshold imbalance test as SGLang's cache-aware router, which defaults
    to 64 / 1.5 in running requests; 8 here because a gateway's own in-flight count is
    fresher than the engine's and small pools tip over sooner).
    """

    max_token_usage: float = 0.95
    balance_abs: int = 8
    balance_rel: float = 1.5


def overloaded(workers: Sequence[WorkerSnapshot], thresholds: OverloadThresholds) -> set[str]:
    """Ids of workers affinity must not override (may be all of them, by KV usage).

    Worker w is overloaded when `w.token_usage >= max_token_usage`, or when
    `w.load - min_load > balance_abs and w.load > balance_rel * min_load`, min_load being
    the least load among `workers` (the least loaded worker is never vetoed by the
    imbalance rule).
    """
    if not workers:
        return set()
    min_load = min(w.load for w in workers)
    vetoed: set[str] = set()
    for w in workers:
        if w.token_usage >= thresholds.max_token_usage:
            vetoed.add(w.worker_id)
        elif (
            w.load - min_load > thresholds.balance_abs
            and w.load > thresholds.balance_rel * min_load
        ):
            vetoed.add(w.worker_id)
    return vetoed
