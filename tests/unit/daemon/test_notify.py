"""sd_notify messages reach a real datagram socket, named by a path or an abstract name."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from homing.daemon.notify import Notifier, format_message, monotonic_usec, socket_address


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
    with pytest.raises(ValueError, match="one line"):
        format_message({"STATUS": "two\nlines"})
