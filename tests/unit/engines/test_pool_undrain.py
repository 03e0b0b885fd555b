"""Undrain: a draining worker listed again goes back to the phase its drain began in and
stays, whether its last request is still open or its retirement was already scheduled; only
a worker drained from ready or cordoned undrains."""

from __future__ import annotations

import asyncio

import pytest

from homing.engines.lifecycle import Action, IllegalTransition, Phase
from homing.engines.pool import PoolConfig, WorkerPool
from homing.router import Router


def make_pool() -> WorkerPool:
    """Two workers never contacted (start() is not called), both moved to `ready` as their
    discovery would."""
    pool = WorkerPool(
        ["grpc://127.0.0.1:1", "grpc://127.0.0.1:2"], router=Router(), config=PoolConfig()
    )
    for worker_id in ("w0", "w1"):
        pool._apply(pool._workers[worker_id], Action.JOINED)
    return pool


async def settle() -> None:
    """Let the tasks scheduled so far (a retirement) run to their first await."""
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_draining_worker_undrained_with_a_request_open_serves_again_and_stays() -> None:
    pool = make_pool()
    with pool.track("w0"):
        assert pool.drain("w0").phase is Phase.DRAINING
        state = pool.undrain("w0")
        assert state.phase is Phase.READY and not state.draining
    await settle()  # its last request ended: a drained worker would retire now
    assert pool.has("w0") and pool.state("w0").phase is Phase.READY


async def test_undrained_before_its_scheduled_retirement_ran_it_stays() -> None:
    """Nothing in flight: `drain` schedules the retirement; `undrain` in the same step wins."""
    pool = make_pool()
    pool.drain("w0")
    pool.undrain("w0")
    await settle()
    assert pool.has("w0") and pool.state("w0").phase is Phase.READY
    assert not await pool.wait_gone("w0", timeout_s=0)


async def test_a_worker_whose_drain_ended_is_gone_and_cannot_be_undrained() -> None:
    pool = make_pool()
    pool.drain("w0")
    assert await pool.wait_gone("w0", timeout_s=1.0)
    with pytest.raises(KeyError):
        pool.undrain("w0")


def test_only_a_draining_worker_undrains() -> None:
    pool = make_pool()
    with pytest.raises(IllegalTransition) as err:
        pool.undrain("w1")
    assert str(err.value) == "cannot undrain a worker that is ready"


async def test_a_cordoned_worker_drained_then_undrained_stays_cordoned() -> None:
    pool = make_pool()
    pool.cordon("w0")
    with pool.track("w0"):
        assert pool.drain("w0").drained_from is Phase.CORDONED
        state = pool.undrain("w0")
    assert state.phase is Phase.CORDONED and state.drained_from is None


@pytest.mark.parametrize("before", [Phase.JOINING, Phase.EJECTED])
async def test_a_worker_drained_while_joining_or_ejected_does_not_undrain(before: Phase) -> None:
    """It returns only through its join or a readmission probe, never by a reload."""
    pool = WorkerPool(["grpc://127.0.0.1:1"], router=Router(), config=PoolConfig())
    if before is Phase.EJECTED:
        pool._apply(pool._workers["w0"], Action.JOINED)
        pool.eject("w0")
    with pool.track("w0"):
        pool.drain("w0")
        assert not pool.state("w0").undrainable
        with pytest.raises(IllegalTransition) as err:
            pool.undrain("w0")
    assert str(err.value) == "cannot undrain a worker that is draining"
