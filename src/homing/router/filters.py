"""Filters: which candidates a policy may consider at all (pure).

Rule of this file: a filter removes workers, never reorders them, and says in its docstring
what it returns when it would remove every worker; the caller decides what to do then.
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
    `max_waiting`: requests in the engine's waiting queue at or above which it is vetoed;
    32 is where a 70B TP8 worker's queue holds more than ~10 s of prefill at Mooncake's
    ~14k-token prompts (SGLang's own default `--max-queued-requests` is unbounded).
    """

    max_token_usage: float = 0.95
    max_waiting: int = 32


def not_draining(workers: Sequence[WorkerSnapshot]) -> Sequence[WorkerSnapshot]:
    """Workers not draining; all of them when every one drains (better served than refused)."""
    kept = [w for w in workers if not w.draining]
    return kept if kept else workers


def overloaded(
    workers: Sequence[WorkerSnapshot], thresholds: OverloadThresholds, bound: int | None = None
) -> set[str]:
    """Ids of workers affinity must not override (may be all of them).

    Worker w is overloaded when `w.token_usage >= max_token_usage`, or
    `w.waiting >= max_waiting`, or (when `bound` is given) `w.load >= bound`: taking one more
    request would put it over the bounded-load capacity (`homing.router.ring.load_bound`).
    """
    vetoed: set[str] = set()
    kv, waiting = thresholds.max_token_usage, thresholds.max_waiting
    for w in workers:
        if w.token_usage >= kv or w.waiting >= waiting:
            vetoed.add(w.worker_id)
        elif bound is not None and max(w.in_flight, w.running + w.waiting) >= bound:
            vetoed.add(w.worker_id)
    return vetoed
