"""Router: model -> replica, prefix-aware (KV events) and load-aware. Pure decision code.

Files: `types` (request, snapshot, decision), `hashing` (the router's block key), `events`
(wire -> plain KV events), `index` (the affinity index), `ledger` (own dispatches between
load records), `ring` (consistent hashing with bounded loads), `filters`, `cost` (the one
scoring rule), `policies/` (one file per policy), `router` (the facade). C extensions of
the hot paths: `_native/` (see setup.py).
"""

from __future__ import annotations

from homing.router.cost import CostWeights, estimated_cost
from homing.router.filters import OverloadThresholds
from homing.router.index import PrefixIndex, PrefixMatch
from homing.router.policies import (
    BUILTIN_POLICIES,
    POLICY_NAMES,
    CacheAwareConfig,
    CacheAwarePolicy,
    ConsistentHashConfig,
    ConsistentHashPolicy,
    LeastLoadPolicy,
    Policy,
    PolicyContext,
    PolicyFactory,
    RoundRobinPolicy,
)
from homing.router.ring import HashRing, load_bound
from homing.router.router import Router, RouterObserver
from homing.router.types import (
    NoWorkerAvailable,
    RouteDecision,
    RouteRequest,
    WorkerSnapshot,
    snapshot_from_state,
)

__all__ = [
    "BUILTIN_POLICIES",
    "POLICY_NAMES",
    "CacheAwareConfig",
    "CacheAwarePolicy",
    "ConsistentHashConfig",
    "ConsistentHashPolicy",
    "CostWeights",
    "HashRing",
    "LeastLoadPolicy",
    "NoWorkerAvailable",
    "OverloadThresholds",
    "Policy",
    "PolicyContext",
    "PolicyFactory",
    "PrefixIndex",
    "PrefixMatch",
    "RoundRobinPolicy",
    "RouteDecision",
    "RouteRequest",
    "Router",
    "RouterObserver",
    "WorkerSnapshot",
    "estimated_cost",
    "load_bound",
    "snapshot_from_state",
]
