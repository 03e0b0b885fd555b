"""homing as systemd runs it: the unit files pass `systemd-analyze verify`, a real
`homing serve` under a real NOTIFY_SOCKET listener sends the exact notification sequence
for start, watchdog, reload (applied and refused) and stop, and socket activation
(`systemd-socket-activate`, systemd's own tool) hands it the HTTP listener so a connection
made before homing runs is served, not refused.

Skipped where Debian's systemd package is missing, unless `HOMING_REQUIRE_SYSTEMD` is set
(then they fail: `make test` installs it).
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import NotifyListener, free_port

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
INSTALLED_PATH = "/usr/local/bin/homing"


def _need(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        if os.environ.get("HOMING_REQUIRE_SYSTEMD"):
            pytest.fail(f"{tool} is not installed and HOMING_REQUIRE_SYSTEMD is set")
        pytest.skip(f"{tool} is not installed (Debian package systemd)")
    return found


def _units(tmp_path: Path) -> list[Path]:
    """The unit files as installed, with ExecStart pointing at this checkout's launcher."""
    out = []
    for name in ("homing.service", "homing.socket"):
        text = (UNITS / name).read_text().replace(INSTALLED_PATH, str(ROOT / "bin" / "homing"))
        path = tmp_path / name
        path.write_text(text)
        out.append(path)
    return out


