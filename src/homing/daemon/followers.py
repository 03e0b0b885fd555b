"""The follower processes of a `homing serve` with `gateway.processes` > 1.

The leader (the process systemd started) runs N-1 followers, `homing serve --follower
PLAN` (`homing.app.processes`), and supervises each with systemd's notification protocol
(its exits, not its liveness: no watchdog yet):
- each follower's `NOTIFY_SOCKET` is a datagram socket of the leader's, so its own
  `Daemon` reports READY=1 and STOPPING=1 here;
- `start` returns once every follower sent READY=1 (TimeoutError naming the ones that did
  not, RuntimeError when one exited first);
- a follower that exits while the leader serves (a crash, a SIGKILL) is started again
  after a backoff: 1 s, doubling to 30 s, back to 1 s once one has served for 60 s. Its
  clients' connections were closed by the kernel with it; the others' streams go on;
- `reload` rewrites each plan, then sends SIGHUP: the follower re-reads its plan, and
  its READY=1 after it (with its STATUS= line, which says whether it applied) ends the wait;
- `stop` sends SIGTERM (each follower drains as the leader does) and waits, then SIGKILL;
- a follower gets SIGTERM when the leader dies, however it dies (PR_SET_PDEATHSIG, set by
  `homing.lifeline.LIFELINE` before the follower's program starts).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from homing.aio import first_done
from homing.app.processes import FollowerPlan
from homing.clock import Clock
from homing.lifeline import LIFELINE, child_environ

log = structlog.get_logger("homing.daemon")

#: What a follower runs, its plan file's path appended.
FOLLOWER_PROGRAM = (sys.executable, "-m", "homing", "serve", "--follower")

#: Restart backoff of a follower that exited: first delay, cap, and how long one must have
#: served for the next exit to start from the first delay again (seconds).
RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0
RESTART_RESET_S = 60.0


def restart_delay(previous_s: float | None, served_s: float) -> float:
    """Seconds before a follower that exited is started again: `RESTART_FIRST_S` after a
    first exit (`previous_s` None) or after one that served `RESTART_RESET_S` or more, else
    twice the previous delay, at most `RESTART_MAX_S`."""
    if previous_s is None or served_s >= RESTART_RESET_S:
        return RESTART_FIRST_S
    return min(RESTART_MAX_S, previous_s * 2)


@dataclass
class Follower:
    """One follower: its plan file, notify socket and current process (None between a
    crash and its restart). `ready`: it sent READY=1 since it last started. `restarts`:
    how often it was started again. `status`: its last STATUS= line. `reload`: set by its
    READY=1 while a reload asked of it is under way; `reload_pending`: a reload came while
    it was starting (its SIGHUP goes with its READY=1)."""

    index: int
    plan_path: Path
    notify_path: Path
    notify: socket.socket
    process: asyncio.subprocess.Process | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    started_at: float = 0.0
    delay_s: float | None = None
    restarts: int = 0
    status: str = ""
    reload: asyncio.Event | None = None
    reload_pending: bool = False

    @property
    def pid(self) -> int | None:
        """The running process's pid (None while it is down)."""
        return self.process.pid if self.process is not None else None


