"""The event loop's busy share, sampled periodically and handed to whoever needs it.

`LoopBusySampler` runs a timer callback on the event loop every `period_s` seconds of its
`Clock`. Each run reads how long the loop thread has wanted a CPU (`demand_seconds`: the
time it ran plus the time it was runnable and waiting on a run queue, from Linux's
per-thread schedstat; timer callbacks run on the loop's thread) and the clock, and hands
`busy = demand seconds / wall seconds` since the previous run, clamped to [0, 1], to each
sink (for example `StreamIntervalPolicy.observe`). The cost is one timer, one small file
read and a clock read per period (default 1 s), nothing on the request path.

Run time alone (`time.thread_time`) would read a saturated loop on a shared machine at the
share of a CPU it gets (about 0.45 for a gateway beside its workers on 2 cores, measured),
not at 1. Waiting for the GIL while another thread (grpc's poller) holds it is not counted
either way. Samples are taken late when the loop is busy (the timer waits its turn), which
stretches a sample's wall time but not its share.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from homing.clock import Clock, TimerHandle

log = structlog.get_logger("homing.obs")

SCHEDSTAT = "/proc/thread-self/schedstat"


def demand_seconds() -> float:
    """Seconds the calling thread ran or was runnable waiting for a CPU: Linux's per-thread
    schedstat (`/proc/thread-self/schedstat`: ns on a CPU, ns waiting on a run queue); on a
    machine shared with other processes the waiting counts too, so a loop that would use the
    whole CPU reads near 1 even when it gets half of it. `time.thread_time` where schedstat
    cannot be read."""
    try:
        with open(SCHEDSTAT, "rb") as f:
            ran, waited = f.read().split()[:2]
    except (OSError, ValueError):
        return time.thread_time()
    return (int(ran) + int(waited)) / 1e9


BusySink = Callable[[float], object]
"""Receives each sample: the loop thread's demand seconds per wall second, in [0, 1]."""


class LoopBusySampler:
    """Samples the running loop's busy share every `period_s` seconds (> 0) of `clock`.

    `start()` must be called from the event loop's thread (in a coroutine or callback of
    the running loop); `stop()` cancels the next sample. Both are idempotent. A sink that
    raises is logged (`loop_busy_sink_failed`) and keeps receiving later samples; it does
    not stop the other sinks or the sampler.
    `cpu_time`: the calling thread's busy seconds so far (default `demand_seconds`).
    Raises ValueError on a period <= 0.
    """

    def __init__(
        self,
        clock: Clock,
        sinks: list[BusySink] | None = None,
        *,
        period_s: float = 1.0,
        cpu_time: Callable[[], float] = demand_seconds,
    ) -> None:
        if not period_s > 0:
            raise ValueError(f"sampling period must be > 0 seconds, got {period_s}")
        self._clock = clock
        self._sinks: list[BusySink] = list(sinks or [])
        self.period_s = period_s
        self._cpu_time = cpu_time
        self._timer: TimerHandle | None = None
        self._last: tuple[float, float] | None = None
        self.last_share: float | None = None  # the latest sample (None before the first)

    @property
    def running(self) -> bool:
        """True between `start` and `stop`."""
        return self._timer is not None

    def add_sink(self, sink: BusySink) -> None:
        """Hand later samples to `sink` as well."""
        self._sinks.append(sink)

    def remove_sink(self, sink: BusySink) -> None:
        """Stop handing samples to `sink` (no effect when it is not a sink)."""
        if sink in self._sinks:
            self._sinks.remove(sink)

    def start(self) -> None:
        """Begin sampling: the first sample comes `period_s` from now."""
        if self._timer is not None:
            return
        self._last = (self._clock.now(), self._cpu_time())
        self._timer = self._clock.call_later(self.period_s, self._tick)

    def stop(self) -> None:
        """Stop sampling; `start` again begins a fresh first period."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._last = None

    def _tick(self) -> None:
        if self._timer is None or self._last is None:
            return
        now, cpu = self._clock.now(), self._cpu_time()
        then, cpu_then = self._last
        self._last = (now, cpu)
        self._timer = self._clock.call_later(self.period_s, self._tick)
        wall = now - then
        if wall <= 0:
            return
        share = min(1.0, max(0.0, (cpu - cpu_then) / wall))
        self.last_share = share
        for sink in list(self._sinks):
            try:
                sink(share)
            except Exception:
                log.exception("loop_busy_sink_failed", sink=repr(sink), share=share)
