"""Routing policies behind one `Policy` protocol, and the built-in registry."""

from __future__ import annotations

from homing.router.policies.base import Policy, PolicyContext, PolicyFactory
from homing.router.policies.cache_aware import (
    CacheAwareConfig,
    CacheAwarePolicy,
    build_cache_aware,
)
from homing.router.policies.least_load import LeastLoadPolicy, build_least_load, pick_least_loaded
from homing.router.policies.round_robin import RoundRobinPolicy, build_round_robin

#: Built-in policies by name; `Router` takes this unless given its own registry.
BUILTIN_POLICIES: dict[str, PolicyFactory] = {
    "round_robin": build_round_robin,
    "least_load": build_least_load,
    "cache_aware": build_cache_aware,
}

__all__ = [
    "BUILTIN_POLICIES",
    "CacheAwareConfig",
    "CacheAwarePolicy",
    "LeastLoadPolicy",
    "Policy",
    "PolicyContext",
    "PolicyFactory",
    "RoundRobinPolicy",
    "build_cache_aware",
    "build_least_load",
    "build_round_robin",
    "pick_least_loaded",
]
