"""Router: model -> replica, prefix-aware (KV events) and load-aware. Pure decision code.

Files: `types` (request, snapshot, decision), `hashing` (the router's block hash),
`events` (wire -> plain KV events), `index` (prefix index), `filters` and `scorers` (pure
units the policies compose), `policies/` (one file per policy), `router` (the facade).
"""

from __future__ import annotations

from homing.router.filters import OverloadThresholds
from homing.router.index import PrefixIndex
from homing.router.policies import (
    BUILTIN_POLICIES,
    CacheAwareConfig,
    CacheAwarePolicy,
    LeastLoadPolicy,
    Policy,
    PolicyContext,
    PolicyFactory,
    RoundRobinPolicy,
)
from homing.router.router import Router
from homing.router.types import (
    NoWorkerAvailable,
    RouteDecision,
    RouteRequest,
    WorkerSnapshot,
    snapshot_from_state,
)

__all__ = [
    "BUILTIN_POLICIES",
    "CacheAwareConfig",
    "CacheAwarePolicy",
    "LeastLoadPolicy",
    "NoWorkerAvailable",
    "OverloadThresholds",
    "Policy",
    "PolicyContext",
    "PolicyFactory",
    "PrefixIndex",
    "RoundRobinPolicy",
    "RouteDecision",
    "RouteRequest",
    "Router",
    "WorkerSnapshot",
    "snapshot_from_state",
]
