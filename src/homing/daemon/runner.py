"""`homing serve` as a service: signals, systemd notifications, the watchdog and reloads.

Sequence, as systemd sees it with `Type=notify` (sd_notify(3)):
- start: the gateway and its workers start; READY=1 (with a STATUS line) once the listeners
  are bound and every model has `daemon.min_ready_workers` ready workers;
- every `daemon.status_interval_s`: STATUS= (models, ready workers, requests/s, in flight);
- with `WatchdogSec`: WATCHDOG=1 every half interval, from the event loop;
- SIGHUP (`ExecReload`): RELOADING=1 with MONOTONIC_USEC, the configuration re-read and
  applied in place (`homing.app.App.reload`) or refused with the reason logged (the old one
  kept), then READY=1 with a STATUS line saying which;
- SIGTERM or SIGINT: STOPPING=1, then the drain (`App.stop`).
Without `NOTIFY_SOCKET` the same runs and notifies nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, MutableMapping

import structlog

from homing.app import App, ReloadRefused
from homing.clock import SystemClock
from homing.config import ConfigError, HomingConfig
from homing.daemon.activation import check_names, listen_sockets
from homing.daemon.notify import Notifier
from homing.daemon.watchdog import StallMonitor, WatchdogPinger, watchdog_interval_s

log = structlog.get_logger("homing.daemon")

#: Listener names socket activation may hand over (`FileDescriptorName=`).
ACTIVATED_LISTENERS = {"http"}


class Daemon:
    """Runs one `App` until SIGTERM or SIGINT. `config`: the configuration to start with;
    `load()`: reads it again for a reload (raises `ConfigError`). `environ`: where the
    NOTIFY_SOCKET, WATCHDOG_* and LISTEN_* variables are read (default `os.environ`).
    After `run` has started: `app`, and `last_reload` (None, or what the last one did)."""

    def __init__(
        self,
        config: HomingConfig,
        load: Callable[[], HomingConfig],
        *,
        environ: MutableMapping[str, str] | None = None,
    ) -> None:
        self.config = config
        self._load = load
        self._environ = os.environ if environ is None else environ
        self.notifier = Notifier(self._environ)
        self.app: App | None = None
        self.last_reload: str | None = None
        self._clock = SystemClock()
        self._stop = asyncio.Event()
        self._reload_wanted = asyncio.Event()
        self._opened = 0
        self._rate_at = 0.0

    async def run(self) -> None:
        """Start, serve until a stop signal, then drain and stop. Raises what made the
        start fail (OSError, TimeoutError, RuntimeError, ActivationError)."""
        loop = asyncio.get_running_loop()
        handlers = {
            signal.SIGINT: self._stop.set,
            signal.SIGTERM: self._stop.set,
            signal.SIGHUP: self._reload_wanted.set,
        }
        for sig, handler in handlers.items():
            loop.add_signal_handler(sig, handler)
        pinger, monitor = self._watchdogs()
        try:
            await self._serve(pinger)
        finally:
            for sig in handlers:
                loop.remove_signal_handler(sig)
            if monitor is not None:
                monitor.stop()
            self.notifier.close()

    def _watchdogs(self) -> tuple[WatchdogPinger | None, StallMonitor | None]:
        interval = watchdog_interval_s(self._environ, os.getpid())
        pinger = None
        if interval is not None and self.notifier.enabled:
            pinger = WatchdogPinger(interval, self.notifier.watchdog, self._clock)
            pinger.start()  # a long start (a real engine's) must not miss pings either
        monitor = None
        threshold = self.config.daemon.stall_threshold_s
        if threshold > 0:
            monitor = StallMonitor(threshold, self._clock, tick_s=min(0.1, threshold / 4))
            monitor.start()
        return pinger, monitor

    async def _serve(self, pinger: WatchdogPinger | None) -> None:
        cfg = self.config
        sockets = listen_sockets(self._environ)
        check_names(sockets, ACTIVATED_LISTENERS)
        app = self.app = App(cfg, listen_sockets=sockets)
        status_task: asyncio.Task[None] | None = None
        try:
            await app.start()
            await app.wait_min_ready(cfg.daemon.min_ready_workers, cfg.engines.startup_timeout_s)
            self._opened, self._rate_at = app.recorder.opened, self._clock.now()
            self.notifier.ready(status=app.status_line())
            log.info("ready", notify=self.notifier.enabled, activated=sorted(sockets))
            status_task = asyncio.create_task(self._status_loop(app))
            await self._until_stopped(app)
            log.info("shutdown_requested")
        finally:
            if status_task is not None:
                status_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await status_task
            in_flight = app.service.in_flight if app.service is not None else 0
            self.notifier.stopping(status=f"draining {in_flight} requests in flight")
            try:  # the pings go on through the drain: it may outlast the interval
                await app.stop()
            finally:
                if pinger is not None:
                    pinger.stop()

    async def _until_stopped(self, app: App) -> None:
        """Serve reloads until a stop signal; a reload under way when it comes is cancelled
        (what it already applied stays)."""
        while not self._stop.is_set():
            stop = asyncio.ensure_future(self._stop.wait())
            reload = asyncio.ensure_future(self._reload_wanted.wait())
            try:
                await asyncio.wait({stop, reload}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
                reload.cancel()
            if self._stop.is_set():
                return
            self._reload_wanted.clear()
            task = asyncio.create_task(self.reload(app))
            stop = asyncio.ensure_future(self._stop.wait())
            try:
                await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def reload(self, app: App) -> bool:
        """Re-read and apply the configuration (see the module docstring); True when it was
        applied, False when refused (the reason logged and in the STATUS line)."""
        self.notifier.reloading()
        self.notifier.status("reloading the configuration")
        log.info("reload_requested")
        applied = False
        try:
            new = self._load()
            plan = await app.reload(new)
        except (ConfigError, ReloadRefused) as err:
            self.last_reload = f"reload refused: {err}"
            log.error("reload_refused", reason=str(err))
        else:
            applied = True
            self.config = new
            changes = ", ".join(plan.changes) or "nothing changed"
            self.last_reload = f"reloaded: {changes}"
            log.info(
                "reload_applied",
                changes=list(plan.changes),
                workers_added=[u for w in plan.workers for u, _ in w.added],
                workers_removed=[u for w in plan.workers for u in w.removed],
            )
        self.notifier.ready(status=f"{app.status_line()}; {self.last_reload}")
        return applied

    async def _status_loop(self, app: App) -> None:
        while True:
            await self._clock.sleep(self.config.daemon.status_interval_s)
            self.notifier.status(self.status(app))

    def status(self, app: App) -> str:
        """The STATUS line now: `App.status_line` with the request rate since the last
        call, and the last reload's outcome."""
        now = self._clock.now()
        opened = app.recorder.opened
        elapsed = now - self._rate_at
        rate = (opened - self._opened) / elapsed if elapsed > 0 else None
        self._opened, self._rate_at = opened, now
        line = app.status_line(rate)
        return f"{line}; {self.last_reload}" if self.last_reload else line
