"""The loop busy-share sampler: CPU seconds of the loop thread per wall second, every period,
to every sink, until stopped."""

from __future__ import annotations

import asyncio
import time

import pytest

from homing.clock import ManualClock, SystemClock
from homing.obs.loop_busy import SCHEDSTAT, LoopBusySampler, demand_seconds


class CpuCounter:
    """A thread CPU clock the test moves (the real one cannot be steered exactly)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


def test_each_sample_is_cpu_time_over_wall_time_since_the_previous_one() -> None:
    clock, cpu, got = ManualClock(), CpuCounter(), []
    sampler = LoopBusySampler(clock, [got.append], period_s=1.0, cpu_time=cpu)
    sampler.start()
    cpu.seconds += 0.25
    clock.advance(1.0)
    cpu.seconds += 0.9
    clock.advance(1.0)
    clock.advance(1.0)
    assert got == [0.25, pytest.approx(0.9), 0.0]
    assert sampler.last_share == 0.0


def test_a_share_is_clamped_to_zero_to_one() -> None:
    clock, cpu, got = ManualClock(), CpuCounter(), []
    sampler = LoopBusySampler(clock, [got.append], period_s=1.0, cpu_time=cpu)
    sampler.start()
    cpu.seconds += 1.3  # timer granularity can put CPU time ahead of the clock
    clock.advance(1.0)
    assert got == [1.0]


def test_no_sample_before_the_first_period_and_none_after_stop() -> None:
    clock, got = ManualClock(), []
    sampler = LoopBusySampler(clock, [got.append], period_s=0.5, cpu_time=CpuCounter())
    sampler.start()
    clock.advance(0.49)
    assert got == []
    clock.advance(0.01)
    assert len(got) == 1
    sampler.stop()
    assert (sampler.running, clock.pending) == (False, 0)
    clock.advance(10.0)
    assert len(got) == 1


def test_start_twice_keeps_one_timer() -> None:
    clock, got = ManualClock(), []
    sampler = LoopBusySampler(clock, [got.append], period_s=1.0, cpu_time=CpuCounter())
    sampler.start()
    sampler.start()
    assert clock.pending == 1
    clock.advance(3.0)
    assert len(got) == 3


def test_a_failing_sink_does_not_stop_the_others_or_the_sampler() -> None:
    clock, got = ManualClock(), []

    def broken(share: float) -> None:
        raise RuntimeError("sink bug")

    sampler = LoopBusySampler(clock, [broken, got.append], period_s=1.0, cpu_time=CpuCounter())
    sampler.start()
    clock.advance(2.0)
    assert len(got) == 2
    assert sampler.running


def test_sinks_added_and_removed_while_running() -> None:
    clock, first, second = ManualClock(), [], []
    sampler = LoopBusySampler(clock, [first.append], period_s=1.0, cpu_time=CpuCounter())
    sampler.start()
    clock.advance(1.0)
    sampler.add_sink(second.append)
    clock.advance(1.0)
    sampler.remove_sink(first.append)
    clock.advance(1.0)
    assert (len(first), len(second)) == (2, 2)


def test_a_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="period"):
        LoopBusySampler(ManualClock(), period_s=0.0)


async def test_the_real_loop_thread_cpu_time_is_sampled() -> None:
    """On the running loop with the default `demand_seconds`: a callback that spends CPU on
    the loop thread shows as a share above 0, and every share lies in [0, 1]."""
    got: list[float] = []
    arrived = asyncio.Event()

    def sink(share: float) -> None:
        got.append(share)
        arrived.set()

    sampler = LoopBusySampler(SystemClock(), [sink], period_s=0.05)
    sampler.start()
    try:
        start = time.thread_time()
        while time.thread_time() - start < 0.02:  # spend CPU on the loop thread
            pass
        async with asyncio.timeout(10.0):
            await arrived.wait()
    finally:
        sampler.stop()
    assert got[0] > 0.0
    assert all(0.0 <= share <= 1.0 for share in got)


def test_demand_seconds_count_the_threads_run_time_from_schedstat() -> None:
    """Linux's per-thread schedstat is read (ran + waited on a run queue), so 30 ms of CPU
    spent by this thread adds at least that much, less the reading's granularity."""
    with open(SCHEDSTAT, "rb") as f:
        assert len(f.read().split()) == 3
    before = demand_seconds()
    start = time.thread_time()
    while time.thread_time() - start < 0.03:
        pass
    assert demand_seconds() - before >= 0.025
