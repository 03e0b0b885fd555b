"""sd_notify messages reach a real datagram socket, named by a path or an abstract name."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from homing.daemon.notify import (
    MAX_VALUE_CHARS,
    Notifier,
    format_message,
    monotonic_usec,
    socket_address,
)
from homing.lifeline import SERVICE_VARIABLES, child_environ


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify.sock")
    sock.bind(path)
    sock.settimeout(2)
    yield sock, path
    sock.close()


def test_a_path_socket_receives_ready_with_its_status(listener: tuple[socket.socket, str]) -> None:
    sock, path = listener
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.ready(status="serving m 2/2 ready")
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving m 2/2 ready"
    notifier.close()


def test_an_abstract_socket_named_with_an_at_sign_receives_messages() -> None:
    name = f"homing-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(b"\0" + name.encode())
        sock.settimeout(2)
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert notifier.stopping(status="draining 3 requests in flight")
        assert sock.recv(4096) == b"STOPPING=1\nSTATUS=draining 3 requests in flight"
        notifier.close()


def test_reloading_carries_the_monotonic_clock_in_microseconds(
    listener: tuple[socket.socket, str],
) -> None:
    sock, path = listener
    notifier = Notifier({"NOTIFY_SOCKET": path})
    before = monotonic_usec()
    notifier.reloading()
    after = monotonic_usec()
    first, second = sock.recv(4096).decode().split("\n")
    assert first == "RELOADING=1"
    key, value = second.split("=")
    assert key == "MONOTONIC_USEC" and before <= int(value) <= after
    notifier.close()


def test_without_notify_socket_every_send_is_a_no_op() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    assert not notifier.ready() and not notifier.watchdog()


def test_a_relative_notify_socket_is_ignored_not_fatal() -> None:
    notifier = Notifier({"NOTIFY_SOCKET": "relative/path"})
    assert not notifier.enabled and not notifier.ready()


def test_a_manager_that_went_away_costs_a_log_line_not_an_exception(tmp_path: Path) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody.sock")})
    assert notifier.enabled
    assert notifier.watchdog() is False
    notifier.close()


def test_socket_addresses_and_messages_follow_sd_notify() -> None:
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"
    assert socket_address("@abc") == b"\0abc"
    assert format_message({"READY": 1, "STATUS": "ok"}) == b"READY=1\nSTATUS=ok"


def test_control_characters_in_a_value_are_sent_as_spaces_and_a_long_value_is_cut() -> None:
    assert format_message({"STATUS": "two\nlines\r\tand\x00nul\x85"}) == (
        b"STATUS=two lines  and nul "
    )
    assert format_message({"STATUS": "lone \udcff surrogate"}) == b"STATUS=lone ? surrogate"
    cut = format_message({"STATUS": "x" * (MAX_VALUE_CHARS + 10)})
    assert cut == b"STATUS=" + b"x" * (MAX_VALUE_CHARS - 3) + b"..."


def test_a_status_with_a_newline_reaches_the_socket_as_one_line(
    listener: tuple[socket.socket, str],
) -> None:
    """A model name with a newline in it must not make `send` raise or forge a field."""
    sock, path = listener
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.ready(status="serving evil\nREADY=0 1/1 ready")
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving evil READY=0 1/1 ready"
    notifier.close()


def test_a_send_that_fails_for_any_reason_returns_false(tmp_path: Path) -> None:
    """A message over the datagram limit fails in `sendto`: logged, False, no exception."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        path = str(tmp_path / "small.sock")
        sock.bind(path)
        notifier = Notifier({"NOTIFY_SOCKET": path})
        fields = {f"K{i}": "x" * MAX_VALUE_CHARS for i in range(1024)}  # 2 MiB
        with capture_logs() as logs:
            assert notifier.send(**fields) is False
        assert [e["event"] for e in logs] == ["notify_failed"]
        notifier.close()


def test_the_environment_of_a_child_has_none_of_the_service_variables() -> None:
    env = {
        "NOTIFY_SOCKET": "/run/systemd/notify",
        "WATCHDOG_USEC": "10000000",
        "WATCHDOG_PID": "1",
        "LISTEN_FDS": "1",
        "LISTEN_PID": "1",
        "LISTEN_FDNAMES": "http",
        "PATH": "/bin",
        "HOMING_STATE_DIR": "/var/lib/homing",
    }
    assert child_environ(env) == {"PATH": "/bin", "HOMING_STATE_DIR": "/var/lib/homing"}
    assert env["NOTIFY_SOCKET"] == "/run/systemd/notify"  # the parent's own is untouched
    assert SERVICE_VARIABLES == {k for k in env if k not in ("PATH", "HOMING_STATE_DIR")}
