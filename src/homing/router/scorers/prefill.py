"""Prefill term: prompt tokens the worker would still have to compute for this request."""

from __future__ import annotations


def uncached_prefill_tokens(
    prompt_tokens: int, device_tokens: int, lower_tier_tokens: int, lower_tier_worth: float
) -> float:
    """`P - (D + worth * H)`, in tokens, clamped to [0, P].

    P: prompt tokens; D: matched prefix tokens on the worker's device (GPU) tier; H: matched
    prefix tokens beyond D found only in a lower tier (host memory, disk, a shared pool);
    `worth` in [0, 1]: the share of a recompute a lower-tier hit saves (it must be loaded
    over PCIe or the network first; `CostWeights.lower_tier_worth`). Prefill cost falls
    with exactly the cached share (cached tokens are not recomputed; SGLang RadixAttention).
    """
    saved = device_tokens + lower_tier_worth * lower_tier_tokens
    return float(min(max(prompt_tokens - saved, 0.0), prompt_tokens))
