"""The engine's non-evictable KV usage (`active_token_usage`) from the pool's load view to
the overload rule, and idleness that needs an empty waiting queue."""

from __future__ import annotations

from dataclasses import replace

from homing.engines.pool import EngineLoadView, WorkerState
from homing.router import WorkerSnapshot, snapshot_from_state
from homing.router.filters import OverloadThresholds, idle, overloaded

LOAD = EngineLoadView(
    running=4,
    waiting=2,
    waiting_uncached_tokens=None,
    token_usage=0.99,
    max_running_requests=64,
    updated_at=5.0,
    active_token_usage=0.2,
)


def snap(worker_id: str, load: EngineLoadView) -> WorkerSnapshot:
    return snapshot_from_state(WorkerState(worker_id=worker_id, url="grpc://h:1", load=load))


def test_a_worker_whose_kv_is_mostly_evictable_cache_is_not_vetoed() -> None:
    """99% `token_usage` but 20% active, queueing: the active figure decides (no veto)."""
    cache = snap("w0", LOAD)
    assert cache.active_token_usage == 0.2
    assert overloaded([cache], OverloadThresholds()) == set()


def test_active_usage_at_the_threshold_vetoes_and_none_falls_back_to_token_usage() -> None:
    assert overloaded([snap("w1", replace(LOAD, active_token_usage=0.97))], OverloadThresholds())
    unreported = snap("w2", replace(LOAD, active_token_usage=None))
    assert unreported.active_token_usage is None
    assert overloaded([unreported], OverloadThresholds()) == {"w2"}


def test_idle_needs_nothing_running_waiting_or_in_flight() -> None:
    assert idle(WorkerSnapshot("w", token_usage=0.99))
    assert not idle(WorkerSnapshot("w", waiting=1))
    assert not idle(WorkerSnapshot("w", running=1))
    assert not idle(WorkerSnapshot("w", in_flight=1))


def test_a_worker_with_only_a_waiting_queue_can_be_vetoed() -> None:
    """Nothing running, 33 waiting (an engine that stopped admitting): over `max_waiting`."""
    queued = WorkerSnapshot("w", waiting=33)
    assert overloaded([queued], OverloadThresholds()) == {"w"}
