"""The `local` actuator: replicas as child processes of this one, on loopback.

Rule of this file: the I/O shell that starts and stops one replica per member through a
`Spawner`: simulated workers (`SimSpawner`, `homing.embedded.SimLauncher`) or real SGLang
ones (`SglangSpawner`, `SglangLauncher`), both ready on the child's ready line, or a
command template (`CommandSpawner`: `{port}`, `{host}`, `{model}`, `{index}` filled in;
ready once its engine at `grpc://127.0.0.1:{port}` answers a HealthCheck, polled every
`POLL_S`). `start(count)` adds `count` STARTING members at once and starts each from a task
of its own; a start that fails (the process exited first, or it did not answer within
`startup_timeout_s` of the injected clock) removes the member, logs `scaler_start_failed`
and counts in `failed_starts`. A READY member whose process exits on its own is removed
(`scaler_member_exited`). `stop` SIGTERMs a member's process group and SIGKILLs it after
`stop_grace_s`; `close` cancels the starts in flight and stops every process this actuator
started.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Protocol

import structlog

from homing.clock import Clock, SystemClock
from homing.config import SglangSettings, SimSettings
from homing.config.rules import check_command_template
from homing.embedded import SglangLauncher, SimLauncher
from homing.engines.client import EngineClient
from homing.engines.sglang_launch import kill_group
from homing.lifeline import LIFELINE, child_environ
from homing.ports import free_port_pair
from homing.scaler.actuators.base import (
    ActuatorError,
    ColdStarts,
    Listeners,
    Member,
    MemberState,
)

log = structlog.get_logger("homing.scaler")

#: Seconds between HealthCheck polls of a starting command-template replica.
POLL_S = 0.5
#: Seconds one startup HealthCheck may take: a real SGLang answers it with a one-token
#: generation, about a second on a CPU (`homing.engines.sglang_launch`).
HEALTH_TIMEOUT_S = 30.0
#: Log lines of a failed replica quoted in its `scaler_start_failed` reason.
LOG_TAIL_LINES = 5
#: Bytes read from the end of a failed replica's log for those lines.
LOG_TAIL_BYTES = 4096
#: Replica processes one local actuator starts at once (the CPUs of a small host).
MAX_CONCURRENT_STARTS = 4
#: The loopback address command-template replicas are told to bind and are reached on.
HOST = "127.0.0.1"


@dataclass(frozen=True)
class CommandTemplate:
    """A command line that starts one replica, e.g. `["python", "-m",
    "sglang.launch_server", "--model-path", "{model}", "--port", "{port}",
    "--smg-grpc-mode"]`; `env`: variables added to the inherited environment (values may
    hold placeholders too). Placeholders: `{port}` (a free loopback port), `{host}`
    (127.0.0.1), `{model}`, `{index}` (0, 1, ... per start); `{{` and `}}` are literal
    braces. Raises ValueError for an empty argv or any other placeholder."""

    argv: list[str]
    env: dict[str, str] | None = None

    def __post_init__(self) -> None:
        check_command_template(self.argv, self.env)

    def render(
        self, *, port: int, model: str, index: int, host: str = HOST
    ) -> tuple[list[str], dict[str, str]]:
        """(argv, added env) with the placeholders filled in."""
        values = {"port": port, "host": host, "model": model, "index": index}
        argv = [a.format(**values) for a in self.argv]
        env = {k: v.format(**values) for k, v in (self.env or {}).items()}
        return argv, env


@dataclass
class Replica:
    """One replica process that served: its process, worker URL and the process group to
    clear after a stop (None: the spawner's own stop clears it)."""

    process: asyncio.subprocess.Process
    url: str
    group: int | None = None


class Spawner(Protocol):
    """How `LocalActuator` starts and stops one replica."""

    def describe(self) -> str:
        """Names what it starts, for logs."""
        ...

    async def spawn(
        self, member_id: str, index: int, *, clock: Clock, started: Callable[[int], None]
    ) -> Replica:
        """Start replica number `index` and return it once its engine serves; `started(pid)`
        once its process exists. Raises ActuatorError (the reason) when it exits first;
        cancelled (the caller's startup timeout, a close), it stops what it started."""
        ...

    async def stop(self, replica: Replica, *, clock: Clock, grace_s: float) -> None:
        """SIGTERM the replica, SIGKILL it after `grace_s`; returns once it is gone."""
        ...


class LauncherSpawner:
    """Workers of one of homing's own launchers (`homing.embedded`), through its
    `start_one` (ready on the child's ready line) and `stop_one`; each child dies with this
    process (`--parent-pid`)."""

    def __init__(self, launcher: SimLauncher | SglangLauncher, *, startup_timeout_s: float) -> None:
        self.launcher = launcher
        self.startup_timeout_s = startup_timeout_s

    def describe(self) -> str:
        """The launcher's kind of worker."""
        return self.launcher.what

    async def spawn(
        self, member_id: str, index: int, *, clock: Clock, started: Callable[[int], None]
    ) -> Replica:
        """One more worker (its pid is known once it is ready)."""
        try:
            url = await self.launcher.start_one(timeout_s=self.startup_timeout_s)
        except RuntimeError as err:  # "... exited with code N before it was ready"
            raise ActuatorError(str(err)) from None
        child = next(c for c in self.launcher.children if c.url == url)
        started(child.process.pid)
        return Replica(child.process, url)

    async def stop(self, replica: Replica, *, clock: Clock, grace_s: float) -> None:
        """`stop_one` (SIGTERM, SIGKILL after `grace_s`, then what is left of a real
        SGLang's process group); nothing when the launcher no longer has it."""
        with contextlib.suppress(KeyError):
            await self.launcher.stop_one(replica.url, grace_s=grace_s)
        await replica.process.wait()


class SimSpawner(LauncherSpawner):
    """Simulated workers (`homing sim --workers 1`, `SimLauncher`) for `settings`."""

    def __init__(self, settings: SimSettings, *, startup_timeout_s: float = 120.0) -> None:
        super().__init__(SimLauncher(settings), startup_timeout_s=startup_timeout_s)


class SglangSpawner(LauncherSpawner):
    """Real SGLang workers (`homing worker`, `SglangLauncher`) for `settings`, with KV page
    size `page_size` (the router's block size); each within `settings.startup_timeout_s`."""

    def __init__(self, settings: SglangSettings, *, page_size: int) -> None:
        super().__init__(
            SglangLauncher(settings, page_size=page_size),
            startup_timeout_s=settings.startup_timeout_s,
        )


class CommandSpawner:
    """Replicas from a `CommandTemplate`, each in a process group (and session) of its own,
    SIGTERMed by Linux when this process dies; stdout and stderr go to
    `log_dir/<member_id>.log` (None: /dev/null)."""

    def __init__(
        self, template: CommandTemplate, *, model: str, log_dir: Path | None = None
    ) -> None:
        self.template = template
        self.model = model
        self.log_dir = log_dir

    def describe(self) -> str:
        """The template's program."""
        return self.template.argv[0]

    def log_path(self, member_id: str) -> Path | None:
        """Where the output of `member_id` goes (None: nowhere)."""
        return None if self.log_dir is None else self.log_dir / f"{member_id}.log"

    async def spawn(
        self, member_id: str, index: int, *, clock: Clock, started: Callable[[int], None]
    ) -> Replica:
        """Run the command on a free port (the next one free too, for a simulated
        worker's sidecar) and poll its engine until it answers."""
        port = free_port_pair(HOST)
        argv, added = self.template.render(port=port, model=self.model, index=index)
        program = _program(argv[0])
        env = child_environ()
        env.update(added)
        path = self.log_path(member_id)
        out: IO[bytes] | int
        if path is None:
            out = asyncio.subprocess.DEVNULL
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            out = path.open("wb")
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-c", LIFELINE, str(os.getpid()), program, *argv[1:],
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                start_new_session=True,
            )  # fmt: skip
        except OSError as err:
            raise ActuatorError(f"cannot run {argv[0]!r}: {err}") from None
        finally:
            if not isinstance(out, int):
                out.close()
        started(process.pid)
        replica = Replica(process, f"grpc://{HOST}:{port}", group=process.pid)
        try:
            await self._wait_ready(replica, member_id, clock)
        except BaseException:
            await self.stop(replica, clock=clock, grace_s=0.0)
            raise
        return replica

    async def _wait_ready(self, replica: Replica, member_id: str, clock: Clock) -> None:
        """Poll HealthCheck every `POLL_S` until healthy; ActuatorError when the process
        exits first (its exit status and the end of its log)."""
        exited = asyncio.ensure_future(replica.process.wait())
        client = EngineClient(replica.url, worker_id=member_id)
        try:
            while True:
                probe = asyncio.ensure_future(client.health_check(timeout_s=HEALTH_TIMEOUT_S))
                await asyncio.wait({probe, exited}, return_when=asyncio.FIRST_COMPLETED)
                if probe.done() and probe.result():
                    return
                probe.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await probe
                if not exited.done():
                    with contextlib.suppress(TimeoutError):
                        async with clock.timeout(POLL_S):
                            await asyncio.shield(exited)
                if exited.done():
                    raise ActuatorError(
                        f"exited with status {exited.result()} before it was ready"
                        f"{self._tail(member_id)}"
                    )
        finally:
            exited.cancel()
            await client.close()

    def _tail(self, member_id: str) -> str:
        path = self.log_path(member_id)
        if path is None:
            return " (its output went to /dev/null)"
        try:
            with path.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
                lines = f.read().decode(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        except OSError as err:
            return f" (its log {path} cannot be read: {err})"
        return f"; last lines of {path}: " + " | ".join(lines) if lines else f"; {path} is empty"

    async def stop(self, replica: Replica, *, clock: Clock, grace_s: float) -> None:
        """SIGTERM the process group, SIGKILL it after `grace_s`, reap the leader, then
        SIGKILL whatever is left in the group."""
        pgid = replica.group if replica.group is not None else replica.process.pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            async with clock.timeout(grace_s):
                await replica.process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            await replica.process.wait()
        if kill_group(pgid):
            log.warning("scaler_group_killed", pgid=pgid)


def _program(name: str) -> str:
    """The file a command template's program `name` runs: a path as it is, a bare name
    looked up on PATH. ActuatorError when it is not an executable file (checked here: the
    lifeline that execs it would only exit 1)."""
    if os.sep not in name:
        found = shutil.which(name)
        if found is None:
            raise ActuatorError(f"{name!r} is not a program on PATH")
        return found
    if not os.path.isfile(name):
        what = "a directory" if os.path.isdir(name) else "no such file"
        raise ActuatorError(f"{name!r} is not a program ({what})")
    if not os.access(name, os.X_OK):
        raise ActuatorError(f"{name!r} is not a program (not executable)")
    return name


class LocalActuator:
    """Replicas as child processes started by `spawner` (see the module docstring).

    `startup_timeout_s`: per start, from its spawn to ready. `stop_grace_s`: SIGTERM to
    SIGKILL. `max_concurrent_starts`: processes starting at once (the others stay STARTING,
    queued): a start loads weights and imports a framework, so one host starting dozens at
    once starves them all. Members are named `local-<index>`.
    """

    kind = "local"

    def __init__(
        self,
        spawner: Spawner,
        *,
        clock: Clock,
        startup_timeout_s: float = 120.0,
        stop_grace_s: float = 25.0,
        max_concurrent_starts: int = MAX_CONCURRENT_STARTS,
    ) -> None:
        if max_concurrent_starts < 1:
            raise ValueError("max_concurrent_starts must be at least 1")
        self._start_slots = asyncio.Semaphore(max_concurrent_starts)
        self.spawner = spawner
        self.clock = clock
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.failed_starts = 0
        self._members: dict[str, Member] = {}
        self._replicas: dict[str, Replica] = {}
        self._pids: dict[str, int] = {}
        self._starts: dict[str, asyncio.Task[None]] = {}
        self._stops: dict[str, asyncio.Task[None]] = {}
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._index = itertools.count()
        self._cold = ColdStarts()
        self._listeners = Listeners()
        self._closed = False

    @classmethod
    def for_sim(
        cls,
        settings: SimSettings,
        *,
        clock: Clock | None = None,
        startup_timeout_s: float = 120.0,
        stop_grace_s: float = 25.0,
    ) -> LocalActuator:
        """Simulated workers for `settings` (its `workers` is ignored: the scaler decides)."""
        return cls(
            SimSpawner(settings, startup_timeout_s=startup_timeout_s),
            clock=clock or SystemClock(),
            startup_timeout_s=startup_timeout_s,
            stop_grace_s=stop_grace_s,
        )

    @classmethod
    def for_command(
        cls,
        template: CommandTemplate,
        *,
        model: str,
        clock: Clock | None = None,
        log_dir: Path | None = None,
        startup_timeout_s: float = 120.0,
        stop_grace_s: float = 25.0,
    ) -> LocalActuator:
        """Replicas from `template` with `{model}` = `model`, logs under `log_dir`."""
        return cls(
            CommandSpawner(template, model=model, log_dir=log_dir),
            clock=clock or SystemClock(),
            startup_timeout_s=startup_timeout_s,
            stop_grace_s=stop_grace_s,
        )

    def members(self) -> list[Member]:
        """Members starting, ready or stopping, in the order they were asked for."""
        return list(self._members.values())

    def pid(self, member_id: str) -> int | None:
        """The process id of `member_id` once known (None: not yet, or no such member)."""
        return self._pids.get(member_id)

    async def open(self) -> None:
        """Nothing to do: it knows its members from the processes it started."""

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener()` whenever members change; returns the unsubscribe."""
        return self._listeners.subscribe(listener)

    def cold_start_s(self) -> float | None:
        """Median of the last (up to 8) cold starts, seconds; None before one."""
        return self._cold.median()

    async def start(self, count: int) -> None:
        """Add `count` STARTING members and start each in the background. ValueError for a
        negative count, ActuatorError once closed."""
        if count < 0:
            raise ValueError(f"cannot start {count} replicas")
        if self._closed:
            raise ActuatorError("the local actuator is closed")
        now = self.clock.now()
        loop = asyncio.get_running_loop()
        for _ in range(count):
            index = next(self._index)
            member_id = f"local-{index}"
            self._members[member_id] = Member(member_id, None, MemberState.STARTING, now, None)
            task = loop.create_task(self._start(member_id, index), name=f"start {member_id}")
            self._starts[member_id] = task
            task.add_done_callback(lambda _, m=member_id: self._starts.pop(m, None))
        if count:
            log.info("scaler_starting", kind=self.kind, count=count, what=self.spawner.describe())
            self._listeners.notify()

    async def _start(self, member_id: str, index: int) -> None:
        def started(pid: int) -> None:
            self._pids[member_id] = pid

        try:
            async with self._start_slots:  # the timeout counts from the spawn, not the wait
                async with self.clock.timeout(self.startup_timeout_s):
                    replica = await self.spawner.spawn(
                        member_id, index, clock=self.clock, started=started
                    )
        except TimeoutError:
            self._failed(member_id, f"did not answer within {self.startup_timeout_s:g} s")
            return
        except ActuatorError as err:
            self._failed(member_id, str(err))
            return
        except Exception as err:  # an unforeseen failure of the spawner: still a failed start
            self._failed(member_id, repr(err))
            return
        self._replicas[member_id] = replica
        self._pids[member_id] = replica.process.pid
        member = self._members[member_id]
        if member.state is MemberState.STOPPING:
            return  # it came up as its stop began: `_stop` stops it
        now = self.clock.now()
        self._members[member_id] = replace(
            member, url=replica.url, state=MemberState.READY, ready_at=now
        )
        self._cold.add(now - member.asked_at)
        watcher = asyncio.get_running_loop().create_task(self._watch(member_id, replica))
        self._watchers[member_id] = watcher
        watcher.add_done_callback(lambda _: self._watchers.pop(member_id, None))
        log.info(
            "scaler_member_ready",
            member=member_id,
            url=replica.url,
            pid=replica.process.pid,
            cold_start_s=round(now - member.asked_at, 3),
        )
        self._listeners.notify()

    def _failed(self, member_id: str, reason: str) -> None:
        self._members.pop(member_id, None)
        self._pids.pop(member_id, None)
        self.failed_starts += 1
        log.warning("scaler_start_failed", kind=self.kind, member=member_id, reason=reason)
        self._listeners.notify()

    async def _watch(self, member_id: str, replica: Replica) -> None:
        """Remove a READY member whose process exits on its own."""
        code = await replica.process.wait()
        member = self._members.get(member_id)
        if member is None or member.state is not MemberState.READY:
            return  # being stopped
        log.warning("scaler_member_exited", member=member_id, url=replica.url, code=code)
        del self._members[member_id]
        self._replicas.pop(member_id, None)
        self._pids.pop(member_id, None)
        self._listeners.notify()
        await self.spawner.stop(replica, clock=self.clock, grace_s=0.0)  # clear what is left

    async def stop(self, member_id: str) -> None:
        """Stop `member_id` (cancel its start, or SIGTERM then SIGKILL after
        `stop_grace_s`); returns once its process is gone. ActuatorError for an unknown
        member."""
        if member_id not in self._members:
            raise ActuatorError(f"no member {member_id!r} to stop")
        task = self._stops.get(member_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._stop(member_id))
            self._stops[member_id] = task
            task.add_done_callback(lambda _: self._stops.pop(member_id, None))
        await asyncio.shield(task)

    async def _stop(self, member_id: str) -> None:
        try:
            member = self._members[member_id]
            self._members[member_id] = replace(member, state=MemberState.STOPPING)
            self._listeners.notify()
            start = self._starts.get(member_id)
            if start is not None:  # still starting: the spawner kills it on cancellation
                start.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await start
            replica = self._replicas.get(member_id)  # ready, or it came up as we cancelled
            if replica is not None:
                await self.spawner.stop(replica, clock=self.clock, grace_s=self.stop_grace_s)
            log.info("scaler_member_stopped", member=member_id)
        finally:
            self._members.pop(member_id, None)
            self._replicas.pop(member_id, None)
            self._pids.pop(member_id, None)
            watcher = self._watchers.pop(member_id, None)
            if watcher is not None:
                watcher.cancel()
            self._listeners.notify()

    async def close(self) -> None:
        """Cancel the starts in flight and stop every process started here (SIGKILL after
        `stop_grace_s`); no member is left. Idempotent."""
        self._closed = True
        ids = list(self._members)
        await asyncio.gather(
            *(self.stop(m) for m in ids if m in self._members), return_exceptions=True
        )
        await asyncio.gather(*list(self._stops.values()), return_exceptions=True)
        for watcher in list(self._watchers.values()):
            watcher.cancel()
