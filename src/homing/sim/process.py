"""A worker process as its parent sees it: start `python -m homing sim` (or another `homing`
sub-command that announces itself the same way, such as `homing worker`), wait for its
ready line, stop it.

Rule of this file: the one place that launches and stops homing's worker child processes
(the embedded default, `homing.bench.sim_throughput`, `homing.bench.routers`). A child prints one
JSON line `{"event": "ready", "workers": [...]}` on stdout when it serves (other lines are
skipped); its stdout is drained afterwards so the child never blocks on a full pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from homing.lifeline import child_environ

_background: set[asyncio.Task[None]] = set()  # drain tasks, kept until they end


async def spawn_sim(
    args: Sequence[str], *, stderr: int | None = None, timeout_s: float = 120.0
) -> tuple[asyncio.subprocess.Process, dict[str, Any]]:
    """Start `python -m homing sim ARGS` and return it with its ready message.

    `stderr`: where the child's stderr goes (None: ours). Raises RuntimeError when the
    child exits before it is ready, TimeoutError after `timeout_s` (the child is killed).
    """
    return await spawn_homing(
        "sim", args, what="simulated worker", stderr=stderr, timeout_s=timeout_s
    )


async def spawn_homing(
    command: str,
    args: Sequence[str],
    *,
    what: str,
    stderr: int | None = None,
    timeout_s: float = 120.0,
    kill_grace_s: float = 0.0,
) -> tuple[asyncio.subprocess.Process, dict[str, Any]]:
    """Start `python -m homing COMMAND ARGS` and return it with its ready message.

    `what` names the child in errors. `stderr`: where the child's stderr goes (None: ours).
    Raises RuntimeError when the child exits before it is ready, TimeoutError after
    `timeout_s`; either way the child is stopped (SIGTERM, SIGKILL after `kill_grace_s`).
    """
    # A session of its own: a terminal's Ctrl-C or hangup reaches the parent only, which
    # drains its requests before it stops the child (`terminate`); the child still dies
    # with its parent (`homing sim --parent-pid`). Not the service's NOTIFY_SOCKET,
    # WATCHDOG_* or LISTEN_* either: the child is not the service.
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "homing", command, *args,
        stdout=asyncio.subprocess.PIPE, stderr=stderr, stdin=asyncio.subprocess.DEVNULL,
        start_new_session=True, env=child_environ(),
    )  # fmt: skip
    try:
        async with asyncio.timeout(timeout_s):
            ready = await _ready(process, what)
    except BaseException:
        await terminate([process], grace_s=kill_grace_s)
        raise
    assert process.stdout is not None
    task = asyncio.get_running_loop().create_task(_drain(process.stdout))
    _background.add(task)
    task.add_done_callback(_background.discard)
    return process, ready


async def _ready(process: asyncio.subprocess.Process, what: str) -> dict[str, Any]:
    assert process.stdout is not None
    while True:
        line = await process.stdout.readline()
        if not line:
            code = await process.wait()
            raise RuntimeError(f"{what} exited with code {code} before it was ready")
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(message, dict) and message.get("event") == "ready":
            return message


async def terminate(processes: Iterable[asyncio.subprocess.Process], grace_s: float) -> None:
    """SIGTERM every process, SIGKILL those still alive after `grace_s`, and reap them."""
    procs = list(processes)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            async with asyncio.timeout(grace_s):
                await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass
