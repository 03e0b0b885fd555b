"""Routing policies behind one `Policy` protocol, and the built-in registry."""

from __future__ import annotations

from homing.router.policies.base import BasePolicy, Policy, PolicyContext, PolicyFactory
from homing.router.policies.cache_aware import (
    CacheAwareConfig,
    CacheAwarePolicy,
    build_cache_aware,
)
from homing.router.policies.consistent_hash import (
    ConsistentHashConfig,
    ConsistentHashPolicy,
    build_consistent_hash,
    routing_key,
)
from homing.router.policies.least_load import (
    LeastLoadConfig,
    LeastLoadPolicy,
    build_least_load,
    pick_least_loaded,
)
from homing.router.policies.round_robin import (
    RoundRobinConfig,
    RoundRobinPolicy,
    build_round_robin,
)

#: Built-in policies by name; `Router` takes this unless given its own registry.
BUILTIN_POLICIES: dict[str, PolicyFactory] = {
    "round_robin": build_round_robin,
    "least_load": build_least_load,
    "consistent_hash": build_consistent_hash,
    "cache_aware": build_cache_aware,
}

#: The names `RouterSettings.policy` and `homing serve --policy` accept.
POLICY_NAMES: tuple[str, ...] = tuple(BUILTIN_POLICIES)

__all__ = [
    "BUILTIN_POLICIES",
    "POLICY_NAMES",
    "BasePolicy",
    "CacheAwareConfig",
    "CacheAwarePolicy",
    "ConsistentHashConfig",
    "ConsistentHashPolicy",
    "LeastLoadConfig",
    "LeastLoadPolicy",
    "Policy",
    "PolicyContext",
    "PolicyFactory",
    "RoundRobinConfig",
    "RoundRobinPolicy",
    "build_cache_aware",
    "build_consistent_hash",
    "build_least_load",
    "build_round_robin",
    "pick_least_loaded",
    "routing_key",
]
