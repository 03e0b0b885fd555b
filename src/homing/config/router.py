"""Routing (`[router]`): the policy, the scoring rule's weights, bounded load, the affinity
index and retries."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from homing.config.base import Section

RoutingPolicy = Literal["cache_aware", "round_robin", "least_load", "consistent_hash"]


class CostWeightSettings(Section):
    """Weights of the router's scoring rule `cost = a*U + b*Q + d*L` (homing.router.cost):
    `prefill` a per uncached prompt token, `queue` b per queued prefill token, `decode` d in
    tokens per request on the worker, `lower_tier_worth` h: share of a recompute that a
    host/remote-tier hit saves."""

    prefill: float = Field(default=3.0, ge=0, allow_inf_nan=False)
    queue: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    decode: float = Field(default=128.0, ge=0, allow_inf_nan=False)
    lower_tier_worth: float = Field(default=0.8, ge=0, le=1)


class RouterModelSettings(Section):
    """Per-model overrides of `RouterSettings` (keyed by served model name); unset fields
    take the router-wide value."""

    policy: RoutingPolicy | None = None
    weights: CostWeightSettings | None = None
    load_factor: float | None = Field(default=None, ge=1)
    min_match_ratio: float | None = Field(default=None, ge=0, le=1)


class RouterSettings(Section):
    """Routing for the model's pool (homing.router): the policy, the scoring rule's weights,
    the bounded-load factors (c for the ring, c_hit for affinity) and their floors, the
    overload veto, and the affinity index's global budget, approximate-mode TTL and
    exact-mode booking TTL. `models` overrides policy and weights per served model name."""

    policy: RoutingPolicy = "cache_aware"
    block_size: int = Field(default=16, ge=1)
    weights: CostWeightSettings = Field(default_factory=CostWeightSettings)
    load_factor: float = Field(default=1.25, ge=1)
    min_bound: int = Field(default=4, ge=1)
    hit_load_factor: float = Field(default=2.0, ge=1)
    hit_min_bound: int = Field(default=8, ge=1)
    ring_choices: int = Field(default=8, ge=1)
    vnodes: int = Field(default=160, ge=1)
    min_match_ratio: float = Field(default=0.05, ge=0, le=1)
    max_token_usage: float = Field(default=0.95, gt=0, le=1)
    max_waiting: int = Field(default=32, ge=1)
    index_budget_mb: float = Field(default=160.0, gt=0)
    approx_ttl_s: float = Field(default=120.0, gt=0)
    booking_ttl_s: float | None = Field(default=None, gt=0)
    # Retries of a failed worker call before the client's first byte, each on a worker the
    # request has not tried (homing.gateway.retry_budget): at most `max_retries` per request,
    # and per model only while retries over the last `retry_window_s` seconds stay within
    # `retry_budget_ratio` of its requests plus `retry_min_per_s` a second (Finagle's retry
    # budget: 0.2 of requests, 10 s window). Two retries by default, so a request still
    # reaches a third worker while two fail at once (Envoy's default is one; gRPC's retry
    # policy allows up to four). `migrate_streams`: a stream whose worker fails
    # after the client got its first byte resumes on another worker (once, in the same
    # budget) instead of ending with an error event.
    max_retries: int = Field(default=2, ge=0, le=10, strict=True)
    retry_budget_ratio: float = Field(default=0.2, ge=0, le=1, allow_inf_nan=False, strict=True)
    retry_min_per_s: float = Field(default=3.0, ge=0, le=10_000, allow_inf_nan=False, strict=True)
    retry_window_s: float = Field(default=10.0, ge=1, le=60, allow_inf_nan=False, strict=True)
    migrate_streams: bool = Field(default=False, strict=True)
    models: dict[str, RouterModelSettings] = Field(default_factory=dict)
