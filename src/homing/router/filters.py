"""Filters: which candidates a policy may consider at all (pure).

Rule of this file: a filter removes workers, never reorders them, and says in its docstring
what it returns when it would remove every worker; the caller decides what to do then.

Overload is judged by queueing, not by KV occupancy alone. KV usage is a stock, not a rate:
an engine's pool fills with what it holds, and SGLang's radix cache keeps finished requests'
KV as evictable prefix cache, so a worker can report a nearly full pool and still admit the
next request at once (llm-d's autoscaler users saw replicas saturate at 16% KV and idle ones
refused at high KV). High KV usage therefore vetoes a worker only while the engine cannot
admit more: it has a waiting queue, or its admission window (`max_running_requests`) is
full. A worker with nothing running, nothing waiting and nothing of this gateway's in
flight is never overloaded: it can always start a request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from homing.router.types import WorkerSnapshot


@dataclass(frozen=True)
class OverloadThresholds:
    """When a worker counts as overloaded (see `overloaded`).

    `max_token_usage`: KV utilisation (non-evictable, `kv_usage`) at or above which a worker
    that is also queueing or at its admission window is vetoed; 0.95 leaves ~5% of the pool
    for running requests' decode growth before SGLang starts retracting.
    `max_waiting`: requests in the engine's waiting queue at or above which it is vetoed;
    32 is where a 70B TP8 worker's queue holds more than ~10 s of prefill at Mooncake's
    ~14k-token prompts (SGLang's own default `--max-queued-requests` is unbounded).
    `max_in_flight`: requests per worker at or above which it is vetoed (admission's
    `max_in_flight_per_replica`, so the router never sends a request admission let through
    to a worker admission counts as full; None: no such cap).
    """

    max_token_usage: float = 0.95
    max_waiting: int = 32
    max_in_flight: int | None = None


def not_draining(workers: Sequence[WorkerSnapshot]) -> Sequence[WorkerSnapshot]:
    """Workers not draining; all of them when every one drains (better served than refused)."""
    kept = [w for w in workers if not w.draining]
    return kept if kept else workers


def kv_usage(w: WorkerSnapshot) -> float:
    """KV utilisation in [0, 1] that new work cannot reclaim: the engine's
    `active_token_usage` (occupancy excluding evictable prefix cache) when it reports one,
    else its `token_usage` (SGLang's already excludes evictable radix-cache pages)."""
    active = w.active_token_usage
    return w.token_usage if active is None else active


def idle(w: WorkerSnapshot) -> bool:
    """True when `w` runs nothing and queues nothing (its latest load record) and has none
    of this gateway's requests in flight: it can start a request now, whatever its KV usage
    says. A worker with a waiting queue is not idle, even with nothing running (an engine
    stuck admitting, or whose running count lags its queue)."""
    return w.running == 0 and w.waiting == 0 and w.in_flight == 0


def engine_overloaded(w: WorkerSnapshot, thresholds: OverloadThresholds) -> bool:
    """The engine-side veto: not `idle`, and either `waiting >= max_waiting`, or
    `kv_usage >= max_token_usage` while the engine cannot admit more (it has a waiting
    queue, or `max_running_requests` is known and `load >= max_running_requests`)."""
    if idle(w):
        return False
    waiting = w.waiting
    if waiting >= thresholds.max_waiting:
        return True
    if kv_usage(w) < thresholds.max_token_usage:
        return False
    window = w.max_running_requests
    return waiting > 0 or (window > 0 and w.load >= window)


def overloaded(
    workers: Sequence[WorkerSnapshot], thresholds: OverloadThresholds, bound: int | None = None
) -> set[str]:
    """Ids of workers affinity must not override (may be all of them).

    Worker w is overloaded when it is not `idle` and `engine_overloaded(w, thresholds)`, or
    `w.load >= min(bound, thresholds.max_in_flight)` of those given: taking one more request
    would put it over the bounded-load capacity (`homing.router.ring.load_bound`) or
    admission's per-replica cap.
    """
    cap = thresholds.max_in_flight
    if cap is not None:
        bound = cap if bound is None else min(bound, cap)
    vetoed: set[str] = set()
    for w in workers:
        if idle(w):
            continue
        if engine_overloaded(w, thresholds) or (bound is not None and w.load >= bound):
            vetoed.add(w.worker_id)
    return vetoed
