"""The pool's circuit breakers without a network: requests' transport failures open one,
its timer runs on the pool's clock, a lease on a half-open worker is its one trial."""

from __future__ import annotations

import grpc

from homing.clock import ManualClock
from homing.engines.client import EngineError
from homing.engines.lifecycle import Phase
from homing.engines.pool import PoolConfig, WorkerPool, WorkerState
from homing.router import Router

REFUSED = EngineError(grpc.StatusCode.UNAVAILABLE, "connection refused")


def make_pool(clock: ManualClock) -> WorkerPool:
    """Two workers never contacted (start() is not called)."""
    return WorkerPool(
        ["grpc://127.0.0.1:1", "grpc://127.0.0.1:2"],
        router=Router(),
        clock=clock,
        config=PoolConfig(unhealthy_threshold=100),
    )


def fail(pool: WorkerPool, worker_id: str, n: int, err: EngineError = REFUSED) -> None:
    for _ in range(n):
        pool.report_failure(worker_id, err)


def test_five_transport_failures_open_the_breaker_until_the_clock_passes_one_second() -> None:
    clock = ManualClock()
    pool = make_pool(clock)
    fail(pool, "w0", 4)
    assert pool.state("w0").breaker == "closed"
    fail(pool, "w0", 1)
    w0 = pool.state("w0")
    assert (w0.breaker, w0.breaker_opens) == ("open", 1)
    assert pool.state("w1").breaker == "closed"
    clock.advance(0.99)
    assert w0.breaker == "open"
    clock.advance(0.01)
    assert w0.breaker == "half_open"


def test_a_clients_mistake_never_opens_it() -> None:
    pool = make_pool(ManualClock())
    fail(pool, "w0", 20, EngineError(grpc.StatusCode.INVALID_ARGUMENT, "prompt too long"))
    assert pool.state("w0").breaker == "closed"


def test_the_trial_lease_closes_it_when_it_ends_without_a_failure() -> None:
    clock = ManualClock()
    pool = make_pool(clock)
    fail(pool, "w0", 5)
    clock.advance(1.0)
    mark = pool.open_lease("w0")
    assert mark.trial and pool.state("w0").breaker_trial
    pool.close_lease("w0", mark)
    assert (pool.state("w0").breaker, pool.state("w0").breaker_trial) == ("closed", False)


def test_a_failed_trial_reopens_it_for_twice_as_long() -> None:
    clock = ManualClock()
    pool = make_pool(clock)
    fail(pool, "w0", 5)
    clock.advance(1.0)
    mark = pool.open_lease("w0")
    fail(pool, "w0", 1)  # the trial's own failure
    pool.close_lease("w0", mark)  # then its lease ends: no success
    w0 = pool.state("w0")
    assert (w0.breaker, w0.breaker_opens) == ("open", 2)
    clock.advance(1.99)
    assert w0.breaker == "open"
    clock.advance(0.01)
    assert w0.breaker == "half_open"


def test_a_lease_ended_after_a_failure_on_its_worker_is_no_success() -> None:
    """Four failures, a lease that saw a fifth failure elsewhere on the worker: open."""
    pool = make_pool(ManualClock())
    mark = pool.open_lease("w0")
    fail(pool, "w0", 4)
    pool.close_lease("w0", mark)
    assert pool.state("w0").breaker == "closed"
    fail(pool, "w0", 1)
    assert pool.state("w0").breaker == "open"


def test_routable_needs_the_breaker_to_admit() -> None:
    """Ready and healthy is not enough: open, or half-open with its trial out, takes none."""
    ready = {"worker_id": "w0", "url": "grpc://h:1", "phase": Phase.READY, "healthy": True}
    assert WorkerState(**ready).routable
    assert WorkerState(**ready, breaker="half_open").routable
    assert not WorkerState(**ready, breaker="half_open", breaker_trial=True).routable
    assert not WorkerState(**ready, breaker="open").routable
