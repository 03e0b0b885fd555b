"""The engine loop's lifecycle: stopping it ends its task whatever the loop was waiting on."""

from __future__ import annotations

import asyncio

from homing.sim.engine_loop import EngineLoop
from homing.sim.faults import FaultState, parse_fault
from homing.sim.scheduler import Scheduler, SchedulerConfig, SimRequest
from homing.sim.timing import TimingModel


class _Counting:
    def token_at(self, index: int) -> int:
        return 1000 + index


def _engine(faults: FaultState) -> EngineLoop:
    scheduler = Scheduler(
        SchedulerConfig(
            kv_capacity_tokens=16 * 1024,
            max_running_requests=8,
            page_size=16,
            chunked_prefill_size=8192,
            eos_token_ids=frozenset({1}),
        ),
        TimingModel.from_names("llama-3.1-8b", "H100", 1),
    )
    return EngineLoop(scheduler, faults=faults)


async def test_stop_ends_a_stalled_loop_woken_in_the_same_instant() -> None:
    """An abort wakes the stalled loop and `stop` cancels it before the loop runs again: the
    cancellation is not lost (asyncio.wait_for on Python 3.11 would swallow it and keep the
    loop, and a worker restart, waiting out the stall)."""
    faults = FaultState()
    engine = _engine(faults)
    faults.apply(parse_fault({"stall_s": 600}), engine.wall_now())
    engine.start()
    stream = engine.submit(
        SimRequest(
            request_id="r", input_ids=tuple(range(10, 50)), max_new_tokens=4, output=_Counting()
        )
    )
    for _ in range(5):  # let the loop reach its stall wait
        await asyncio.sleep(0)
    engine.abort("r")  # sets the loop's wake-up event
    async with asyncio.timeout(5.0):
        await engine.stop()
    assert not engine.running
    assert stream.finished