def _directives(path: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def test_the_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = _need("systemd-analyze")
    units = _units(tmp_path)
    done = subprocess.run(
        [analyze, "verify", *map(str, units)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout + done.stderr == ""


def test_the_service_is_hardened_and_outlasts_the_drain(tmp_path: Path) -> None:
    analyze = _need("systemd-analyze")
    service = _units(tmp_path)[0]
    unit = _directives(service)
    assert unit["Type"] == ["notify"] and unit["NotifyAccess"] == ["main"]
    assert unit["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert unit["Restart"] == ["on-failure"] and unit["User"] == ["homing"]
    assert unit["StateDirectory"] == ["homing"]
    for key in ("NoNewPrivileges", "PrivateTmp", "ProtectHome", "PrivateDevices"):
        assert unit[key] == ["yes"], key
    assert unit["ProtectSystem"] == ["strict"]
    from homing.config import GatewaySettings
    from homing.fleet.fleet import CUT_GRACE_S

    drain = GatewaySettings().drain_timeout_s + CUT_GRACE_S
    assert float(unit["TimeoutStopSec"][0].removesuffix("s")) > drain
    assert float(unit["WatchdogSec"][0].removesuffix("s")) > 0
    done = subprocess.run(
        [analyze, "security", "--offline=yes", str(service)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    level = re.search(r"Overall exposure level for homing.service: ([\d.]+)", done.stdout)
    assert level is not None, done.stdout + done.stderr
    assert float(level.group(1)) <= 2.0, done.stdout  # systemd rates up to 2.0 "OK"


CONFIG = """
[gateway]
port = {port}
grpc_port = {grpc_port}
[sim]
workers = 2
speedup = 10.0
[router]
policy = "{policy}"
[daemon]
status_interval_s = 0.5
[admin]
state_dir = "{state}"
"""


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifyListener]:
    listener = NotifyListener(tmp_path / "notify.sock")
    yield listener
    listener.sock.close()


def _http_status(port: int, path: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


@pytest.mark.timeout(180)
def test_start_watchdog_reload_and_stop_notify_systemd_in_order(
    tmp_path: Path, notify: NotifyListener
) -> None:
    port, grpc_port = free_port(), free_port()
    config = tmp_path / "homing.toml"
    fill = {"port": port, "grpc_port": grpc_port, "state": tmp_path / "state"}
    config.write_text(CONFIG.format(policy="cache_aware", **fill))
    env = {
        **os.environ,
        "NOTIFY_SOCKET": str(notify.path),
        "WATCHDOG_USEC": "1000000",
        "PYTHONUNBUFFERED": "1",
    }
    log = (tmp_path / "serve.log").open("w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "homing", "serve", "--config", str(config)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        ready = notify.until("READY", 90)
        # READY=1 only once listening with every model's workers ready.
        assert _http_status(port, "/ready") == 200
        assert ready["STATUS"] == "serving llama-3.1-8b 2/2 ready; 0 in flight"
        status = notify.until("STATUS", 5)
        assert re.fullmatch(
            r"serving llama-3.1-8b 2/2 ready; \d+\.\d req/s; 0 in flight", status["STATUS"]
        )

        # The watchdog: a ping every half of WATCHDOG_USEC, from the event loop.
        start = time.monotonic()
        while time.monotonic() - start < 2.5:
            notify.until("WATCHDOG", 2)
        pings = [t for t, f in notify.messages if "WATCHDOG" in f and t >= start]
        gaps = [b - a for a, b in itertools.pairwise(pings)]
        assert len(pings) >= 4 and max(gaps) < 0.95, gaps

        # A reload that applies: the policy changes in place.
        config.write_text(CONFIG.format(policy="round_robin", **fill))
        process.send_signal(signal.SIGHUP)
        reloading = notify.until("RELOADING", 10)
        assert (
            abs(
                int(reloading["MONOTONIC_USEC"])
                - time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            )
            < 10e6
        )
        applied = notify.until("READY", 30)
        assert applied["STATUS"].endswith("; reloaded: router.policy"), applied

        # A config that fails validation is refused with the reason; the old one is kept.
        config.write_text(CONFIG.format(policy="fastest", **fill))
        process.send_signal(signal.SIGHUP)
        notify.until("RELOADING", 10)
        refused = notify.until("READY", 30)
        assert "reload refused:" in refused["STATUS"] and "router.policy" in refused["STATUS"]
        # ... and so is one that needs a restart, naming what.
        config.write_text(CONFIG.format(policy="round_robin", **{**fill, "port": free_port()}))
        process.send_signal(signal.SIGHUP)
        notify.until("RELOADING", 10)
        restart = notify.until("READY", 30)
        assert "reload refused: gateway.port cannot change without a restart" in restart["STATUS"]
        assert _http_status(port, "/ready") == 200

        process.send_signal(signal.SIGTERM)
        stopping = notify.until("STOPPING", 30)
        assert stopping["STATUS"] == "draining 0 requests in flight"
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert notify.sequence() == [
        "READY=1",
        "RELOADING=1",
        "READY=1",
        "RELOADING=1",
        "READY=1",
        "RELOADING=1",
        "READY=1",
        "STOPPING=1",
    ]
    log.seek(0)
    text = log.read()
    assert "homing.toml: router.policy: Input should be 'cache_aware'" in text
    assert '"event": "reload_refused"' in text
    assert '"policy": "round_robin", "event": "router_policy_reloaded"' in text


def _connect_when_bound(port: int) -> socket.socket:
    """A connection to systemd-socket-activate's socket, once it has bound it."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=90)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextmanager
def _socket_activated(
    tmp_path: Path, port: int, fdname: str, *serve_args: str
) -> Iterator[subprocess.Popen[bytes]]:
    """`homing serve --grpc-port FREE *serve_args` under `systemd-socket-activate`, which
    listens on 127.0.0.1:`port` and starts it on the first connection, passing that socket
    as `fdname`; stdout and stderr together in the process's `stdout` pipe. Killed on exit
    if still running."""
    activate = _need("systemd-socket-activate")
    process = subprocess.Popen(
        [
            activate,
            f"--listen=127.0.0.1:{port}",
            f"--fdname={fdname}",
            f"--setenv=HOMING_STATE_DIR={tmp_path / 'state'}",
            "--setenv=PYTHONUNBUFFERED=1",
            f"--setenv=PATH={os.environ['PATH']}",
            sys.executable,
            "-m",
            "homing",
            "serve",
            "--grpc-port",
            str(free_port()),
            *serve_args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.timeout(180)
def test_socket_activation_serves_a_connection_made_before_homing_ran(tmp_path: Path) -> None:
    port = free_port()
    with _socket_activated(tmp_path, port, "http", "--speedup", "10") as process:
        with _connect_when_bound(port) as conn:  # homing starts on this first connection
            conn.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            conn.settimeout(90)
            reply = b""
            while chunk := conn.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 200 OK"), reply[:200]
        assert b'"id": "llama-3.1-8b"' in reply
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0, out.decode()
        assert b'"activated": ["http"]' in out


def test_a_handed_over_socket_homing_has_no_listener_for_is_refused(tmp_path: Path) -> None:
    port = free_port()
    with _socket_activated(tmp_path, port, "grpc") as process:
        with _connect_when_bound(port):
            pass  # the child starts on the first connection
        out, _ = process.communicate(timeout=60)
    assert process.returncode == 2
    assert (
        out.decode()
        .strip()
        .endswith(
            "homing: socket activation passed grpc; homing listens on http (FileDescriptorName=)"
        )
    )
