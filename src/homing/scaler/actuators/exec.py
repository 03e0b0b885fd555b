"""The `exec` actuator: a user's script starts and stops the replicas (Slurm and the like).

Rule of this file: the script is the source of truth for which members exist. It is run as
`argv + ["scale", N]` (N: the desired total; env `HOMING_STOP`: the member ids to stop when
scaling down, comma-separated, else empty) and as `argv + ["list"]` every `poll_s` of the
injected clock; both print the current members on stdout, one per line: `<member_id>
<grpc://host:port | ->` ("-" while it has no address yet). One script call runs at a time.
A member listed with a URL is STARTING until its engine answers a HealthCheck (polled every
`PROBE_S`), then READY. A member that leaves the list before it was ready, or is not ready
within `startup_timeout_s` of being seen (then the script is asked to stop it), is a failed
start (`scaler_start_failed`, `failed_starts`). A script that exits non-zero, runs past
`timeout_s`, prints more than `MAX_OUTPUT_BYTES` or a malformed line makes `start`/`stop`
raise ActuatorError (its exit status and the last line of its stderr); a failing `list`
poll keeps the last members and logs `scaler_list_failed`. The call ends when the script
exits: its output goes to unlinked temporary files, not pipes, so a process it leaves running
(`worker &`) does not hold the call; such a process should redirect its own output, or it
writes on into a deleted file that only its exit frees.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import IO

import structlog

from homing.clock import Clock, SystemClock
from homing.engines.client import EngineClient, grpc_target
from homing.lifeline import child_environ
from homing.scaler.actuators.base import (
    ActuatorError,
    ColdStarts,
    Listeners,
    Member,
    MemberState,
)

log = structlog.get_logger("homing.scaler")

#: Bytes of stdout (and of stderr) read from one script call; more is an error.
MAX_OUTPUT_BYTES = 1024 * 1024
#: Members one script may list (and `start` may ask for in all).
MAX_MEMBERS = 1024
#: Seconds between HealthCheck probes of a listed member that is not ready yet (as the
#: local actuator polls).
PROBE_S = 0.5
#: Seconds one probe HealthCheck may take.
PROBE_TIMEOUT_S = 5.0
#: Env var naming the members to stop on a `scale` call.
STOP_ENV = "HOMING_STOP"
#: Seconds between looks at the size of a running script's output.
OUTPUT_POLL_S = 0.1


def parse_members(text: str) -> list[tuple[str, str | None]]:
    """The script's output -> [(member_id, url or None)], in its order.

    Blank lines are skipped. Raises ActuatorError for a line that is not two fields, a URL
    that is neither "-" nor grpc://host:port, a repeated member id, or more than
    `MAX_MEMBERS` members.
    """
    members: list[tuple[str, str | None]] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2:
            raise ActuatorError(
                f"line {number}: want '<member_id> <grpc://host:port|->', got {line!r}"
            )
        member_id, address = fields
        url = None if address == "-" else address
        if url is not None:
            if not url.startswith("grpc://"):
                raise ActuatorError(f"line {number}: {address!r} is not grpc://host:port or -")
            try:
                port = int(grpc_target(url).rsplit(":", 1)[1])
            except ValueError:
                port = 0
            if not 0 < port < 65536:
                raise ActuatorError(f"line {number}: {address!r} is not grpc://host:port or -")
        if member_id in seen:
            raise ActuatorError(f"line {number}: member {member_id!r} is listed twice")
        seen.add(member_id)
        members.append((member_id, url))
        if len(members) > MAX_MEMBERS:
            raise ActuatorError(f"more than {MAX_MEMBERS} members listed")
    return members


class ExecActuator:
    """Replicas a user's script runs (see the module docstring).

    `argv`: the script and its own leading arguments. `poll_s`: seconds between `list`
    calls. `timeout_s`: seconds one script call may run (it is SIGKILLed then).
    `startup_timeout_s`: seconds a member may take from first listed to ready. Polling
    starts with the first call made inside a running event loop (construction included).
    """

    kind = "exec"

    def __init__(
        self,
        argv: Sequence[str],
        *,
        clock: Clock | None = None,
        poll_s: float = 2.0,
        timeout_s: float = 60.0,
        startup_timeout_s: float = 600.0,
    ) -> None:
        if not argv or not argv[0]:
            raise ValueError("exec actuator: argv is empty (it needs a script to run)")
        self.argv = list(argv)
        self.clock: Clock = clock or SystemClock()
        self.poll_s = poll_s
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.failed_starts = 0
        self._members: dict[str, Member] = {}
        self._seen_at: dict[str, float] = {}  # when each member was first listed
        self._asked: collections.deque[float] = collections.deque()  # asked, not yet listed
        self._given_up: set[str] = set()  # failed starts the script still lists
        self._probes: dict[str, asyncio.Task[None]] = {}
        self._gone: dict[str, asyncio.Event] = {}  # set once a stopping member is unlisted
        self._background: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()
        self._cold = ColdStarts()
        self._listeners = Listeners()
        self._poller: asyncio.Task[None] | None = None
        self._closed = False
        self._ensure_polling()

    def members(self) -> list[Member]:
        """Members as of the script's last answer and the probes since, in its order."""
        self._ensure_polling()
        return list(self._members.values())

    async def open(self) -> None:
        """Nothing to do: its polling of the script's `list` starts on its own."""

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener()` whenever members change; returns the unsubscribe."""
        self._ensure_polling()
        return self._listeners.subscribe(listener)

    def cold_start_s(self) -> float | None:
        """Median of the last (up to 8) cold starts, asked (or first listed) to ready."""
        return self._cold.median()

    async def start(self, count: int) -> None:
        """`scale <members + count>`; returns once the script answered. ValueError for a
        negative count; ActuatorError when the script fails or the total would pass
        `MAX_MEMBERS`."""
        if count < 0:
            raise ValueError(f"cannot start {count} replicas")
        self._check_open()
        self._ensure_polling()
        async with self._lock:
            target = self._running() + count
            if target > MAX_MEMBERS:
                raise ActuatorError(f"{target} members asked for; at most {MAX_MEMBERS}")
            now = self.clock.now()
            self._asked.extend([now] * count)
            try:
                self._apply(await self._call("scale", str(target)))
            except BaseException:
                for _ in range(min(count, len(self._asked))):
                    self._asked.pop()
                raise
        log.info("scaler_scaled", kind=self.kind, target=target)

    async def stop(self, member_id: str) -> None:
        """`scale <members - 1>` with `HOMING_STOP=member_id`; returns once the script no
        longer lists it (waiting on `list` polls up to `timeout_s`). ActuatorError for an
        unknown member, a failing script, or a member still listed then."""
        self._check_open()
        self._ensure_polling()
        member = self._members.get(member_id)
        if member is None:
            raise ActuatorError(f"no member {member_id!r} to stop")
        gone = self._gone.setdefault(member_id, asyncio.Event())
        if member.state is not MemberState.STOPPING:
            self._members[member_id] = replace(member, state=MemberState.STOPPING)
            self._listeners.notify()
            try:
                async with self._lock:
                    target = self._running()
                    self._apply(await self._call("scale", str(target), stop=[member_id]))
            except BaseException:
                if member_id in self._members:
                    self._members[member_id] = replace(self._members[member_id], state=member.state)
                    self._listeners.notify()
                self._gone.pop(member_id, None)
                raise
        try:
            async with self.clock.timeout(self.timeout_s):
                await gone.wait()
        except TimeoutError:
            raise ActuatorError(
                f"{member_id} still listed {self.timeout_s:g} s after it was stopped"
            ) from None

    async def close(self) -> None:
        """Stop polling and probing (the script's replicas are left as they are)."""
        self._closed = True
        tasks = [*self._probes.values(), *self._background]
        if self._poller is not None:
            tasks.append(self._poller)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._probes.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise ActuatorError("the exec actuator is closed")

    def _running(self) -> int:
        """Members not being stopped (nor given up on)."""
        return sum(1 for m in self._members.values() if m.state is not MemberState.STOPPING)

    def _ensure_polling(self) -> None:
        if self._poller is not None or self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._poller = loop.create_task(self._poll(), name="exec actuator poll")

    async def _poll(self) -> None:
        while True:
            try:
                async with self._lock:
                    self._apply(await self._call("list"))
            except ActuatorError as err:
                log.warning("scaler_list_failed", kind=self.kind, error=str(err))
            except Exception:  # a bug must not end the polling
                log.exception("scaler_list_failed", kind=self.kind)
            self._give_up_slow()
            await self.clock.sleep(self.poll_s)

    async def _call(self, *args: str, stop: Sequence[str] = ()) -> list[tuple[str, str | None]]:
        """Run the script with `args`; its parsed members. ActuatorError on any failure."""
        command = " ".join([*self.argv, *args])
        env = child_environ()
        env[STOP_ENV] = ",".join(stop)
        # Output goes to unlinked files, not pipes: a process the script leaves running (a
        # replica started with `&`) inherits them, and a pipe it held would keep the call
        # waiting for its end; the script's own exit ends the call.
        with contextlib.ExitStack() as files:
            try:
                out_file = files.enter_context(tempfile.TemporaryFile())
                err_file = files.enter_context(tempfile.TemporaryFile())
            except OSError as err:
                raise ActuatorError(
                    f"cannot run {command!r}: no file for its output: {err}"
                ) from None
            try:
                process = await asyncio.create_subprocess_exec(
                    *self.argv, *args,
                    stdin=asyncio.subprocess.DEVNULL, stdout=out_file, stderr=err_file,
                    env=env, start_new_session=True,
                )  # fmt: skip
            except OSError as err:
                raise ActuatorError(f"cannot run {command!r}: {err}") from None
            try:
                async with self.clock.timeout(self.timeout_s):
                    code = await _wait_capped(process, (out_file, err_file))
            except TimeoutError:
                raise ActuatorError(f"{command!r} ran past {self.timeout_s:g} s") from None
            except ActuatorError as error:
                raise ActuatorError(f"{command!r}: {error}") from None
            finally:
                if process.returncode is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(process.pid, signal.SIGKILL)
                    await process.wait()
            try:
                out, err = _read_capped(out_file), _read_capped(err_file)
            except ActuatorError as error:
                raise ActuatorError(f"{command!r}: {error}") from None
        if code != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            last = lines[-1] if lines else "(no stderr)"
            raise ActuatorError(f"{command!r} exited with status {code}: {last}")
        try:
            return parse_members(out.decode(errors="replace"))
        except ActuatorError as error:
            raise ActuatorError(f"{command!r} printed a malformed list: {error}") from None

    def _apply(self, listed: list[tuple[str, str | None]]) -> None:
        """Make the members those `listed`, keeping what is known of each."""
        now = self.clock.now()
        before = self._members
        after: dict[str, Member] = {}
        for member_id, url in listed:
            if member_id in self._given_up:
                continue
            old = before.get(member_id)
            if old is None:
                asked_at = self._asked.popleft() if self._asked else now
                self._seen_at[member_id] = now
                after[member_id] = Member(member_id, url, MemberState.STARTING, asked_at, None)
            elif old.url != url and old.state is not MemberState.STOPPING:
                self._seen_at[member_id] = now  # a new address: a new start
                after[member_id] = replace(old, url=url, state=MemberState.STARTING, ready_at=None)
            else:
                after[member_id] = replace(old, url=url)
        listed_ids = {m for m, _ in listed}
        self._given_up &= listed_ids
        for member_id, old in before.items():
            if member_id in after:
                continue
            if old.state is MemberState.STARTING and member_id not in self._given_up:
                self._failed(member_id, "the script no longer lists it and it was never ready")
            self._seen_at.pop(member_id, None)
            gone = self._gone.pop(member_id, None)
            if gone is not None:
                gone.set()
        self._members = after
        for member_id, member in after.items():
            probe = self._probes.get(member_id)
            wanted = member.state is MemberState.STARTING and member.url is not None
            if probe is not None and (not wanted or before.get(member_id) != member):
                probe.cancel()
                self._probes.pop(member_id, None)
                probe = None
            if wanted and probe is None:
                assert member.url is not None
                task = asyncio.get_running_loop().create_task(self._probe(member_id, member.url))
                self._probes[member_id] = task
        for member_id in set(self._probes) - set(after):
            self._probes.pop(member_id).cancel()
        if after != before:
            self._listeners.notify()

    async def _probe(self, member_id: str, url: str) -> None:
        """HealthCheck `url` every `PROBE_S` until it answers healthy; then READY."""
        client = EngineClient(url, worker_id=member_id)
        try:
            while not await client.health_check(timeout_s=PROBE_TIMEOUT_S):
                await self.clock.sleep(PROBE_S)
        finally:
            await client.close()
        self._probes.pop(member_id, None)
        member = self._members.get(member_id)
        if member is None or member.url != url or member.state is not MemberState.STARTING:
            return
        now = self.clock.now()
        self._members[member_id] = replace(member, state=MemberState.READY, ready_at=now)
        self._cold.add(now - member.asked_at)
        log.info("scaler_member_ready", member=member_id, url=url)
        self._listeners.notify()

    def _give_up_slow(self) -> None:
        """Members STARTING for longer than `startup_timeout_s` are failed starts; the
        script is asked to stop them from a task of its own."""
        now = self.clock.now()
        slow = [
            m.member_id
            for m in self._members.values()
            if m.state is MemberState.STARTING
            and now - self._seen_at.get(m.member_id, now) >= self.startup_timeout_s
        ]
        for member_id in slow:
            self._given_up.add(member_id)
            probe = self._probes.pop(member_id, None)
            if probe is not None:
                probe.cancel()
            del self._members[member_id]
            self._failed(member_id, f"not ready within {self.startup_timeout_s:g} s")
            task = asyncio.get_running_loop().create_task(self._stop_given_up(member_id))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _stop_given_up(self, member_id: str) -> None:
        try:
            async with self._lock:
                self._apply(await self._call("scale", str(self._running()), stop=[member_id]))
        except ActuatorError as err:
            log.warning("scaler_stop_failed", kind=self.kind, member=member_id, error=str(err))

    def _failed(self, member_id: str, reason: str) -> None:
        self.failed_starts += 1
        log.warning("scaler_start_failed", kind=self.kind, member=member_id, reason=reason)
        self._listeners.notify()


async def _wait_capped(process: asyncio.subprocess.Process, files: Sequence[IO[bytes]]) -> int:
    """The script's exit status; ActuatorError (the caller kills its group) as soon as one of
    `files` passes MAX_OUTPUT_BYTES, looked at every OUTPUT_POLL_S while it runs."""
    exited = asyncio.ensure_future(process.wait())
    try:
        while True:
            done, _ = await asyncio.wait({exited}, timeout=OUTPUT_POLL_S)
            if done:
                return exited.result()
            for file in files:
                if os.fstat(file.fileno()).st_size > MAX_OUTPUT_BYTES:
                    raise ActuatorError(f"printed more than {MAX_OUTPUT_BYTES} bytes")
    finally:
        exited.cancel()


def _read_capped(file: IO[bytes], cap: int = MAX_OUTPUT_BYTES) -> bytes:
    """What `file` holds when read (the script's output; a process it left running may have
    added to it since); ActuatorError when that passes `cap` bytes. Read with pread: the
    file position is shared with such a process, and moving it would misplace its writes."""
    size = os.fstat(file.fileno()).st_size
    if size > cap:
        raise ActuatorError(f"printed more than {cap} bytes")
    return os.pread(file.fileno(), size, 0)
