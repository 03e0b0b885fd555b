"""A drained worker that other gateway processes also serve leaves once the whole box has
nothing on it: not at this process's last request while another process still streams on
it, and not before the others had time to learn of the drain."""

from __future__ import annotations

from pathlib import Path

from homing.clock import ManualClock
from homing.engines.lifecycle import Action, Phase
from homing.engines.pool import PoolConfig, WorkerPool
from homing.engines.pool.membership import SHARED_DRAIN_POLL_S, SHARED_DRAIN_SETTLE_S
from homing.engines.pool.shared_in_flight import InFlightBoard
from homing.router import Router

URL = "grpc://127.0.0.1:1"


def make_pool(board: InFlightBoard, clock: ManualClock) -> WorkerPool:
    """Process 0's pool of one worker, never contacted, moved to `ready` as discovery
    would."""
    pool = WorkerPool([URL], router=Router(), config=PoolConfig(), clock=clock, shared=(board, 0))
    pool._apply(pool._workers["w0"], Action.JOINED)
    return pool


async def test_a_drained_worker_stays_while_another_process_streams_on_it(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    board = InFlightBoard.create(str(tmp_path / "board"), processes=2, slots=8)
    pool = make_pool(board, clock)
    slot = board.slot(URL)
    assert slot is not None
    board.store(1, slot, 2)  # process 1 has two streams on it
    with pool.track("w0"):
        pool.drain("w0")
    await clock.settle()  # its retirement, scheduled at this process's last request, waits
    clock.advance(SHARED_DRAIN_SETTLE_S + 5 * SHARED_DRAIN_POLL_S)
    await clock.settle()
    assert pool.has("w0") and pool.state("w0").phase is Phase.DRAINING
    board.store(1, slot, 0)  # process 1's streams ended
    clock.advance(2 * SHARED_DRAIN_POLL_S)
    await clock.settle()
    assert not pool.has("w0")
    board.close()


async def test_a_drained_idle_worker_waits_for_the_others_to_learn_of_the_drain(
    tmp_path: Path,
) -> None:
    """Nothing in flight anywhere: it still stays `SHARED_DRAIN_SETTLE_S`, the time the
    other processes take to stop routing to it."""
    clock = ManualClock()
    board = InFlightBoard.create(str(tmp_path / "board"), processes=2, slots=8)
    pool = make_pool(board, clock)
    pool.drain("w0")
    await clock.settle()  # its retirement waits from here
    clock.advance(SHARED_DRAIN_SETTLE_S - 0.5)
    await clock.settle()
    assert pool.has("w0")
    clock.advance(1.0)
    await clock.settle()
    assert not pool.has("w0")
    board.close()


async def test_drained_undrained_and_drained_again_waits_from_the_second_drain(
    tmp_path: Path,
) -> None:
    """The first drain's retirement, still waiting, does not retire the second drain's
    worker early: the others learn of the second drain only from its start."""
    clock = ManualClock()
    board = InFlightBoard.create(str(tmp_path / "board"), processes=2, slots=8)
    pool = make_pool(board, clock)
    pool.drain("w0")
    await clock.settle()
    clock.advance(SHARED_DRAIN_SETTLE_S - 0.5)
    pool.undrain("w0")
    pool.drain("w0")
    await clock.settle()
    clock.advance(1.0)  # the first retirement's settle has passed, not the second's
    await clock.settle()
    assert pool.has("w0") and pool.state("w0").phase is Phase.DRAINING
    clock.advance(SHARED_DRAIN_SETTLE_S)
    await clock.settle()
    assert not pool.has("w0")
    board.close()
