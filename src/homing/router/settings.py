"""Router configuration -> router objects: the one place `RouterSettings` is read.

Rule of this file: translation only. `router_from_settings` builds the `Router` the
composition root needs before any worker is discovered (router-wide values); once the
served model name is known, `apply_model_settings` switches to that model's policy and
weights when `RouterSettings.models` names it. The global index budget is given in MiB and
turned into blocks with the measured `BYTES_PER_BLOCK_ESTIMATE`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from homing.clock import Clock
from homing.router.cost import CostWeights
from homing.router.filters import OverloadThresholds
from homing.router.index import BYTES_PER_BLOCK_ESTIMATE
from homing.router.policies.cache_aware import CacheAwareConfig
from homing.router.policies.consistent_hash import ConsistentHashConfig
from homing.router.router import Router

if TYPE_CHECKING:
    from homing.config import CostWeightSettings, RouterSettings


def _weights(w: CostWeightSettings) -> CostWeights:
    return CostWeights(
        prefill=w.prefill, queue=w.queue, decode=w.decode, lower_tier_worth=w.lower_tier_worth
    )


def policy_configs(
    settings: RouterSettings, model: str | None = None, *, max_in_flight: int | None = None
) -> tuple[str, CacheAwareConfig, ConsistentHashConfig]:
    """The policy name and the configs of the two configurable built-in policies for
    `model` (router-wide values when `model` is None or has no override); `max_in_flight`:
    admission's per-replica cap, which cache_aware's veto and ring bound respect too."""
    override = settings.models.get(model) if model is not None else None
    policy = settings.policy
    weights = settings.weights
    load_factor = settings.load_factor
    min_match_ratio = settings.min_match_ratio
    if override is not None:
        policy = override.policy or policy
        weights = override.weights or weights
        load_factor = override.load_factor or load_factor
        if override.min_match_ratio is not None:
            min_match_ratio = override.min_match_ratio
    cache_aware = CacheAwareConfig(
        weights=_weights(weights),
        min_match_ratio=min_match_ratio,
        load_factor=load_factor,
        min_bound=settings.min_bound,
        hit_load_factor=settings.hit_load_factor,
        hit_min_bound=settings.hit_min_bound,
        ring_choices=settings.ring_choices,
        vnodes=settings.vnodes,
        overload=OverloadThresholds(
            max_token_usage=settings.max_token_usage,
            max_waiting=settings.max_waiting,
            max_in_flight=max_in_flight,
        ),
    )
    consistent_hash = ConsistentHashConfig(
        vnodes=settings.vnodes, load_factor=load_factor, min_bound=settings.min_bound
    )
    return policy, cache_aware, consistent_hash


def index_budget_blocks(settings: RouterSettings) -> int:
    """`index_budget_mb` as a block count (>= 1)."""
    return max(1, int(settings.index_budget_mb * 2**20 // BYTES_PER_BLOCK_ESTIMATE))


def router_from_settings(
    settings: RouterSettings, *, clock: Clock | None = None, max_in_flight: int | None = None
) -> Router:
    """A `Router` with the router-wide policy, weights, budget and TTL of `settings`
    (`max_in_flight`: as in `policy_configs`)."""
    policy, cache_aware, consistent_hash = policy_configs(settings, max_in_flight=max_in_flight)
    return Router(
        policy,
        block_size=settings.block_size,
        clock=clock,
        cache_aware=cache_aware,
        consistent_hash=consistent_hash,
        max_blocks=index_budget_blocks(settings),
        approx_ttl_s=settings.approx_ttl_s,
        booking_ttl_s=settings.booking_ttl_s,
    )


def apply_model_settings(
    router: Router, settings: RouterSettings, model: str, *, max_in_flight: int | None = None
) -> bool:
    """Switch `router` to `model`'s override of policy and weights, if `settings.models`
    has one; True when it did (`max_in_flight`: as in `policy_configs`)."""
    if model not in settings.models:
        return False
    policy, cache_aware, consistent_hash = policy_configs(
        settings, model, max_in_flight=max_in_flight
    )
    router.set_policy(policy, cache_aware=cache_aware, consistent_hash=consistent_hash)
    return True
