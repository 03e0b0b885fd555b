"""`homing serve` as a service: signals, systemd notifications, the watchdog and reloads.

Sequence, as systemd sees it with `Type=notify` (sd_notify(3)):
- start: the signal handlers are set first; the gateway and its workers start; READY=1
  (with a STATUS line) once the listeners are bound and every model has
  `daemon.min_ready_workers` ready workers. A stop signal before then cancels the start:
  STOPPING=1, what had started is stopped, and `run` returns (exit 0);
- every `daemon.status_interval_s`: STATUS= (models, ready workers, requests/s, in flight);
- with `WatchdogSec`: WATCHDOG=1 every half interval, from the event loop;
- SIGHUP (`ExecReload`): RELOADING=1 with MONOTONIC_USEC, the configuration re-read (in a
  thread: a slow file never holds the loop or its watchdog pings) and applied in place
  (`homing.app.App.reload`) or refused with the reason logged (`reload_refused`; an
  unexpected exception: `reload_failed`; the old configuration kept), then READY=1, always,
  with a STATUS line saying which. A SIGHUP that came before the loop's handler was set
  (`homing.daemon.early`) or during the start is one reload once READY=1 was sent;
- SIGTERM or SIGINT: STOPPING=1, then the drain (`App.stop`).
With `gateway.processes` > 1 this process leads the others (`homing.daemon.followers`): it
binds the HTTP listener itself (unless systemd handed one over) and passes it on, and
READY=1 waits for every follower's; a reload and the drain reach them all. A follower
(`follow` set) is run by this same class, its notifications going to the leader.
Without `NOTIFY_SOCKET` the same runs and notifies nobody. A malformed `WATCHDOG_USEC` or
`WATCHDOG_PID` is logged (`watchdog_env_invalid`) and no pings are sent: like
sd_watchdog_enabled(3), whose callers then do not ping; systemd itself never sets one.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import secrets
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable, Coroutine, Mapping, MutableMapping
from pathlib import Path
from typing import Any, TypeVar

import structlog

from homing.admin.server import MAX_SOCKET_PATH
from homing.aio import first_done
from homing.app import App, ReloadRefused
from homing.app.processes import (
    FollowerPlan,
    Leader,
    follower_config,
    runtime_dir,
    with_process_key,
)
from homing.clock import SystemClock
from homing.config import ConfigError, HomingConfig, default_state_dir
from homing.daemon.activation import check_names, listen_sockets
from homing.daemon.early import take_pending_sighup
from homing.daemon.followers import Followers, bind_http
from homing.daemon.notify import Notifier
from homing.daemon.watchdog import StallMonitor, WatchdogPinger, watchdog_interval_s
from homing.engines.lifecycle import Phase
from homing.engines.pool.shared_in_flight import InFlightBoard
from homing.gateway.quotas.shared import QuotaServer

log = structlog.get_logger("homing.daemon")
T = TypeVar("T")

#: Listener names socket activation may hand over (`FileDescriptorName=`).
ACTIVATED_LISTENERS = {"http"}

#: Seconds a follower gets beyond `gateway.drain_timeout_s` to exit after SIGTERM before
#: it is killed (its own drain, then its pools' and listeners' close).
FOLLOWER_GRACE_S = 10.0

#: Seconds the leader waits for each follower's READY=1 after a reload.
FOLLOWER_RELOAD_S = 30.0

#: The in-flight board's file in the leader's runtime directory.
BOARD_FILE = "in_flight.board"


class Daemon:
    """Runs one `App` until SIGTERM or SIGINT. `config`: the configuration to start with;
    `load()`: reads it again for a reload (raises `ConfigError`). `environ`: where the
    NOTIFY_SOCKET, WATCHDOG_* and LISTEN_* variables are read (default `os.environ`).
    `follow`: the leader, for a follower (`homing.app.processes`); a follower serves the
    listening `sockets` it inherited instead of LISTEN_* ones. A leader adds an admin key of
    its own for its followers (`with_process_key`), to the first configuration and to each
    reloaded one, and serves them its memory quota store (`QuotaServer`).
    After `run` has started: `app`, `followers` (the leader of several processes; else
    None), and `last_reload` (None, or what the last one did)."""

    def __init__(
        self,
        config: HomingConfig,
        load: Callable[[], HomingConfig],
        *,
        environ: MutableMapping[str, str] | None = None,
        follow: Leader | None = None,
        sockets: Mapping[str, socket.socket] | None = None,
        shared_in_flight: tuple[InFlightBoard, int] | None = None,
    ) -> None:
        # "auto" read once: the table's rows and the followers started must agree.
        self._processes = 1 if follow is not None else config.gateway.process_count()
        self._leads = self._processes > 1
        self._process_key = secrets.token_hex(32) if self._leads else None
        self.config = self._keyed(config)
        self._load = load
        self._follow = follow
        self._shared = shared_in_flight
        self._runtime: Path | None = None
        self._runtime_temporary = False
        self._runtime_lock: int | None = None  # a descriptor held for the process's life
        self._quota_server: QuotaServer | None = None
        self._sockets = dict(sockets) if sockets is not None else None
        self.followers: Followers | None = None
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
        start fail (OSError, TimeoutError, RuntimeError, ActivationError); returns when a
        stop signal came during the start."""
        loop = asyncio.get_running_loop()
        handlers = {
            signal.SIGINT: self._stop.set,
            signal.SIGTERM: self._stop.set,
            signal.SIGHUP: self._reload_wanted.set,
        }
        for sig, handler in handlers.items():
            loop.add_signal_handler(sig, handler)
        if take_pending_sighup():  # came before the loop's handler: reload once ready
            self._reload_wanted.set()
        pinger: WatchdogPinger | None = None
        monitor: StallMonitor | None = None
        try:
            pinger, monitor = self._watchdogs()
            await self._serve()
        finally:
            for sig in handlers:
                loop.remove_signal_handler(sig)
            if monitor is not None:
                monitor.stop()
            if pinger is not None:  # the pings go on through the drain
                pinger.stop()
            self.notifier.close()

    def _watchdogs(self) -> tuple[WatchdogPinger | None, StallMonitor | None]:
        try:
            interval = watchdog_interval_s(self._environ, os.getpid())
        except ValueError as err:
            log.warning("watchdog_env_invalid", error=str(err))
            interval = None
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

    async def _serve(self) -> None:
        cfg = self.config
        if self._sockets is not None:
            sockets = self._sockets
        else:
            sockets = listen_sockets(self._environ)
            check_names(sockets, ACTIVATED_LISTENERS)
        leads = self._leads
        if leads:
            if "http" not in sockets:
                sockets["http"] = bind_http(cfg.gateway.host, cfg.gateway.port)
            runtime = self._runtime_dir()
            board = InFlightBoard.create(str(runtime / BOARD_FILE), self._processes)
            self._shared = (board, 0)
        app = self.app = App(
            cfg, listen_sockets=sockets, follow=self._follow, shared_in_flight=self._shared
        )
        status_task: asyncio.Task[None] | None = None
        try:
            self.notifier.status("starting")
            if not await self._start(app):
                log.info("shutdown_requested", before_ready=True)
                return
            if leads and not await self._start_followers(app, sockets["http"]):
                log.info("shutdown_requested", before_ready=True)
                return
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
            stops = [app.stop()]
            if self.followers is not None:  # they drain beside this one, on our workers
                followers_gone = asyncio.Event()
                app.keep_workers = followers_gone.wait
                stops.append(self._stop_followers(self.followers, followers_gone))
            for failed in await asyncio.gather(*stops, return_exceptions=True):
                if isinstance(failed, BaseException):
                    log.error("stop_failed", error=repr(failed))
            if self._quota_server is not None:  # once no follower charges any more
                await self._quota_server.stop()
            if self._shared is not None:
                self._shared[0].close()
            if self._runtime is not None and self._runtime_temporary:
                shutil.rmtree(self._runtime, ignore_errors=True)

    async def _stop_followers(self, followers: Followers, gone: asyncio.Event) -> None:
        """Drain and stop the followers (the drain timeout of the configuration in force
        plus `FOLLOWER_GRACE_S`), then set `gone`, whatever happened."""
        try:
            await followers.stop(self.config.gateway.drain_timeout_s + FOLLOWER_GRACE_S)
        finally:
            gone.set()

    def _runtime_dir(self) -> Path:
        """Where the leader keeps its followers' plans, sockets and shared files (made
        0700): the state directory's "processes", or a private temporary directory when
        a Unix socket there would be too long to bind (removed at the stop)."""
        if self._runtime is None:
            chosen = runtime_dir(default_state_dir(self.config.admin.state_dir), MAX_SOCKET_PATH)
            if chosen is None:
                chosen = Path(tempfile.mkdtemp(prefix="homing-processes-"))
                self._runtime_temporary = True
            chosen.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._runtime_lock = _lock_runtime(chosen)
            log.info("gateway_processes_runtime", path=str(chosen))
            self._runtime = chosen
        return self._runtime

    async def _start_followers(self, app: App, http: socket.socket) -> bool:
        """Start the other gateway processes once this one serves; True once every one is
        ready, False when the stop signal came first. Raises what made the start fail."""
        cfg = self.config
        count = self._processes - 1
        self.notifier.status(f"starting {count} more gateway processes")
        runtime = self._runtime_dir()
        quotas = None
        if app.quotas is not None and cfg.quotas.backend == "memory":
            quotas = str(runtime / "quotas.sock")
            self._quota_server = QuotaServer(app.quotas.store, quotas)
            await self._quota_server.start()
        leader = Leader(
            admin=next(a for a in app.admin.addresses if a.startswith("unix:")),
            key=self._process_key,
            quotas=quotas,
            board=str(runtime / BOARD_FILE),
        )
        self.followers = Followers(
            count,
            lambda index: self._plan(app, index, leader, http, runtime),
            runtime_dir=runtime,
            http_socket=http,
            clock=self._clock,
            on_exit=self._forget_process,
        )
        task = await self._until_done_or_stopped(
            self.followers.start(cfg.engines.startup_timeout_s)
        )
        if task.cancelled():
            return False
        task.result()
        return True

    def _plan(
        self, app: App, index: int, leader: Leader, http: socket.socket, runtime: Path
    ) -> FollowerPlan:
        """What follower `index` runs now: this configuration over the fleet's workers
        (none draining or gone), on this process's ports."""
        assert app.fleet is not None and app.grpc_port is not None
        workers = [
            [(w.url, w.version) for w in m.workers() if w.phase not in (Phase.DRAINING, Phase.GONE)]
            for m in app.fleet.models.values()
        ]
        config = follower_config(
            self.config,
            workers=workers,
            grpc_port=app.grpc_port,
            state_dir=str(runtime / f"process-{index}"),
        )
        return FollowerPlan(index=index, leader=leader, http_fd=http.fileno(), config=config)

    async def _reload_followers(self, followers: Followers) -> str:
        """Reload the followers; what to add to this reload's outcome: each follower whose
        reload did not say "reloaded" (refused, failed, no answer), or that could not be
        asked."""
        try:
            outcomes = await followers.reload(FOLLOWER_RELOAD_S)
        except Exception as err:  # a plan not written: the followers keep their config
            log.exception("followers_reload_failed", error=str(err) or type(err).__name__)
            return f"; the other gateway processes were not reloaded: {err}"
        odd = {i: status for i, status in outcomes.items() if "reloaded" not in status}
        for index, status in odd.items():
            log.error("gateway_process_reload", index=index, status=status)
        return "".join(f"; process {i}: {status}" for i, status in sorted(odd.items()))

    def _forget_process(self, index: int) -> None:
        """Gateway process `index` exited: its requests in flight died with it."""
        if self._shared is not None:
            self._shared[0].clear(index)

    def _keyed(self, config: HomingConfig) -> HomingConfig:
        """`config` with the followers' admin key when this process leads others."""
        if self._process_key is None:
            return config
        return with_process_key(config, self._process_key)

    async def _start(self, app: App) -> bool:
        """`app.start()` then `wait_min_ready`, raced with the stop signal: True once ready,
        False when the stop signal came first (the start is cancelled, which stops what it
        had started). Raises what made the start fail (a TimeoutError always with a
        message)."""
        cfg = self.config
        minimum = cfg.daemon.min_ready_workers

        async def start() -> None:
            await app.start()
            if minimum > 0:
                self.notifier.status(f"waiting for {minimum} ready workers per model")
            await app.wait_min_ready(minimum, cfg.engines.startup_timeout_s)

        task = await self._until_done_or_stopped(start())
        if task.cancelled():
            return False
        try:
            task.result()  # what made the start fail
        except TimeoutError as err:
            if str(err):
                raise
            timeout_s = cfg.engines.startup_timeout_s
            raise TimeoutError(
                f"no worker was ready within engines.startup_timeout_s ({timeout_s:g} s)"
            ) from err
        return True

    async def _until_stopped(self, app: App) -> None:
        """Serve reloads until a stop signal; a reload under way when it comes is cancelled
        (what it already applied stays)."""
        while not self._stop.is_set():
            await first_done(self._stop.wait(), self._reload_wanted.wait())
            if self._stop.is_set():
                return
            self._reload_wanted.clear()
            await self._until_done_or_stopped(self.reload(app))

    async def _until_done_or_stopped(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run `work` until it ends or the stop signal comes, whichever is first; in the
        second case it is cancelled and awaited. Returns its finished task."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return task

    async def reload(self, app: App) -> bool:
        """Re-read and apply the configuration (see the module docstring); True when it was
        applied, False when refused or failed (the reason logged and in the STATUS line).
        READY=1 follows RELOADING=1 however it ends, a cancellation included."""
        self.notifier.reloading()
        self.notifier.status("reloading the configuration")
        log.info("reload_requested")
        applied = False
        try:
            new = self._keyed(await asyncio.to_thread(self._load))
            plan = await app.reload(new)
        except (ConfigError, ReloadRefused) as err:
            self.last_reload = f"reload refused: {err}"
            log.error("reload_refused", reason=str(err))
        except asyncio.CancelledError:
            self.last_reload = "reload interrupted by a stop"
            raise
        except Exception as err:  # the service goes on with what it has
            self.last_reload = f"reload failed: {err or type(err).__name__}"
            log.exception("reload_failed", error=str(err) or type(err).__name__)
        else:
            applied = True
            self.config = new
            self.last_reload = plan.outcome()
            if self.followers is not None:
                self.last_reload += await self._reload_followers(self.followers)
            (log.warning if plan.failed else log.info)(
                "reload_applied",
                changes=list(plan.changes),
                workers_added=[u for w in plan.workers for u, _ in w.added],
                workers_removed=[u for w in plan.workers for u in w.removed],
                workers_failed=[f"{u} ({why})" for u, why in plan.failed],
                workers_joining=list(plan.joining),
                workers_rejoined=list(plan.rejoined),
            )
        finally:
            self.notifier.ready(status=f"{self._status_line(app)}; {self.last_reload}")
        return applied

    @staticmethod
    def _status_line(app: App) -> str:
        try:
            return app.status_line()
        except Exception:  # a half-applied reload must not lose READY=1
            return "serving"

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


def _lock_runtime(runtime: Path) -> int:
    """Hold an exclusive lock on `runtime`'s lock file for this process's life (the
    descriptor is returned, never closed): a second leader on the same directory would
    replace the first's in-flight table and sockets. RuntimeError naming the directory
    when another live process holds it."""
    fd = os.open(runtime / "leader.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RuntimeError(
            f"another homing serve with several gateway processes uses {runtime}; give "
            "each its own state directory (HOMING_STATE_DIR or admin.state_dir)"
        ) from None
    return fd