class Followers:
    """`count` followers whose plans `plan(index)` gives (index 1..count), files under
    `runtime_dir`, each inheriting `http_socket`; `clock` times the restarts;
    `on_exit(index)` runs when a follower exited, before it is started again. `program`:
    the command a follower runs, its plan file's path appended (an absolute executable
    first)."""

    def __init__(
        self,
        count: int,
        plan: Callable[[int], FollowerPlan],
        *,
        runtime_dir: Path,
        http_socket: socket.socket,
        clock: Clock,
        on_exit: Callable[[int], None] | None = None,
        program: Sequence[str] = FOLLOWER_PROGRAM,
    ) -> None:
        self._plan = plan
        self._on_exit = on_exit
        self._program = list(program)
        self._dir = runtime_dir
        self._http = http_socket
        self._clock = clock
        self._stopping = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.members: list[Follower] = []
        runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for index in range(1, count + 1):
            notify_path = runtime_dir / f"process-{index}.notify"
            notify_path.unlink(missing_ok=True)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(str(notify_path))
            sock.setblocking(False)
            self.members.append(
                Follower(index, runtime_dir / f"process-{index}.json", notify_path, sock)
            )

    @property
    def pids(self) -> list[int | None]:
        """Each follower's pid, in index order (None while one is down)."""
        return [f.pid for f in self.members]

    async def start(self, timeout_s: float) -> None:
        """Start every follower and wait for each one's READY=1, at most `timeout_s`.
        TimeoutError naming those not ready; RuntimeError when one exited first."""
        loop = asyncio.get_running_loop()
        for f in self.members:
            loop.add_reader(f.notify.fileno(), self._on_notify, f)
            await self._spawn(f)
        waits = [asyncio.ensure_future(self._until_ready(f)) for f in self.members]
        try:
            async with self._clock.timeout(timeout_s):
                await asyncio.gather(*waits)
        except TimeoutError:
            late = [f.index for f in self.members if not f.ready.is_set()]
            raise TimeoutError(
                f"gateway process(es) {late} not ready within {timeout_s:g} s"
            ) from None
        finally:
            for w in waits:
                w.cancel()
        for f in self.members:
            self._supervise(f)

    async def _until_ready(self, f: Follower) -> None:
        assert f.process is not None
        await first_done(f.ready.wait(), f.process.wait())
        if not f.ready.is_set():
            raise RuntimeError(
                f"gateway process {f.index} exited with {f.process.returncode} before ready"
            )

    async def _spawn(self, f: Follower) -> None:
        """Write `f`'s plan as it is now and start its process."""
        self._plan(f.index).write(f.plan_path)
        env = child_environ()
        env["NOTIFY_SOCKET"] = str(f.notify_path)
        f.ready.clear()
        fd = self._http.fileno()
        f.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            LIFELINE,
            str(os.getpid()),
            *self._program,
            str(f.plan_path),
            pass_fds=(fd,),
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
        )
        f.started_at = self._clock.now()
        log.info("gateway_process_started", index=f.index, pid=f.process.pid)

    def _on_notify(self, f: Follower) -> None:
        """Datagrams from `f`'s notify socket: READY=1 marks it ready (and ends a reload it
        was asked for); STATUS= is kept as its `status`."""
        while True:
            try:
                data = f.notify.recv(4096)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            lines = data.decode(errors="replace").split("\n")
            for line in lines:
                if line.startswith("STATUS="):
                    f.status = line.removeprefix("STATUS=")
            if "READY=1" in lines:
                f.ready.set()
                if f.reload is not None:
                    f.reload.set()
                if f.reload_pending and f.process is not None:
                    f.reload_pending = False
                    with contextlib.suppress(ProcessLookupError):
                        f.process.send_signal(signal.SIGHUP)

    def _supervise(self, f: Follower) -> None:
        task = asyncio.get_running_loop().create_task(self._watch(f), name=f"process-{f.index}")
        self._tasks.add(task)
        task.add_done_callback(self._watch_ended)

    def _watch_ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:  # a bug of ours: say so
            log.error("gateway_process_supervision_failed", error=repr(task.exception()))

    async def _watch(self, f: Follower) -> None:
        """Restart `f` whenever it exits, until `stop`; a start that fails is tried again
        after the next backoff."""
        while not self._stopping:
            if f.process is not None:
                code = await f.process.wait()
                if self._stopping:
                    return
                served_s = self._clock.now() - f.started_at
                f.delay_s = restart_delay(f.delay_s, served_s)
                log.error(
                    "gateway_process_exited",
                    index=f.index,
                    pid=f.process.pid,
                    code=code,
                    served_s=round(served_s, 3),
                    restart_in_s=f.delay_s,
                )
                f.process = None
                if self._on_exit is not None:
                    self._on_exit(f.index)
            await self._clock.sleep(f.delay_s or RESTART_FIRST_S)
            if self._stopping:
                return
            try:
                await self._spawn(f)
            except Exception as err:  # out of processes, a plan not written: try again
                f.delay_s = restart_delay(f.delay_s, 0.0)
                log.error(
                    "gateway_process_start_failed",
                    index=f.index,
                    error=str(err) or type(err).__name__,
                    retry_in_s=f.delay_s,
                )
                continue
            f.restarts += 1

    async def reload(self, timeout_s: float) -> dict[int, str]:
        """Rewrite every plan (a follower that restarts reads the new one too), SIGHUP the
        ready followers and wait, at most `timeout_s` in all, for each one's READY=1 after
        its reload: the STATUS line each sent with it, by index ("exited during the
        reload" or "no answer within T s" otherwise). A follower still starting gets its
        SIGHUP once it is ready (its outcome is not waited for); one that is down reads
        the new plan when it starts."""
        for f in self.members:
            self._plan(f.index).write(f.plan_path)
        asked = []
        for f in self.members:
            if f.process is None or f.process.returncode is not None:
                continue
            if not f.ready.is_set():
                f.reload_pending = True  # a SIGHUP before its handler is set would end it
                continue
            f.reload = asyncio.Event()
            with contextlib.suppress(ProcessLookupError):
                f.process.send_signal(signal.SIGHUP)
            asked.append(f)
        outcomes: dict[int, str] = {}
        try:
            async with self._clock.timeout(timeout_s):
                for f in asked:
                    assert f.reload is not None and f.process is not None
                    await first_done(f.reload.wait(), f.process.wait())
                    reloaded = f.reload.is_set()
                    outcomes[f.index] = f.status if reloaded else "exited during the reload"
        except TimeoutError:
            for f in asked:
                outcomes.setdefault(f.index, f"no answer within {timeout_s:g} s")
        finally:
            for f in asked:
                f.reload = None
        return outcomes

    async def stop(self, timeout_s: float) -> None:
        """SIGTERM every follower (each drains), wait at most `timeout_s` for them all,
        SIGKILL those left; then close the notify sockets. Safe to call twice."""
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        running = [
            f.process
            for f in self.members
            if f.process is not None and f.process.returncode is None
        ]
        for p in running:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        if running:
            try:
                async with asyncio.timeout(timeout_s):
                    await asyncio.gather(*(p.wait() for p in running))
            except TimeoutError:
                for p in running:
                    if p.returncode is None:
                        log.error("gateway_process_killed", pid=p.pid, after_s=timeout_s)
                        with contextlib.suppress(ProcessLookupError):
                            p.kill()
                await asyncio.gather(*(p.wait() for p in running))
        loop = asyncio.get_running_loop()
        for f in self.members:
            f.plan_path.unlink(missing_ok=True)  # it holds the leader's admin key
            if f.notify.fileno() >= 0:
                loop.remove_reader(f.notify.fileno())
                f.notify.close()
                f.notify_path.unlink(missing_ok=True)


def bind_http(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A listening TCP socket on `host:port` (0: any free port) for every gateway process
    to accept on. OSError naming the address when it cannot be bound."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as err:
        sock.close()
        raise OSError(err.errno, f"cannot listen on {host}:{port}: {err.strerror}") from None
    sock.setblocking(False)
    return sock
