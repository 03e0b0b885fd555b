"""The engine loop's lifecycle: stopping it ends its task whatever the loop was waiting on, and
every stream, silenced ones included."""

from __future__ import annotations

import asyncio

from homing.sim.engine_loop import EngineLoop
from homing.sim.faults import FaultState, parse_fault
from homing.sim.scheduler import RequestFinished, Scheduler, SchedulerConfig, SimRequest
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


def _long(request_id: str) -> SimRequest:
    """A request that decodes for much longer than any test runs."""
    return SimRequest(
        request_id=request_id,
        input_ids=tuple(range(10, 50)),
        max_new_tokens=10_000,
        output=_Counting(),
    )


async def test_a_client_abort_silences_the_stream_and_stop_ends_it() -> None:
    """`client_abort` takes the request out of the scheduler and drops what its stream had
    queued, the stream stays open through later steps, and `stop` ends it with "abort"."""
    engine = _engine(FaultState())
    engine.start()
    try:
        stream = engine.submit(_long("a"))
        other = engine.submit(_long("b"))
        async with asyncio.timeout(5.0):
            await stream.queue.get()  # "a" produced a token
            assert engine.client_abort("a")
            assert "a" not in engine.scheduler and engine.num_silenced_streams == 1
            assert stream.queue.empty()
            for _ in range(3):  # the engine keeps stepping ("b" decodes)
                await other.queue.get()
        assert stream.queue.empty() and not stream.finished
    finally:
        async with asyncio.timeout(5.0):
            await engine.stop()
    assert stream.finished and engine.num_silenced_streams == 0
    item = stream.queue.get_nowait()
    assert isinstance(item, RequestFinished) and item.finish_reason == "abort"


async def test_closing_a_silenced_stream_forgets_it_and_spares_a_reused_id() -> None:
    """`close_stream` of a silenced stream only forgets it: a new request with the same id
    keeps running; closing that request's own stream aborts it."""
    engine = _engine(FaultState())
    engine.start()
    try:
        old = engine.submit(_long("x"))
        engine.client_abort("x")
        new = engine.submit(_long("x"))
        engine.close_stream(old)
        assert engine.num_silenced_streams == 0 and "x" in engine.scheduler
        engine.close_stream(new)
        assert "x" not in engine.scheduler and engine.num_streams == 0
    finally:
        async with asyncio.timeout(5.0):
            await engine.stop()
