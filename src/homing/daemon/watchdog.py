"""The systemd watchdog, fed from the event loop, and reports of event-loop stalls.

`WatchdogPinger` sends WATCHDOG=1 every half of `WatchdogSec` (sd_watchdog_enabled(3)
advises pinging well within the interval) from a timer callback on the event loop, so a
loop that stops running callbacks stops the pings and systemd restarts the process. The
period is kept within `MIN_PING_PERIOD_S` (a tiny `WATCHDOG_USEC` would make the loop spin)
and `MAX_PING_PERIOD_S`.

`StallMonitor` tells a person what blocked the loop: a timer callback on the loop stamps a
heartbeat every `tick_s`; a daemon thread checks it, and when the heartbeat is older than
`threshold_s` it logs `loop_stalled` once with the loop thread's stack as it is at that
moment (the code holding the loop), then `loop_stall_ended` with the stall's length when
the heartbeat moves again. Costs one timer callback per `tick_s` on the loop and one thread
wake-up per half tick.
"""

from __future__ import annotations

import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping

import structlog

from homing.clock import Clock, TimerHandle

log = structlog.get_logger("homing.daemon")


#: The shortest time between two pings, seconds, whatever `WATCHDOG_USEC` says.
MIN_PING_PERIOD_S = 0.01

#: The longest time between two pings, seconds (a ping more often than needed costs nothing).
MAX_PING_PERIOD_S = 3600.0

_DECIMAL = re.compile(r"[0-9]{1,19}")  # ASCII digits only; 19 digits hold any 64-bit value


def watchdog_interval_s(environ: Mapping[str, str], pid: int) -> float | None:
    """`WATCHDOG_USEC` in seconds when the watchdog is meant for process `pid`
    (`WATCHDOG_PID` unset or equal to it), else None. ValueError unless `WATCHDOG_USEC` is a
    positive ASCII decimal number of microseconds (at most 19 digits) and `WATCHDOG_PID`,
    when set, an ASCII decimal process id."""
    usec = environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    owner = environ.get("WATCHDOG_PID")
    if owner:
        if not _DECIMAL.fullmatch(owner):
            raise ValueError(f"WATCHDOG_PID={owner[:64]!r} is not a process id")
        if int(owner) != pid:
            return None
    if not _DECIMAL.fullmatch(usec) or int(usec) <= 0:
        raise ValueError(
            f"WATCHDOG_USEC={usec[:64]!r} is not a positive number of microseconds "
            "(ASCII digits, at most 19)"
        )
    return int(usec) / 1e6


class WatchdogPinger:
    """Calls `ping()` every `interval_s / 2` seconds of `clock` (`period_s`, kept within
    `MIN_PING_PERIOD_S` and `MAX_PING_PERIOD_S`) from the running loop.

    `start()` from the loop's thread; `stop()` cancels the next ping. Both idempotent.
    ValueError unless `interval_s` > 0. An interval too short to honour is logged
    (`watchdog_interval_too_short`).
    """

    def __init__(self, interval_s: float, ping: Callable[[], object], clock: Clock) -> None:
        if not interval_s > 0:
            raise ValueError("the watchdog interval must be > 0")
        self.period_s = min(max(interval_s / 2, MIN_PING_PERIOD_S), MAX_PING_PERIOD_S)
        if interval_s / 2 < MIN_PING_PERIOD_S:
            log.warning(
                "watchdog_interval_too_short",
                interval_s=interval_s,
                ping_period_s=self.period_s,
            )
        self._ping = ping
        self._clock = clock
        self._timer: TimerHandle | None = None

    def start(self) -> None:
        if self._timer is None:
            self._beat()

    def _beat(self) -> None:
        self._ping()
        self._timer = self._clock.call_later(self.period_s, self._beat)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


#: Deepest stack frames a stall report keeps (the innermost ones: where the loop is held).
STACK_FRAMES = 30


class StallMonitor:
    """Logs event-loop stalls over `threshold_s` seconds with the loop thread's stack.

    `start()` from the loop's thread (its heartbeat timer runs on `clock`; the checking
    thread reads `time.monotonic`); `stop()` ends both. `on_stall(seconds, stack)`: called
    from the checking thread with each stall report (tests read it; the log line is always
    written). ValueError unless 0 < `tick_s` < `threshold_s`.
    """

    def __init__(
        self,
        threshold_s: float,
        clock: Clock,
        *,
        tick_s: float = 0.1,
        on_stall: Callable[[float, str], object] | None = None,
    ) -> None:
        if not 0 < tick_s < threshold_s:
            raise ValueError("need 0 < tick_s < threshold_s")
        self.threshold_s = threshold_s
        self.tick_s = tick_s
        self._clock = clock
        self._on_stall = on_stall
        self._beat_at = time.monotonic()
        self._timer: TimerHandle | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._loop_thread = 0

    def start(self) -> None:
        if self._thread is not None:
            return
        self._loop_thread = threading.get_ident()
        self._stop.clear()
        self._heartbeat()
        self._thread = threading.Thread(
            target=self._watch, name="homing-stall-monitor", daemon=True
        )
        self._thread.start()

    def _heartbeat(self) -> None:
        self._beat_at = time.monotonic()
        self._timer = self._clock.call_later(self.tick_s, self._heartbeat)

    def _watch(self) -> None:
        stalled_since: float | None = None
        while not self._stop.wait(self.tick_s / 2):
            beat = self._beat_at
            late = time.monotonic() - beat
            if stalled_since is not None and beat != stalled_since:
                log.warning("loop_stall_ended", stalled_s=round(beat - stalled_since, 3))
                stalled_since = None
            if stalled_since is None and late > self.threshold_s:
                stalled_since = beat
                stack = self._loop_stack()
                log.warning("loop_stalled", blocked_s=round(late, 3), stack=stack)
                if self._on_stall is not None:
                    self._on_stall(late, stack)

    def _loop_stack(self) -> str:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return ""
        return "".join(traceback.format_stack(frame)[-STACK_FRAMES:])

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None
