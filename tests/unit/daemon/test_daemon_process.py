"""A real `homing serve` under a real notification socket: a stop signal during the start
stops it (STOPPING=1, exit 0) instead of being ignored until READY; a reload of a file homing
cannot read is refused with the reason and READY=1 follows every RELOADING=1; a reload's read
holds no watchdog ping; an unexpected failure in a reload is logged and READY=1 follows."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import NotifyListener, free_port
from structlog.testing import capture_logs

from homing.config import HomingConfig
from homing.daemon.runner import Daemon


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifyListener]:
    listener = NotifyListener(tmp_path / "notify.sock")
    yield listener
    listener.sock.close()


def _serve(tmp_path: Path, config: Path, notify: NotifyListener, **env: str) -> subprocess.Popen:
    log = (tmp_path / "serve.log").open("w")
    return subprocess.Popen(
        [sys.executable, "-m", "homing", "serve", "--config", str(config)],
        env={**os.environ, "NOTIFY_SOCKET": str(notify.path), "PYTHONUNBUFFERED": "1", **env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _log(tmp_path: Path) -> str:
    return (tmp_path / "serve.log").read_text()


def _children_of(pid: int) -> list[int]:
    """Processes started with `--parent-pid PID` (homing's simulated workers) still alive."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            except OSError:
                continue
            if b"--parent-pid" in argv and str(pid).encode() in argv and state != b"Z":
                found.append(int(entry.name))
    return found


UNREACHABLE = """
[gateway]
port = {port}
grpc_port = {grpc_port}
[engines]
workers = ["grpc://127.0.0.1:{dead}"]
startup_timeout_s = 600
[daemon]
min_ready_workers = 1
[admin]
state_dir = "{state}"
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_while_the_start_waits_for_a_worker_stops_the_process(
    tmp_path: Path, notify: NotifyListener, signum: int
) -> None:
    """The listed worker never answers, so the start waits for it (up to startup_timeout_s,
    600 s) and READY=1 never comes; the signal is not left waiting that long: STOPPING=1
    and exit 0 within seconds."""
    config = tmp_path / "homing.toml"
    config.write_text(
        UNREACHABLE.format(
            port=free_port(), grpc_port=free_port(), dead=free_port(), state=tmp_path / "state"
        )
    )
    process = _serve(tmp_path, config, notify)
    try:
        notify.until("STATUS", 30, value="starting")
        process.send_signal(signum)
        sent = time.monotonic()
        assert notify.until("STOPPING", 10)["STATUS"] == "draining 0 requests in flight"
        assert process.wait(10) == 0, _log(tmp_path)
        assert time.monotonic() - sent < 10
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert notify.states() == ["STOPPING=1"]
    assert '"before_ready": true, "event": "shutdown_requested"' in _log(tmp_path)


SIM = """
[gateway]
port = {port}
grpc_port = {grpc_port}
[sim]
workers = 2
speedup = 10.0
[daemon]
status_interval_s = 600
[admin]
state_dir = "{state}"
"""


@pytest.mark.timeout(60)
def test_a_stop_signal_while_the_workers_start_stops_them_and_the_process(
    tmp_path: Path, notify: NotifyListener
) -> None:
    """SIGTERM right after the start began (its simulated workers still starting): exit 0
    with STOPPING=1, no READY=1, and no worker process left behind."""
    config = tmp_path / "homing.toml"
    config.write_text(SIM.format(port=free_port(), grpc_port=free_port(), state=tmp_path / "state"))
    process = _serve(tmp_path, config, notify)
    try:
        notify.until("STATUS", 30, value="starting")
        process.send_signal(signal.SIGTERM)
        notify.until("STOPPING", 20)
        assert process.wait(20) == 0, _log(tmp_path)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert notify.states() == ["STOPPING=1"]
    deadline = time.monotonic() + 10
    while _children_of(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _children_of(process.pid) == []


EARLY_SIGHUP = """
import os, signal, sys
from homing.cli import main
from homing.daemon.runner import Daemon

run = Daemon.run

async def hup_then_run(self):
    os.kill(os.getpid(), signal.SIGHUP)  # after hold_sighup, before the loop's handler
    await run(self)

Daemon.run = hup_then_run
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.timeout(60)
def test_a_sighup_before_the_loops_handler_is_one_reload_after_ready(
    tmp_path: Path, notify: NotifyListener
) -> None:
    """Python's default for SIGHUP ends the process; one that comes during `homing serve`'s
    imports is held and becomes one reload once READY=1 was sent."""
    config = tmp_path / "homing.toml"
    config.write_text(SIM.format(port=free_port(), grpc_port=free_port(), state=tmp_path / "state"))
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-c", EARLY_SIGHUP, "serve", "--config", str(config)],
        env={**os.environ, "NOTIFY_SOCKET": str(notify.path), "PYTHONUNBUFFERED": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        notify.until("READY", 30)
        notify.until("READY", 30)  # the one after the held SIGHUP's reload
        assert process.poll() is None, _log(tmp_path)
        process.send_signal(signal.SIGTERM)
        notify.until("STOPPING", 10)
        assert process.wait(20) == 0, _log(tmp_path)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert notify.states() == ["READY=1", "RELOADING=1", "READY=1", "STOPPING=1"]


def _unreadable(config: Path, kind: str) -> str:
    """Make `config` a file homing must refuse; the reason it gives."""
    config.unlink()
    if kind == "not utf-8":
        config.write_bytes(b"[router]\npolicy = '\xff'\n")
        return f"{config}: not UTF-8 text (byte 19 is invalid)"
    if kind == "fifo":
        os.mkfifo(config)  # read on the loop, it would hold the loop until a writer came
        return f"{config}: not a regular file (a FIFO)"
    if kind == "/dev/zero":
        config.symlink_to("/dev/zero")
        return f"{config}: not a regular file (a character device)"
    if kind == "nested":
        config.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
        return f"{config}: nested too deeply to read"
    assert kind == "huge"
    with config.open("wb") as f:
        f.truncate(64 * 1024 * 1024)
    return f"{config}: larger than 4 MiB"


@pytest.mark.timeout(120)
def test_a_reload_of_an_unreadable_file_is_refused_and_ready_follows_every_reloading(
    tmp_path: Path, notify: NotifyListener
) -> None:
    config = tmp_path / "homing.toml"
    good = SIM.format(port=free_port(), grpc_port=free_port(), state=tmp_path / "state")
    config.write_text(good)
    process = _serve(tmp_path, config, notify)
    kinds = ["not utf-8", "fifo", "/dev/zero", "nested", "huge"]
    try:
        notify.until("READY", 60)
        for kind in kinds:
            reason = _unreadable(config, kind)
            process.send_signal(signal.SIGHUP)
            notify.until("RELOADING", 10)
            refused = notify.until("READY", 10)
            assert refused["STATUS"] == (
                f"serving llama-3.1-8b 2/2 ready; 0 in flight; reload refused: {reason}"
            )
        config.unlink()
        config.write_text(good)
        process.send_signal(signal.SIGHUP)
        notify.until("RELOADING", 10)
        assert notify.until("READY", 10)["STATUS"].endswith("; reloaded: nothing changed")
        process.send_signal(signal.SIGTERM)
        notify.until("STOPPING", 30)
        assert process.wait(30) == 0, _log(tmp_path)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert notify.states() == [
        "READY=1",
        *["RELOADING=1", "READY=1"] * (len(kinds) + 1),
        "STOPPING=1",
    ]
    assert _log(tmp_path).count('"event": "reload_refused"') == len(kinds)


async def test_a_reload_that_fails_unexpectedly_is_logged_and_ready_still_follows(
    tmp_path: Path, notify: NotifyListener
) -> None:
    """The reload's file read runs in a thread: while it is held the watchdog pings go on
    from the loop. When it raises something unexpected, `reload_failed` is logged with the
    exception, the STATUS line says so, READY=1 follows, and the process keeps serving."""
    config = HomingConfig.model_validate(
        {
            "gateway": {"port": free_port(), "grpc_port": free_port()},
            "sim": {"workers": 1, "speedup": 10.0},
            "daemon": {"status_interval_s": 600},
            "admin": {"state_dir": str(tmp_path / "state")},
        }
    )
    entered, release, left = threading.Event(), threading.Event(), threading.Event()

    def load() -> HomingConfig:
        entered.set()
        release.wait(30)  # held, as a slow disk holds a read
        left.set()
        raise LookupError("the disk went away")

    notify.sock.setblocking(False)
    loop = asyncio.get_running_loop()
    env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "100000"}
    daemon = Daemon(config, load, environ=env)
    running = asyncio.create_task(daemon.run())

    async def until(key: str) -> dict[str, str]:
        """The next message with `key`; after `run` ended, from what it left buffered."""
        while True:
            if running.done():
                data = notify.sock.recv(65536)  # BlockingIOError: it sent no more
            else:
                receive = asyncio.ensure_future(loop.sock_recv(notify.sock, 65536))
                await asyncio.wait({receive, running}, timeout=60, return_when="FIRST_COMPLETED")
                if not receive.done():
                    receive.cancel()
                    failed = running.done() and running.exception()
                    pytest.fail(f"no {key}: {failed or 'timeout'}")
                data = receive.result()
            fields = dict(line.split("=", 1) for line in data.decode().split("\n"))
            notify.messages.append((time.monotonic(), fields))
            if key in fields:
                return fields

    with capture_logs() as logs:
        await until("READY")
        os.kill(os.getpid(), signal.SIGHUP)
        await until("RELOADING")
        await asyncio.to_thread(entered.wait, 10)
        for _ in range(3):  # the loop still runs while the read is held
            await until("WATCHDOG")
        assert not left.is_set()  # on the loop, the pings would come only after it
        release.set()
        ready = await until("READY")
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(running, 30)
    stopping = await until("STOPPING")
    assert stopping["STATUS"] == "draining 0 requests in flight"
    assert ready["STATUS"] == (
        "serving llama-3.1-8b 1/1 ready; 0 in flight; reload failed: the disk went away"
    )
    failed = [e for e in logs if e["event"] == "reload_failed"]
    assert len(failed) == 1 and failed[0]["error"] == "the disk went away"
    assert failed[0]["exc_info"] is True
    assert notify.states() == ["READY=1", "RELOADING=1", "READY=1", "STOPPING=1"]
