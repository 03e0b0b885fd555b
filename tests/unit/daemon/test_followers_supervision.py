"""The leader's supervision of its followers, over real child processes that speak the
notify protocol: a follower that dies is started again after the backoff, and a start that
fails (its plan cannot be made) is tried again after the next one instead of ending the
supervision."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

from helpers import eventually

from homing.app.processes import FollowerPlan, Leader
from homing.clock import ManualClock
from homing.config import HomingConfig
from homing.daemon.followers import RESTART_FIRST_S, Followers

#: A stand-in follower: READY=1 to its NOTIFY_SOCKET, then it lives until killed.
FOLLOWER = (
    "import os, socket, time\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
    "s.sendto(b'READY=1', os.environ['NOTIFY_SOCKET'])\n"
    "time.sleep(60)\n"
)


async def test_a_killed_follower_is_restarted_even_after_a_start_that_failed(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    calls = {"n": 0}

    def plan(index: int) -> FollowerPlan:
        calls["n"] += 1
        if calls["n"] == 2:  # the first restart cannot make its plan
            raise ValueError("no plan this time")
        return FollowerPlan(index, Leader("unix:/nowhere"), 0, HomingConfig())

    http = socket.socket()
    followers = Followers(
        1,
        plan,
        runtime_dir=tmp_path / "rt",
        http_socket=http,
        clock=clock,
        program=(sys.executable, "-c", FOLLOWER),
    )
    try:
        async with asyncio.timeout(30):  # start's own timeout is on the manual clock
            await followers.start(timeout_s=30)
        (first,) = followers.pids
        assert first is not None
        os.kill(first, signal.SIGKILL)
        assert await eventually(lambda: followers.pids == [None], 10.0)
        await clock.settle()
        clock.advance(RESTART_FIRST_S)  # the restart: its plan fails, logged, not fatal
        assert await eventually(lambda: calls["n"] == 2, 10.0)
        await clock.settle()
        assert followers.pids == [None] and followers.members[0].restarts == 0
        clock.advance(2 * RESTART_FIRST_S)  # the next backoff: started again
        assert await eventually(lambda: followers.pids[0] not in (None, first), 10.0)
        assert followers.members[0].restarts == 1
    finally:
        await followers.stop(timeout_s=5)
        http.close()
    assert not (tmp_path / "rt" / "process-1.json").exists()  # the plan held a key


#: A stand-in follower that answers a SIGHUP as `homing serve` does: RELOADING=1, then
#: READY=1 with a STATUS line saying what the reload did.
RELOADER = (
    "import os, signal, socket, time\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
    "to = os.environ['NOTIFY_SOCKET']\n"
    "def hup(*_):\n"
    "    s.sendto(b'RELOADING=1', to)\n"
    "    s.sendto(b'READY=1\\nSTATUS=serving; reloaded: tenants', to)\n"
    "signal.signal(signal.SIGHUP, hup)\n"
    "s.sendto(b'READY=1\\nSTATUS=serving', to)\n"
    "time.sleep(60)\n"
)


async def _reload_with(tmp_path: Path, program: str) -> dict[int, str]:
    """One follower running `program`, started, then reloaded; the reload's outcomes."""
    http = socket.socket()
    followers = Followers(
        1,
        lambda index: FollowerPlan(index, Leader("unix:/nowhere"), 0, HomingConfig()),
        runtime_dir=tmp_path / "rt",
        http_socket=http,
        clock=ManualClock(),
        program=(sys.executable, "-c", program),
    )
    try:
        async with asyncio.timeout(30):
            await followers.start(timeout_s=30)
            return await followers.reload(timeout_s=30)
    finally:
        await followers.stop(timeout_s=5)
        http.close()


async def test_a_reload_waits_for_each_followers_ready_and_returns_its_status(
    tmp_path: Path,
) -> None:
    assert await _reload_with(tmp_path, RELOADER) == {1: "serving; reloaded: tenants"}


async def test_a_follower_that_dies_of_the_sighup_is_reported_not_waited_for(
    tmp_path: Path,
) -> None:
    """The stand-in without a SIGHUP handler dies of it (Python's default): reported at
    once, not after the reload's timeout."""
    assert await _reload_with(tmp_path, FOLLOWER) == {1: "exited during the reload"}
