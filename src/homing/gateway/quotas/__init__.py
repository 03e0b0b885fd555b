"""Per-tenant quotas: requests and tokens per sliding minute, concurrent streams.

Files: `types` (plain data and the `QuotaStore` protocol), `window` (the pure math and the
in-process backend), `redis_store` (the same math as Redis Lua scripts, shared across
instances), `guard` (the shell: charges, errors, fail-open/closed, lease renewal).
"""

from __future__ import annotations

from homing.gateway.quotas.guard import QuotaGuard, QuotaTicket, build_store, scopes_for
from homing.gateway.quotas.redis_store import RedisQuotaStore
from homing.gateway.quotas.types import (
    Charge,
    Denial,
    QuotaStore,
    QuotaStoreError,
    ScopeLimits,
    ScopeUsage,
)
from homing.gateway.quotas.window import InProcessQuotaStore, LeaseSet, SlidingWindow

__all__ = [
    "Charge",
    "Denial",
    "InProcessQuotaStore",
    "LeaseSet",
    "QuotaGuard",
    "QuotaStore",
    "QuotaStoreError",
    "QuotaTicket",
    "RedisQuotaStore",
    "ScopeLimits",
    "ScopeUsage",
    "SlidingWindow",
    "build_store",
    "scopes_for",
]
