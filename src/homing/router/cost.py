"""The one scoring rule: the estimated cost of serving a request on a worker now.

Rule of this file: one formula, in prompt-token equivalents (lower is better):

    cost_w = a * U_w + b * Q_w + d * L_w

- U_w = P - (D_w + h * H_w), clamped to [0, P]: uncached prompt tokens on w; P prompt
  tokens, D_w / H_w the matched prefix on device / only in a lower tier (index), h the
  lower-tier worth (the share of a recompute a lower-tier hit saves: it must be loaded
  over PCIe or the network first). Prefill cost falls with exactly the cached share
  (cached tokens are not recomputed; SGLang RadixAttention);
- Q_w: uncached prefill tokens queued on w ahead of the request: the engine's latest
  EngineLoad record (`waiting_uncached_tokens`, the queue's tokens its prefix cache does not
  hold, else the upper bound `prefill_pending_tokens`; 0 when it reports neither; see
  `WorkerSnapshot.queued_prefill_tokens`) plus the uncached tokens of the router's own
  dispatches since (`DispatchLedger`), which the record cannot contain yet; with
  first-come first-served scheduling the request waits for all of it before its own
  prefill starts. Both parts count only tokens not cached on w, so a worker whose cache
  was lost (a restart, a flushed index) shows the lost hits as queued load;
- L_w = max(in_flight, running + waiting): requests on w (`WorkerSnapshot.load`), the
  decode batch the request joins. Every running sequence adds its own decode token, KV
  reads and per-sequence overhead to each step (the sim's step model: ~0.3-0.7 ms per
  sequence on llama-3.1-70b TP8), so the batch sets the request's TPOT and slows its
  prefill chunks; our own count and the engine's overlap, hence the max.

Why these units and weights: with first-come first-served chunked prefill, the request's
TTFT on w is about (Q_w + U_w) / prefill rate, so a queued token and an uncached token cost
the request the same time. But an uncached token is also work the pool must do, and added
work delays later requests: in an M/G/1 queue at utilisation rho each second of added work
delays later arrivals by rho / (1 - rho) seconds in total, so its full cost is
1 / (1 - rho) times its own time. At the ~70% load the router is tuned for that is ~3.3,
hence a = 3 per uncached token against b = 1 per queued token (ours; on the Mooncake
replay of `make bench-routers` a = 1 kept 77-83% of the hit-rate bound, a = 3 kept 93-94%
with a lower p95 TTFT). d = 128 makes one request of decode load weigh like 128 queued
prompt tokens (~8 ms of llama-3.1-70b TP8 prefill, a quarter of a decode step at batch 16);
it separates otherwise equal workers, the affinity veto caps imbalance. h = 0.8: a
host-tier hit still has to be copied to the GPU (SGLang HiCache loads over PCIe at ~10-50
GB/s, recompute runs at ~16k tokens/s x 320 KB/token for llama-3.1-70b); ours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class CostWeights:
    """Weights of the scoring rule (module docstring): `prefill` a, `queue` b, `decode` d
    (tokens per request), `lower_tier_worth` h in [0, 1]. ValueError for a weight that is
    negative or not finite, or h outside [0, 1]."""

    prefill: float = 3.0
    queue: float = 1.0
    decode: float = 128.0
    lower_tier_worth: float = 0.8

    def __post_init__(self) -> None:
        try:
            weights = [float(w) for w in (self.prefill, self.queue, self.decode)]
        except OverflowError:  # an int beyond float range
            weights = [math.inf]
        if not all(0 <= w < math.inf for w in weights):  # False for NaN too
            raise ValueError(f"cost weights must be finite and >= 0: {self}")
        if not 0.0 <= self.lower_tier_worth <= 1.0:
            raise ValueError(f"lower_tier_worth must be in [0, 1], got {self.lower_tier_worth}")


def estimated_cost(
    weights: CostWeights,
    *,
    prompt_tokens: int,
    device_tokens: int,
    lower_tier_tokens: int,
    engine_queued: int | None,
    dispatched_since_record: int,
    in_flight: int,
    running: int,
    waiting: int,
) -> float:
    """`cost_w` of the module docstring, in prompt-token equivalents (the reference the
    policies' inlined cost passes are tested against)."""
    saved = device_tokens + weights.lower_tier_worth * lower_tier_tokens
    uncached = float(min(max(prompt_tokens - saved, 0.0), prompt_tokens))
    queued = (engine_queued or 0) + dispatched_since_record
    return (
        weights.prefill * uncached
        + weights.queue * queued
        + weights.decode * max(in_flight, running + waiting)
    )
