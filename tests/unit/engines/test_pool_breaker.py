"""The pool's circuit breakers without a network: requests' transport failures open one,
its timer runs on the pool's clock, a lease on a half-open worker is its one trial (resolved
at the worker's first answer), and each lease's own outcome decides what it counts for."""

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


def open_then_half_open(pool: WorkerPool, clock: ManualClock) -> None:
    fail(pool, "w0", 5)
    clock.advance(1.0)
    assert pool.state("w0").breaker == "half_open"


def test_the_trial_closes_the_breaker_at_the_workers_first_answer_not_its_stream_end() -> None:
    clock = ManualClock()
    pool = make_pool(clock)
    open_then_half_open(pool, clock)
    mark = pool.open_lease("w0")
    assert mark.trial and pool.state("w0").breaker_trial
    pool.lease_answered("w0", mark)  # first token: the stream is still going
    assert (pool.state("w0").breaker, pool.state("w0").breaker_trial) == ("closed", False)
    pool.lease_completed("w0", mark)
    pool.close_lease("w0", mark)
    assert pool.state("w0").breaker == "closed"


def test_a_trial_released_without_an_answer_frees_the_slot_for_the_next_request() -> None:
    """The client left before the first token (or no stream was ever sent): no outcome,
    the breaker stays half-open and the next lease is the trial."""
    clock = ManualClock()
    pool = make_pool(clock)
    open_then_half_open(pool, clock)
    mark = pool.open_lease("w0")
    assert pool.state("w0").breaker_trial
    pool.close_lease("w0", mark)
    w0 = pool.state("w0")
    assert (w0.breaker, w0.breaker_trial) == ("half_open", False)
    assert pool.open_lease("w0").trial


def test_a_trial_the_worker_aborted_counts_neither_way() -> None:
    """ABORTED (the worker ended the request itself) and CANCELLED are no transport
    failure: the lease is not failed, the trial slot is freed, nothing opens or closes."""
    clock = ManualClock()
    pool = make_pool(clock)
    open_then_half_open(pool, clock)
    for code in (grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED):
        mark = pool.open_lease("w0")
        err = EngineError(code, "the worker aborted the request", transport=False)
        pool.lease_failed("w0", mark, err)
        pool.report_failure("w0", err)
        pool.close_lease("w0", mark)
        assert not mark.failed
        w0 = pool.state("w0")
        assert (w0.breaker, w0.breaker_trial, w0.breaker_opens) == ("half_open", False, 1)


def test_a_failed_trial_reopens_it_for_twice_as_long() -> None:
    clock = ManualClock()
    pool = make_pool(clock)
    open_then_half_open(pool, clock)
    mark = pool.open_lease("w0")
    pool.lease_failed("w0", mark, REFUSED)  # the trial's own stream failed
    fail(pool, "w0", 1)  # and the gateway reported it
    pool.close_lease("w0", mark)
    w0 = pool.state("w0")
    assert mark.failed
    assert (w0.breaker, w0.breaker_opens) == ("open", 2)
    clock.advance(1.99)
    assert w0.breaker == "open"
    clock.advance(0.01)
    assert w0.breaker == "half_open"


def test_an_old_trial_resolves_nothing_once_the_breaker_reopened() -> None:
    """Trial A fails (re-opened), trial B is out: A's late answer or release neither closes
    the breaker nor frees B's slot; B's answer closes it."""
    clock = ManualClock()
    pool = make_pool(clock)
    open_then_half_open(pool, clock)
    a = pool.open_lease("w0")
    fail(pool, "w0", 1)
    clock.advance(2.0)
    b = pool.open_lease("w0")
    assert b.trial
    pool.lease_answered("w0", a)
    pool.close_lease("w0", a)
    w0 = pool.state("w0")
    assert (w0.breaker, w0.breaker_trial) == ("half_open", True)
    pool.lease_answered("w0", b)
    assert w0.breaker == "closed"


def test_a_lease_completed_on_a_busy_worker_resets_the_run_despite_others_failures() -> None:
    """Lease A is open while four other requests fail; A completes: the run starts over,
    so a fifth failure does not open the breaker (only consecutive failures do)."""
    pool = make_pool(ManualClock())
    a = pool.open_lease("w0")
    fail(pool, "w0", 4)
    pool.lease_answered("w0", a)
    pool.lease_completed("w0", a)
    pool.close_lease("w0", a)
    fail(pool, "w0", 4)
    assert pool.state("w0").breaker == "closed"
    fail(pool, "w0", 1)
    assert pool.state("w0").breaker == "open"


def test_failures_after_a_lease_completed_count_though_it_is_released_later() -> None:
    """Lease A completes, then four requests fail (the worker died) before A is released
    (its answer still being written to its client): the run keeps those four, and a fifth
    failure opens the breaker."""
    pool = make_pool(ManualClock())
    a = pool.open_lease("w0")
    pool.lease_answered("w0", a)
    pool.lease_completed("w0", a)
    fail(pool, "w0", 4)
    pool.close_lease("w0", a)
    assert pool.state("w0").breaker == "closed"
    fail(pool, "w0", 1)
    assert pool.state("w0").breaker == "open"


def test_a_lease_that_failed_itself_earns_no_success() -> None:
    """Answered, then cut (a transport failure of its own): four earlier failures plus its
    own make five in a row, and its release resets nothing."""
    pool = make_pool(ManualClock())
    a = pool.open_lease("w0")
    fail(pool, "w0", 4)
    pool.lease_answered("w0", a)
    pool.lease_failed("w0", a, REFUSED)
    pool.lease_completed("w0", a)  # another choice of the lease completed: still failed
    fail(pool, "w0", 1)
    pool.close_lease("w0", a)
    assert pool.state("w0").breaker == "open"


def test_leases_the_client_left_or_the_worker_aborted_are_no_success() -> None:
    """Neither a cancelled lease (no answer) nor an aborted one resets the run."""
    pool = make_pool(ManualClock())
    fail(pool, "w0", 4)
    cancelled = pool.open_lease("w0")
    pool.close_lease("w0", cancelled)
    aborted = pool.open_lease("w0")
    pool.lease_failed("w0", aborted, EngineError(grpc.StatusCode.ABORTED, "", transport=False))
    pool.close_lease("w0", aborted)
    answered_then_left = pool.open_lease("w0")
    pool.lease_answered("w0", answered_then_left)
    pool.close_lease("w0", answered_then_left)
    fail(pool, "w0", 1)
    assert pool.state("w0").breaker == "open"


def test_our_own_deadline_does_not_fail_the_lease() -> None:
    pool = make_pool(ManualClock())
    mark = pool.open_lease("w0")
    pool.lease_failed("w0", mark, EngineError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline"))
    assert not mark.failed


def test_routable_needs_the_breaker_to_admit() -> None:
    """Ready and healthy is not enough: open, or half-open with its trial out, takes none."""
    ready = {"worker_id": "w0", "url": "grpc://h:1", "phase": Phase.READY, "healthy": True}
    assert WorkerState(**ready).routable
    assert WorkerState(**ready, breaker="half_open").routable
    assert not WorkerState(**ready, breaker="half_open", breaker_trial=True).routable
    assert not WorkerState(**ready, breaker="open").routable
