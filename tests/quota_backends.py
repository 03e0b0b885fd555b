"""The two quota backends built alike for tests that hold both to one contract."""

from __future__ import annotations

import uuid

from homing.clock import ManualClock
from homing.gateway.quotas import InProcessQuotaStore, QuotaStore, RedisQuotaStore


def quota_store(
    kind: str, redis_url: str, clock: ManualClock, *, window_ms: int, lease_ms: int
) -> QuotaStore:
    """The in-process store (`kind` "memory") or a Redis store under a fresh key prefix,
    both on `clock`."""
    if kind == "memory":
        return InProcessQuotaStore(clock=clock, window_ms=window_ms, lease_ms=lease_ms)
    return RedisQuotaStore(
        redis_url,
        key_prefix=f"test-{uuid.uuid4().hex}",
        window_ms=window_ms,
        lease_ms=lease_ms,
        timeout_s=2.0,
        clock=clock,
    )
